"""FSDP2 (``fully_shard``) over 2 CPU processes (gloo), launched as a user would with
``accelerate launch --config_file configs/accelerate/cpu_fsdp_2proc.yaml``: accelerate itself
turns FSDP off without a GPU, proxrl shards the model itself (``runtime.fsdp``).

The sharded run equals the 1-process run with the same global config (float64 weights, so the
only differences are summation order): per-step losses within 1e-10 and final weights within
1e-9 while each weight moved ~1e-2 (FSDP averages gradients over ranks: a loss not weighed by
world / global units halves every step's gradient and logged loss, |Δloss| 0.35 for dpo). A
checkpoint written by the sharded run holds the full tensors (weights and Adam moments, gathered
from the shards), equal to the 1-process run's checkpoint: it loads in one process."""

from __future__ import annotations

from pathlib import Path

import torch

from proxrl.runtime.checkpoint import CheckpointManager
from tests.algos.lm_tasks import preference_rows, sft_rows, write_jsonl
from tests.distributed.launch import FSDP_CONFIG, accelerate_launch, check
from tests.distributed.test_dp_offline import (
    LOSS_TOL,
    WEIGHT_TOL,
    _compare,
    _run_one_process,
    _write_config,
)


def _sharded(command: str, cfg: str, output_dir: Path, *extra: str) -> None:
    args = ["-m", "proxrl", command, "--config", cfg, "--output-dir", str(output_dir), *extra]
    result = accelerate_launch(args, config=FSDP_CONFIG)
    check(result)
    assert "FSDP2: 2 LlamaDecoderLayer blocks and 1 entry modules sharded over 2 ranks" in (
        result.stderr
    )


def _max_diff(a: object, b: object) -> float:
    """Max |a − b| over every tensor of two nested checkpoints (same structure asserted)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape
        return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        return max((_max_diff(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b)
        return max((_max_diff(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    return 0.0


def test_sft_sharded_matches_one_process_and_its_checkpoint_is_whole(tiny_lm, tmp_path):
    """The sharded run stops after step 2 and is resumed sharded to step 4 (the full
    checkpoint cut back into shards, Adam's moments too): it still equals 4 steps on 1
    process (constant learning rate, so max_steps does not change the schedule)."""
    from proxrl.algos.offline import sft

    fields = {
        "model": tiny_lm,
        "data": write_jsonl(tmp_path / "train.jsonl", sft_rows(32, seed=0)),
        "batch_size": 8,
        "grad_accum": 1,
        "epochs": 1,
        "learning_rate": 3e-3,
        "lr_schedule": "constant",
        "dtype": "float64",
        "progress": False,
        "save_every": 2,
    }
    cfg = _write_config(tmp_path / "sft.yaml", fields | {"max_steps": 4})  # = 1 epoch
    _run_one_process(sft, cfg, tmp_path / "one")
    first_half = _write_config(tmp_path / "two_steps.yaml", fields | {"max_steps": 2})
    _sharded("sft", first_half, tmp_path / "two")
    _sharded("sft", cfg, tmp_path / "two", "--resume", "--resume-with-changes")
    loss_diff, weight_diff, moved = _compare(tmp_path / "one", tmp_path / "two", tiny_lm)
    managers = [CheckpointManager(tmp_path / run) for run in ("one", "two")]
    assert [CheckpointManager.step_of(m.latest()) for m in managers] == [4, 4]
    one, two = (m.load(m.root / "step_000000002") for m in managers)
    checkpoint_diff = _max_diff(one, two)
    print(
        f"sft FSDP 2 procs vs 1: max |Δloss| {loss_diff:.2e}, max |Δw| {weight_diff:.2e}, "
        f"moved {moved:.2e}, checkpoint max |Δ| {checkpoint_diff:.2e}"
    )
    assert moved > 1e-3
    assert loss_diff <= LOSS_TOL
    assert weight_diff <= WEIGHT_TOL
    assert checkpoint_diff <= WEIGHT_TOL
    assert two[1]["optimizer"]["state"], "the checkpoint holds Adam's moments"


def test_dpo_sharded_matches_one_process(tiny_lm, tmp_path):
    from proxrl.algos.offline import dpo

    cfg = _write_config(
        tmp_path / "dpo.yaml",
        {
            "model": tiny_lm,
            "data": write_jsonl(tmp_path / "pairs.jsonl", preference_rows(16, seed=0)),
            "batch_size": 4,
            "grad_accum": 1,
            "epochs": 1,
            "learning_rate": 3e-3,
            "beta": 0.5,
            "dtype": "float64",
            "progress": False,
        },
    )
    _run_one_process(dpo, cfg, tmp_path / "one")
    _sharded("dpo", cfg, tmp_path / "two")
    loss_diff, weight_diff, moved = _compare(tmp_path / "one", tmp_path / "two", tiny_lm)
    print(
        f"dpo FSDP 2 procs vs 1: max |Δloss| {loss_diff:.2e}, max |Δw| {weight_diff:.2e}, "
        f"moved {moved:.2e}"
    )
    assert moved > 1e-3
    assert loss_diff <= LOSS_TOL
    assert weight_diff <= WEIGHT_TOL
