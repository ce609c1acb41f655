"""The run context (``runtime.run.Run``) and the one learning-rate schedule
(``runtime.lr_schedule``): hand-computed rates, bit-equality with the formulas the trainers
used before, and a resume that restores the schedule's position."""

from __future__ import annotations

import json
import logging
import signal
from dataclasses import dataclass
from typing import Annotated

import pytest
import torch

from proxrl.runtime.config import SESSION_OPTION
from proxrl.runtime.errors import Interrupted, ProxrlError
from proxrl.runtime.lr_schedule import StepSchedule, warmup_then_decay
from proxrl.runtime.run import LR_SCHEDULER, Run


@dataclass
class Cfg:
    output_dir: Annotated[str, SESSION_OPTION]  # marked as RunConfig marks them
    resume: Annotated[bool, SESSION_OPTION] = False
    overwrite: Annotated[bool, SESSION_OPTION] = False
    resume_with_changes: Annotated[bool, SESSION_OPTION] = False
    keep_checkpoints: int = 3
    max_consecutive_skips: int = 5
    report_to: tuple[str, ...] = ("none",)
    progress: Annotated[bool, SESSION_OPTION] = False
    learning_rate: float = 0.5


def _optimizer(lr: float = 0.5) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)


# -- the rate, by hand -------------------------------------------------------------------------


def test_linear_decay_by_hand():
    """total 4, no warm-up: 1 - (k-1)/4 → 1, 0.75, 0.5, 0.25 (base 2 → 2, 1.5, 1, 0.5)."""
    rate = warmup_then_decay(4)
    assert [rate(2.0, k) for k in (1, 2, 3, 4)] == [2.0, 1.5, 1.0, 0.5]


def test_warmup_then_linear_by_hand():
    """total 6, warm-up 2: k/2 for k ≤ 2 → 0.5, 1; then 1 - (k-3)/4 → 1, 0.75, 0.5, 0.25."""
    rate = warmup_then_decay(6, warmup=2)
    assert [rate(1.0, k) for k in range(1, 7)] == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]
    assert rate(1.0, 11) == 0.0  # past the end: clamped at 0, never negative


def test_warmup_then_constant_by_hand():
    """warm-up 4 then constant: 0.25, 0.5, 0.75, 1, 1, 1."""
    rate = warmup_then_decay(100, warmup=4, decay="constant")
    assert [rate(1.0, k) for k in range(1, 7)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


# -- bit-equality with the formulas the trainers used ------------------------------------------


def _offline_before(step: int, total: int, lr: float, warmup: int, schedule: str) -> float:
    """algos/offline/loop.py ``learning_rate_at`` as it was (step: 1-based)."""
    if warmup and step <= warmup:
        return lr * step / warmup
    if schedule == "constant":
        return lr
    remaining = max(total - warmup, 1)
    return lr * max(0.0, 1 - (step - 1 - warmup) / remaining)


def _classic_before(iteration: int, n: int, lr: float, anneal: bool) -> float:
    """classic/train.py (iteration: 1-based)."""
    return lr * (1.0 - (iteration - 1) / n) if anneal else lr


def _online_before(iteration: int, n: int, rate: float, linear: bool) -> float:
    """algos/online/loop.py (iteration: 0-based)."""
    fraction_left = 1 - iteration / n if linear else 1.0
    return rate * fraction_left


RATES = (3e-3, 2e-3, 1e-5, 2e-5, 5e-4, 1e-3, 2.5e-4, 3e-4, 0.1)


@pytest.mark.parametrize("lr", RATES)
def test_offline_rates_are_bit_identical(lr):
    for total in (1, 7, 50, 313):
        for warmup in (0, 3, 10):
            for schedule in ("linear", "constant"):
                rate = warmup_then_decay(total, warmup, schedule)  # type: ignore[arg-type]
                for step in range(1, total + 1):
                    assert rate(lr, step) == _offline_before(step, total, lr, warmup, schedule)


@pytest.mark.parametrize("lr", RATES)
def test_classic_and_online_rates_are_bit_identical(lr):
    for n in (1, 3, 97, 488):
        for anneal in (True, False):
            rate = warmup_then_decay(n, 0, "linear" if anneal else "constant")
            for k in range(1, n + 1):
                assert rate(lr, k) == _classic_before(k, n, lr, anneal)
                assert rate(lr, k) == _online_before(k - 1, n, lr, anneal)


def test_step_schedule_sets_every_group_and_warns_nothing(recwarn):
    """Two param groups with their own base rates; at(k) sets each to rate(base, k), the
    scheduler is moved before the optimizer steps and torch's call-order warning stays quiet."""
    params = [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))]
    opt = torch.optim.SGD([{"params": params[:1], "lr": 1.0}, {"params": params[1:], "lr": 4.0}])
    schedule = StepSchedule(opt, warmup_then_decay(4))
    assert schedule.at(2) == 0.75
    assert [g["lr"] for g in opt.param_groups] == [0.75, 3.0]
    schedule.step()
    assert schedule.last_epoch == 3 and schedule.get_last_lr() == [0.5, 2.0]
    opt.step()
    assert not [w for w in recwarn if "lr_scheduler" in str(w.message)]


# -- the run context ---------------------------------------------------------------------------


def _run(tmp_path, **changes) -> tuple[Run, torch.optim.Optimizer]:
    cfg = Cfg(output_dir=str(tmp_path / "run"), **changes)
    run = Run(cfg)
    run.check(total=10)
    run.prepare()
    opt = _optimizer(cfg.learning_rate)
    run.track(optimizer=opt)
    run.schedule(opt, warmup_then_decay(10, warmup=2))
    return run, opt


def test_a_fresh_run_writes_config_marker_and_metrics(tmp_path):
    run, opt = _run(tmp_path)
    assert run.start(10) is None
    with run.running(10, "test"):
        assert run.learning_rate(1) == 0.5 * 1 / 2 == opt.param_groups[0]["lr"]
        run.log(1, {"train/loss": 1.0})
    run.save(1, step=1)
    run.close()
    out = tmp_path / "run"
    assert (out / "config.yaml").is_file()
    assert json.loads((out / ".proxrl-run").read_text()) == {
        "planned_steps": 10,
        "command": "test_run",  # named from the config class's module
    }
    assert (out / "metrics.jsonl").read_text() == '{"step": 1, "train/loss": 1.0}\n'


def test_resume_restores_the_schedule_guard_and_drops_later_rows(tmp_path):
    """Checkpoint at step 3 (rows 1..4 logged); the resumed run's schedule is at 3, its guard
    counts as before, metrics.jsonl keeps rows 1..3, and step 4's rate is the formula's."""
    run, _ = _run(tmp_path)
    run.start(10)
    for step in range(1, 5):
        run.learning_rate(step)
        run.log(step, {"x": float(step)})
        if step == 3:
            run.guard.skipped = 2
            run.save(3, step=3)
    run.close()

    again, opt = _run(tmp_path, resume=True)
    assert again.schedules[0].last_epoch == 0  # fresh, before the restore
    restored = again.start(10)
    assert restored is not None and restored.step == 3 and restored.counters["step"] == 3
    assert again.schedules[0].last_epoch == 3
    assert again.guard.skipped == 2
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]
    # step 4 of 10 after 2 warm-up steps: 0.5 · (1 - (4-1-2)/8) = 0.5 · 0.875
    assert again.learning_rate(4) == 0.4375 == opt.param_groups[0]["lr"]
    again.close()


def test_a_checkpoint_without_a_schedule_resumes_quietly(tmp_path, caplog):
    """A checkpoint written before the schedule was state (no lr_scheduler entry) resumes with
    no warning; the rate comes from the step number."""
    cfg = Cfg(output_dir=str(tmp_path / "run"))
    old = Run(cfg)
    old.prepare()
    old.track(optimizer=_optimizer())
    old.start(10)
    old.save(3, step=3)
    old.close()
    run, _ = _run(tmp_path, resume=True)
    with caplog.at_level(logging.WARNING):
        run.start(10)
    assert LR_SCHEDULER not in caplog.text and "holds no" not in caplog.text
    assert run.learning_rate(4) == 0.4375
    run.close()


def test_check_refuses_before_touching_anything(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ProxrlError, match="not empty and holds no proxrl run"):
        Run(Cfg(output_dir=str(out))).check()
    with pytest.raises(ProxrlError, match="holds no run to resume"):
        Run(Cfg(output_dir=str(tmp_path / "none"), resume=True)).check()
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_failed_resume_leaves_the_run_as_it_was(tmp_path):
    """--resume of a run that stopped before its first checkpoint: refused by start() before
    config.yaml or metrics.jsonl are written."""
    run, _ = _run(tmp_path)
    run.start(10)
    run.close()
    out = tmp_path / "run"
    (out / "config.yaml").write_text("old: 1\n")
    (out / "metrics.jsonl").unlink()
    again, _ = _run(tmp_path, resume=True)
    with pytest.raises(ProxrlError, match="no complete checkpoint"):
        again.start(10)
    assert (out / "config.yaml").read_text() == "old: 1\n"
    assert not (out / "metrics.jsonl").exists()


def test_a_stop_signal_saves_and_raises_interrupted(tmp_path):
    run, _ = _run(tmp_path)
    run.start(10)
    with pytest.raises(Interrupted) as caught, run.running(10, "test"):
        assert not run.stop_requested
        run.stop.request(signal.SIGTERM)  # as the handler records it
        assert run.stop_requested
        raise run.interrupted(run.save(1, step=1))
    assert caught.value.exit_code == 143 and "step_000000001" in str(caught.value)
    assert run.metrics is not None and run.metrics._file is None  # closed
