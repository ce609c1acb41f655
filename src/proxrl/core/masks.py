"""Off-policy masks (``OFF_POLICY_MASKS``): which tokens of a stale or mismatched rollout take
no policy gradient, chosen apart from the policy loss and composable with any of them.

A mask reads the tokens' log-probabilities under the policy being trained (``logprobs``, no
gradient is taken through it) and under the sampling policy (``old_logprobs``, μ), the
advantages and the 0/1 ``mask`` of valid tokens, all (B, T), and returns a (B, T) 0/1 ``keep``.
The online loop multiplies the advantages by it before the loss (``algos.online.algorithm``):
every policy loss here is A_t times a function of the ratio, so a token with A = 0 takes neither
loss nor gradient, while it still counts in the aggregation's normaliser, as in the papers'
formulas (the masked token's term is 0 inside the same 1/|o| or 1/Σ|o|).

Why masks and not losses: each of these methods is stated on top of a surrogate (OPSM on
GRPO's, M2PO on GRPO's and on others'), and a mask composes with every entry of
``POLICY_LOSSES`` instead of doubling it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from proxrl.core.masked import masked_mean
from proxrl.registry import Registry

OffPolicyMask = Callable[[Tensor, Tensor, Tensor, Tensor, Any], Tensor]
OFF_POLICY_MASKS: Registry[OffPolicyMask] = Registry("off-policy mask")
"""``off_policy_mask`` → (log π (B, T), log μ (B, T), advantages (B, T), mask (B, T), settings
with the knobs ``opsm_delta``, ``m2po_tau``) → (B, T) 0/1 keep. The trait ``batch_wide``
marks the masks whose statistic spans the tokens given (m2po's second moment): the online
update computes them once over an optimizer step's rows, before its micro-batches, so that the
keep does not depend on the split; the others (opsm: per sequence) are the same on any split
and run in each micro-batch."""


def opsm_keep(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, delta: float
) -> Tensor:
    """Off-policy sequence masking (DeepSeek-V3.2, 2025, §3.1): drop a sequence with a negative
    advantage whose policies diverged, ``M_i = 0`` where ``A_i < 0`` and
    ``(1/|o_i|)·Σ_t (log μ(o_t) − log π(o_t)) > δ`` (the k1 estimate of KL(μ‖π) on the
    sequence). A negative sample far from the current policy teaches it little and destabilises
    it; a positive one is kept whatever its divergence.

    Per token ``A_t < 0`` decides, so that a sequence-level advantage drops the whole sequence
    and a token-level one (PPO's) only its negative tokens. As slime ``--use-opsm
    --opsm-delta``, TRL ``off_policy_mask_threshold``.

    Args:
        logprobs: (B, T) log π (read without gradient). old_logprobs: (B, T) log μ.
        advantages: (B, T). mask: (B, T) 1 at valid tokens.
    Returns:
        (B, T) keep, 0/1 in the dtype of ``logprobs``.
    """
    divergence = masked_mean(old_logprobs - logprobs.detach(), mask, dim=-1)  # (B,)
    drop = (advantages < 0) & (divergence > delta).unsqueeze(-1)
    return (~drop).to(logprobs.dtype)


def m2po_keep(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, tau: float) -> Tensor:
    """M2PO (Zheng et al. 2025, arXiv 2510.01161, "Prosperity before Collapse"): a trust region
    on the second moment of the log-ratios. Mask the valid tokens with the largest
    ``(log π − log μ)²``, one at a time from the largest, until the mean of the rest is ≤ τ;
    every token is kept when the mean over all is ≤ τ already. Only the extreme outliers of
    stale data are dropped, the informative tokens that a ratio clip would cut stay.

    Ties are broken by position (a stable sort), so the result is a function of the inputs.
    As AReaL ``m2_threshold`` (τ = 0.04 in the paper). The moment is over the tokens given: the
    online update gives all of an optimizer step's rows (``BATCH_WIDE_MASKS``), with π at the
    step. AReaL masks by the moment of log μ against the log-probs recomputed before the update
    (fixed through it) in each micro-batch.

    Args:
        logprobs: (B, T) log π (read without gradient). old_logprobs: (B, T) log μ.
        mask: (B, T) 1 at valid tokens.
    Returns:
        (B, T) keep, 0/1 in the dtype of ``logprobs``.
    """
    valid = mask.bool()
    moments = torch.where(valid, (logprobs.detach() - old_logprobs) ** 2, 0.0).flatten()
    order = torch.sort(moments, descending=True, stable=True).indices
    order = order[valid.flatten()[order]]  # the valid tokens, largest first
    count = order.numel()
    if count == 0:
        return torch.ones_like(logprobs)
    ordered = moments[order]
    # after dropping the k largest (k = 0 … n − 1): the sum and count of the rest, summed from
    # the smallest up; total − prefix would cancel the rest away under one large outlier (in
    # float32, 400.0009 − 400 loses a tenth of the 9e-4 left)
    rest_sum = ordered.flip(0).cumsum(0).flip(0)
    rest_count = torch.arange(count, 0, -1, dtype=ordered.dtype, device=ordered.device)
    inside = rest_sum / rest_count <= tau
    dropped = int(inside.to(torch.int64).argmax()) if bool(inside.any()) else count
    keep = torch.ones_like(moments)
    keep[order[:dropped]] = 0.0
    return keep.view_as(logprobs)


@OFF_POLICY_MASKS.register(
    "opsm", "drop a sequence with A < 0 once KL(μ‖π) > opsm_delta", knobs=("opsm_delta",)
)
def _opsm(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, settings: Any
) -> Tensor:
    return opsm_keep(logprobs, old_logprobs, advantages, mask, settings.opsm_delta)


@OFF_POLICY_MASKS.register(
    "m2po",
    "drop the largest (log r)² until their mean ≤ m2po_tau",
    knobs=("m2po_tau",),
    batch_wide=True,
)
def _m2po(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, settings: Any
) -> Tensor:
    return m2po_keep(logprobs, old_logprobs, mask, settings.m2po_tau)


BATCH_WIDE_MASKS = OFF_POLICY_MASKS.having("batch_wide")
"""The masks chosen over a whole optimizer step (their trait ``batch_wide``)."""
