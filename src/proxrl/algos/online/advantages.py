"""The advantage stage of the online loop: the algorithm's estimator, run once per iteration
over the rows the update trains on (after any dynamic-sampling filter, so whitening and batch
baselines see only that batch)."""

from __future__ import annotations

from dataclasses import replace

from proxrl.algos.online.algorithm import Algorithm
from proxrl.rollout.experience import Experience


def estimate(algo: Algorithm, experience: Experience, kl_coef: float) -> Experience:
    """``experience`` with the per-token rewards, advantages and returns of ``algo``'s estimator
    at the KL coefficient ``kl_coef``."""
    rewards, advantages, returns = algo.estimate(experience, kl_coef)
    return replace(experience, rewards=rewards, advantages=advantages, returns=returns)
