"""``ray_trainer_processes: 2``: the trainer role as two Ray actors running the data-parallel
code, against the same run launched by torchrun on 2 processes (placement local).

Each rank samples its share of the prompts from its own stream (seed + rank) in both, so the
two runs draw the same rollouts only if the Ray ranks got their ranks, shared one set of
engines holding rank 0's weights, and summed their gradients as the launched ranks do; the
launched run equals one process given the same rollout (tests/distributed/test_dp_online.py).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from test_placement import WORDS, assert_same_run

from proxrl.algos.online import grpo
from proxrl.runtime.checkpoint import CheckpointManager

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "distributed"))
from launch import check, torchrun  # noqa: E402

HERE = Path(__file__).resolve().parent


def fields(tiny_lm: str, prompts: Path) -> dict[str, object]:
    return dict(
        model=tiny_lm,
        prompts=str(prompts),
        reward_fn=["ray_rewards:list_actors"],
        iterations=3,
        rollout_batch_size=4,  # 2 prompts per rank
        group_size=2,
        max_new_tokens=6,
        temperature=1.0,
        mini_batch_size=4,
        ppo_epochs=2,
        learning_rate=3e-3,
        kl_coef=0.05,  # a reference model: the reference actor
        dtype="float64",
        progress=False,
        seed=5,
        save_every=1,
    )


def test_two_trainer_actors_run_the_data_parallel_update_as_two_launched_processes(
    local_ray, tiny_lm, tmp_path, caplog
):
    """GRPO with a reference: two trainer actors (in two processes other than the driver) give
    the torchrun run's metrics to round-off and its final weights; the reward, reference and
    engine actors exist once for the group, and the checkpoint holds both ranks' streams."""
    prompts = tmp_path / "prompts.jsonl"
    actors = tmp_path / "actors.json"
    rows = [{"prompt": f"say: {w} ->", "actors": str(actors)} for w in WORDS]
    prompts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    launched = tmp_path / "launched"
    config = tmp_path / "grpo.yaml"
    config.write_text(
        "".join(f"{k}: {json.dumps(v)}\n" for k, v in fields(tiny_lm, prompts).items())
    )
    path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    command = ["-m", "proxrl", "grpo", "--config", str(config), "--output-dir", str(launched)]
    check(torchrun(command, env={"PYTHONPATH": path}, timeout=240))
    assert not actors.exists()  # no Ray there

    out = tmp_path / "ray"
    cfg = grpo.Config(
        **fields(tiny_lm, prompts),
        output_dir=str(out),
        placement="ray",
        ray_trainer_processes=2,
        ray_trainer_cpus=0.5,  # 2 × 0.5 + engine, reward and reference 0.25 each: 1.75 of 2
    )
    with caplog.at_level(logging.INFO, logger="proxrl.algos.online.placement.ray_run"):
        grpo.train(cfg)
    pids = [r.args[2] for r in caplog.records if r.getMessage().startswith("placement: trainer")]
    assert len(set(pids)) == 2 and os.getpid() not in pids, pids
    seen = json.loads(actors.read_text())
    run = seen["names"][0].rsplit("-", 2)[0]
    assert [name.removeprefix(run) for name in seen["names"]] == [
        "-engine-0",
        "-reference",
        "-reward",
        "-trainer",
        "-trainer-1",
    ]
    assert seen["pid"] not in pids
    assert_same_run(out, launched)
    manager = CheckpointManager(out)
    _, state = manager.load(manager.latest())
    assert state["iteration"] == 3 and len(state["rng_ranks"]) == 2
    assert not state["rng_ranks"][0]["torch"].equal(state["rng_ranks"][1]["torch"])
