"""Reward-model ensembles: each member's scores put on one scale, then combined per response.

Coste et al. 2023 ("Reward Model Ensembles Help Mitigate Overoptimization") compare the mean,
the worst case (minimum) and an uncertainty-weighted mean that subtracts the members'
disagreement; here the disagreement is their standard deviation, k · std (the paper subtracts
λ · variance; the std keeps the penalty in the scores' units).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from proxrl.registry import Registry


def standardised_scores(scores: Tensor, mean: float, std: float) -> Tensor:
    """(B,) one member's scores → (B,) ``(scores − mean) / std``: in units of that member's
    own spread, so members trained to different scales weigh the same in a combination."""
    if not std > 0:
        raise ValueError(f"std must be > 0, got {std}")
    return (scores - mean) / std


def calibration_statistics(scores: Tensor) -> tuple[float, float]:
    """(B,) one member's scores on a batch → (their mean, their population std), the scale of a
    member that brings none of its own: ``standardised_scores(s, mean, std)`` then gives that
    batch mean 0 and std 1. NaN std for an empty batch; 0 for constant scores."""
    return scores.mean().item(), scores.std(correction=0).item()


def ensemble_mean(scores: Tensor) -> Tensor:
    """(K, B) members × responses → (B,) their mean."""
    return scores.mean(0)


def ensemble_min(scores: Tensor) -> Tensor:
    """(K, B) → (B,) the lowest member's score (the worst case)."""
    return scores.min(0).values


def ensemble_spread(scores: Tensor) -> Tensor:
    """(K, B) → (B,) the members' standard deviation (over K, population: divided by K), 0 for
    a single member."""
    return scores.std(0, correction=0)


def ensemble_mean_minus_std(scores: Tensor, k: float = 1.0) -> Tensor:
    """(K, B) → (B,) mean − k · std over the members: a score the members disagree on is
    trusted less."""
    return ensemble_mean(scores) - k * ensemble_spread(scores)


Combination = Callable[[Tensor, float], Tensor]
ENSEMBLE_COMBINATIONS: Registry[Combination] = Registry("reward ensemble")
"""``reward_ensemble`` → ((K, B) standardised member scores, k) → (B,) the ensemble's score."""
ENSEMBLE_COMBINATIONS.add("mean", lambda scores, k: ensemble_mean(scores), "the members' mean")
ENSEMBLE_COMBINATIONS.add(
    "min", lambda scores, k: ensemble_min(scores), "the lowest member's score (the worst case)"
)
ENSEMBLE_COMBINATIONS.add(
    "mean_minus_std",
    ensemble_mean_minus_std,
    "mean − k × the members' std (disagreement costs)",
    knobs=("reward_ensemble_std_coef",),
)
