"""VAPO's positive-example NLL (Yue et al. 2025, §4.3): an imitation term on the rollout's best
responses, added to the policy loss so that what the policy already gets right is not unlearned.

``L_NLL = −(1 / Σ_{o∈T} |o|) · Σ_{o∈T} Σ_t log π(o_t | ·)``, T the positive responses: for a
verifiable reward the correct ones (``positive_responses`` with no threshold: the rollout's
best score, when not every score is equal), for a reward model those scoring at least a
threshold.

The term is paid in the update's own aggregation so that micro-batching leaves the gradient
unchanged: on any rows it is ``scale · agg(−log π · positive, mask)``, the tokens of the other
responses counting in the normaliser, and ``scale = units(all rows) / units(positive rows)``
counted once over the rollout (``positive_scale``). Over the whole rollout with ``token-mean``
this is exactly the token mean of the positive responses' NLL; over a minibatch it is that
mean's estimate.
"""

from __future__ import annotations

import torch
from torch import Tensor

from proxrl.core.masked import Aggregation


def positive_responses(scores: Tensor, threshold: float | None = None) -> Tensor:
    """Which responses are positive examples.

    Args:
        scores: (B,) each response's score.
        threshold: None: the responses whose score equals the batch's maximum, none when every
            score is equal (a verifiable reward: the correct ones, unless none or all are);
            else the responses scoring at least ``threshold`` (a reward model's scale).
    Returns:
        (B,) bool.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be (B,), got shape {tuple(scores.shape)}")
    if threshold is not None:
        return scores >= threshold
    if scores.numel() == 0 or bool((scores == scores.max()).all()):
        return torch.zeros_like(scores, dtype=torch.bool)
    return scores == scores.max()


def positive_scale(mask: Tensor, positive: Tensor, agg: Aggregation) -> float:
    """``units(all rows) / units(positive rows)`` of a rollout, in ``agg``'s units (tokens for
    ``token-mean``, sequences for the sequence means); 0 without a positive row.

    Args:
        mask: (B, T) 1 at the tokens the loss reads.
        positive: (B,) bool, from ``positive_responses``.
    """
    positive_units = float(agg.units(mask[positive]))
    return float(agg.units(mask)) / positive_units if positive_units else 0.0


def positive_nll(
    logprobs: Tensor, mask: Tensor, positive: Tensor, scale: float, agg: Aggregation
) -> Tensor:
    """The positive-example NLL term of some rows: ``scale · agg(−log π · [positive], mask)``.

    Args:
        logprobs: (B, T) log π(o_t | ·) of the current policy, with gradient.
        mask: (B, T) 1 at the tokens the loss reads (the other responses' count in the
            normaliser, as in every term of the update).
        positive: (B,) bool: which rows are positive examples.
        scale: ``positive_scale`` of the whole rollout.
    Returns:
        () the term, 0 (with gradient) where no row is positive.
    """
    weights = positive.unsqueeze(1).to(logprobs.dtype)
    return scale * agg(-logprobs * weights, mask)
