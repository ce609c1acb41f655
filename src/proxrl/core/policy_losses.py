"""The policy losses an online algorithm picks by name (``POLICY_LOSSES``), and the surrogates
published after PPO-Clip for language models: GSPO, GSPO-token, CISPO, SAPO, DPPO (binary TV
and binary KL), M2PO's unclipped one, Clip-Cov and KL-Cov.

Each takes the per-token log-probabilities of the sampled tokens under the policy being trained
(``logprobs``, with gradient) and under the sampling policy (``old_logprobs``), (B, T)
advantages, a 0/1 ``mask`` and an aggregation (``agg``, see ``core.masked``), and returns
``(loss, stats)`` like ``ppo_clip_loss``. Every one builds a per-token loss and leaves the
reduction to the aggregation, so that all of them split over micro-batches the same way.

A policy loss is one function here plus one registration in ``POLICY_LOSSES``; its knobs are
fields of ``PolicyLossSettings`` (with their ``Bound``), which the online config inherits: the
option, its knobs, ``--help``, YAML and the range checks all follow from this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Protocol

import torch
from torch import Tensor

from proxrl.core.losses import Stats, policy_loss_result, ppo_clip_loss
from proxrl.core.masked import Aggregation, masked_mean
from proxrl.core.masks import OFF_POLICY_MASKS
from proxrl.registry import Bound, Registry

OffPolicyMaskChoice = OFF_POLICY_MASKS.choice(off=("none",))
CLIP = ("clip", "clip_high")
"""The knobs of the clipped ratio (cispo: the weight's upper bound 1 + clip_high)."""
DPPO_KNOBS = ("dppo_delta_low", "dppo_delta_high", "dppo_ratio_cap")


@dataclass
class PolicyLossSettings:
    """The knobs of the policy losses (the online commands' fields of the same names)."""

    clip: Annotated[float, Bound(gt=0)] = 0.2
    """PPO clip range ε (lower side)."""
    clip_high: Annotated[float | None, Bound(gt=0)] = None
    """Upper clip range (default: clip); DAPO uses 0.28."""
    dual_clip: Annotated[float | None, Bound(gt=1)] = None
    """Dual-clip bound c on negative-advantage losses, past the clip range: c > 1 + clip_high
    (None: off)."""
    sapo_tau_pos: Annotated[float, Bound(gt=0)] = 1.0
    """sapo: temperature τ of the soft gate on tokens with a positive advantage."""
    sapo_tau_neg: Annotated[float, Bound(gt=0)] = 1.05
    """sapo: temperature τ of the soft gate on tokens with a zero or negative advantage (larger:
    their off-policy gradient fades faster)."""
    dppo_delta_low: Annotated[float, Bound(gt=0)] = 0.2
    """dppo_tv, dppo_kl: divergence δ past which a token with A < 0 whose probability fell takes
    no gradient (TV: μ(a) − π(a); KL: the binary KL between μ(a) and π(a))."""
    dppo_delta_high: Annotated[float, Bound(gt=0)] = 0.2
    """dppo_tv, dppo_kl: divergence δ past which a token with A > 0 whose probability rose takes
    no gradient (TV: π(a) − μ(a); KL: the binary KL)."""
    dppo_ratio_cap: Annotated[float | None, Bound(gt=1)] = 10.0
    """dppo_tv, dppo_kl: the largest ratio π(a)/μ(a) that weighs a token's gradient (the DPPO
    authors' 10; veRL's clip_ratio_c 20; None: no cap)."""
    clip_cov_ratio: Annotated[float, Bound(gt=0, le=1)] = 2e-4
    """clip_cov: share of the valid tokens whose gradient is dropped, drawn among those with a
    covariance in (clip_cov_lb, clip_cov_ub) (at least one)."""
    clip_cov_lb: Annotated[float, Bound(below="clip_cov_ub")] = 1.0
    """clip_cov: lower bound of the covariance of the tokens that may be drawn."""
    clip_cov_ub: Annotated[float, Bound()] = 5.0
    """clip_cov: upper bound of the covariance of the tokens that may be drawn."""
    kl_cov_ratio: Annotated[float, Bound(gt=0, le=1)] = 2e-4
    """kl_cov: share of the valid tokens, those of the largest covariance (at least one), that
    pay kl_cov_coef·|log π − log π_old|."""
    kl_cov_coef: Annotated[float, Bound(ge=0)] = 1.0
    """kl_cov: coefficient of the |log-ratio| penalty on the selected tokens (veRL ppo_kl_coef)."""
    off_policy_mask: OffPolicyMaskChoice = "none"  # type: ignore[valid-type]
    """Tokens of stale data that take no policy gradient, with any policy_loss: none, opsm (a
    sequence with A < 0 and mean log(μ/π) > opsm_delta; DeepSeek-V3.2) or m2po (the largest
    (log π/μ)² until the mean of the rest ≤ m2po_tau; M2PO)."""
    opsm_delta: Annotated[float, Bound(ge=0)] = 1e-4
    """off_policy_mask opsm: δ on a sequence's mean log(μ/π) (slime's --opsm-delta 1e-4)."""
    m2po_tau: Annotated[float, Bound(gt=0)] = 0.04
    """off_policy_mask m2po: τ on the mean (log π/μ)² of the kept tokens (the paper's 0.04)."""

    @property
    def upper_clip(self) -> float:
        """ε_hi: clip_high, or clip when it is not set."""
        return self.clip if self.clip_high is None else self.clip_high


class PolicyLoss(Protocol):
    def __call__(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        settings: PolicyLossSettings,
        agg: Aggregation,
        selection: Tensor | None = None,
    ) -> tuple[Tensor, Stats]: ...


POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")
"""``policy_loss`` → (log π (B, T) with gradient, log π_old (B, T), advantages (B, T), mask
(B, T), settings, aggregation, selection) → (loss, stats). ``selection``: (B, T), for a loss
with an entry in ``TOKEN_SELECTIONS`` (clip_cov, kl_cov), the tokens that entry chose over the
whole optimizer step's rows, at these rows; None for the others (which ignore it)."""


class TokenSelection(Protocol):
    def __call__(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        settings: PolicyLossSettings,
        generator: torch.Generator | None,
    ) -> Tensor: ...


TOKEN_SELECTIONS: Registry[TokenSelection] = Registry("token selection")
"""``policy_loss`` → (log π (B, T) without gradient, log π_old (B, T), advantages (B, T), mask
(B, T), settings, generator) → (B, T) 0/1: the tokens a policy loss picks by a statistic of a
whole batch (a covariance's means, a top-k, a random draw), which its ``POLICY_LOSSES`` entry
then reads as ``selection``. The online update calls it once per optimizer step over all of the
step's rows, before their micro-batches, so the choice does not depend on how the step is split
into micro-batches or processes. ``generator``: the run's, for a selection that draws at random
(clip_cov: a resumed run draws the same); the others ignore it."""


def _sequence_log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """(B, 1) ``(1/|y_i|)·Σ_t (log π − log π_old)``: the log of the geometric mean of the
    token ratios (0 for an empty row)."""
    return masked_mean(logprobs - old_logprobs, mask, dim=-1).unsqueeze(-1)


def _clip_terms(
    ratio: Tensor, advantages: Tensor, mask: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor]:
    """PPO-Clip's per-token ``max(−A·r, −A·clip(r, 1 − clip_low, 1 + clip_high))`` and the bool
    of the tokens the clip decides, each (B, T), for a (B, T) token ratio or a (B, 1) sequence
    ratio (GSPO's) with (B, T) advantages and mask.

    Padding's advantage is zeroed: a (B, 1) sequence ratio gathers gradient from every column,
    and 0 × NaN would reach it from a NaN sitting in padding."""
    advantages = torch.where(mask.bool(), advantages, 0.0)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped).detach()


def _clipped_surrogate(
    ratio: Tensor, advantages: Tensor, mask: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor]:
    """``_clip_terms``' per-token loss and the share of valid tokens the clip decides."""
    per_token, by_clip = _clip_terms(ratio, advantages, mask, clip_low, clip_high)
    return per_token, masked_mean(by_clip.to(ratio.dtype), mask).detach()


def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 3e-4,
    clip_high: float | None = None,
    agg: str | Aggregation = "seq-mean-token-mean",
) -> tuple[Tensor, Stats]:
    """GSPO (Zheng et al. 2025, eq. 5–7): one importance ratio per sequence, the geometric
    mean of its token ratios ``s_i = exp((1/|y_i|)·Σ_t log(π_θ/π_old))``, clipped at the
    sequence level: ``J = (1/G)·Σ_i min(s_i·A_i, clip(s_i, 1−ε_lo, 1+ε_hi)·A_i)``. A clipped
    sequence contributes no gradient to any of its tokens.

    Departures: the loss is written per token, ``max(−A_{i,t}·s_i, −A_{i,t}·clip(s_i))``, and
    reduced by ``agg``, as TRL (``importance_sampling_level="sequence"``) and veRL do; with a
    sequence-level advantage and ``seq-mean-token-mean`` (the default here) it is the paper's
    objective exactly. The paper's clip ranges are tiny (ε_lo = 3e-4, ε_hi = 4e-4): a sequence
    ratio moves far less than a token ratio.

    Args:
        logprobs: (B, T) log π_θ of the sampled tokens, with gradient.
        old_logprobs: (B, T) log π_old of the same tokens.
        advantages: (B, T) (the sequence's advantage at each of its tokens).
    Stats: ``clipfrac`` (share of valid tokens in clipped sequences), ``seq_ratio_mean``, and
    the token-ratio diagnostics of ``ppo_clip_loss``.
    """
    clip_high = clip_low if clip_high is None else clip_high
    ratio = torch.exp(_sequence_log_ratio(logprobs, old_logprobs, mask))
    per_token, clipfrac = _clipped_surrogate(ratio, advantages, mask, clip_low, clip_high)
    extra = {"clipfrac": clipfrac, "seq_ratio_mean": ratio.mean().detach()}
    return policy_loss_result(per_token, logprobs - old_logprobs, mask, agg, extra)


def gspo_token_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 3e-4,
    clip_high: float | None = None,
    agg: str | Aggregation = "seq-mean-token-mean",
) -> tuple[Tensor, Stats]:
    """GSPO-token (Zheng et al. 2025, eq. 13–14), for token-level advantages:
    ``s_{i,t} = sg[s_i]·π_θ(y_t)/sg[π_θ(y_t)]`` — numerically the sequence ratio s_i, but its
    gradient is ``s_i·∇log π_θ(y_t)`` on token t alone; clipped as GSPO's:
    ``max(−A_{i,t}·s_{i,t}, −A_{i,t}·clip(s_{i,t}, 1−ε_lo, 1+ε_hi))``, reduced by ``agg``. With
    one advantage per sequence and ``seq-mean-token-mean`` its value and gradient equal
    GSPO's. veRL's ``loss_mode: gspo`` is this form. Args and stats as ``gspo_loss``."""
    clip_high = clip_low if clip_high is None else clip_high
    sequence = _sequence_log_ratio(logprobs, old_logprobs, mask).detach()
    ratio = torch.exp(logprobs - logprobs.detach() + sequence)
    per_token, clipfrac = _clipped_surrogate(ratio, advantages, mask, clip_low, clip_high)
    extra = {"clipfrac": clipfrac, "seq_ratio_mean": torch.exp(sequence).mean().detach()}
    return policy_loss_result(per_token, logprobs - old_logprobs, mask, agg, extra)


def cispo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_high: float = 0.2,
    clip_low: float | None = None,
    agg: str | Aggregation = "token-mean",
) -> tuple[Tensor, Stats]:
    """CISPO (MiniMax-M1, 2025, eq. 4–5): REINFORCE with a clipped, stop-gradient importance
    weight, ``J = Σ_{i,t} sg(r̂_{i,t})·A_{i,t}·log π_θ(y_{i,t}) / Σ_i |y_i|`` with
    ``r̂ = clip(r, 1−ε_lo, 1+ε_hi)``, ``r = π_θ/π_old``. Unlike PPO-Clip, a token whose ratio
    is clipped keeps its gradient ``r̂·A·∇log π`` (only its weight is capped), so rare tokens
    that PPO would drop after one update still learn.

    ``clip_low`` None is the paper's setting (no lower bound: "ε_lo set to a large value");
    the paper's reduction is ``token-mean``. Stats: ``clipfrac`` (share of valid tokens whose
    weight was capped), the ratio diagnostics of ``ppo_clip_loss``.

    Args:
        logprobs: (B, T) log π_θ, with gradient. old_logprobs: (B, T) log π_old.
        advantages: (B, T).
    """
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    low = None if clip_low is None else 1 - clip_low
    weight = torch.clamp(ratio, low, 1 + clip_high).detach()
    capped = masked_mean((weight != ratio.detach()).to(ratio.dtype), mask).detach()
    per_token = -weight * advantages * logprobs
    return policy_loss_result(per_token, log_ratio, mask, agg, {"clipfrac": capped})


def sapo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    agg: str | Aggregation = "seq-mean-token-mean",
) -> tuple[Tensor, Stats]:
    """SAPO (Gao et al. 2025, "Soft Adaptive Policy Optimization", eq. 5–6): a soft gate in
    place of PPO's hard clip, per token ``−f(r)·A`` with ``r = π_θ/π_old`` and
    ``f(r) = σ(τ·(r − 1))·4/τ``, ``τ = tau_pos`` where ``A > 0`` and ``tau_neg`` elsewhere.
    Its gradient with respect to log π_θ is ``−4·σ(1 − σ)·r·A`` (σ at τ(r − 1)): exactly
    PPO's ``−A`` on-policy (r = 1), fading smoothly as r leaves 1, faster for a larger τ.

    As veRL (``loss_mode: sapo``) and TRL (``loss_type="sapo"``): the token ratio, τ picked by
    the sign of each token's advantage, defaults τ_pos 1.0 and τ_neg 1.05, and
    ``log r`` clamped to [−20, 20] before the exp (veRL's guard: ``exp`` of a large log-ratio
    would be inf, and ∞·σ(1 − σ) NaN). The paper's reduction is ``seq-mean-token-mean``.
    Stats: the ratio diagnostics of ``ppo_clip_loss``.

    Args:
        logprobs: (B, T) log π_θ, with gradient. old_logprobs: (B, T) log π_old.
        advantages: (B, T).
    """
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(torch.clamp(log_ratio, -20.0, 20.0))
    positive = torch.as_tensor(tau_pos, dtype=ratio.dtype, device=ratio.device)
    negative = torch.as_tensor(tau_neg, dtype=ratio.dtype, device=ratio.device)
    tau = torch.where(advantages > 0, positive, negative)
    gate = torch.sigmoid(tau * (ratio - 1)) * (4 / tau)
    return policy_loss_result(-gate * advantages, log_ratio, mask, agg)


@POLICY_LOSSES.register(
    "ppo", "token ratio, clipped (PPO-Clip; dual_clip bounds A < 0)", knobs=CLIP + ("dual_clip",)
)
def _ppo(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: PolicyLossSettings,
    agg: Aggregation,
    selection: Tensor | None = None,
) -> tuple[Tensor, Stats]:
    clip, clip_high, dual_clip = settings.clip, settings.clip_high, settings.dual_clip
    return ppo_clip_loss(logprobs, old_logprobs, advantages, mask, clip, clip_high, dual_clip, agg)


@POLICY_LOSSES.register(
    "gspo", "sequence ratio, clipped per sequence (Zheng et al. 2025)", knobs=CLIP
)
def _gspo(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: PolicyLossSettings,
    agg: Aggregation,
    selection: Tensor | None = None,
) -> tuple[Tensor, Stats]:
    clip, clip_high = settings.clip, settings.clip_high
    return gspo_loss(logprobs, old_logprobs, advantages, mask, clip, clip_high, agg)


@POLICY_LOSSES.register(
    "gspo_token", "GSPO's sequence ratio, each token its own gradient", knobs=CLIP
)
def _gspo_token(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: PolicyLossSettings,
    agg: Aggregation,
    selection: Tensor | None = None,
) -> tuple[Tensor, Stats]:
    clip, clip_high = settings.clip, settings.clip_high
    return gspo_token_loss(logprobs, old_logprobs, advantages, mask, clip, clip_high, agg)


@POLICY_LOSSES.register("cispo", "clipped stop-gradient IS weight × log π (MiniMax-M1)", knobs=CLIP)
def _cispo(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: PolicyLossSettings,
    agg: Aggregation,
    selection: Tensor | None = None,
) -> tuple[Tensor, Stats]:
    """The paper's setting: no lower bound on the weight, the upper at 1 + clip_high."""
    upper = settings.upper_clip
    return cispo_loss(logprobs, old_logprobs, advantages, mask, upper, None, agg)


@POLICY_LOSSES.register(
    "sapo",
    "token ratio through a soft sigmoid gate (Gao et al. 2025)",
    knobs=("sapo_tau_pos", "sapo_tau_neg"),
)
def _sapo(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: PolicyLossSettings,
    agg: Aggregation,
    selection: Tensor | None = None,
) -> tuple[Tensor, Stats]:
    tau_pos, tau_neg = settings.sapo_tau_pos, settings.sapo_tau_neg
    return sapo_loss(logprobs, old_logprobs, advantages, mask, tau_pos, tau_neg, agg)


def _divergence_masked_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    outside: Tensor,
    agg: str | Aggregation,
    ratio_cap: float | None,
) -> tuple[Tensor, Stats]:
    """DPPO's per-token ``−r·A`` with the tokens ``outside`` the trust region taking none, and
    ``r`` capped at ``ratio_cap``: ``−min(r, C)·A``, whose gradient is ``−min(r, C)·A·∇log π``
    (veRL's ``sg(min(r, C))·A·log π``: a rare token's huge ratio weighs no more than C)."""
    log_ratio = logprobs - old_logprobs
    # veRL's guard: exp of a large log-ratio would be inf, and inf × 0 (a masked token) NaN
    ratio = torch.exp(torch.clamp(log_ratio, -20.0, 20.0))
    if ratio_cap is not None:  # the capped value, and log π's gradient times it
        weight = torch.clamp(ratio, max=ratio_cap).detach()
        ratio = weight * torch.exp(log_ratio - log_ratio.detach())
    keep = (~outside).to(ratio.dtype)
    extra = {"clipfrac": masked_mean(outside.to(ratio.dtype), mask).detach()}
    return policy_loss_result(-ratio * advantages * keep, log_ratio, mask, agg, extra)


def dppo_tv_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    delta_low: float = 0.2,
    delta_high: float = 0.2,
    agg: str | Aggregation = "token-mean",
    ratio_cap: float | None = 10.0,
) -> tuple[Tensor, Stats]:
    """DPPO-Binary-TV (arXiv 2602.04879, "Rethinking the Trust Region in LLM RL"): a trust region
    on the sampled token's probability instead of its ratio. Per token ``−r·A·m`` with
    ``r = π(a)/μ(a)`` and ``m = 0`` where the update would move π further out of the region:
    ``A > 0`` and ``π(a) − μ(a) > δ_high``, or ``A < 0`` and ``μ(a) − π(a) > δ_low`` (π, μ the
    probabilities of the sampled token under the trained and the sampling policy; ``m`` holds no
    gradient). A rare token may move its ratio far while its probability barely moves, which
    PPO's ratio clip would stop and this does not; a likely token is stopped after a small ratio.

    As veRL ``dppo_tv`` (gradient ``−min(r, C)·A·∇log π·m``; veRL writes it as
    ``sg(min(r, C))·A·log π`` with C = 20, the DPPO authors cap at C = 10, the default
    ``ratio_cap``; None: no cap, only the log-ratio clamped to ±20 as SAPO's), SkyRL ``dppo``.
    Stats: ``clipfrac`` (the share of valid tokens outside the region), the ratio diagnostics of
    ``ppo_clip_loss``.

    Args:
        logprobs: (B, T) log π, with gradient. old_logprobs: (B, T) log μ.
        advantages: (B, T). mask: (B, T).
    """
    with torch.no_grad():
        change = torch.exp(logprobs) - torch.exp(old_logprobs)  # π(a) − μ(a)
        outside = torch.where(advantages > 0, change > delta_high, False)
        outside |= torch.where(advantages < 0, -change > delta_low, False)
    return _divergence_masked_loss(
        logprobs, old_logprobs, advantages, mask, outside, agg, ratio_cap
    )


def binary_kl(old_logprobs: Tensor, logprobs: Tensor) -> Tensor:
    """The KL between the Bernoulli laws of "the sampled token or not" under μ and π:
    ``μ·log(μ/π) + (1 − μ)·log((1 − μ)/(1 − π))``, μ = exp(old_logprobs), π = exp(logprobs),
    each (B, T); 0 where μ = π, +inf where π = 1 > μ."""
    mu = torch.exp(old_logprobs)
    # log(1 − e^x) as log(−expm1(x)): exact for a probability near 1
    rest = torch.log(-torch.expm1(old_logprobs)) - torch.log(-torch.expm1(logprobs))
    return mu * (old_logprobs - logprobs) + torch.where(mu < 1, (1 - mu) * rest, 0.0)


def dppo_kl_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    delta_low: float = 0.2,
    delta_high: float = 0.2,
    agg: str | Aggregation = "token-mean",
    ratio_cap: float | None = 10.0,
) -> tuple[Tensor, Stats]:
    """DPPO-Binary-KL (arXiv 2602.04879): as ``dppo_tv_loss`` with the divergence the binary KL
    ``D = KL(Bern(μ(a)) ‖ Bern(π(a)))`` (``binary_kl``): a token takes no gradient where
    ``A > 0``, ``π(a) > μ(a)`` and ``D > δ_high``, or ``A < 0``, ``π(a) < μ(a)`` and
    ``D > δ_low``. As veRL ``dppo_kl``. Args and stats as ``dppo_tv_loss``."""
    with torch.no_grad():
        divergence = binary_kl(old_logprobs, logprobs)
        rose, fell = logprobs > old_logprobs, logprobs < old_logprobs
        outside = torch.where(advantages > 0, rose & (divergence > delta_high), False)
        outside |= torch.where(advantages < 0, fell & (divergence > delta_low), False)
    return _divergence_masked_loss(
        logprobs, old_logprobs, advantages, mask, outside, agg, ratio_cap
    )


@POLICY_LOSSES.register(
    "dppo_tv", "−r·A, no gradient past a TV trust region on π(a) (DPPO)", knobs=DPPO_KNOBS
)
def _dppo_tv(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: PolicyLossSettings,
    agg: Aggregation,
    selection: Tensor | None = None,
) -> tuple[Tensor, Stats]:
    low, high = settings.dppo_delta_low, settings.dppo_delta_high
    cap = settings.dppo_ratio_cap
    return dppo_tv_loss(logprobs, old_logprobs, advantages, mask, low, high, agg, cap)


@POLICY_LOSSES.register(
    "dppo_kl", "−r·A, no gradient past a binary-KL trust region (DPPO)", knobs=DPPO_KNOBS
)
def _dppo_kl(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: PolicyLossSettings,
    agg: Aggregation,
    selection: Tensor | None = None,
) -> tuple[Tensor, Stats]:
    low, high = settings.dppo_delta_low, settings.dppo_delta_high
    cap = settings.dppo_ratio_cap
    return dppo_kl_loss(logprobs, old_logprobs, advantages, mask, low, high, agg, cap)


def unclipped_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    agg: str | Aggregation = "token-mean",
) -> tuple[Tensor, Stats]:
    """The importance-weighted policy gradient with no clip: per token ``−r·A``,
    ``r = π/π_old`` (the log-ratio clamped to ±20 before the exp, veRL's guard against
    ``inf·0``). M2PO's surrogate (Zheng et al. 2025, arXiv 2510.01161): the paper drops PPO's
    ratio clip and bounds the update by its second-moment mask instead (``off_policy_mask
    m2po``), which then drops the extreme ratios and keeps the informative tokens a clip would
    cut. Alone nothing bounds the step. Stats: the ratio diagnostics of ``ppo_clip_loss``,
    ``clipfrac`` 0.

    Args:
        logprobs: (B, T) log π, with gradient. old_logprobs: (B, T) log π_old.
        advantages: (B, T). mask: (B, T).
    """
    outside = torch.zeros_like(mask, dtype=torch.bool)
    return _divergence_masked_loss(logprobs, old_logprobs, advantages, mask, outside, agg, None)


def token_covariance(logprobs: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """Cui et al. 2025 (arXiv 2505.22617, "The Entropy Mechanism of RL for Reasoning LMs",
    eq. 9): each valid token's centred product ``(A_t − mean A)·(log π_t − mean log π)``, the
    means over the valid tokens given; the tokens of large covariance are those whose update
    collapses the entropy. No gradient. (B, T) each → (B, T), 0 where masked."""
    with torch.no_grad():
        logprobs = logprobs.detach()
        centred_a = advantages - masked_mean(advantages, mask)
        centred_logp = logprobs - masked_mean(logprobs, mask)
        return torch.where(mask.bool(), centred_a * centred_logp, 0.0)


def clip_cov_draw(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    ratio: float = 2e-4,
    bounds: tuple[float, float] = (1.0, 5.0),
    generator: torch.Generator | None = None,
) -> Tensor:
    """Clip-Cov's draw (Cui et al. 2025, arXiv 2505.22617, §5.2): among the valid tokens that
    PPO's ratio clip leaves alone with ``lb < Cov < ub`` (``token_covariance``), a random
    ``max(1, ⌊ratio·N⌋)`` (N valid tokens; all of them when fewer), by ``torch.randperm`` on
    ``generator``. The covariance's means and N are over the tokens given: the online update
    gives all of an optimizer step's rows (veRL: one micro-batch's).

    Args:
        logprobs: (B, T) log π (read without gradient). old_logprobs: (B, T) log π_old.
        advantages: (B, T). mask: (B, T).
    Returns:
        (B, T) 0/1 in the dtype of ``logprobs``: 1 at the tokens drawn.
    """
    clip_high = clip_low if clip_high is None else clip_high
    with torch.no_grad():
        logprobs = logprobs.detach()
        ratio_now = torch.exp(logprobs - old_logprobs)
        _, by_clip = _clip_terms(ratio_now, advantages, mask, clip_low, clip_high)
        covariance = token_covariance(logprobs, advantages, mask)
        lower, upper = bounds
        candidates = mask.bool() & ~by_clip & (covariance > lower) & (covariance < upper)
        where = candidates.flatten().nonzero().squeeze(-1)
        count = max(1, int(ratio * float(mask.sum())))
        drawn = where[torch.randperm(where.numel(), generator=generator)[:count]]
        chosen = torch.zeros_like(logprobs).flatten()
        chosen[drawn] = 1.0
        return chosen.view_as(logprobs)


def clip_cov_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    drawn: Tensor,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    agg: str | Aggregation = "token-mean",
) -> tuple[Tensor, Stats]:
    """Clip-Cov (Cui et al. 2025, arXiv 2505.22617, §5.2): PPO-Clip, and the gradient of a few
    tokens of high covariance dropped to stop the entropy's collapse: the tokens ``drawn``
    (``clip_cov_draw``) take neither loss nor gradient. As veRL ``clip_cov`` (defaults ratio
    2e-4, bounds 1 and 5).

    Args:
        logprobs: (B, T) log π, with gradient. old_logprobs: (B, T) log π_old.
        advantages: (B, T). mask: (B, T). drawn: (B, T) 0/1, no gradient.
    Stats: ``clipfrac`` (ratio-clipped share), ``cov_dropped`` (share of valid tokens drawn),
    the ratio diagnostics of ``ppo_clip_loss``.
    """
    clip_high = clip_low if clip_high is None else clip_high
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    per_token, by_clip = _clip_terms(ratio, advantages, mask, clip_low, clip_high)
    extra = {
        "clipfrac": masked_mean(by_clip.to(per_token.dtype), mask).detach(),
        "cov_dropped": masked_mean(drawn, mask).detach(),
    }
    return policy_loss_result(per_token * (1 - drawn), log_ratio, mask, agg, extra)


def kl_cov_select(
    logprobs: Tensor, advantages: Tensor, mask: Tensor, ratio: float = 2e-4
) -> Tensor:
    """KL-Cov's selection (Cui et al. 2025, arXiv 2505.22617, §5.2): the ``max(1, ⌊ratio·N⌋)``
    valid tokens of the largest covariance (``token_covariance``; ties to the earlier token, a
    stable sort), N and the covariance's means over the tokens given (the online update: all
    of an optimizer step's rows; veRL: one micro-batch's).

    Args:
        logprobs: (B, T) log π (read without gradient). advantages: (B, T). mask: (B, T).
    Returns:
        (B, T) 0/1 in the dtype of ``logprobs``: 1 at the tokens selected.
    """
    with torch.no_grad():
        covariance = token_covariance(logprobs, advantages, mask).flatten()
        valid = mask.bool().flatten()
        order = torch.sort(torch.where(valid, covariance, -torch.inf), descending=True, stable=True)
        count = min(max(1, int(ratio * float(mask.sum()))), int(valid.sum()))
        selected = torch.zeros_like(covariance)
        selected[order.indices[:count]] = 1.0
        return selected.view_as(logprobs)


def kl_cov_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    selected: Tensor,
    coef: float = 1.0,
    agg: str | Aggregation = "token-mean",
) -> tuple[Tensor, Stats]:
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617, §5.2): the unclipped ``−r·A`` on every token,
    plus ``coef·|log π − log π_old|`` on the tokens ``selected`` (``kl_cov_select``: those of the
    largest covariance). A KL penalty only where the entropy collapses, instead of a clip
    everywhere. As veRL ``kl_cov`` (defaults ratio 2e-4, coef 1).

    Args:
        logprobs: (B, T) log π, with gradient. old_logprobs: (B, T) log π_old.
        advantages: (B, T). mask: (B, T). selected: (B, T) 0/1, no gradient.
    Stats: ``kl_cov_selected`` (share of valid tokens penalised), the ratio diagnostics.
    """
    log_ratio = logprobs - old_logprobs
    token_ratio = torch.exp(torch.clamp(log_ratio, -20.0, 20.0))
    per_token = -token_ratio * advantages + coef * log_ratio.abs() * selected
    extra = {"kl_cov_selected": masked_mean(selected, mask).detach()}
    return policy_loss_result(per_token, log_ratio, mask, agg, extra)


def _selected(name: str, selection: Tensor | None) -> Tensor:
    if selection is None:
        raise ValueError(f"policy loss {name}: the selection of TOKEN_SELECTIONS[{name!r}]")
    return selection


@POLICY_LOSSES.register(
    "clip_cov",
    "PPO-Clip, a random few high-covariance tokens dropped",
    knobs=CLIP + ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub"),
    draws=True,
)
def _clip_cov(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: PolicyLossSettings,
    agg: Aggregation,
    selection: Tensor | None = None,
) -> tuple[Tensor, Stats]:
    drawn = _selected("clip_cov", selection)
    clip, clip_high = settings.clip, settings.clip_high
    return clip_cov_loss(logprobs, old_logprobs, advantages, mask, drawn, clip, clip_high, agg)


@TOKEN_SELECTIONS.register("clip_cov", "a random clip_cov_ratio of the covariances in (lb, ub)")
def _clip_cov_draw(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: PolicyLossSettings,
    generator: torch.Generator | None,
) -> Tensor:
    bounds = (settings.clip_cov_lb, settings.clip_cov_ub)
    clip, clip_high, ratio = settings.clip, settings.clip_high, settings.clip_cov_ratio
    return clip_cov_draw(
        logprobs, old_logprobs, advantages, mask, clip, clip_high, ratio, bounds, generator
    )


DRAWING_LOSSES = POLICY_LOSSES.having("draws")
"""The policy losses whose ``TOKEN_SELECTIONS`` entry draws from the generator it is given
(their trait ``draws``)."""


@POLICY_LOSSES.register(
    "kl_cov",
    "−r·A, + |log r| on the tokens of largest covariance",
    knobs=("kl_cov_ratio", "kl_cov_coef"),
)
def _kl_cov(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: PolicyLossSettings,
    agg: Aggregation,
    selection: Tensor | None = None,
) -> tuple[Tensor, Stats]:
    selected = _selected("kl_cov", selection)
    return kl_cov_loss(
        logprobs, old_logprobs, advantages, mask, selected, settings.kl_cov_coef, agg
    )


@TOKEN_SELECTIONS.register("kl_cov", "the kl_cov_ratio of the tokens of largest covariance")
def _kl_cov_select(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: PolicyLossSettings,
    generator: torch.Generator | None,
) -> Tensor:
    return kl_cov_select(logprobs, advantages, mask, settings.kl_cov_ratio)


@POLICY_LOSSES.register("unclipped", "−r·A, no clip (M2PO's surrogate, with off_policy_mask m2po)")
def _unclipped(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    settings: PolicyLossSettings,
    agg: Aggregation,
    selection: Tensor | None = None,
) -> tuple[Tensor, Stats]:
    return unclipped_loss(logprobs, old_logprobs, advantages, mask, agg)
