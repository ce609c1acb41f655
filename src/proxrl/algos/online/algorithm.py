"""The ``Algorithm`` record: the small, explicit choices that make one online algorithm differ
from another (how advantages are estimated, the policy loss, where the KL is paid, the critic),
and ``surrogate``, the policy loss a config names, bound to its knobs."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from proxrl.algos.online.critic import CriticLoader, NoCritic
from proxrl.core import OFF_POLICY_MASKS, POLICY_LOSSES, AdaptiveKL, masked_mean
from proxrl.rollout.experience import Experience

if TYPE_CHECKING:
    from proxrl.algos.online.config import OnlineConfig


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


PolicyLoss = Callable[[Tensor, Experience], tuple[Tensor, dict[str, Tensor]]]
RUN_GENERATOR: ContextVar[torch.Generator | None] = ContextVar("run_generator", default=None)
"""While an update runs, the generator a policy loss that draws at random (clip_cov) draws
from: seeded from the run's (``update.loss_generator``), so a resumed run draws the same."""


def run_generator() -> torch.Generator | None:
    """``RUN_GENERATOR``'s value. The losses call this function rather than read the ContextVar:
    a loss is pickled by value into Ray's trainer actor (placement ray), and a ContextVar it
    named would be pickled with it (it cannot be); a module function is pickled by name."""
    return RUN_GENERATOR.get()


def surrogate(cfg: OnlineConfig) -> PolicyLoss:
    """The policy loss ``cfg.policy_loss`` names (``core.POLICY_LOSSES``), bound to cfg's knobs
    (its ``PolicyLossSettings`` fields) and aggregation, after the ``cfg.off_policy_mask``
    (``core.OFF_POLICY_MASKS``) has zeroed the advantage of the tokens it drops (stat
    ``off_policy_masked``: their share of the valid tokens)."""
    loss = POLICY_LOSSES[cfg.policy_loss]
    masking = None if cfg.off_policy_mask == "none" else OFF_POLICY_MASKS[cfg.off_policy_mask]

    def policy_loss(logprobs: Tensor, mb: Experience) -> tuple[Tensor, dict[str, Tensor]]:
        mask, advantages = mb.loss_mask.float(), mb.advantages
        generator = run_generator()
        if masking is None:
            return loss(logprobs, mb.logprobs, advantages, mask, cfg, cfg.aggregation, generator)  # type: ignore[arg-type]
        keep = masking(logprobs.detach(), mb.logprobs, advantages, mask, cfg)
        advantages = advantages * keep  # type: ignore[operator]
        result, stats = loss(
            logprobs, mb.logprobs, advantages, mask, cfg, cfg.aggregation, generator
        )  # type: ignore[arg-type]
        stats["off_policy_masked"] = masked_mean(1 - keep, mask).detach()
        return result, stats

    return policy_loss
