"""The critic-free family on the online loop: GRPO, RLOO, ReMax, REINFORCE++ and REINFORCE.

Papers: Shao et al. 2024 (GRPO, DeepSeekMath), Liu et al. 2025 (Dr. GRPO), Ahmadian et al.
2024 (RLOO), Li et al. 2023 (ReMax), Hu 2025 (REINFORCE++), Williams 1992 (REINFORCE).

What each estimator takes as its baseline, and where it pays the KL to the reference:
- ``grpo``: group mean (÷ group std unless ``group_scale="none"``, Dr. GRPO), or group ranks,
  or a mix (``rank_weight``); KL as a loss term with the k3 estimator, as in the paper;
- ``rloo``: the mean of the other samples of the prompt; KL in the sequence reward;
- ``remax``: the score of the prompt's greedy decode; KL in the sequence reward;
- ``reinforce_pp``: none — per-token KL-shaped rewards, reward-to-go, whitened over the batch;
- ``reinforce``: the batch mean; KL in the sequence reward; the plain policy-gradient loss.
All but ``reinforce`` minimise the PPO-Clip surrogate, so ``ppo_epochs > 1`` stays safe.
Departure: GRPO's KL term uses β·k3(π‖π_ref) of the current policy on tokens sampled from
π_old without importance weights (as DeepSeekMath and TRL do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import torch
from torch import Tensor

from proxrl.algos.online.loop import Algorithm, OnlineConfig, train_online
from proxrl.core import (
    discounted_returns,
    grpo_advantages,
    last_valid_index,
    mixed_group_advantages,
    policy_gradient_loss,
    ppo_clip_loss,
    rank_advantages,
    reinforce_pp_advantages,
    remax_advantages,
    rloo_advantages,
    sequence_kl,
    shaped_rewards,
)
from proxrl.rollout.experience import Experience
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.fields import Range

GROUP_ESTIMATORS = ("grpo", "rloo")


@dataclass
class Config(OnlineConfig):
    """proxrl grpo: critic-free policy optimisation with a group or batch baseline."""

    estimator: Literal["grpo", "rloo", "remax", "reinforce_pp", "reinforce"] = "grpo"
    """Which baseline and loss: grpo, rloo, remax, reinforce_pp or reinforce."""
    group_size: int = 4
    """Responses sampled per prompt (at least 2 for grpo and rloo)."""
    group_scale: Literal["std", "none"] = "std"
    """grpo: divide by the group std (std), or only subtract the mean (none: Dr. GRPO)."""
    rank_weight: Annotated[float, Range(ge=0, le=1)] = 0.0
    """grpo: weight of the rank-based advantage mixed with the normalised one (1: ranks only)."""
    kl_coef: float = 0.0
    """Coefficient β of the KL to the reference (grpo: in the loss; the others: in the reward)."""
    gamma: Annotated[float, Range(ge=0, le=1)] = 1.0
    """reinforce_pp: discount of the reward-to-go."""

    def validate(self) -> None:
        if self.estimator in GROUP_ESTIMATORS and self.group_size < 2:
            raise ProxrlError(
                f"group_size: {self.estimator} needs at least 2 samples per prompt, "
                f"got {self.group_size}"
            )
        super().validate()


def _per_token(sequence_advantages: Tensor, mask: Tensor) -> Tensor:
    return sequence_advantages.unsqueeze(1) * mask


def build(cfg: Config) -> Algorithm:
    def estimate(exp: Experience, kl_coef: float) -> tuple[Tensor, Tensor, Tensor]:
        mask = exp.response_mask.float()
        if cfg.estimator == "reinforce_pp":
            rewards = shaped_rewards(
                exp.scores, exp.logprobs, exp.ref_logprobs, mask, kl_coef, cfg.kl_estimator
            )
            return (
                rewards,
                reinforce_pp_advantages(rewards, mask, cfg.gamma),
                discounted_returns(rewards, mask, cfg.gamma),
            )
        if cfg.estimator == "grpo":  # KL is paid in the loss
            returns = exp.scores
            if cfg.rank_weight == 1:
                advantages = rank_advantages(returns, cfg.group_size)
            elif cfg.rank_weight:
                advantages = mixed_group_advantages(returns, cfg.group_size, cfg.rank_weight)
            else:
                advantages = grpo_advantages(returns, cfg.group_size, cfg.group_scale)
        else:
            returns = exp.scores - kl_coef * sequence_kl(
                exp.logprobs, exp.ref_logprobs, mask, cfg.kl_estimator
            )
            if cfg.estimator == "rloo":
                advantages = rloo_advantages(returns, cfg.group_size)
            elif cfg.estimator == "remax":
                if exp.greedy_scores is None:
                    raise ValueError(
                        "remax: the rollout carries no greedy_scores "
                        "(Algorithm.needs_greedy is off)"
                    )
                advantages = remax_advantages(returns, exp.greedy_scores)
            else:
                advantages = returns - returns.mean()
        # The sequence return sits at the last token, as a per-token reward would.
        rewards = torch.zeros_like(mask).scatter(
            1, last_valid_index(mask).unsqueeze(1), returns.unsqueeze(1)
        )
        return rewards, _per_token(advantages, mask), _per_token(returns, mask)

    def policy_loss(logprobs: Tensor, mb: Experience) -> tuple[Tensor, dict[str, Tensor]]:
        mask = mb.response_mask.float()
        if cfg.estimator == "reinforce":
            return policy_gradient_loss(logprobs, mb.advantages, mask, cfg.loss_agg)
        return ppo_clip_loss(
            logprobs,
            mb.logprobs,
            mb.advantages,
            mask,
            cfg.clip,
            cfg.clip_high,
            cfg.dual_clip,
            cfg.loss_agg,
        )

    return Algorithm(
        name=cfg.estimator,
        estimate=estimate,
        policy_loss=policy_loss,
        kl_in_loss=cfg.estimator == "grpo",
        needs_greedy=cfg.estimator == "remax",
    )


def train(cfg: Config) -> dict[str, float]:
    return train_online(cfg, build(cfg))
