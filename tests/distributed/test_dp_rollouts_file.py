"""A rollouts file on 2 data-parallel CPU processes (gloo): each rank evaluates its share of the
file's groups (rank 0 the first half), and the gathered rollout is the file's, so a 2-process
``ppo`` run on it ends at the 1-process run's weights and metrics (float64)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from proxrl import cli
from proxrl.runtime.metrics import read_metrics
from tests.distributed.launch import check, torchrun

WEIGHT_TOL = 1e-9  # summed gradients in another order (~1e-16); a duplicated or lost row: ~1e-3


def _rows() -> list[dict]:
    """4 groups of 2: distinct prompts, responses of 2–5 tokens, a multi-turn row with
    per-token rewards in each group, the other with one reward."""
    rows = []
    for group in range(4):
        prompt = [20 + group, 30, 40 + group]
        length = 2 + group
        response = [50 + group + t for t in range(length)]
        rewards = [0.0] * length
        rewards[0], rewards[-1] = 0.25 * group, 0.5
        mask = [1] * length
        if length > 2:
            mask[1] = 0  # an observation between two model turns
        rows.append(
            {
                "prompt_ids": prompt,
                "response_ids": response,
                "logprobs": [-1.0 - 0.1 * t for t in range(length)],
                "loss_mask": mask,
                "rewards": rewards,
                "group": group,
            }
        )
        rows.append(
            {
                "prompt_ids": prompt,
                "response_ids": response[:2],
                "logprobs": [-0.5, -0.7],
                "reward": 1.0 - 0.2 * group,
                "group": group,
            }
        )
    return rows


@pytest.mark.parametrize("command", ["ppo", "grpo"])
def test_a_rollouts_file_on_two_processes_trains_as_on_one(command, tiny_lm, tmp_path):
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text("".join(json.dumps(row) + "\n" for row in _rows()))
    fields = {
        "model": tiny_lm,
        "rollouts_file": str(rollouts),
        "iterations": 2,
        "rollout_batch_size": 4,
        "group_size": 2,
        "mini_batch_size": 4,
        "max_new_tokens": 8,
        "learning_rate": 3e-3,
        "lr_schedule": "constant",
        "dtype": "float64",
        "progress": False,
        "report_to": "none",
        "save_every": 0,
        "seed": 3,
        "shared_prefix": False,  # two processes repeat prompts: one must too, to the bit
    }
    if command == "ppo":
        fields |= {"critic": "head"}
    config = tmp_path / "run.yaml"
    config.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in fields.items()))
    one, two = tmp_path / "one", tmp_path / "two"
    assert cli.main([command, "--config", str(config), "--output-dir", str(one)]) == 0
    run = ["-m", "proxrl", command, "--config", str(config), "--output-dir", str(two)]
    check(torchrun(run, timeout=300))
    weights = [load_file(str(out / "model.safetensors")) for out in (one, two)]
    assert weights[0].keys() == weights[1].keys()
    diff = max(float((weights[0][k] - weights[1][k]).abs().max()) for k in weights[0])
    print(f"{command} on a rollouts file, 1 vs 2 processes: max |Δw| {diff:.2e}")
    assert diff <= WEIGHT_TOL
    rows = [read_metrics(out) for out in (one, two)]
    assert len(rows[0]) == len(rows[1]) == 2
    for a, b in zip(*rows, strict=True):
        for key in ("objective/scores", "policy/total_loss", "response/length_mean"):
            assert abs(a[key] - b[key]) <= WEIGHT_TOL, key
    start = load_file(str(Path(tiny_lm) / "model.safetensors"))
    assert not all(bool((start[k].double() == weights[0][k].double()).all()) for k in start)
