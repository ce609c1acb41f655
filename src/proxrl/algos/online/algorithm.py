"""The ``Algorithm`` record: the small, explicit choices that make one online algorithm differ
from another (how advantages are estimated, the policy loss, where the KL is paid, the critic),
and ``surrogate``, the policy loss a run names, bound to its knobs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from proxrl.algos.online.critic import CriticLoader, NoCritic
from proxrl.core import (
    BATCH_WIDE_MASKS,
    OFF_POLICY_MASKS,
    POLICY_LOSSES,
    TOKEN_SELECTIONS,
    AdaptiveKL,
    Aggregation,
    PolicyLossSettings,
    masked_mean,
)
from proxrl.rollout.experience import Experience

StepSelection = Callable[
    [Tensor, Experience, torch.Generator | None], tuple[Experience, dict[str, float]]
]
"""(log π (B, T) at an optimizer step, without gradient; the step's rows; the run's generator
for this update) → the rows with what is chosen over all of them before their micro-batches (a
batch-wide off-policy mask's tokens at advantage 0; the policy loss's ``selection``), and the
choice's stats over the step (``off_policy_masked``)."""


@dataclass
class Algorithm:
    """The small, explicit choices that make one online algorithm differ from another."""

    name: str
    estimate: Callable[[Experience, float], tuple[Tensor, Tensor, Tensor]]
    """(rollout, β) → (rewards, advantages, returns), each (B, T)."""
    policy_loss: Callable[[Tensor, Experience], tuple[Tensor, dict[str, Tensor]]]
    """(new log-probs (B, T), minibatch) → (loss, stats)."""
    kl_loss: Callable[[Tensor, Tensor], Tensor] | None = None
    """(log π (B, T), log π_ref (B, T)) → per-token KL estimate paid as β × a loss term (None:
    the KL is paid in the reward)."""
    needs_greedy: bool = False
    """Also decode each prompt greedily and score it (ReMax's baseline), in
    ``Experience.greedy_scores``."""
    critic: CriticLoader = NoCritic.load
    """Loads the critic (``critic.CRITICS[option]`` bound to its settings; none by default)."""
    penalty: AdaptiveKL | None = None
    """PPO-Penalty's adaptive β on KL(π_old‖π), updated after each iteration."""
    combine_sources: Callable[[Tensor, list[float]], Tensor] | None = None
    """((B, K) each reward source's scores, the K reward_weights) → (B,)
    ``Experience.combined_scores``, taken when the groups are scored (GDPO); None: not kept."""
    step_selection: StepSelection | None = None
    """What the policy loss chooses over a whole optimizer step before its micro-batches
    (``algorithm.step_selection``: m2po's mask, clip_cov's and kl_cov's tokens); None: nothing."""


PolicyLoss = Callable[[Tensor, Experience], tuple[Tensor, dict[str, Tensor]]]


def surrogate(policy_loss: str, knobs: PolicyLossSettings, aggregation: Aggregation) -> PolicyLoss:
    """The policy loss ``policy_loss`` names (``core.POLICY_LOSSES``), bound to its ``knobs``
    (the run's ``PolicyLossSettings`` fields) and ``aggregation``, after the knobs'
    ``off_policy_mask`` (``core.OFF_POLICY_MASKS``) has zeroed the advantage of the tokens it
    drops (stat ``off_policy_masked``: their share of the valid tokens). A batch-wide mask
    (m2po) and the loss's ``selection`` (clip_cov, kl_cov) were chosen over the whole optimizer
    step already (``step_selection``): the micro-batch's rows carry them."""
    loss = POLICY_LOSSES[policy_loss]
    per_micro_batch = knobs.off_policy_mask not in ("none", *BATCH_WIDE_MASKS)
    masking = OFF_POLICY_MASKS[knobs.off_policy_mask] if per_micro_batch else None

    def policy_loss_of(logprobs: Tensor, mb: Experience) -> tuple[Tensor, dict[str, Tensor]]:
        mask, advantages, chosen = mb.loss_mask.float(), mb.advantages, mb.loss_selection
        if masking is None:
            return loss(logprobs, mb.logprobs, advantages, mask, knobs, aggregation, chosen)  # type: ignore[arg-type]
        keep = masking(logprobs.detach(), mb.logprobs, advantages, mask, knobs)
        advantages = advantages * keep  # type: ignore[operator]
        result, stats = loss(logprobs, mb.logprobs, advantages, mask, knobs, aggregation, chosen)  # type: ignore[arg-type]
        stats["off_policy_masked"] = masked_mean(1 - keep, mask).detach()
        return result, stats

    return policy_loss_of


def step_selection(policy_loss: str, knobs: PolicyLossSettings) -> StepSelection | None:
    """What the policy loss ``policy_loss`` chooses over a whole optimizer step, before its
    micro-batches: a batch-wide off-policy mask (``core.BATCH_WIDE_MASKS``: m2po, the knobs'
    ``off_policy_mask``) zeroes its dropped tokens' advantages, then the loss's
    ``core.TOKEN_SELECTIONS`` entry (clip_cov, kl_cov) chooses its tokens (on the advantages
    the loss will see: masked and carrying the rollout correction's weights). None where the
    loss needs neither: every choice is then made per micro-batch."""
    mask_name = knobs.off_policy_mask
    masking = OFF_POLICY_MASKS[mask_name] if mask_name in BATCH_WIDE_MASKS else None
    selecting = TOKEN_SELECTIONS.get(policy_loss)
    if masking is None and selecting is None:
        return None

    def select(
        logprobs: Tensor, rows: Experience, generator: torch.Generator | None
    ) -> tuple[Experience, dict[str, float]]:
        mask, stats = rows.loss_mask.float(), {}
        if masking is not None:
            keep = masking(logprobs, rows.logprobs, rows.advantages, mask, knobs)  # type: ignore[arg-type]
            rows = replace(rows, advantages=rows.advantages * keep)  # type: ignore[operator]
            stats["off_policy_masked"] = float(masked_mean(1 - keep, mask))
        if selecting is not None:
            advantages = corrected(rows).advantages
            chosen = selecting(logprobs, rows.logprobs, advantages, mask, knobs, generator)  # type: ignore[arg-type]
            rows = replace(rows, loss_selection=chosen)
        return rows, stats

    return select


def corrected(mb: Experience) -> Experience:
    """The minibatch whose advantages carry the rollout correction's weights (rollout_weights),
    the one place every algorithm's policy loss gets it.

    Every policy loss is A_t times a function of the ratio, or a max/min of such terms with the
    same A_t (PPO-Clip, dual clip, REINFORCE, PPO-Penalty's surrogate); for w_t ≥ 0 scaling A_t
    by w_t scales that token's loss by w_t, as TIS/MIS/IcePop ask, and the weights hold no
    gradient. Terms without A_t (PPO-Penalty's and clip+penalty's KL(π_old‖π)) stay unweighted.
    A masked token (w = 0) still counts in the loss's normaliser, as in IcePop's formula.
    """
    if mb.rollout_weights is None:
        return mb
    return replace(mb, advantages=mb.advantages * mb.rollout_weights)
