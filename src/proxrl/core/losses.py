"""Every loss of the RLHF pipeline, one function per variant.

Each returns ``(loss, stats)``: a scalar to minimise and a dict of detached scalar diagnostics.
Token-level losses take (B, T) tensors, a 0/1 ``mask`` of valid tokens and ``agg``, the
reduction of ``aggregate_loss``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from proxrl.core.logprobs import logprobs_from_logits
from proxrl.core.masked import Aggregation, aggregate_loss, masked_mean

Stats = dict[str, Tensor]


def policy_gradient_loss(
    logprobs: Tensor, advantages: Tensor, mask: Tensor, agg: str | Aggregation = "token-mean"
) -> tuple[Tensor, Stats]:
    """REINFORCE (Williams 1992): ``−A_t·log π(a_t|s_t)``, on-policy only."""
    loss = aggregate_loss(-advantages * logprobs, mask, agg)
    return loss, {"policy_loss": loss.detach()}


def _ratio_stats(log_ratio: Tensor, mask: Tensor) -> Stats:
    """Diagnostics of ``log r = log π − log π_old`` for samples drawn from π_old: the k1 and k3
    estimates of KL(π_old‖π), and the ratio's mean and max over valid tokens."""
    with torch.no_grad():  # diagnostics: recording them for autograd would be wasted work
        ratio = torch.exp(log_ratio)
        return {
            "approx_kl": masked_mean(torch.expm1(log_ratio) - log_ratio, mask),
            "approx_kl_k1": masked_mean(-log_ratio, mask),
            "ratio_mean": masked_mean(ratio, mask),
            # 0, not −inf, when no token is valid (every response truncated under mask_truncated)
            "ratio_max": torch.where(mask.bool(), ratio, 0.0).max(),
        }


def policy_loss_result(
    per_token: Tensor,
    log_ratio: Tensor,
    mask: Tensor,
    agg: str | Aggregation,
    extra: Stats | None = None,
) -> tuple[Tensor, Stats]:
    """What a policy loss returns, from its per-token loss: ``(loss, stats)`` with
    ``loss = aggregate_loss(per_token, mask, agg)`` and the stats in this order: the ratio
    diagnostics of ``_ratio_stats(log_ratio, mask)``, then ``extra`` (the loss's own), then
    ``policy_loss`` (the loss, detached).

    Args:
        per_token: (B, T) loss of each token, with gradient.
        log_ratio: (B, T) ``log π − log π_old`` of the sampled tokens (read without gradient).
        mask: (B, T) 0/1, the valid tokens.
        agg: the reduction (``core.masked.aggregate_loss``).
        extra: name → 0-d tensor without gradient, the loss's own diagnostics.
    """
    loss = aggregate_loss(per_token, mask, agg)
    stats = _ratio_stats(log_ratio, mask) | (extra or {})
    stats["policy_loss"] = loss.detach()
    return loss, stats


def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
    agg: str | Aggregation = "token-mean",
) -> tuple[Tensor, Stats]:
    """PPO-Clip (Schulman et al. 2017, eq. 7) as a loss: ``max(−A·r, −A·clip(r, 1−ε_lo, 1+ε_hi))``.

    ``clip_high`` defaults to ``clip_low``; DAPO raises it (0.28) so unlikely tokens can grow.
    ``dual_clip`` = c > 1 (Ye et al. 2020) bounds the loss of a negative advantage at ``−c·A``
    so a huge ratio cannot blow it up.

    Args:
        logprobs: (B, T) log π_θ(a_t|s_t), with gradient.
        old_logprobs: (B, T) log π_old of the same tokens, from the rollout.
        advantages: (B, T).
    Stats: ``clipfrac`` (share of valid tokens where the clipped term is the active one),
    ``approx_kl`` (k3) and ``approx_kl_k1`` of KL(π_old‖π), ``ratio_mean``, ``ratio_max``.
    """
    clip_high = clip_low if clip_high is None else clip_high
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        extra = {"clipfrac": masked_mean((clipped > unclipped).to(ratio.dtype), mask)}
    if dual_clip is not None:
        if dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        bounded = torch.minimum(per_token, -advantages * dual_clip)
        extra["dual_clipfrac"] = masked_mean(
            ((advantages < 0) & (bounded < per_token)).to(ratio.dtype), mask
        ).detach()
        per_token = torch.where(advantages < 0, bounded, per_token)
    return policy_loss_result(per_token, log_ratio, mask, agg, extra)


def ppo_penalty_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    beta: float,
    agg: str | Aggregation = "token-mean",
) -> tuple[Tensor, Stats]:
    """PPO-Penalty (Schulman et al. 2017, eq. 8) as a loss: ``−A·r + β·KL(π_old‖π)``.

    The KL is estimated per sampled token with k3, ``(r − 1) − log r`` (unbiased under samples
    of π_old, ≥ 0, gradient equal to the exact KL's). With ``beta=0`` this is the plain
    unclipped surrogate ("no clipping or penalty" in the paper's Table 1).
    Stats: ``kl`` (the k3 mean, which an ``AdaptiveKL`` controller takes), ratio diagnostics.
    """
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    kl = torch.expm1(log_ratio) - log_ratio
    extra = {"kl": masked_mean(kl.detach(), mask)}  # the same floats as approx_kl's
    return policy_loss_result(-advantages * ratio + beta * kl, log_ratio, mask, agg, extra)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip: float | None = None,
    agg: str | Aggregation = "token-mean",
) -> tuple[Tensor, Stats]:
    """Critic regression ``½(V − R)²``; with ``clip`` = c the pessimistic clipped form
    ``½·max((V − R)², (clip(V, V_old − c, V_old + c) − R)²)`` (OpenAI baselines' formula).

    Stats: ``value_clipfrac`` (share of tokens where the clipped term is larger), ``value_mean``.

    V itself is clamped, not written as baselines' ``V_old + clip(V − V_old, −c, c)``: that sum
    is not exactly V in floating point where nothing is clipped, and the round-off alone made
    the clipped term the larger on ~10% of float32 tokens, counted as clipped. Where V is
    clipped both forms give the same float (``V_old ± c``); elsewhere the clamp gives V itself,
    so the loss and gradient are the formula's and ``value_clipfrac`` counts clipping only.
    """
    squared = (values - returns) ** 2
    with torch.no_grad():
        stats: Stats = {"value_mean": masked_mean(values, mask)}
    if clip is not None:
        clipped_values = torch.clamp(values, old_values - clip, old_values + clip)
        squared_clipped = (clipped_values - returns) ** 2
        with torch.no_grad():
            stats["value_clipfrac"] = masked_mean(
                (squared_clipped > squared).to(values.dtype), mask
            )
        squared = torch.maximum(squared, squared_clipped)
    loss = 0.5 * aggregate_loss(squared, mask, agg)
    stats["value_loss"] = loss.detach()
    return loss, stats


def entropy_bonus(
    entropy: Tensor, mask: Tensor, agg: str | Aggregation = "token-mean"
) -> tuple[Tensor, Stats]:
    """``−H``: add ``coef × this`` to a loss to reward exploration. Stats: ``entropy``."""
    mean_entropy = aggregate_loss(entropy, mask, agg)
    return -mean_entropy, {"entropy": mean_entropy.detach()}


def _preference_stats(chosen_rewards: Tensor, rejected_rewards: Tensor, prefix: str) -> Stats:
    return {
        f"{prefix}chosen": chosen_rewards.mean().detach(),
        f"{prefix}rejected": rejected_rewards.mean().detach(),
        f"{prefix}margins": (chosen_rewards - rejected_rewards).mean().detach(),
        f"{prefix}accuracies": (chosen_rewards > rejected_rewards).float().mean().detach(),
    }


def bradley_terry_loss(
    chosen_scores: Tensor,
    rejected_scores: Tensor,
    margin: Tensor | None = None,
    center_coef: float = 0.0,
) -> tuple[Tensor, Stats]:
    """Reward-model loss under the Bradley–Terry model: ``−log σ(r_c − r_r − m)``, mean over
    pairs. ``margin`` (B,) asks for a larger gap on pairs rated far apart (Llama 2);
    ``center_coef`` adds ``coef·mean((r_c + r_r)²)`` to keep scores centred on 0
    (Eisenstein et al. 2023).

    Args:
        chosen_scores, rejected_scores: (B,) scalar rewards of the two responses.
    Stats: ``accuracy``, ``margin_mean``, ``chosen_mean``, ``rejected_mean``.
    """
    gap = chosen_scores - rejected_scores
    target_gap = gap if margin is None else gap - margin
    loss = -F.logsigmoid(target_gap).mean()
    if center_coef:
        loss = loss + center_coef * ((chosen_scores + rejected_scores) ** 2).mean()
    return loss, {
        "accuracy": (gap > 0).float().mean().detach(),
        "margin_mean": gap.mean().detach(),
        "chosen_mean": chosen_scores.mean().detach(),
        "rejected_mean": rejected_scores.mean().detach(),
    }


def ranking_loss(scores: Tensor, ranking: Tensor) -> tuple[Tensor, Stats]:
    """InstructGPT's K-way loss: Bradley–Terry over all C(K,2) pairs of each ranking, averaged.

    Args:
        scores: (B, K) rewards of K responses to each prompt.
        ranking: (B, K) rank of each response, 0 the best; equal ranks are ties and form no pair.
    Stats: ``accuracy`` over the ranked pairs, ``pairs`` (their count).
    """
    better = ranking.unsqueeze(2) < ranking.unsqueeze(1)  # (B, K, K): i ranked above j
    gaps = scores.unsqueeze(2) - scores.unsqueeze(1)
    if not bool(better.any()):
        raise ValueError("the rankings hold no ordered pair (all tied)")
    loss = -F.logsigmoid(gaps[better]).mean()
    return loss, {
        "accuracy": (gaps[better] > 0).float().mean().detach(),
        "pairs": better.sum().float().detach(),  # a count: exact in float32 up to 2^24
    }


def dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, Stats]:
    """DPO (Rafailov et al. 2023): ``−log σ(β·[(π_c − ref_c) − (π_r − ref_r)])``.

    ``label_smoothing`` = ε > 0 is conservative DPO (cDPO): the label is flipped with
    probability ε, ``−(1−ε)·log σ(βh) − ε·log σ(−βh)``.

    Args: (B,) summed log-probabilities of each response under the policy and the reference.
    Stats: ``rewards/chosen`` = β(π_c − ref_c), ``rewards/rejected``, ``rewards/margins``,
    ``rewards/accuracies``.
    """
    chosen_rewards = beta * (policy_chosen_logps - ref_chosen_logps)
    rejected_rewards = beta * (policy_rejected_logps - ref_rejected_logps)
    h = chosen_rewards - rejected_rewards
    losses = -(1 - label_smoothing) * F.logsigmoid(h) - label_smoothing * F.logsigmoid(-h)
    return losses.mean(), _preference_stats(chosen_rewards, rejected_rewards, "rewards/")


def ipo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float,
) -> tuple[Tensor, Stats]:
    """IPO (Azar et al. 2023): ``(h − 1/(2β))²`` with
    ``h = (π_c − ref_c) − (π_r − ref_r)``; regresses the log-ratio gap to a finite target
    instead of pushing it to infinity. Pass length-averaged log-probs to follow TRL.
    Stats as ``dpo_loss``."""
    h = (policy_chosen_logps - ref_chosen_logps) - (policy_rejected_logps - ref_rejected_logps)
    losses = (h - 1 / (2 * beta)) ** 2
    return losses.mean(), _preference_stats(
        beta * (policy_chosen_logps - ref_chosen_logps),
        beta * (policy_rejected_logps - ref_rejected_logps),
        "rewards/",
    )


def simpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    beta: float,
    gamma_beta_ratio: float,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, Stats]:
    """SimPO (Meng et al. 2024), reference-free:
    ``−log σ(β·(π̄_c − π̄_r) − γ)`` with ``γ = gamma_beta_ratio·β``, where π̄ is the
    length-averaged log-probability of a response (the caller averages).
    Stats: ``rewards/*`` with reward β·π̄."""
    h = beta * (policy_chosen_logps - policy_rejected_logps - gamma_beta_ratio)
    losses = -(1 - label_smoothing) * F.logsigmoid(h) - label_smoothing * F.logsigmoid(-h)
    return losses.mean(), _preference_stats(
        beta * policy_chosen_logps, beta * policy_rejected_logps, "rewards/"
    )


def sft_loss(logits: Tensor, labels: Tensor, mask: Tensor) -> tuple[Tensor, Stats]:
    """Next-token cross-entropy over the masked tokens (completion only, typically).

    Args:
        logits: (B, T, V) already aligned so ``logits[:, t]`` predicts ``labels[:, t]``.
        labels: (B, T) target ids (any value at masked positions).
        mask: (B, T) 1 where the token counts.
    Stats: ``loss``, ``tokens`` (valid token count).
    """
    safe_labels = torch.where(mask.bool(), labels, 0)
    nll = -logprobs_from_logits(logits, safe_labels)
    loss = masked_mean(nll, mask)
    return loss, {
        "loss": loss.detach(),
        "tokens": mask.sum().float().detach(),
    }  # float32 even for bf16 logits
