"""Reductions over the valid entries of a padded batch.

Every function takes a 0/1 ``mask`` of the same shape as ``x`` (or broadcastable to it).
Masked-out entries never influence a result: they are replaced by zeros before any arithmetic,
so a NaN or Inf sitting in padding cannot leak into a loss or a statistic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from proxrl.registry import Registry


def _zero_masked(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask.bool(), x, 0.0)  # a Python 0.0 takes x's dtype


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` over entries where ``mask`` is 1; over all entries when ``dim`` is None."""
    masked = _zero_masked(x, mask)
    return masked.sum() if dim is None else masked.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over entries where ``mask`` is 1.

    With ``dim`` set, a row with no valid entry has mean 0 (not NaN), so empty responses do not
    poison a batch statistic.
    """
    count = mask.to(x.dtype).expand_as(x)
    if dim is None:
        return masked_sum(x, mask) / count.sum().clamp_min(1)
    return masked_sum(x, mask, dim) / count.sum(dim).clamp_min(1)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the valid entries of ``x`` (a scalar), Bessel-corrected when ``unbiased``."""
    count = mask.to(x.dtype).expand_as(x).sum()
    if count < (2 if unbiased else 1):
        raise ValueError(
            f"masked_var needs at least {2 if unbiased else 1} valid entries, got {int(count)}"
        )
    centred = x - masked_mean(x, mask)
    variance = masked_sum(centred * centred, mask) / count
    return variance * count / (count - 1) if unbiased else variance


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` over the valid entries; masked entries come back 0.

    With ``shift_mean=False`` the mean is added back (only the scale changes), which keeps the
    sign of rewards when whitening them.
    """
    mean = masked_mean(x, mask)
    whitened = (x - mean) * torch.rsqrt(masked_var(x, mask) + eps)
    if not shift_mean:
        whitened = whitened + mean
    return _zero_masked(whitened, mask)


# Loss aggregations. Each reduces a per-token loss (B, T) to ``numerator / units``: the
# numerator is a sum over rows, so it splits over micro-batches; ``units`` (tokens, sequences,
# or sequences × a constant horizon) is counted on the whole mini-batch before its micro-batches
# run, so that 1, 2 or 4 micro-batches give the same gradient (the offline trainers'
# ``accumulate_gradients`` idea). Dividing by a micro-batch's own count, or by its trimmed width,
# is the bug of TRL #3021 / ms-swift #10117.


def valid_tokens(mask: Tensor, horizon: int | None = None) -> Tensor:
    """Units of ``token-mean``: the number of valid tokens. (B, T) → scalar."""
    return mask.sum().to(torch.float64)


def nonempty_sequences(mask: Tensor, horizon: int | None = None) -> Tensor:
    """Units of ``seq-mean-token-mean``: rows with at least one valid token. (B, T) → scalar."""
    return mask.bool().any(-1).sum().to(torch.float64)


def sequences(mask: Tensor, horizon: int | None = None) -> Tensor:
    """Units of ``seq-mean-token-sum``: every row, empty or not. (B, T) → scalar."""
    return torch.tensor(float(mask.shape[0]), dtype=torch.float64, device=mask.device)


def sequence_horizons(mask: Tensor, horizon: int | None = None) -> Tensor:
    """Units of ``seq-mean-token-sum-norm``: rows × the constant ``horizon`` (default T).
    (B, T) → scalar."""
    width = mask.shape[-1] if horizon is None else horizon
    return torch.tensor(float(mask.shape[0] * width), dtype=torch.float64, device=mask.device)


def token_sum(loss: Tensor, mask: Tensor) -> Tensor:
    """Σ over valid tokens: the numerator of ``token-mean`` and of the two token-sum modes."""
    return masked_sum(loss, mask)


def sequence_mean_sum(loss: Tensor, mask: Tensor) -> Tensor:
    """Σ over rows of each row's token mean (an empty row adds 0): ``seq-mean-token-mean``'s
    numerator."""
    return masked_mean(loss, mask, dim=-1).sum()


def _divide(numerator: Tensor, units: Tensor | float) -> Tensor:
    if not isinstance(units, Tensor):
        units = torch.tensor(float(units), dtype=torch.float64)
    return numerator / units.to(device=numerator.device, dtype=numerator.dtype).clamp_min(1)


def token_mean(
    loss: Tensor, mask: Tensor, units: Tensor | float | None = None, horizon: int | None = None
) -> Tensor:
    """``Σ_{i,t} m·ℓ / Σ_{i,t} m``: every valid token of the mini-batch weighs the same (DAPO,
    Yu et al. 2025; TRL's ``dapo``, and ``bnpo``, which TRL normalises per device micro-batch
    and proxrl over the whole mini-batch; those two spellings are aliases of the config's). Long
    responses weigh more than short ones.

    Args:
        loss: (B, T) per-token loss. mask: (B, T) 1 at valid tokens.
        units: the mini-batch's token count when this (B, T) is one micro-batch of it
            (default: this batch's own).
    """
    return _divide(token_sum(loss, mask), valid_tokens(mask) if units is None else units)


def seq_mean_token_mean(
    loss: Tensor, mask: Tensor, units: Tensor | float | None = None, horizon: int | None = None
) -> Tensor:
    """``(1/S)·Σ_i (1/|o_i|)·Σ_t ℓ_{i,t}``: each sequence's token mean, then the mean over the
    S sequences that have a token (GRPO as published, Shao et al. 2024; TRL's ``grpo``). A
    token of a short response weighs more than one of a long response. (B, T) → scalar;
    ``units``: S of the whole mini-batch."""
    return _divide(
        sequence_mean_sum(loss, mask), nonempty_sequences(mask) if units is None else units
    )


def seq_mean_token_sum(
    loss: Tensor, mask: Tensor, units: Tensor | float | None = None, horizon: int | None = None
) -> Tensor:
    """``(1/B)·Σ_i Σ_t ℓ_{i,t}``: each sequence's token sum, mean over the B sequences.
    (B, T) → scalar; ``units``: B of the whole mini-batch."""
    return _divide(token_sum(loss, mask), sequences(mask) if units is None else units)


def seq_mean_token_sum_norm(
    loss: Tensor, mask: Tensor, units: Tensor | float | None = None, horizon: int | None = None
) -> Tensor:
    """``(1/B)·Σ_i Σ_t ℓ_{i,t} / H``: token sums divided by a constant H, the generation budget
    (Dr. GRPO, Liu et al. 2025: no per-response length normaliser, so no length bias; TRL's
    ``dr_grpo``). ``horizon`` = H defaults to T, which changes with the batch's width: pass
    the budget (``max_new_tokens``), as the trainers do. (B, T) → scalar; ``units``: B·H of the
    whole mini-batch."""
    units = sequence_horizons(mask, horizon) if units is None else units
    return _divide(token_sum(loss, mask), units)


Reduce = Callable[..., Tensor]
Units = Callable[[Tensor, "int | None"], Tensor]


@dataclass(frozen=True)
class Aggregation:
    """A loss aggregation bound to its settings: ``agg(loss, mask)`` reduces a (B, T) per-token
    loss, ``agg.units(mask)`` counts the normaliser of a (whole) mini-batch. With ``units`` set
    (the mini-batch's count), ``agg(loss, mask)`` on a micro-batch is its share of the
    mini-batch's loss *in the micro-batch's own units*: weigh it by
    ``agg.units(micro mask) / units`` and the shares add up to the mini-batch's loss."""

    reduce: Reduce
    count: Units
    horizon: int | None = None

    def __call__(self, loss: Tensor, mask: Tensor) -> Tensor:
        return self.reduce(loss, mask, None, self.horizon)

    def units(self, mask: Tensor) -> Tensor:
        return self.count(mask, self.horizon)


AGGREGATIONS: Registry[tuple[Reduce, Units]] = Registry("aggregation mode")
"""``loss_aggregation`` → (reduce, units): the reduction and the count of its normaliser."""
AGGREGATIONS.add("token-mean", (token_mean, valid_tokens), "every valid token weighs the same")
AGGREGATIONS.add(
    "seq-mean-token-mean",
    (seq_mean_token_mean, nonempty_sequences),
    "each sequence's token mean, then the mean over sequences (GRPO)",
)
AGGREGATIONS.add(
    "seq-mean-token-sum",
    (seq_mean_token_sum, sequences),
    "each sequence's token sum, then the mean over sequences",
)
AGGREGATIONS.add(
    "seq-mean-token-sum-norm",
    (seq_mean_token_sum_norm, sequence_horizons),
    "token sums ÷ a constant horizon, the generation budget (Dr. GRPO)",
)


def aggregation(mode: str | Aggregation, horizon: int | None = None) -> Aggregation:
    """The aggregation named ``mode`` (a key of ``AGGREGATIONS``), with Dr. GRPO's horizon."""
    if isinstance(mode, Aggregation):
        return mode
    reduce, count = AGGREGATIONS[mode]
    return Aggregation(reduce, count, horizon)


def aggregate_loss(
    loss: Tensor, mask: Tensor, mode: str | Aggregation, horizon: int | None = None
) -> Tensor:
    """Reduce a per-token loss (B, T) to a scalar with the aggregation ``mode`` (a name of
    ``AGGREGATIONS`` or an ``Aggregation``): ``token-mean``, ``seq-mean-token-mean``,
    ``seq-mean-token-sum``, ``seq-mean-token-sum-norm`` (÷ ``horizon``, default T)."""
    return aggregation(mode, horizon)(loss, mask)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """``1 - Var[returns - values] / Var[returns]`` over valid entries: 1 is a perfect critic,
    0 predicts no better than a constant, negative is worse than a constant."""
    return 1 - masked_var(returns - values, mask) / masked_var(returns, mask)
