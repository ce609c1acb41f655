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
import signal
from dataclasses import replace
from pathlib import Path

import pytest

from proxrl.algos.online import grpo
from proxrl.runtime.checkpoint import CheckpointManager
from proxrl.runtime.errors import Interrupted
from proxrl.runtime.metrics import read_metrics
from tests.distributed.launch import check, torchrun
from tests.ray.test_placement import WORDS, assert_same_run

HERE = Path(__file__).resolve().parent


def fields(tiny_lm: str, prompts: Path) -> dict[str, object]:
    return dict(
        model=tiny_lm,
        prompts=str(prompts),
        reward_fn=["tests.ray.ray_rewards:list_actors"],
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
    )


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The prompts, with the columns the tests' reward functions read (the score ignores them):
    where list_actors writes, and whom signal_driver_at_call signals, with what, when."""
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    columns = {
        "actors": str(path.with_name("actors.json")),
        "driver": os.getpid(),
        "signum": int(signal.SIGTERM),
        "signal_at": 3,  # iteration 2's batch of either rank: the stop comes after iteration 2
    }
    path.write_text("".join(json.dumps({"prompt": f"say: {w} ->"} | columns) + "\n" for w in WORDS))
    return path


@pytest.fixture(scope="module")
def launched(tiny_lm, prompts, tmp_path_factory) -> Path:
    """The reference run: the loop on 2 processes started by torchrun (placement local)."""
    root = tmp_path_factory.mktemp("launched")
    config = root / "grpo.yaml"
    config.write_text(
        "".join(f"{k}: {json.dumps(v)}\n" for k, v in fields(tiny_lm, prompts).items())
    )
    path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    out = root / "run"
    command = ["-m", "proxrl", "grpo", "--config", str(config), "--output-dir", str(out)]
    check(torchrun(command, env={"PYTHONPATH": path}, timeout=240))
    assert not prompts.with_name("actors.json").exists()  # no Ray there
    return out


def on_ray(tiny_lm: str, prompts: Path, out: Path, **overrides: object) -> grpo.Config:
    return grpo.Config(
        **(fields(tiny_lm, prompts) | overrides),
        output_dir=str(out),
        placement="ray",
        ray_trainer_processes=2,
        ray_trainer_cpus=0.5,  # 2 × 0.5 + engine, reward and reference 0.25 each: 1.75 of 2
    )


def trainer_pids(caplog: pytest.LogCaptureFixture) -> list[int]:
    """The trainer actors' processes the driver has logged so far, in order."""
    return [r.args[2] for r in caplog.records if r.getMessage().startswith("placement: trainer")]


def test_two_trainer_actors_stopped_by_a_signal_and_resumed_give_the_two_launched_processes_run(
    local_ray, tiny_lm, prompts, launched, tmp_path, caplog
):
    """GRPO with a reference on two trainer actors (in two processes other than the driver);
    SIGTERM reaches the driver in the second iteration: forwarded to both trainers, they stop
    after the same iteration with one checkpoint (rank 0's, both ranks' streams in it), exit
    code 143, and --resume on two trainers again continues to the torchrun run's metrics to
    round-off and its final weights. The reward, reference and engine actors exist once for
    the group, the last checkpoint holds both ranks' streams, and each run's placement group
    for the trainers is gone at its end. (One interrupted run and its resume: each Ray run
    starts five actors.)
    (Without the gradient sum the ranks' policies part, and rank 1's next batch, sampled by
    the engines from rank 0's weights, differs from the one launched rank 1 samples itself.)"""
    out = tmp_path / "ray"
    groups_before = set(local_ray.util.placement_group_table())
    reward = ["tests.ray.ray_rewards:list_actors_and_signal_driver_at_call"]
    cfg = on_ray(tiny_lm, prompts, out, reward_fn=reward)
    with caplog.at_level(logging.INFO, logger="proxrl.algos.online.placement.ray_run"):
        with pytest.raises(Interrupted) as info:
            grpo.train(cfg)
        first = trainer_pids(caplog)
        assert info.value.exit_code == 143
        checkpoints = CheckpointManager(out).checkpoints()
        assert [p.name for p in checkpoints] == ["step_000000002"]
        _, state = CheckpointManager(out).load(checkpoints[-1])
        assert len(state["rng_ranks"]) == 2
        assert [r["step"] for r in read_metrics(out)] == [1, 2]
        assert not (out / "model.safetensors").exists()
        grpo.train(replace(cfg, resume=True))
        resumed = trainer_pids(caplog)[len(first) :]
    for pids in (first, resumed):
        assert len(set(pids)) == 2 and os.getpid() not in pids, pids
    seen = json.loads(prompts.with_name("actors.json").read_text())  # the resumed run's
    run = seen["names"][0].rsplit("-", 2)[0]
    assert [name.removeprefix(run) for name in seen["names"]] == [
        "-engine-0",
        "-reference",
        "-reward",
        "-trainer",
        "-trainer-1",
    ]
    assert seen["pid"] not in resumed
    assert_same_run(out, launched)
    manager = CheckpointManager(out)
    _, state = manager.load(manager.latest())
    assert state["iteration"] == 3 and len(state["rng_ranks"]) == 2
    assert not state["rng_ranks"][0]["torch"].equal(state["rng_ranks"][1]["torch"])
    groups = local_ray.util.placement_group_table()
    new = [g["state"] for key, g in groups.items() if key not in groups_before]
    assert new == ["REMOVED", "REMOVED"]  # the trainers' CPUs free for a next run
