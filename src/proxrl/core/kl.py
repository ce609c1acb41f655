"""KL divergence to the reference policy: per-token estimators, reward shaping, controllers.

The estimators follow Schulman's "Approximating KL divergence" note. With tokens sampled from π
and ``log r = log π_ref(a) − log π(a)``:
- k1 = −log r: unbiased for KL(π‖π_ref), high variance, can be negative per token;
- k2 = ½(log r)²: biased, low variance, its gradient matches the KL's to first order;
- k3 = (r − 1) − log r: unbiased, always ≥ 0, low variance when π ≈ π_ref.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from proxrl.core.masked import masked_sum
from proxrl.registry import Registry

KLEstimator = Callable[[Tensor, Tensor], Tensor]
KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator")
"""``kl_estimator`` / ``kl_loss_type`` → (log π (B, T), log π_ref (B, T)) → (B, T) per-token KL."""


@KL_ESTIMATORS.register("k1", "log π − log π_ref: unbiased, can be negative per token")
def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """``log π − log π_ref`` per token. (B, T), (B, T) → (B, T)."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2", "½(log π − log π_ref)²: biased, low variance")
def kl_k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """``½(log π − log π_ref)²`` per token. (B, T), (B, T) → (B, T)."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


@KL_ESTIMATORS.register("k3", "(r − 1) − log r, r = π_ref/π: unbiased, ≥ 0")
def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """``exp(log r) − 1 − log r`` with ``log r = log π_ref − log π``, per token; ≥ 0.

    ``expm1`` keeps it accurate (and non-negative) when the two policies are close.
    """
    log_ratio = ref_logprobs - logprobs
    return torch.expm1(log_ratio) - log_ratio


@KL_ESTIMATORS.register("k3+", "k3's value with k2's gradient (veRL's low_var_kl+)")
def kl_k3_plus(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k3's value with k2's gradient ("k3+", veRL's ``low_var_kl+``): ``k2 + sg(k3 − k2)``.

    As a loss term, k3's own gradient with respect to log π, ``1 − π_ref/π``, is a biased
    estimate of the KL's gradient when tokens come from π_old; k2's, ``log π − log π_ref``, is
    the gradient of the exact reverse KL to first order (Schulman's note; veRL #2150). The logged
    value stays the unbiased, non-negative k3. (B, T), (B, T) → (B, T)."""
    k2 = kl_k2(logprobs, ref_logprobs)
    return k2 + (kl_k3(logprobs, ref_logprobs) - k2).detach()


REWARD_KL_ESTIMATORS = KL_ESTIMATORS.names(exclude=("k3+",))
"""The estimators of the KL paid in the reward: k3+ differs from k3 only in its gradient, and a
reward carries none."""


def kl_per_token(logprobs: Tensor, ref_logprobs: Tensor, estimator: str) -> Tensor:
    """The estimator named ``estimator`` (a key of ``KL_ESTIMATORS``), for configs that choose
    one by name."""
    return KL_ESTIMATORS[estimator](logprobs, ref_logprobs)


def last_valid_index(mask: Tensor) -> Tensor:
    """(B, T) mask → (B,) index of the last 1 in each row; a row without one is an error."""
    if not bool(mask.bool().any(dim=-1).all()):
        raise ValueError("every sequence needs at least one valid token to carry its score")
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, -1).max(dim=-1).values


def shaped_rewards(
    scores: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    kl_coef: float,
    estimator: str = "k1",
) -> Tensor:
    """Per-token RLHF reward (Ziegler et al. 2019; InstructGPT): ``−β·KL_t`` at every valid
    token, plus the sequence score at the last valid token.

    Args:
        scores: (B,) reward-model or verifier score of each response.
        logprobs, ref_logprobs: (B, T) log π_old and log π_ref of the sampled tokens.
        mask: (B, T) 1 at valid response tokens.
    Returns:
        (B, T) rewards, 0 at masked positions.
    """
    kl = kl_per_token(logprobs, ref_logprobs, estimator)
    rewards = torch.where(mask.bool(), -kl_coef * kl, 0.0)
    last = last_valid_index(mask)
    return rewards.scatter_add(1, last.unsqueeze(1), scores.to(rewards.dtype).unsqueeze(1))


def rewards_at_tokens(token_rewards: Tensor, at_last: Tensor, mask: Tensor) -> Tensor:
    """Per-token rewards: each valid token's own reward, and ``at_last`` added at the last
    valid token (where ``shaped_rewards`` pays a score: a rollouts file uses it for the
    score-shaping rules' change to the sum of its per-token rewards).

    Args:
        token_rewards: (B, T) the reward of each response token.
        at_last: (B,) what the last valid token receives besides its own reward.
        mask: (B, T) 1 at valid response tokens; a reward elsewhere is dropped.
    Returns:
        (B, T) rewards, 0 at masked positions, in the promoted dtype of the two rewards.
    """
    dtype = torch.promote_types(token_rewards.dtype, at_last.dtype)
    rewards = torch.where(mask.bool(), token_rewards.to(dtype), 0.0)
    last = last_valid_index(mask).unsqueeze(1)
    return rewards.scatter_add(1, last, at_last.to(dtype).unsqueeze(1))


def sequence_kl(
    logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, estimator: str = "k1"
) -> Tensor:
    """(B,) KL of each whole response: the per-token estimate summed over valid tokens."""
    return masked_sum(kl_per_token(logprobs, ref_logprobs, estimator), mask, dim=-1)


class FixedKL:
    """A constant KL coefficient β."""

    def __init__(self, kl_coef: float) -> None:
        self.value = kl_coef

    def update(self, measured_kl: float, n_steps: int = 1) -> None:
        """A fixed coefficient ignores measurements."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKL(FixedKL):
    """PPO-Penalty's rule (Schulman et al. 2017, §4): after each update measure d = KL;
    d < d_targ/1.5 → β ← β/2; d > 1.5·d_targ → β ← 2β; otherwise β stays."""

    def __init__(self, init_kl_coef: float, target: float) -> None:
        super().__init__(init_kl_coef)
        self.target = target

    def update(self, measured_kl: float, n_steps: int = 1) -> None:
        if measured_kl < self.target / 1.5:
            self.value /= 2
        elif measured_kl > self.target * 1.5:
            self.value *= 2


class ProportionalKL(FixedKL):
    """Ziegler et al. 2019 (used by InstructGPT and early TRL): a proportional controller
    ``e = clip(KL/target − 1, −0.2, 0.2)``; ``β ← β·(1 + e·n_steps/horizon)``, where n_steps is
    the number of samples behind the measurement."""

    def __init__(self, init_kl_coef: float, target: float, horizon: int) -> None:
        super().__init__(init_kl_coef)
        self.target = target
        self.horizon = horizon

    def update(self, measured_kl: float, n_steps: int = 1) -> None:
        error = min(max(measured_kl / self.target - 1, -0.2), 0.2)
        self.value *= 1 + error * n_steps / self.horizon


KL_CONTROLLERS: Registry[Callable[[Any], FixedKL]] = Registry("KL controller")
"""``kl_controller`` → (settings with ``kl_coef`` and the entry's knobs) → the β of the KL to
the reference. Trait ``adapts``: β moves with the measured KL (the reference is needed even at
kl_coef 0)."""
KL_CONTROLLERS.add("fixed", lambda s: FixedKL(s.kl_coef), "a constant β, kl_coef")
KL_CONTROLLERS.add(
    "proportional",
    lambda s: ProportionalKL(s.kl_coef, s.kl_target, s.kl_horizon),
    "Ziegler et al.'s proportional controller towards kl_target",
    knobs=("kl_target", "kl_horizon"),
    adapts=True,
)
