"""The critic-free family on the online loop: GRPO, RLOO, ReMax, REINFORCE++ and REINFORCE.

Papers: Shao et al. 2024 (GRPO, DeepSeekMath), Liu et al. 2025 (Dr. GRPO), Ahmadian et al.
2024 (RLOO), Li et al. 2023 (ReMax), Hu 2025 (REINFORCE++), Williams 1992 (REINFORCE).

What each estimator takes as its baseline, and where it pays the KL to the reference:
- ``grpo``: group mean, ÷ the group std (``scale_rewards="group"``), the batch std (``batch``,
  Lite PPO) or nothing (``none``, Dr. GRPO); or group ranks, or a mix (``rank_weight``); KL as
  a loss term (``kl_loss_type``, k3 as in the paper);
- ``rloo``: the mean of the other samples of the prompt; KL in the sequence reward;
- ``remax``: the score of the prompt's greedy decode; KL in the sequence reward;
- ``reinforce_pp``: none — per-token KL-shaped rewards, reward-to-go, whitened over the batch;
- ``reinforce_pp_baseline``: the group mean subtracted from each score, then as
  ``reinforce_pp`` (OpenRLHF ``reinforce_baseline``); KL in the per-token reward;
- ``reinforce``: the batch mean; KL in the sequence reward; the plain policy-gradient loss;
- ``maxrl``: the group mean, ÷ the group mean (MaxRL, rewards in [0, 1]); KL as grpo's;
- ``asymre``: the group mean + ``baseline_shift`` (AsymRE); KL as grpo's;
- ``gdpo``: several reward sources, each normalised in its group, weighted by
  ``reward_weights``, summed, then whitened over the batch (GDPO); KL as grpo's.
All but ``reinforce`` minimise the surrogate ``policy_loss`` picks (PPO-Clip by default), so
``ppo_epochs > 1`` stays safe.
Departure: GRPO's KL term uses β·k3(π‖π_ref) of the current policy on tokens sampled from
π_old without importance weights (as DeepSeekMath and TRL do).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated

import torch
from torch import Tensor

from proxrl.algos.online.algorithm import Algorithm, step_selection, surrogate
from proxrl.algos.online.config import OnlineConfig, canonical
from proxrl.algos.online.launch import launch
from proxrl.core import (
    KL_ESTIMATORS,
    REWARD_SCALES,
    PolicyLossSettings,
    Registry,
    asymre_advantages,
    batch_whitened,
    discounted_returns,
    gdpo_normalised_sum,
    last_valid_index,
    maxrl_advantages,
    mixed_group_advantages,
    policy_gradient_loss,
    rank_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    remax_advantages,
    rloo_advantages,
    sequence_kl,
    shaped_rewards,
)
from proxrl.rollout.experience import Experience
from proxrl.rollout.vllm_sampler import EngineCache
from proxrl.runtime.config import narrowed
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.fields import Range, alias

SCALE_REWARDS_ALIASES = MappingProxyType({"std": "group"})
"""proxrl's older spelling of scale_rewards group → its name in ``core.REWARD_SCALES``."""
Estimate = tuple[Tensor, Tensor, Tensor]
ESTIMATORS: Registry[Callable[[EstimatorOptions, Experience, float], Estimate]] = Registry(
    "estimator"
)
"""``estimator`` → (the estimators' options, rollout, β) → (rewards, advantages, returns), each
(B, T).

An estimator is one function and one registration: its knobs (the fields only it reads) and
its traits, which the config's checks and ``build`` read instead of its name:
- ``group``: a baseline from the prompt's group (group_size ≥ 2);
- ``kl_in_loss``: the KL is paid as a loss term (``kl_loss_type``), not in the reward
  (``kl_estimator``);
- ``policy_gradient``: the plain policy-gradient loss, no ratio (no ``policy_loss``);
- ``needs_greedy``: the rollout carries the greedy decode's score;
- ``combines_sources``: it reads each reward source's scores apart (not from a rollouts file).
"""
KL_IN_REWARD = ("kl_estimator", "policy_loss")
"""The knobs of an estimator paying the KL in the reward with a surrogate."""
KL_IN_LOSS = ("kl_loss_type", "policy_loss")
"""The knobs of an estimator paying the KL in the loss with a surrogate."""


@dataclass
class Config(OnlineConfig):
    """proxrl grpo: critic-free policy optimisation with a group or batch baseline."""

    estimator: EstimatorChoice = "grpo"
    """Which baseline and loss: grpo, rloo, remax, reinforce_pp, reinforce_pp_baseline,
    reinforce, maxrl, asymre or gdpo."""
    group_size: int = 4
    """Responses sampled per prompt (at least 2 for grpo, rloo, reinforce_pp_baseline, maxrl,
    asymre and gdpo)."""
    scale_rewards: Annotated[ScaleRewardsChoice, alias("group_scale")] = "group"
    """grpo: divide group-centred scores by the group std (group: GRPO), the batch std (batch:
    Lite PPO) or nothing (none: Dr. GRPO); std, with the older name group_scale, means group."""
    rank_weight: Annotated[float, Range(ge=0, le=1)] = 0.0
    """grpo: weight of the rank-based advantage mixed with the normalised one (1: ranks only)."""
    kl_coef: float = 0.0
    """Coefficient β of the KL to the reference (grpo, maxrl, asymre, gdpo: in the loss; the
    others: in the reward)."""
    kl_loss_type: KLLossChoice = "k3"
    """grpo, maxrl, asymre, gdpo: estimator of the KL paid in the loss: k1, k2, k3 (unbiased,
    ≥ 0) or k3+ (k3's value, k2's gradient; veRL's low_var_kl+)."""
    gamma: Annotated[float, Range(ge=0, le=1)] = 1.0
    """reinforce_pp, reinforce_pp_baseline: discount of the reward-to-go."""
    baseline_shift: Annotated[float, Range()] = -0.1
    """asymre: δ added to the group-mean baseline, A = r − (mean + δ); δ < 0 weighs the
    positive samples more (AsymRE's −0.1)."""

    def validate(self) -> None:
        trait = functools.partial(ESTIMATORS.trait, self.estimator)
        if trait("group") and self.group_size < 2:
            raise ProxrlError(
                f"group_size: {self.estimator} needs at least 2 samples per prompt, "
                f"got {self.group_size}"
            )
        if trait("combines_sources") and self.rollouts_file is not None:
            raise ProxrlError(
                f"estimator: {self.estimator} normalises each reward source in its group; a "
                "rollouts_file brings one score per trajectory (pick grpo)"
            )
        super().validate()


@dataclass(frozen=True)
class EstimatorOptions:
    """What the estimators read of the run's options, built once with the algorithm
    (``build``, ``narrowed`` from the config); each estimator reads its own knobs of it."""

    group_size: int  # G: a prompt's responses, consecutive rows
    kl_estimator: str  # the KL paid in the reward (core.KL_ESTIMATORS)
    scale_rewards: str  # grpo: core.REWARD_SCALES' name
    rank_weight: float  # grpo
    gamma: float  # reinforce_pp, reinforce_pp_baseline
    baseline_shift: float  # asymre

    def __post_init__(self) -> None:  # the config keeps the spelling it was given ("std")
        object.__setattr__(
            self, "scale_rewards", canonical(self.scale_rewards, SCALE_REWARDS_ALIASES)
        )


def _per_token(sequence_advantages: Tensor, mask: Tensor) -> Tensor:
    return sequence_advantages.unsqueeze(1) * mask


def _at_last_token(returns: Tensor, mask: Tensor) -> Tensor:
    """The sequence return sits at the last token, as a per-token reward would (in the
    returns' dtype: a float64 run's scores on a float32 mask)."""
    return torch.zeros_like(mask, dtype=returns.dtype).scatter(
        1, last_valid_index(mask).unsqueeze(1), returns.unsqueeze(1)
    )


@ESTIMATORS.register(
    "grpo",
    "group mean baseline, scaled by scale_rewards; KL in the loss",
    knobs=(*KL_IN_LOSS, "scale_rewards", "rank_weight"),
    group=True,
    kl_in_loss=True,
)
def _grpo(options: EstimatorOptions, exp: Experience, kl_coef: float) -> Estimate:
    """Group baseline; the KL is paid in the loss, so the return is the score."""
    mask, returns = exp.loss_mask.float(), exp.scores
    if options.rank_weight == 1:
        advantages = rank_advantages(returns, options.group_size)
    elif options.rank_weight:
        advantages = mixed_group_advantages(returns, options.group_size, options.rank_weight)
    else:
        scale = REWARD_SCALES[options.scale_rewards]
        advantages = scale(returns, options.group_size)
    return _at_last_token(returns, mask), _per_token(advantages, mask), _per_token(returns, mask)


def _group_estimator(advantages_of):  # type: ignore[no-untyped-def]
    """An estimator of grpo's shape (the KL paid in the loss, the return the score) whose (N,)
    advantage is ``advantages_of(options, scores)``."""

    def estimate(options: EstimatorOptions, exp: Experience, kl_coef: float) -> Estimate:
        mask, scores = exp.loss_mask.float(), exp.scores
        advantages = advantages_of(options, scores)
        return _at_last_token(scores, mask), _per_token(advantages, mask), _per_token(scores, mask)

    return estimate


def _kl_paid_return(options: EstimatorOptions, exp: Experience, kl_coef: float) -> Tensor:
    mask = exp.loss_mask.float()
    return exp.scores - kl_coef * sequence_kl(
        exp.logprobs, exp.ref_logprobs, mask, options.kl_estimator
    )


def _sequence_estimator(baseline):  # type: ignore[no-untyped-def]
    """An estimator whose (N,) advantage is ``baseline(options, exp, returns)`` of the KL-paid
    sequence return."""

    def estimate(options: EstimatorOptions, exp: Experience, kl_coef: float) -> Estimate:
        mask = exp.loss_mask.float()
        returns = _kl_paid_return(options, exp, kl_coef)
        advantages = baseline(options, exp, returns)
        return (
            _at_last_token(returns, mask),
            _per_token(advantages, mask),
            _per_token(returns, mask),
        )

    return estimate


def _remax_baseline(options: EstimatorOptions, exp: Experience, returns: Tensor) -> Tensor:
    if exp.greedy_scores is None:
        raise ValueError(
            "remax: the rollout carries no greedy_scores (Algorithm.needs_greedy is off)"
        )
    return remax_advantages(returns, exp.greedy_scores)


def _reinforce_pp(options: EstimatorOptions, exp: Experience, kl_coef: float) -> Estimate:
    """Per-token KL-shaped rewards, reward-to-go whitened over the batch."""
    mask = exp.loss_mask.float()
    rewards = shaped_rewards(
        exp.scores, exp.logprobs, exp.ref_logprobs, mask, kl_coef, options.kl_estimator
    )
    return (
        rewards,
        reinforce_pp_advantages(rewards, mask, options.gamma),
        discounted_returns(rewards, mask, options.gamma),
    )


def _reinforce_pp_baseline(options: EstimatorOptions, exp: Experience, kl_coef: float) -> Estimate:
    """As reinforce_pp, with the group mean subtracted from each score first."""
    mask = exp.loss_mask.float()
    kl_rewards = shaped_rewards(
        torch.zeros_like(exp.scores),
        exp.logprobs,
        exp.ref_logprobs,
        mask,
        kl_coef,
        options.kl_estimator,
    )
    rewards = kl_rewards + _at_last_token(exp.scores, mask)
    return (
        rewards,
        reinforce_pp_baseline_advantages(
            exp.scores, options.group_size, kl_rewards, mask, options.gamma
        ),
        discounted_returns(rewards, mask, options.gamma),
    )


ESTIMATORS.add(
    "rloo",
    _sequence_estimator(lambda options, exp, r: rloo_advantages(r, options.group_size)),
    "the mean of the prompt's other samples; KL in the sequence reward",
    knobs=KL_IN_REWARD,
    group=True,
)
ESTIMATORS.add(
    "remax",
    _sequence_estimator(_remax_baseline),
    "the score of the prompt's greedy decode; KL in the sequence reward",
    knobs=KL_IN_REWARD,
    needs_greedy=True,
)
ESTIMATORS.add(
    "reinforce_pp",
    _reinforce_pp,
    "per-token KL rewards, reward-to-go whitened over the batch",
    knobs=(*KL_IN_REWARD, "gamma"),
)
ESTIMATORS.add(
    "reinforce_pp_baseline",
    _reinforce_pp_baseline,
    "reinforce_pp after the group mean is subtracted from each score",
    knobs=(*KL_IN_REWARD, "gamma"),
    group=True,
)
ESTIMATORS.add(
    "reinforce",
    _sequence_estimator(lambda options, exp, r: r - r.mean()),
    "the batch mean; KL in the sequence reward; the plain policy-gradient loss",
    knobs=("kl_estimator",),
    policy_gradient=True,
)


@ESTIMATORS.register(
    "maxrl",
    "group mean baseline ÷ the group mean, rewards in [0, 1] (MaxRL); KL in the loss",
    knobs=KL_IN_LOSS,
    group=True,
    kl_in_loss=True,
)
@_group_estimator
def _maxrl(options: EstimatorOptions, scores: Tensor) -> Tensor:
    try:
        return maxrl_advantages(scores, options.group_size)
    except ValueError as error:  # a reward outside [0, 1]: the run's data, not a bug
        raise ProxrlError(f"reward_fn: {error} (estimator maxrl)") from None


@ESTIMATORS.register(
    "asymre",
    "group mean + baseline_shift as the baseline (AsymRE); KL in the loss",
    knobs=(*KL_IN_LOSS, "baseline_shift"),
    group=True,
    kl_in_loss=True,
)
@_group_estimator
def _asymre(options: EstimatorOptions, scores: Tensor) -> Tensor:
    return asymre_advantages(scores, options.group_size, options.baseline_shift)


@ESTIMATORS.register(
    "gdpo",
    "each reward source normalised in its group, weighted, summed, whitened over the batch",
    knobs=KL_IN_LOSS,
    group=True,
    kl_in_loss=True,
    combines_sources=True,
)
def _gdpo(options: EstimatorOptions, exp: Experience, kl_coef: float) -> Estimate:
    """The sources' group-normalised weighted sum (taken when scored), whitened over the batch
    trained on; the return is the score, as grpo's."""
    if exp.combined_scores is None:
        raise ValueError("gdpo: the rollout carries no combined_scores (combine_sources unset)")
    mask, scores = exp.loss_mask.float(), exp.scores
    advantages = batch_whitened(exp.combined_scores)
    return _at_last_token(scores, mask), _per_token(advantages, mask), _per_token(scores, mask)


EstimatorChoice = ESTIMATORS.choice()
ScaleRewardsChoice = REWARD_SCALES.choice(aliases=SCALE_REWARDS_ALIASES)
KLLossChoice = KL_ESTIMATORS.choice()


def build(cfg: Config) -> Algorithm:
    estimate = functools.partial(ESTIMATORS[cfg.estimator], narrowed(EstimatorOptions, cfg))
    knobs = narrowed(PolicyLossSettings, cfg)

    trait = functools.partial(ESTIMATORS.trait, cfg.estimator)
    if trait("policy_gradient"):  # on-policy: no ratio to clip

        def policy_loss(logprobs: Tensor, mb: Experience) -> tuple[Tensor, dict[str, Tensor]]:
            mask = mb.loss_mask.float()
            return policy_gradient_loss(logprobs, mb.advantages, mask, cfg.aggregation)
    else:
        policy_loss = surrogate(cfg.policy_loss, knobs, cfg.aggregation)
    reinforce = trait("policy_gradient")

    return Algorithm(
        name=cfg.estimator,
        estimate=estimate,
        policy_loss=policy_loss,
        step_selection=None if reinforce else step_selection(cfg.policy_loss, knobs),
        kl_loss=KL_ESTIMATORS[cfg.kl_loss_type] if trait("kl_in_loss") else None,
        needs_greedy=trait("needs_greedy"),
        combine_sources=_gdpo_combination(cfg.group_size) if trait("combines_sources") else None,
    )


def _gdpo_combination(group_size: int) -> Callable[[Tensor, list[float]], Tensor]:
    def combine(source_scores: Tensor, weights: list[float]) -> Tensor:
        return gdpo_normalised_sum(source_scores, group_size, weights)

    return combine


def train(cfg: Config, engines: EngineCache | None = None) -> dict[str, float]:
    """Run ``cfg`` (``engines``: an ``EngineCache`` kept across a caller's runs; ``launch``)."""
    return launch(cfg, build, engines)
