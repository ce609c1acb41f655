"""PPO for language models with four models: actor, critic, reference and reward.

Papers: Schulman et al. 2017 (PPO), Ziegler et al. 2019 and Ouyang et al. 2022 (InstructGPT)
for the RLHF form, Huang et al. 2024 ("The N+ implementation details of RLHF with PPO").

The score of a response is paid at its last token (a rollouts file's per-token rewards each at
its own token: ``Experience.token_rewards``) and the KL to the reference at every token
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
from typing import Annotated

import torch
from torch import Tensor

from proxrl.algos.online.algorithm import Algorithm, step_selection, surrogate
from proxrl.algos.online.config import OnlineConfig
from proxrl.algos.online.critic import CRITICS, CriticSettings
from proxrl.algos.online.launch import launch
from proxrl.algos.online.micro_batches import PassLayout, packs
from proxrl.core import (
    AdaptiveKL,
    Aggregation,
    PolicyLossSettings,
    aggregate_loss,
    gae,
    kl_k3,
    length_adaptive_lam,
    masked_whiten,
    positive_nll,
    positive_responses,
    positive_scale,
    ppo_penalty_loss,
    shaped_rewards,
)
from proxrl.registry import AppliesWith, Registry
from proxrl.rollout.experience import Experience
from proxrl.rollout.vllm_sampler import EngineCache
from proxrl.runtime.config import narrowed
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.fields import Range

PolicyLoss = Callable[[Tensor, Experience], tuple[Tensor, dict[str, Tensor]]]


def _clip(aggregation: str, clipped: PolicyLoss, penalty: AdaptiveKL | None) -> PolicyLoss:
    return clipped


def _penalty(aggregation: str, clipped: PolicyLoss, penalty: AdaptiveKL | None) -> PolicyLoss:
    assert penalty is not None

    def loss(logprobs: Tensor, mb: Experience) -> tuple[Tensor, dict[str, Tensor]]:
        mask = mb.loss_mask.float()
        return ppo_penalty_loss(
            logprobs, mb.logprobs, mb.advantages, mask, penalty.value, aggregation
        )

    return loss


def _clip_plus_penalty(
    aggregation: str, clipped: PolicyLoss, penalty: AdaptiveKL | None
) -> PolicyLoss:
    assert penalty is not None

    def loss(logprobs: Tensor, mb: Experience) -> tuple[Tensor, dict[str, Tensor]]:
        total, stats = clipped(logprobs, mb)
        # β·KL(π_old‖π), k3 of r = π/π_old
        kl = aggregate_loss(kl_k3(mb.logprobs, logprobs), mb.loss_mask.float(), aggregation)
        return total + penalty.value * kl, stats

    return loss


PPO_SURROGATES: Registry[Callable[[str, PolicyLoss, AdaptiveKL | None], PolicyLoss]] = Registry(
    "surrogate"
)
"""``surrogate`` → (the loss aggregation, the clipped policy loss, PPO-Penalty's β or None) → the
loss.
Knobs: ``policy_loss`` (the clipped loss a surrogate builds on) and PPO-Penalty's."""
PENALTY = ("penalty_beta", "penalty_target")
PPO_SURROGATES.add("clip", _clip, "PPO-Clip (or the policy_loss chosen)", knobs=("policy_loss",))
PPO_SURROGATES.add("penalty", _penalty, "PPO-Penalty: adaptive β on KL(π_old‖π)", knobs=PENALTY)
PPO_SURROGATES.add(
    "clip+penalty",
    _clip_plus_penalty,
    "the clipped surrogate plus the penalty",
    knobs=("policy_loss", *PENALTY),
)


@dataclass
class Config(OnlineConfig):
    """proxrl ppo: PPO with a critic, KL-shaped rewards and GAE."""

    ppo_epochs: int = 4
    """Passes over each rollout batch."""
    surrogate: SurrogateChoice = "clip"
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
    """GAE λ of the policy's advantages (and of the value targets unless critic_lam)."""
    critic_lam: Annotated[float | None, Range(ge=0, le=1)] = None
    """GAE λ of the critic's value targets (None: lam; VC-PPO and VAPO: 1.0, no bias from a
    critic that starts wrong at long range)."""
    length_adaptive_alpha: Annotated[float | None, Range(gt=0)] = None
    """VAPO's length-adaptive λ of the policy: λ = 1 − 1/(α·l) per response, l its model tokens,
    clamped to [0, 1] (None: off, lam; VAPO: 0.05)."""
    positive_nll_coef: Annotated[float | None, Range(ge=0)] = None
    """Weight of VAPO's NLL on the rollout's positive responses, reduced as loss_aggregation
    (token-mean: their tokens' mean) (None or 0: off; VAPO: 0.1)."""
    positive_threshold: Annotated[float | None, Range(), AppliesWith("positive_nll_coef")] = None
    """A response is positive at or above this score (None: it has the rollout's best score,
    when not all are equal; a reward model needs a threshold)."""
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
    critic_lora_r: Annotated[int | None, Range(ge=0)] = None
    """LoRA rank of the separate critic, its score head trained in full (None: lora_r, as
    OpenRLHF's --lora_rank; 0: train every critic weight)."""
    vf_coef: Annotated[float, Range(ge=0)] = 0.1
    """Weight of the value loss."""
    value_clip: Annotated[float | None, Range(gt=0)] = 0.2
    """Clip value predictions to ±value_clip around the rollout's values (None: off)."""
    critic_warmup_iterations: Annotated[int, Range(ge=0)] = 0
    """Train only the critic for this many first iterations (value pretraining, on the value
    targets of critic_lam)."""
    critic_warmup_patience: Annotated[int | None, Range(ge=1)] = None
    """End the critic's warm-up after this many iterations in a row whose value loss is not
    below its best (None: off, the whole warm-up)."""

    def validate(self) -> None:
        super().validate()
        if self.critic_warmup_iterations >= self.iterations:
            raise ProxrlError("critic_warmup_iterations: must be fewer than iterations")
        if self.critic_warmup_patience is not None and not self.critic_warmup_iterations:
            raise ProxrlError("critic_warmup_patience: needs a warm-up (critic_warmup_iterations)")
        if self.critic_warmup_patience is not None and self.ray_actors:
            raise ProxrlError(
                "critic_warmup_patience: not with placement ray (its critic actor runs the "
                "whole warm-up)"
            )
        if self.positive_nll_coef and self.positive_threshold is None and self.weighs_a_model:
            raise ProxrlError(
                "positive_threshold: positive_nll_coef with a reward model needs the score at or "
                "above which a response is positive (a learned score has no 'correct')"
            )
        if "penalty_beta" in PPO_SURROGATES.knobs(self.surrogate) and self.penalty_beta == 0:
            raise ProxrlError(
                f"penalty_beta: surrogate={self.surrogate} doubles or halves β, so it cannot "
                "start from 0"
            )

    @property
    def weighs_a_model(self) -> bool:
        """A reward model's score reaches the policy (its weight, the first, is not 0)."""
        return bool(self.reward_model) and (not self.reward_weights or self.reward_weights[0] != 0)

    @property
    def value_lam(self) -> float:
        """λ of the value targets: critic_lam, else lam."""
        return self.lam if self.critic_lam is None else self.critic_lam


CriticChoice = CRITICS.choice()
SurrogateChoice = PPO_SURROGATES.choice()


@dataclass(frozen=True)
class GAEOptions:
    """What PPO's estimator reads of the run's options, built once with the algorithm
    (``build``, ``narrowed`` from the config)."""

    kl_estimator: str  # the KL paid in the reward (core.KL_ESTIMATORS)
    whiten_rewards: bool
    gamma: float
    lam: float  # the policy's λ
    value_lam: float  # the value targets' λ (critic_lam, else lam)
    length_adaptive_alpha: float | None  # VAPO's length-adaptive λ (None: lam)
    whiten_advantages: bool


def gae_estimate(
    options: GAEOptions,
    exp: Experience,
    kl_coef: float,
    positives: PositiveExamples | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """PPO's estimator: KL-shaped per-token rewards (whitened if asked), GAE over the critic's
    values, advantages whitened over the batch if asked. → (rewards, advantages, returns).
    The task reward is the score at the last token, or a rollouts file's per-token rewards at
    their tokens (``token_rewards``: the shaping rules' change to their sum at the last).

    The policy's advantages take λ = lam, or VAPO's length-adaptive λ per response; the value
    targets take critic_lam (decoupled λ, VC-PPO): GAE runs a second time only when the two
    differ. ``positives`` learns this rollout's positive responses (positive_nll_coef)."""
    mask = exp.loss_mask.float()
    at_last = exp.scores if exp.token_rewards is None else torch.zeros_like(exp.scores)
    rewards = shaped_rewards(
        at_last, exp.logprobs, exp.ref_logprobs, mask, kl_coef, options.kl_estimator
    )
    if exp.token_rewards is not None:  # a rollouts file's rewards, each at its own token
        rewards = rewards + torch.where(mask.bool(), exp.token_rewards.to(rewards.dtype), 0.0)
    if options.whiten_rewards:
        rewards = masked_whiten(rewards, mask, shift_mean=False)
    policy_lam: float | Tensor = options.lam
    if options.length_adaptive_alpha is not None:
        policy_lam = length_adaptive_lam(mask, options.length_adaptive_alpha)
    advantages, returns = gae(rewards, exp.values, mask, options.gamma, policy_lam)
    if options.length_adaptive_alpha is not None or options.value_lam != options.lam:
        _, returns = gae(rewards, exp.values, mask, options.gamma, options.value_lam)
    if options.whiten_advantages:
        advantages = masked_whiten(advantages, mask)
    if positives is not None:
        positives.observe(exp.scores, mask)
    return rewards, advantages, returns


class PositiveExamples:
    """VAPO's positive-example NLL (``core.nll``) beside the policy loss: the estimate tells it
    each rollout's positive responses (by the score at or above which a row is positive, so a
    micro-batch's rows decide alone) and the rollout's scale; the loss adds the term.

    Rows dropped after the estimate (mask_truncated) still count in the scale."""

    def __init__(self, coef: float, threshold: float | None, agg: Aggregation) -> None:
        self.coef, self.threshold, self.agg = coef, threshold, agg
        self.cutoff: float | None = None  # a row scoring at least this is positive (None: none)
        self.scale = 0.0

    def observe(self, scores: Tensor, mask: Tensor) -> None:
        positive = positive_responses(scores, self.threshold)
        self.cutoff = float(scores[positive].min()) if bool(positive.any()) else None
        self.scale = positive_scale(mask, positive, self.agg)

    def wrap(self, loss: PolicyLoss) -> PolicyLoss:
        def with_nll(logprobs: Tensor, mb: Experience) -> tuple[Tensor, dict[str, Tensor]]:
            total, stats = loss(logprobs, mb)
            if self.cutoff is None:
                positive = torch.zeros_like(mb.scores, dtype=torch.bool)
            else:
                positive = mb.scores >= self.cutoff
            nll = positive_nll(logprobs, mb.loss_mask.float(), positive, self.scale, self.agg)
            return total + self.coef * nll, stats | {"positive_nll": nll.detach()}

        return with_nll


def build(cfg: Config) -> Algorithm:
    positives = None
    if cfg.positive_nll_coef:
        positives = PositiveExamples(cfg.positive_nll_coef, cfg.positive_threshold, cfg.aggregation)
    estimate = partial(gae_estimate, narrowed(GAEOptions, cfg), positives=positives)
    penalised = "penalty_beta" in PPO_SURROGATES.knobs(cfg.surrogate)
    penalty = AdaptiveKL(cfg.penalty_beta, cfg.penalty_target) if penalised else None
    knobs = narrowed(PolicyLossSettings, cfg)
    clipped = surrogate(cfg.policy_loss, knobs, cfg.aggregation)
    policy_loss = PPO_SURROGATES[cfg.surrogate](cfg.aggregation, clipped, penalty)
    if positives is not None:
        policy_loss = positives.wrap(policy_loss)
    settings = CriticSettings(
        learning_rate=cfg.critic_learning_rate,
        vf_coef=cfg.vf_coef,
        value_clip=cfg.value_clip,
        warmup_iterations=cfg.critic_warmup_iterations,
        warmup_patience=cfg.critic_warmup_patience,
        source=cfg.critic_model,
        packed=packs(narrowed(PassLayout, cfg, prefix_off=cfg.prefix_off())),
        shared_prefix=cfg.shares_prefix,
        lora_r=cfg.lora_r if cfg.critic_lora_r is None else cfg.critic_lora_r,
        lora_alpha=cfg.lora_alpha or None,
    )
    return Algorithm(
        name="ppo",
        estimate=estimate,
        policy_loss=policy_loss,
        critic=partial(CRITICS[cfg.critic], settings),
        penalty=penalty,
        step_selection=step_selection(cfg.policy_loss, knobs),
    )


def train(cfg: Config, engines: EngineCache | None = None) -> dict[str, float]:
    """Run ``cfg`` (``engines``: an ``EngineCache`` kept across a caller's runs; ``launch``)."""
    return launch(cfg, build, engines)
