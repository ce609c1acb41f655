"""PPO for language models with four models: actor, critic, reference and reward.

Papers: Schulman et al. 2017 (PPO), Ziegler et al. 2019 and Ouyang et al. 2022 (InstructGPT)
for the RLHF form, Huang et al. 2024 ("The N+ implementation details of RLHF with PPO").

The score of a response is paid at its last token and the KL to the reference at every token
(``shaped_rewards``); advantages are GAE over the response; the surrogate is PPO-Clip,
PPO-Penalty (adaptive β on KL(π_old‖π)) or both. Where this departs from the papers:
- advantages are whitened over the whole rollout batch, not per minibatch (as TRL does);
- log-probs are recomputed by a forward pass after sampling rather than taken from the
  sampler, so the ratio is exactly 1 on the first minibatch;
- the critic is either a separate model (initialised from the reward model by default, as in
  InstructGPT) or a zero-initialised value head on the policy's last hidden state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Literal

from torch import Tensor

from proxrl.algos.online.algorithm import Algorithm, surrogate
from proxrl.algos.online.config import OnlineConfig
from proxrl.algos.online.critic import CRITICS, CriticSettings
from proxrl.algos.online.loop import train_online
from proxrl.core import (
    AdaptiveKL,
    aggregate_loss,
    gae,
    kl_k3,
    masked_whiten,
    ppo_penalty_loss,
    shaped_rewards,
)
from proxrl.rollout.experience import Experience
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.fields import Range, alias


@dataclass
class Config(OnlineConfig):
    """proxrl ppo: PPO with a critic, KL-shaped rewards and GAE."""

    ppo_epochs: Annotated[int, alias("num_iterations", "num_ppo_epochs")] = 4
    """Passes over each rollout batch."""
    surrogate: Literal["clip", "penalty", "clip+penalty"] = "clip"
    """PPO-Clip (or the policy_loss chosen), PPO-Penalty (adaptive β on KL(π_old‖π)), or the
    clipped surrogate plus the penalty."""
    penalty_beta: Annotated[float, Range(ge=0)] = 1.0
    """Initial β of PPO-Penalty (the paper starts at 1)."""
    penalty_target: Annotated[float, Range(gt=0)] = 0.01
    """d_targ of PPO-Penalty's adaptive rule (halve β below d_targ/1.5, double it above
    1.5·d_targ)."""
    gamma: Annotated[float, Range(ge=0, le=1)] = 1.0
    """Discount over response tokens."""
    lam: Annotated[float, Range(ge=0, le=1)] = 0.95
    """GAE λ."""
    whiten_rewards: bool = False
    """Scale per-token rewards to unit variance over the batch (mean kept)."""
    whiten_advantages: bool = True
    """Normalise advantages to mean 0, std 1 over the batch."""
    critic: CriticChoice = "separate"
    """A separate value model (placement ray: in a critic actor of its own), or a value head on
    the policy's backbone (part of the policy, in its process)."""
    critic_model: str | None = None
    """Where the separate critic starts: the (first) reward model (default; else the policy),
    policy, a model directory or hub id, or an earlier ppo run's directory (its critic/: warm
    start)."""
    critic_learning_rate: Annotated[float, Range(gt=0)] = 1e-5
    """Critic learning rate (AdamW)."""
    vf_coef: Annotated[float, Range(ge=0)] = 0.1
    """Weight of the value loss."""
    value_clip: Annotated[float | None, Range(gt=0)] = 0.2
    """Clip value predictions to ±value_clip around the rollout's values (None: off)."""
    critic_warmup_iterations: Annotated[int, Range(ge=0)] = 0
    """Train only the critic for this many first iterations."""

    def validate(self) -> None:
        super().validate()
        if self.surrogate == "penalty" and self.policy_loss != "ppo":
            raise ProxrlError(
                f"policy_loss: surrogate penalty is PPO-Penalty; {self.policy_loss} needs "
                "surrogate clip or clip+penalty"
            )
        if self.critic_model is not None and self.critic == "head":
            raise ProxrlError("critic_model: only with critic=separate (a value head starts at 0)")
        if self.critic_warmup_iterations >= self.iterations:
            raise ProxrlError("critic_warmup_iterations: must be fewer than iterations")
        if "penalty" in self.surrogate and self.penalty_beta == 0:
            raise ProxrlError(
                f"penalty_beta: surrogate={self.surrogate} doubles or halves β, so it cannot "
                "start from 0"
            )


CriticChoice = CRITICS.literal()


def gae_estimate(cfg: Config, exp: Experience, kl_coef: float) -> tuple[Tensor, Tensor, Tensor]:
    """PPO's estimator: KL-shaped per-token rewards (whitened if asked), GAE over the critic's
    values, advantages whitened over the batch if asked. → (rewards, advantages, returns)."""
    mask = exp.loss_mask.float()
    rewards = shaped_rewards(
        exp.scores, exp.logprobs, exp.ref_logprobs, mask, kl_coef, cfg.kl_estimator
    )
    if cfg.whiten_rewards:
        rewards = masked_whiten(rewards, mask, shift_mean=False)
    advantages, returns = gae(rewards, exp.values, mask, cfg.gamma, cfg.lam)
    if cfg.whiten_advantages:
        advantages = masked_whiten(advantages, mask)
    return rewards, advantages, returns


PolicyLoss = Callable[[Tensor, Experience], tuple[Tensor, dict[str, Tensor]]]


def _clip(cfg: Config, clipped: PolicyLoss, penalty: AdaptiveKL | None) -> PolicyLoss:
    return clipped


def _penalty(cfg: Config, clipped: PolicyLoss, penalty: AdaptiveKL | None) -> PolicyLoss:
    assert penalty is not None

    def loss(logprobs: Tensor, mb: Experience) -> tuple[Tensor, dict[str, Tensor]]:
        mask = mb.loss_mask.float()
        return ppo_penalty_loss(
            logprobs, mb.logprobs, mb.advantages, mask, penalty.value, cfg.aggregation
        )

    return loss


def _clip_plus_penalty(cfg: Config, clipped: PolicyLoss, penalty: AdaptiveKL | None) -> PolicyLoss:
    assert penalty is not None

    def loss(logprobs: Tensor, mb: Experience) -> tuple[Tensor, dict[str, Tensor]]:
        total, stats = clipped(logprobs, mb)
        # β·KL(π_old‖π), k3 of r = π/π_old
        kl = aggregate_loss(kl_k3(mb.logprobs, logprobs), mb.loss_mask.float(), cfg.aggregation)
        return total + penalty.value * kl, stats

    return loss


PPO_SURROGATES: dict[str, Callable[[Config, PolicyLoss, AdaptiveKL | None], PolicyLoss]] = {
    "clip": _clip,
    "penalty": _penalty,
    "clip+penalty": _clip_plus_penalty,
}
"""``surrogate`` → (config, the clipped policy loss, PPO-Penalty's β or None) → the loss."""


def build(cfg: Config) -> Algorithm:
    estimate = partial(gae_estimate, cfg)
    penalty = (
        AdaptiveKL(cfg.penalty_beta, cfg.penalty_target) if "penalty" in cfg.surrogate else None
    )
    policy_loss = PPO_SURROGATES[cfg.surrogate](cfg, surrogate(cfg), penalty)
    settings = CriticSettings(
        learning_rate=cfg.critic_learning_rate,
        vf_coef=cfg.vf_coef,
        value_clip=cfg.value_clip,
        warmup_iterations=cfg.critic_warmup_iterations,
        source=cfg.critic_model,
        packed=bool(cfg.max_tokens_per_micro_batch),
    )
    return Algorithm(
        name="ppo",
        estimate=estimate,
        policy_loss=policy_loss,
        critic=partial(CRITICS[cfg.critic], settings),
        penalty=penalty,
    )


def train(cfg: Config) -> dict[str, float]:
    return train_online(cfg, build(cfg))
