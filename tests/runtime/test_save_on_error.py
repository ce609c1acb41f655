"""An exception mid-run saves the last finished step (``Run.running(save_on_error=...)`` and
``Run.finished``): the weights, optimizer, schedule, guard and the RNGs as they were when that
step finished, so the resumed run ends bit-identical to an uninterrupted one — here with a
loop whose every step draws from the global RNG and a failing step that drew from it before it
raised. A failure after the weights changed saves nothing (the state is not consistent)."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Annotated

import pytest
import torch

from proxrl.runtime.checkpoint import CheckpointManager
from proxrl.runtime.checkpointer import TrainableWeights
from proxrl.runtime.config import SESSION_OPTION
from proxrl.runtime.lr_schedule import warmup_then_decay
from proxrl.runtime.run import Run

TOTAL = 6


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


class Boom(RuntimeError):
    pass


def _train(out, resume=False, fail_at=None, fail_after_update=False):
    """A run of TOTAL steps: each draws noise from torch's and Python's global RNGs for its
    gradient and takes an SGD step with momentum; step ``fail_at`` draws, then raises (after
    its update with ``fail_after_update``)."""
    torch.manual_seed(0)
    random.seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    run = Run(Cfg(str(out), resume=resume))
    run.check(TOTAL)
    run.prepare()
    run.track(model=TrainableWeights(model), optimizer=opt)
    run.schedule(opt, warmup_then_decay(TOTAL))
    restored = run.start(TOTAL)
    start = restored.step if restored else 0
    with run.running(TOTAL, "toy", completed=start, save_on_error=run.save_finished):
        for step in range(start + 1, TOTAL + 1):
            run.learning_rate(step)
            for p in model.parameters():
                p.grad = torch.randn_like(p) * random.random()
            if step == fail_at and not fail_after_update:
                raise Boom(f"the loss raised at step {step}")
            opt.step()
            if step == fail_at:
                raise Boom(f"raised after the update of step {step}")
            run.log(step, {"loss": float(model.weight.detach().sum())})
            run.finished(step, step=step)
    run.save(TOTAL, step=TOTAL)
    run.close()
    run.release()
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.timeout(60)
def test_an_exception_saves_the_last_finished_step_and_resume_equals_uninterrupted(
    tmp_path, caplog
):
    straight = _train(tmp_path / "straight")
    out = tmp_path / "failed"
    with caplog.at_level(logging.WARNING, logger="proxrl.runtime.run"), pytest.raises(Boom):
        _train(out, fail_at=4)
    manager = CheckpointManager(out)
    assert [manager.step_of(p) for p in manager.checkpoints()] == [3]
    saved = out / "checkpoints" / "step_000000003"
    assert f"Boom in the run after step 3 finished; saved it in {saved}; continue" in caplog.text
    resumed = _train(out, resume=True)
    assert resumed.keys() == straight.keys()
    for name in straight:
        assert torch.equal(resumed[name], straight[name]), name


@pytest.mark.timeout(60)
def test_an_exception_after_the_update_began_saves_nothing(tmp_path, caplog):
    out = tmp_path / "failed"
    with caplog.at_level(logging.WARNING, logger="proxrl.runtime.run"), pytest.raises(Boom):
        _train(out, fail_at=4, fail_after_update=True)
    assert CheckpointManager(out).checkpoints() == []
    assert "not saving step 3: the weights changed after step 3 finished" in caplog.text


@pytest.mark.timeout(60)
def test_without_save_on_error_or_a_finished_step_nothing_is_saved(tmp_path, caplog):
    out = tmp_path / "failed"
    with caplog.at_level(logging.WARNING, logger="proxrl.runtime.run"), pytest.raises(Boom):
        _train(out, fail_at=1)
    assert CheckpointManager(out).checkpoints() == []
    assert "Boom in the run before a step finished since the last save" in caplog.text
