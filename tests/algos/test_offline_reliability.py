"""Offline trainers under trouble, in-process: a NaN loss or gradient skips the step (counted
in guard/skipped_updates, weights and optimizer untouched), N skips in a row stop the run with
the last good checkpoint intact, SIGINT/SIGTERM save a checkpoint and exit 130/143 and the
resumed run equals the uninterrupted one, save_every/keep_checkpoints keep what they say."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from proxrl.algos.offline import loop as offline_loop
from proxrl.algos.offline import sft
from proxrl.cli import main
from proxrl.runtime.checkpoint import CheckpointManager
from proxrl.runtime.errors import Interrupted
from tests.algos.lm_tasks import sft_rows, write_jsonl

VOLATILE = ("time/", "perf/")  # wall-clock keys: differ between any two runs


def _config(tiny_lm: str, tmp_path: Path, name: str = "run", **overrides) -> sft.Config:
    data = tmp_path / "train.jsonl"
    if not data.exists():
        write_jsonl(data, sft_rows(64, seed=0))
    fields = dict(
        model=tiny_lm,
        data=str(data),
        output_dir=str(tmp_path / name),
        batch_size=8,
        learning_rate=3e-3,
        lr_schedule="constant",
        max_steps=8,
        progress=False,
    )
    return sft.Config(**(fields | overrides))


def _rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def _assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = load_file(str(a)), load_file(str(b))
    assert wa.keys() == wb.keys() and wa
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


def _inject(monkeypatch, bad: dict[int, str]) -> None:
    """Make optimizer step k (1-based call count) have a NaN loss or a NaN gradient."""
    original = offline_loop.accumulate_gradients
    calls = [0]

    def patched(model, micro_batches, loss_fn, units_fn):
        calls[0] += 1
        stats = original(model, micro_batches, loss_fn, units_fn)
        kind = bad.get(calls[0])
        if kind == "loss":
            stats["loss"] = math.nan
        elif kind == "grad":
            model.get_parameter("model.layers.1.mlp.up_proj.weight").grad[3, 5] = math.nan
        return stats

    monkeypatch.setattr(offline_loop, "accumulate_gradients", patched)


def test_nan_loss_and_nan_gradient_are_skipped_and_counted(tiny_lm, tmp_path, monkeypatch, caplog):
    _inject(monkeypatch, {3: "loss", 4: "grad"})
    cfg = _config(tiny_lm, tmp_path, save_every=2, max_steps=6)
    with caplog.at_level(logging.WARNING, logger="proxrl.runtime.guard"):
        sft.train(cfg)
    out = Path(cfg.output_dir)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["guard/skipped_updates"] for r in rows] == [0, 0, 1, 2, 2, 2]
    assert ["train/loss" in r for r in rows] == [True, True, False, True, True, True]
    assert ["train/grad_norm" in r for r in rows] == [True, True, False, False, True, True]
    guard = [r for r in caplog.records if r.name == "proxrl.runtime.guard"]
    assert [r.getMessage() for r in guard] == [
        "step 3: loss is NaN; update skipped (1 in a row, 1 in total)",
        (
            "step 4: grad of model.layers.1.mlp.up_proj.weight holds NaN; "
            "update skipped (2 in a row, 2 in total)"
        ),
    ]
    # Steps 3 and 4 changed nothing: checkpoint 4 holds exactly checkpoint 2's weights and
    # optimizer state; step 5 trained again.
    manager = CheckpointManager(out)
    (w2, s2), (w4, s4), (w6, _) = (manager.load(p) for p in manager.checkpoints())
    assert all(torch.equal(w2["model"][k], w4["model"][k]) for k in w2["model"])
    assert all(
        torch.equal(s2["optimizer"]["state"][i][key], s4["optimizer"]["state"][i][key])
        for i in s2["optimizer"]["state"]
        for key in ("exp_avg", "exp_avg_sq", "step")
    )
    assert not torch.equal(
        w4["model"]["model.embed_tokens.weight"], w6["model"]["model.embed_tokens.weight"]
    )
    assert s4["guard"] == {"consecutive": 2, "skipped": 2}
    final = load_file(str(out / "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in final.values())


def test_n_skips_in_a_row_stop_the_run_and_leave_the_last_good_checkpoint(
    tiny_lm, tmp_path, monkeypatch, capsys
):
    _inject(monkeypatch, {3: "loss", 4: "grad", 5: "loss"})
    cfg = _config(tiny_lm, tmp_path, save_every=2, max_steps=8)
    out = Path(cfg.output_dir)
    code = main(
        [
            "sft",
            "--model",
            tiny_lm,
            "--data",
            cfg.data,
            "--output-dir",
            str(out),
            "--batch-size",
            "8",
            "--max-steps",
            "8",
            "--save-every",
            "2",
            "--max-consecutive-skips",
            "3",
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.splitlines()[-1] == (
        "proxrl sft: error: stopped at step 5: 3 updates in a row were skipped "
        f"for non-finite values (last: loss is NaN); the last good checkpoint in "
        f"{out / 'checkpoints'} is intact"
    )
    assert "Traceback" not in err
    manager = CheckpointManager(out)
    # Step 4's checkpoint was saved (weights are step 2's: both skips changed nothing); no
    # final model was written; the newest checkpoint verifies.
    assert [p.name for p in manager.checkpoints()] == ["step_000000002", "step_000000004"]
    assert manager.latest() == manager.checkpoints()[-1]
    assert not (out / "model.safetensors").exists()
    # The stopping step is not logged: the run stops inside it.
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [
        1,
        2,
        3,
        4,
    ]


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_saves_a_checkpoint_and_the_resumed_run_equals_the_uninterrupted_one(
    tiny_lm, tmp_path, monkeypatch, signum, code
):
    straight = _config(tiny_lm, tmp_path, "straight", save_every=0)
    sft.train(straight)

    original = offline_loop.accumulate_gradients
    calls = [0]

    def signalled(*args):
        calls[0] += 1
        if calls[0] == 3:  # arrives mid-step; the step finishes, then the loop stops
            os.kill(os.getpid(), signum)
        return original(*args)

    monkeypatch.setattr(offline_loop, "accumulate_gradients", signalled)
    stopped = _config(tiny_lm, tmp_path, "stopped", save_every=0)
    with pytest.raises(Interrupted) as info:
        sft.train(stopped)
    out = Path(stopped.output_dir)
    assert info.value.exit_code == code
    assert str(info.value) == (
        f"received {signal.Signals(signum).name}; checkpoint saved in "
        f"{out / 'checkpoints' / 'step_000000003'}; continue with --resume"
    )
    assert [p.name for p in CheckpointManager(out).checkpoints()] == ["step_000000003"]
    assert not (out / "model.safetensors").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored

    monkeypatch.setattr(offline_loop, "accumulate_gradients", original)
    sft.train(_config(tiny_lm, tmp_path, "stopped", save_every=0, resume=True))
    _assert_same_weights(Path(straight.output_dir) / "model.safetensors", out / "model.safetensors")
    assert _rows(out) == _rows(Path(straight.output_dir))


@pytest.mark.parametrize(
    ("save_every", "keep", "expected"),
    [(0, 3, [7]), (2, 2, [6, 7]), (3, 3, [3, 6, 7]), (2, 5, [2, 4, 6, 7])],
)
def test_save_every_and_keep_checkpoints(tiny_lm, tmp_path, save_every, keep, expected):
    cfg = _config(tiny_lm, tmp_path, save_every=save_every, keep_checkpoints=keep, max_steps=7)
    sft.train(cfg)
    manager = CheckpointManager(cfg.output_dir)
    assert [manager.step_of(p) for p in manager.checkpoints()] == expected
    assert all(manager.verify(p) is None for p in manager.checkpoints())
