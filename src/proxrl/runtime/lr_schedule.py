"""The learning-rate schedule, written once: a torch ``LRScheduler`` whose position is the step
about to be taken, and the one rate every trainer uses (linear warm-up, then constant or linear
decay to 0).

``StepSchedule(optimizer, rate)`` sets each param group's ``lr`` to ``rate(base_lr, step)``,
``base_lr`` being the group's learning rate when the schedule was made. The trainer moves it
with ``at(step)`` before the step is taken (1-based: step 1 is the first), so a skipped step,
a resumed run and an extended run (``--resume-with-changes --epochs N``) all get the rate their
step number says. The rate is written as ``base * step / warmup`` and ``base * fraction``, not as
``base * factor(step)`` (``LambdaLR``): the floats are the ones proxrl always logged
(``base * step / warmup`` and ``base * (step / warmup)`` differ in the last bit).

Its state (the position) is checkpointed with the run (``runtime.run``); the rates come from the
config, so a resumed run whose learning rate or length changed uses the new ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from proxrl.registry import Registry

Rate = Callable[[float, int], float]
"""``(base learning rate, 1-based step) → learning rate`` of that step."""


LR_SCHEDULES: Registry[None] = Registry("learning-rate schedule")
"""``lr_schedule`` → what follows the warm-up (``warmup_then_decay`` reads the name)."""
LR_SCHEDULES.add("constant", None, "keep the rate")
LR_SCHEDULES.add("linear", None, "decay it linearly to 0 at the last step")
LRScheduleChoice = LR_SCHEDULES.choice()


def warmup_then_decay(total: int, warmup: int = 0, decay: str = "linear") -> Rate:
    """Linear warm-up to the base rate over ``warmup`` steps, then ``constant`` or ``linear``
    decay to 0 at step ``total + 1``. Step ``k`` (1-based) of ``total``:

    - ``k <= warmup``: ``base * k / warmup``;
    - constant: ``base``;
    - linear: ``base * max(0, 1 - (k - 1 - warmup) / max(total - warmup, 1))``.

    Without warm-up the linear rate is ``base * (1 - (k - 1) / total)``: 1 at the first step,
    ``1/total`` at the last (CleanRL's annealing, and the online loop's ``1 - iteration/total``
    with a 0-based iteration)."""

    def rate(base: float, step: int) -> float:
        if warmup and step <= warmup:
            return base * step / warmup
        if decay == "constant":
            return base
        remaining = max(total - warmup, 1)
        return base * max(0.0, 1 - (step - 1 - warmup) / remaining)

    return rate


class StepSchedule(LRScheduler):
    """A torch ``LRScheduler`` over ``optimizer`` at ``rate`` (see the module docstring).

    ``at(step)`` sets every group's ``lr`` for ``step`` and returns the first group's; ``step()``
    moves to the next step (``at(last_epoch + 1)``). ``last_epoch`` is the step whose rate the
    groups hold (0 when made: nothing taken yet). ``state_dict`` holds the position only."""

    def __init__(self, optimizer: Optimizer, rate: Rate) -> None:
        self.rate = rate
        super().__init__(optimizer)  # sets base_lrs and calls step() once: position 0

    def get_lr(self) -> list[float]:  # type: ignore[override]
        return [self.rate(base, self.last_epoch) for base in self.base_lrs]

    def at(self, step: int) -> float:
        """Set every param group's ``lr`` to the rate of ``step``; return the first one."""
        self.last_epoch = step
        rates = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, rates, strict=True):
            group["lr"] = lr
        self._last_lr = rates
        return rates[0]

    def step(self, epoch: int | None = None) -> None:  # type: ignore[override]
        """Move to the next step. The rate is set *before* the optimizer step it is for, so
        there is no call-order check (torch's warns when ``step()`` precedes ``optimizer.step``)."""
        if epoch is not None:
            raise TypeError("StepSchedule.step() takes no epoch; use at(step)")
        self._step_count = getattr(self, "_step_count", 0) + 1
        self.at(self.last_epoch + 1)

    def state_dict(self) -> dict[str, Any]:
        return {"last_epoch": int(self.last_epoch)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the position; the base rates stay this run's (a changed learning rate under
        ``--resume-with-changes`` applies from the next step, as before)."""
        self.last_epoch = int(state_dict["last_epoch"])
