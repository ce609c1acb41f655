"""DAPO's dynamic sampling on 2 data-parallel CPU processes: each rank samples whole groups of
its own prompts; the rollout is gathered before the filter, so both ranks drop the same groups,
run the same number of rounds and stay in step (one row per iteration, from rank 0)."""

from __future__ import annotations

import json

from proxrl.runtime.metrics import read_metrics
from tests.algos.dapo_rewards import WORDS, replay_dynamic_sampling
from tests.distributed.launch import accelerate_launch, check


def test_dynamic_sampling_on_two_processes_matches_the_hand_replay(tiny_lm, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"say: {w} ->", "word": w}) + "\n" for w in WORDS)
    )
    fields = {
        "model": tiny_lm,
        "prompts": str(prompts),
        "reward_fn": ["tests.algos.dapo_rewards:constant_for_early_words"],
        "iterations": 5,
        "rollout_batch_size": 2,
        "group_size": 4,
        "max_new_tokens": 6,
        "temperature": 1.0,
        "mini_batch_size": 4,
        "learning_rate": 3e-3,
        "progress": False,
        "seed": 1,
        "sample_every": 1,
        "dynamic_sampling": True,
        "max_sampling_rounds": 2,
    }
    cfg = tmp_path / "grpo.yaml"
    cfg.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in fields.items()))
    out = tmp_path / "run"
    check(
        accelerate_launch(
            ["-m", "proxrl", "grpo", "--config", str(cfg), "--output-dir", str(out)], timeout=300
        )
    )
    expected = replay_dynamic_sampling(5, 2, 2, 1, world=2)
    assert {rounds for rounds, *_ in expected} == {1, 2} and any(f for *_, f, _ in expected)
    rows = read_metrics(out)
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    for iteration, (row, (rounds, dropped, filled, words)) in enumerate(
        zip(rows, expected, strict=True), start=1
    ):
        assert (row["sampling/rounds"], row["sampling/dropped_groups"]) == (rounds, dropped)
        assert row["sampling/filled_groups"] == row["sampling/constant_groups"] == filled
        trained = [s["prompt"] for s in samples if s["iteration"] == iteration]
        assert trained == [f"say: {w} ->" for w in words for _ in range(4)]
