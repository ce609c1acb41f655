"""Advantage estimators: GAE for critics, group and batch baselines for the critic-free family.

Token-level functions take (B, T) tensors and a 0/1 ``mask`` of valid response tokens. Masked
positions are skipped by the backward recursions (their reward and value are never read and they
come back 0), so a response may have holes, e.g. tool output that the policy did not generate.

Group functions take (N,) scores of N/G prompts × G samples, the G samples of a prompt stored
consecutively, as every generator here produces them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from proxrl.core.kl import last_valid_index
from proxrl.core.masked import masked_whiten
from proxrl.registry import Registry

GroupAdvantages = Callable[[Tensor, int, float], Tensor]
REWARD_SCALES: Registry[GroupAdvantages] = Registry("reward scale")
"""``scale_rewards`` → ((N,) scores, group size G, eps) → (N,) group-centred advantages."""


def discounted_returns(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """Reward-to-go ``G_t = r_t + γ·G_{t+1}`` over valid tokens.

    Args:
        rewards: (B, T) per-token rewards.
        mask: (B, T) 1 at valid response tokens.
    Returns:
        (B, T) returns, 0 at masked positions.
    """
    valid = mask.bool()
    running = torch.zeros_like(rewards[:, 0])
    returns = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(valid[:, t], rewards[:, t] + gamma * running, running)
        returns[:, t] = torch.where(valid[:, t], running, 0.0)
    return returns


def gae(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float | Tensor
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over a batch of responses (Schulman et al. 2016).

    ``δ_t = r_t + γ·V_{t+1} − V_t`` and ``A_t = δ_t + γλ·A_{t+1}``, where ``t+1`` is the next
    valid token and the value after the last valid token is 0 (the response has ended).

    Args:
        rewards: (B, T) per-token rewards (e.g. from ``shaped_rewards``).
        values: (B, T) critic values V(s_t) at each response token.
        mask: (B, T) 1 at valid response tokens.
        lam: λ, a float for every response or a (B,) tensor of one λ per response (VAPO's
            length-adaptive λ: ``length_adaptive_lam``).
    Returns:
        ``(advantages, returns)``, both (B, T), 0 at masked positions; ``returns = A + V``.
    """
    if isinstance(lam, Tensor) and lam.shape != values.shape[:1]:
        raise ValueError(f"lam must be a float or ({values.shape[0]},), got {tuple(lam.shape)}")
    decay = gamma * (lam.to(values.dtype) if isinstance(lam, Tensor) else lam)
    valid = mask.bool()
    next_value = torch.zeros_like(values[:, 0])
    running = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(valid[:, t], delta + decay * running, running)
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        advantages[:, t] = torch.where(valid[:, t], running, 0.0)
    returns = torch.where(valid, advantages + values, 0.0)
    return advantages, returns


def length_adaptive_lam(mask: Tensor, alpha: float) -> Tensor:
    """VAPO's length-adaptive λ of the policy (Yue et al. 2025, eq. 8): per response
    ``λ = 1 − 1/(α·l)``, ``l`` its number of valid tokens (the model's own: pass the loss mask,
    so an episode's observation tokens do not count), clamped to [0, 1] (a response shorter
    than 1/α gets λ = 0: one-step TD; an empty one too).

    Args:
        mask: (B, T) 1 at the response's model tokens.
        alpha: α > 0 (VAPO: 0.05).
    Returns:
        (B,) λ per response, in ``mask``'s floating dtype (float32 for an integer mask).
    """
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    dtype = mask.dtype if mask.is_floating_point() else torch.float32
    lengths = mask.to(dtype).sum(dim=1)
    scaled = alpha * lengths
    lam = torch.where(scaled > 0, 1 - 1 / scaled.clamp_min(torch.finfo(dtype).tiny), 0.0)
    return lam.clamp(0.0, 1.0)


def gae_env(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    next_value: Tensor,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """GAE over a (T, N) rollout of N vectorised environments.

    Args:
        rewards: (T, N) reward received after the action at step t.
        values: (T, N) V(s_t).
        dones: (T, N) 1 where the episode ended at step t, so nothing is bootstrapped from
            s_{t+1}. For a time-limit truncation pass done=1 and add γ·V(final observation) to
            that step's reward: the episode did not really end, its value is bootstrapped.
        next_value: (N,) V(s_T), the state after the rollout's last step.
    Returns:
        ``(advantages, returns)``, both (T, N); ``returns = advantages + values``.
    """
    not_done = 1.0 - dones.to(values.dtype)
    following = torch.cat([values[1:], next_value.unsqueeze(0)])  # V(s_{t+1}), (T, N)
    # δ and the decay γλ(1 − done) for every step at once; only A_t = δ_t + decay_t·A_{t+1}
    # needs the loop (2 ops a step instead of 8: a rollout's T is 2048 on MuJoCo).
    deltas = rewards + gamma * following * not_done - values
    decays = gamma * lam * not_done
    running = torch.zeros_like(next_value)
    advantages = torch.empty_like(values)
    for t in reversed(range(values.shape[0])):
        running = deltas[t] + decays[t] * running
        advantages[t] = running
    return advantages, advantages + values


def _groups(scores: Tensor, group_size: int) -> Tensor:
    if scores.dim() != 1:
        raise ValueError(f"scores must be (N,), got shape {tuple(scores.shape)}")
    if group_size < 2:
        raise ValueError(f"group_size must be at least 2 for a group baseline, got {group_size}")
    if scores.numel() % group_size:
        raise ValueError(f"{scores.numel()} scores do not split into groups of {group_size}")
    return scores.view(-1, group_size)


def _centred(groups: Tensor) -> Tensor:
    """(P, G) scores minus their group's mean, exactly 0 in a group whose scores are all equal:
    the mean of G equal floats need not round back to them (G = 3, 5, 6, 7, ...), and ÷ a std
    of ~0 would blow that round-off up into a full-size advantage of random sign."""
    centred = groups - groups.mean(dim=1, keepdim=True)
    constant = (groups == groups[:, :1]).all(dim=1, keepdim=True)
    return torch.where(constant, torch.zeros_like(centred), centred)


@REWARD_SCALES.register("group", "÷ the group std (GRPO)")
def group_scaled_advantages(scores: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """GRPO (Shao et al. 2024): ``(s − mean_g) / (std_g + eps)``, the std of the prompt's own
    group (unbiased, as TRL). TRL ``scale_rewards="group"``. (N,) → (N,)."""
    groups = _groups(scores, group_size)
    return (_centred(groups) / (groups.std(dim=1, keepdim=True) + eps)).reshape(-1)


@REWARD_SCALES.register("batch", "÷ the batch std (Lite PPO)")
def batch_scaled_advantages(scores: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """Lite PPO (Liu et al. 2025, "Tricks or Traps?"): ``(s − mean_g) / (std_batch + eps)``,
    the group mean but the std of every score of the batch (unbiased), so a prompt that is
    nearly always right or wrong is not blown up. TRL ``scale_rewards="batch"``. (N,) → (N,)."""
    groups = _groups(scores, group_size)
    return (_centred(groups) / (scores.std() + eps)).reshape(-1)


@REWARD_SCALES.register("none", "no std: the group-centred score (Dr. GRPO)")
def group_centred_advantages(scores: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """Dr. GRPO (Liu et al. 2025): ``s − mean_g``, no std (dividing by it over-weights prompts
    that are nearly always right or wrong). TRL ``scale_rewards="none"``. ``eps`` is unused (the
    table's signature). (N,) → (N,)."""
    groups = _groups(scores, group_size)
    return _centred(groups).reshape(-1)


def rank_advantages(scores: Tensor, group_size: int) -> Tensor:
    """Rank-based group advantages: each sample's rank within its group mapped to [−1, 1].

    ``rank_i = #{j: s_j < s_i} + ½·#{j ≠ i: s_j = s_i}`` (ties share their mean rank), and
    ``A_i = 2·rank_i / (G − 1) − 1``: the worst sample gets −1, the best +1, and every group sums
    to zero. Insensitive to the reward's scale and outliers. (N,) → (N,).
    """
    groups = _groups(scores, group_size)
    below = (groups.unsqueeze(2) > groups.unsqueeze(1)).to(scores.dtype).sum(2)
    ties = (groups.unsqueeze(2) == groups.unsqueeze(1)).to(scores.dtype).sum(2) - 1
    rank = below + 0.5 * ties
    return (2 * rank / (group_size - 1) - 1).reshape(-1)


def mixed_group_advantages(
    scores: Tensor, group_size: int, rank_weight: float, eps: float = 1e-6
) -> Tensor:
    """``(1 − w)·group_scaled_advantages + w·rank_advantages``: a weighted mix of the two
    signals."""
    if not 0.0 <= rank_weight <= 1.0:
        raise ValueError(f"rank_weight must lie in [0, 1], got {rank_weight}")
    return (1 - rank_weight) * group_scaled_advantages(
        scores, group_size, eps
    ) + rank_weight * rank_advantages(scores, group_size)


def rloo_advantages(scores: Tensor, group_size: int) -> Tensor:
    """REINFORCE leave-one-out (Ahmadian et al. 2024): ``s_i − mean_{j≠i} s_j``. (N,) → (N,)."""
    groups = _groups(scores, group_size)
    others_mean = (groups.sum(dim=1, keepdim=True) - groups) / (group_size - 1)
    constant = (groups == groups[:, :1]).all(dim=1, keepdim=True)  # exactly 0, as ``_centred``
    return torch.where(constant, 0.0, groups - others_mean).reshape(-1)


def remax_advantages(scores: Tensor, greedy_scores: Tensor) -> Tensor:
    """ReMax (Li et al. 2023): the score of the prompt's greedy response is the baseline.

    Args:
        scores: (N,) scores of the sampled responses.
        greedy_scores: (N,) one per sample, or (P,) one per prompt with N = P·G consecutive
            samples per prompt.
    Returns:
        (N,) ``scores − greedy baseline``.
    """
    if greedy_scores.shape != scores.shape:
        if scores.numel() % greedy_scores.numel():
            raise ValueError(
                f"{greedy_scores.numel()} greedy scores do not divide {scores.numel()} samples"
            )
        greedy_scores = greedy_scores.repeat_interleave(scores.numel() // greedy_scores.numel())
    return scores - greedy_scores


def reinforce_pp_advantages(token_rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """REINFORCE++ (Hu 2025): reward-to-go of the KL-shaped token rewards, whitened over the
    whole batch instead of a per-prompt or learned baseline. (B, T) → (B, T), 0 where masked."""
    return masked_whiten(discounted_returns(token_rewards, mask, gamma), mask)


def reinforce_pp_baseline_advantages(
    scores: Tensor, group_size: int, kl_rewards: Tensor, mask: Tensor, gamma: float = 1.0
) -> Tensor:
    """REINFORCE++-baseline (Hu et al. 2025; OpenRLHF ``reinforce_baseline``): subtract the
    group mean from each score, pay the centred score at the last valid token on top of the
    per-token KL rewards, take the reward-to-go and whiten it over the whole batch:
    ``A_t = whiten_batch(Σ_{s≥t} γ^{s−t}·r̃_s)``, ``r̃_s = kl_s + [s = last]·(R − mean_g R)``.
    The group mean removes the prompt's difficulty; the batch whitening sets the scale without
    GRPO's per-group std.

    Args:
        scores: (N,) sequence scores, G consecutive samples per prompt.
        kl_rewards: (N, T) per-token KL rewards (−β·KL_t, 0 where masked; zeros for none).
        mask: (N, T) 1 at valid response tokens (every row needs one).
    Returns:
        (N, T) advantages, 0 where masked.
    """
    centred = group_centred_advantages(scores, group_size)
    last = last_valid_index(mask)
    rewards = torch.where(mask.bool(), kl_rewards, 0.0).scatter_add(
        1, last.unsqueeze(1), centred.to(kl_rewards.dtype).unsqueeze(1)
    )
    return masked_whiten(discounted_returns(rewards, mask, gamma), mask)


def maxrl_advantages(scores: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """MaxRL (arXiv 2602.02710; SkyRL ``maxrl``, prime-rl ``max_rl``): the group-centred score
    divided by the group's mean, ``A_i = (r_i − r̄) / (r̄ + eps)``. For pass/fail rewards r̄ is
    the prompt's success rate p, so a correct answer weighs ``(1 − p)/p``: the gradient of
    log p (maximum likelihood of success) rather than of p, which up-weights the hard prompts.
    A constant group (every r equal, r̄ = 0 included) gives exactly 0.

    Args:
        scores: (N,) rewards in [0, 1], G consecutive samples per prompt.
    Returns:
        (N,) advantages.
    Raises:
        ValueError: a negative reward (its mean could be 0 or negative: the ratio is
            meaningless there).
    """
    groups = _groups(scores, group_size)
    if bool((scores < 0).any()):
        low = float(scores.min())
        raise ValueError(f"maxrl takes rewards in [0, 1]; got {low:g}")
    return (_centred(groups) / (groups.mean(dim=1, keepdim=True) + eps)).reshape(-1)


def asymre_advantages(scores: Tensor, group_size: int, baseline_shift: float) -> Tensor:
    """AsymRE (Arnal et al. 2025, arXiv 2506.20520, "Asymmetric REINFORCE"): REINFORCE with the
    group mean shifted by δ as the baseline, ``A_i = r_i − (r̄ + δ)``. δ < 0 (e.g. −0.1) puts
    more weight on the positive samples than on the negative ones, which the paper finds
    keeps off-policy REINFORCE stable. A constant group gives exactly −δ at every sample (its
    centred score is exactly 0, as ``_centred``'s). (N,) → (N,)."""
    groups = _groups(scores, group_size)
    return (_centred(groups) - baseline_shift).reshape(-1)


def gdpo_normalised_sum(
    source_scores: Tensor, group_size: int, weights: Sequence[float], eps: float = 1e-6
) -> Tensor:
    """GDPO's combination of K rewards (``gdpo_advantages``, before the batch whitening): each
    normalised within its group, ``ñ_k = (r_k − mean_g r_k)/(std_g r_k + eps)`` (GRPO's,
    unbiased std; a constant group exactly 0), then ``s = Σ_k w_k·ñ_k``. A function of each
    group alone, so it may be taken when the groups are scored, before any is dropped.

    Args:
        source_scores: (N, K) each response's K rewards, G consecutive responses per prompt.
        weights: K weights.
    Returns:
        (N,) the weighted sum of the normalised rewards.
    """
    if source_scores.dim() != 2 or source_scores.shape[1] != len(weights):
        raise ValueError(
            f"source_scores must be (N, {len(weights)}), got {tuple(source_scores.shape)}"
        )
    normalised = torch.stack(
        [
            group_scaled_advantages(source_scores[:, k].contiguous(), group_size, eps)
            for k in range(len(weights))
        ],
        dim=1,
    )
    return normalised @ torch.as_tensor(weights, dtype=normalised.dtype)


def batch_whitened(scores: Tensor, eps: float = 1e-6) -> Tensor:
    """``(s − mean s)/(std s + eps)`` over the whole batch (unbiased std), exactly 0 where every
    score is equal. (N,) → (N,)."""
    return group_scaled_advantages(scores, scores.numel(), eps)


def gdpo_advantages(
    source_scores: Tensor, group_size: int, weights: Sequence[float], eps: float = 1e-6
) -> Tensor:
    """GDPO (arXiv 2601.05242, "Group reward-Decoupled normalization Policy Optimization"; veRL
    ``gdpo``, TRL ``multi_objective_aggregation="normalize_then_sum"``): with several rewards,
    normalise each within its group, take the weighted sum (``gdpo_normalised_sum``) and
    whiten it over the batch (``batch_whitened``). Summing the raw rewards first lets the
    reward of the widest spread drown the others, and maps different reward combinations to
    the same advantage.

    Args:
        source_scores: (N, K) each response's K rewards, G consecutive responses per prompt.
        weights: K weights.
    Returns:
        (N,) advantages.
    """
    return batch_whitened(gdpo_normalised_sum(source_scores, group_size, weights, eps), eps)
