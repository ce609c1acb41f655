"""Rollout corrections: weights for a rollout sampled by one engine and trained by another.

A sampler (vLLM, another kernel, bf16) and the trainer give the same weights different
probabilities. With π_s the sampler's and π_old the trainer's probability of the sampled token
before the update, every function here turns the per-token ratio

    ρ_t = π_old(a_t|s_t) / π_s(a_t|s_t)        (``log_ratio`` = log π_old − log π_s)

into a stop-gradient weight w_t ≥ 0 that multiplies the token's policy loss (the "decoupled" or
three-policy form: the PPO ratio stays π_θ / π_old, w corrects the sampler → trainer gap; veRL's
rollout correction, Liu, Li et al. 2025 "When Speed Kills Stability"). Shapes: ``log_ratio`` and
``mask`` are (B, T), 0/1 mask of valid tokens; every result is (B, T) and 0 at masked tokens.
Inputs are read, never changed; nothing here carries a gradient (callers pass detached tensors).
"""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType

import torch
from torch import Tensor

from proxrl.core.kl import kl_k1, kl_k3
from proxrl.core.masked import masked_mean, masked_sum
from proxrl.registry import Registry

Correction = Callable[[Tensor, Tensor, float, float], Tensor]
ROLLOUT_CORRECTIONS: Registry[Correction] = Registry("rollout correction")
"""``rollout_correction`` → (log_ratio (B, T), mask (B, T), low α, cap C) → (B, T) weights; an
entry reads the bounds it needs (``low``: IcePop's only)."""


def _ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask.bool(), log_ratio.exp(), 0.0)


def _sequence_ratio(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """ρ(y) = Π_t ρ_t over valid tokens, broadcast to (B, T) and 0 at masked tokens."""
    total = masked_sum(log_ratio, mask, dim=-1).exp().unsqueeze(-1)
    return torch.where(mask.bool(), total.expand_as(log_ratio), 0.0)


def tis_weights(log_ratio: Tensor, mask: Tensor, cap: float) -> Tensor:
    """Token-level truncated importance sampling (TIS; Yao et al. 2025, "Your efficient RL
    framework secretly brings you off-policy RL training"): w_t = min(ρ_t, C)."""
    return _ratio(log_ratio, mask).clamp_max(cap)


def seq_tis_weights(log_ratio: Tensor, mask: Tensor, cap: float) -> Tensor:
    """Sequence-level TIS: w_t = min(Π_t' ρ_t', C), the same for every token of a response
    (veRL's ``rollout_is: sequence``). Unbiased per sequence before the cap, and its variance
    grows with the length: its cap binds far more often than the token one."""
    return _sequence_ratio(log_ratio, mask).clamp_max(cap)


def mis_weights(log_ratio: Tensor, mask: Tensor, cap: float) -> Tensor:
    """Token-level masked importance sampling (MIS; Liu, Li et al. 2025): w_t = ρ_t·1[ρ_t ≤ C].
    A token whose ratio passes the cap is dropped (weight 0) instead of truncated to C."""
    ratio = _ratio(log_ratio, mask)
    return torch.where(ratio <= cap, ratio, 0.0)


def seq_mis_weights(log_ratio: Tensor, mask: Tensor, cap: float) -> Tensor:
    """Sequence-level MIS: w_t = ρ(y)·1[ρ(y) ≤ C] with ρ(y) = Π_t ρ_t: a response whose
    sequence ratio passes the cap is dropped whole."""
    ratio = _sequence_ratio(log_ratio, mask)
    return torch.where(ratio <= cap, ratio, 0.0)


def icepop_weights(log_ratio: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    """IcePop (Ling team, Ring-1T 2025): two-sided token mask, w_t = ρ_t·1[α ≤ ρ_t ≤ β]
    (their α = 0.5, β = 5). Tokens the two engines disagree on in either direction get no
    gradient; the kept ones are importance-weighted."""
    ratio = _ratio(log_ratio, mask)
    return torch.where((ratio >= low) & (ratio <= high), ratio, 0.0)


def mismatch_stats(
    trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor
) -> dict[str, Tensor]:
    """How far the sampler's log-probs are from the trainer's at the sampled tokens, over valid
    tokens (scalars; with no valid token, each is 0):

    - ``mismatch_kl``: k3 estimate of KL(π_s‖π_old) (tokens are drawn from π_s), ≥ 0;
    - ``mismatch_kl_k1``: mean of log π_s − log π_old (the same KL, unbiased, noisier);
    - ``is_ratio_mean`` / ``_min`` / ``_max``: of the token ratio ρ_t = π_old / π_s.
    """
    valid = mask.bool()
    ratio = (trainer_logprobs - sampler_logprobs).exp()[valid]
    empty = ratio.numel() == 0
    zero = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
    return {
        "mismatch_kl": masked_mean(kl_k3(sampler_logprobs, trainer_logprobs), mask),
        "mismatch_kl_k1": masked_mean(kl_k1(sampler_logprobs, trainer_logprobs), mask),
        "is_ratio_mean": zero if empty else ratio.mean(),
        "is_ratio_min": zero if empty else ratio.min(),
        "is_ratio_max": zero if empty else ratio.max(),
    }


def correction_stats(
    trainer_logprobs: Tensor, sampler_logprobs: Tensor, weights: Tensor, mask: Tensor, cap: float
) -> dict[str, Tensor]:
    """What a user needs to see the mismatch and what the correction did, over valid tokens
    (scalars): ``mismatch_stats`` (the mismatch KL, ρ_t's mean, min and max, ρ_t before any
    cap), and

    - ``masked_share``: share of tokens whose weight is 0 (MIS, IcePop);
    - ``truncated_share``: share of tokens whose weight was cut to the cap ``cap`` (TIS).
    """
    kept = weights[mask.bool()]
    stats = mismatch_stats(trainer_logprobs, sampler_logprobs, mask)
    dtype = stats["is_ratio_mean"].dtype  # the ratio's
    zero = torch.zeros((), dtype=dtype, device=kept.device)
    empty = kept.numel() == 0
    return stats | {
        "masked_share": zero if empty else (kept == 0).to(dtype).mean(),
        "truncated_share": zero if empty else ((kept == cap) & (kept > 0)).to(dtype).mean(),
    }


CAP = ("rollout_correction_cap",)
ROLLOUT_CORRECTIONS.add(
    "tis",
    lambda log_ratio, mask, low, cap: tis_weights(log_ratio, mask, cap),
    "min(ρ_t, C)",
    knobs=CAP,
)
ROLLOUT_CORRECTIONS.add(
    "seq_tis",
    lambda log_ratio, mask, low, cap: seq_tis_weights(log_ratio, mask, cap),
    "min(ρ(y), C) for every token of a response",
    knobs=CAP,
)
ROLLOUT_CORRECTIONS.add(
    "mis",
    lambda log_ratio, mask, low, cap: mis_weights(log_ratio, mask, cap),
    "ρ_t, or 0 above C",
    knobs=CAP,
)
ROLLOUT_CORRECTIONS.add(
    "seq_mis",
    lambda log_ratio, mask, low, cap: seq_mis_weights(log_ratio, mask, cap),
    "ρ(y), or 0 above C: a response dropped whole",
    knobs=CAP,
)
ROLLOUT_CORRECTIONS.add(
    "icepop", icepop_weights, "ρ_t, or 0 outside [α, C]", knobs=(*CAP, "rollout_correction_low")
)


EXTREMES = MappingProxyType({"is_ratio_min": min, "is_ratio_max": max})
"""The ``correction_stats`` that are extremes over tokens; every other one is a token mean."""


def combine_correction_stats(
    parts: list[dict[str, float]], tokens: list[float]
) -> dict[str, float]:
    """``correction_stats`` of several shards of a rollout (the ranks' own tokens) → those of
    the whole rollout: each token mean weighted by its shard's valid-token count ``tokens``,
    ``is_ratio_min`` the least of the shards' and ``is_ratio_max`` the greatest (a mean of the
    ranks' minima would be no token's ratio). Shards without tokens are left out; all empty:
    every stat 0, as ``correction_stats`` of an empty rollout."""
    kept = [(part, n) for part, n in zip(parts, tokens, strict=True) if n > 0]
    if not kept:
        return {key: 0.0 for key in parts[0]}
    total = sum(n for _, n in kept)
    return {
        key: EXTREMES[key](part[key] for part, _ in kept)
        if key in EXTREMES
        else sum(part[key] * n for part, n in kept) / total
        for key in parts[0]
    }
