"""Reductions over the valid entries of a padded batch.

Every function takes a 0/1 ``mask`` of the same shape as ``x`` (or broadcastable to it).
Masked-out entries never influence a result: they are replaced by zeros before any arithmetic,
so a NaN or Inf sitting in padding cannot leak into a loss or a statistic.
"""

from __future__ import annotations

import torch
from torch import Tensor

AGGREGATION_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


def _zero_masked(x: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


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


def aggregate_loss(loss: Tensor, mask: Tensor, mode: str, horizon: int | None = None) -> Tensor:
    """Reduce a per-token loss (B, T) to a scalar.

    - ``token-mean``: every valid token weighs the same (DAPO; long answers weigh more).
    - ``seq-mean-token-mean``: mean over tokens of each sequence, then over sequences
      (original GRPO, PPO in most RLHF libraries). Sequences with no valid token are skipped.
    - ``seq-mean-token-sum``: token sum per sequence, then mean over sequences.
    - ``seq-mean-token-sum-norm``: token sum per sequence divided by a constant ``horizon``
      (default T), then mean over sequences (Dr. GRPO: no length bias from the normaliser).
    """
    if mode == "token-mean":
        return masked_mean(loss, mask)
    per_sequence_sum = masked_sum(loss, mask, dim=-1)
    if mode == "seq-mean-token-mean":
        tokens = mask.to(loss.dtype).expand_as(loss).sum(-1)
        has_tokens = tokens > 0
        per_sequence_mean = per_sequence_sum / tokens.clamp_min(1)
        return masked_mean(per_sequence_mean, has_tokens)
    if mode == "seq-mean-token-sum":
        return per_sequence_sum.mean()
    if mode == "seq-mean-token-sum-norm":
        return (per_sequence_sum / (horizon if horizon is not None else loss.shape[-1])).mean()
    raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGGREGATION_MODES}")


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """``1 - Var[returns - values] / Var[returns]`` over valid entries: 1 is a perfect critic,
    0 predicts no better than a constant, negative is worse than a constant."""
    return 1 - masked_var(returns - values, mask) / masked_var(returns, mask)
