"""Gradient accumulation that does not depend on how a step's batch is split: every
micro-batch's loss is weighted by its share of the step's units (tokens, pairs, sequences),
counted on the whole step before its micro-batches run. The offline trainers and the online
update share it, so "1, 2 or 4 micro-batches give the same gradient" holds for both."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor, nn

# Stats that are counts: summed over micro-batches, not averaged.
COUNT_STATS = ("tokens", "pairs")

LossFn = Callable[[nn.Module, Any], tuple[Tensor, dict[str, Tensor]]]
UnitsFn = Callable[[Any], float]


def accumulate_gradients(
    model: nn.Module,
    micro_batches: Sequence[Any],
    loss_fn: LossFn,
    units_fn: UnitsFn,
    total_units: float | None = None,
) -> dict[str, float]:
    """Backward through every micro-batch, each loss weighted by its share of the step's units
    (``units_fn``: tokens, pairs or sequences), so the accumulated gradient is that of the mean
    loss over the whole step. Returns the step's stats (unit-weighted means; counts summed).

    ``total_units``: the step's units over every rank (default: this rank's), so that with
    data parallelism the gradients and stats summed over ranks are the global-batch ones."""
    units = [units_fn(batch) for batch in micro_batches]
    total = sum(units) if total_units is None else total_units
    if total == 0:
        raise ValueError("an optimizer step with no unit to learn from (empty loss masks)")
    sums: dict[str, float] = defaultdict(float)  # unit-weighted sums, divided once at the end
    for batch, n in zip(micro_batches, units, strict=True):
        if n == 0:
            continue
        loss, batch_stats = loss_fn(model, batch)
        # A loss without a graph trains nothing here (the policy during the warm-up of a critic
        # in another process): there is nothing to differentiate.
        if loss.requires_grad:
            (loss * (n / total)).backward()
        sums["loss"] += float(loss.detach()) * n
        for key, value in batch_stats.items():
            if key != "loss":  # taken from the loss itself above
                sums[key] += float(value) * (1.0 if key in COUNT_STATS else n)
    return {key: value if key in COUNT_STATS else value / total for key, value in sums.items()}
