"""A loss that raises mid-run (issue 40: "a crash loses every iteration"): sft saves the last
finished step before the exception propagates, and ``--resume`` from it ends with weights and
metrics rows identical to an uninterrupted run's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from proxrl.algos.offline import loop as offline_loop
from proxrl.algos.offline import sft
from proxrl.runtime.checkpoint import CheckpointManager
from tests.algos.lm_tasks import sft_rows, write_jsonl


def _config(tiny_lm: str, tmp_path: Path, name: str, **overrides) -> sft.Config:
    data = tmp_path / "train.jsonl"
    if not data.exists():
        write_jsonl(data, sft_rows(64, seed=0))
    fields = dict(
        model=tiny_lm,
        data=str(data),
        output_dir=str(tmp_path / name),
        batch_size=8,
        learning_rate=3e-3,
        max_steps=8,
        save_every=0,
        progress=False,
    )
    return sft.Config(**(fields | overrides))


def _rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows]


@pytest.mark.timeout(120)
def test_a_loss_that_raises_at_step_k_leaves_step_k_minus_1_and_resume_finishes_it(
    tiny_lm, tmp_path, monkeypatch
):
    straight = _config(tiny_lm, tmp_path, "straight")
    sft.train(straight)

    original = offline_loop.accumulate_gradients
    calls = [0]

    def raising(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 5:
            torch.rand(7)  # a partial step advances the RNG before it fails
            raise ValueError("the loss function raised")
        return original(*args, **kwargs)

    monkeypatch.setattr(offline_loop, "accumulate_gradients", raising)
    failed = _config(tiny_lm, tmp_path, "failed")
    out = Path(failed.output_dir)
    with pytest.raises(ValueError, match="the loss function raised"):
        sft.train(failed)
    assert [p.name for p in CheckpointManager(out).checkpoints()] == ["step_000000004"]
    assert not (out / "model.safetensors").exists()

    monkeypatch.setattr(offline_loop, "accumulate_gradients", original)
    sft.train(_config(tiny_lm, tmp_path, "failed", resume=True))
    a = load_file(str(Path(straight.output_dir) / "model.safetensors"))
    b = load_file(str(out / "model.safetensors"))
    assert a.keys() == b.keys() and a
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert _rows(out) == _rows(Path(straight.output_dir))
