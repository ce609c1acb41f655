"""The advantage stage of the online loop: the algorithm's estimator, run once per iteration
over the rows the update trains on (after any dynamic-sampling filter, so whitening and batch
baselines see only that batch), then a teacher's per-token term (on-policy distillation)."""

from __future__ import annotations

from dataclasses import replace

from torch import Tensor

from proxrl.algos.online.algorithm import Algorithm
from proxrl.algos.online.distill_fields import DistillFields
from proxrl.core import DISTILL_LOSSES
from proxrl.rollout.experience import Experience


def estimate(
    algo: Algorithm, experience: Experience, kl_coef: float, distill: DistillFields | None = None
) -> Experience:
    """``experience`` with the per-token rewards, advantages and returns of ``algo``'s estimator
    at the KL coefficient ``kl_coef``; with a teacher (``distill``'s options), its
    ``distill_loss``'s advantage term added to every estimator's advantages alike."""
    rewards, advantages, returns = algo.estimate(experience, kl_coef)
    if distill is not None and distill.distills:
        advantages = advantages + teacher_term(distill, experience)
    return replace(experience, rewards=rewards, advantages=advantages, returns=returns)


def teacher_term(distill: DistillFields, experience: Experience) -> Tensor:
    """(B, T) what the teacher adds to each sampled token's advantage: reverse_kl_reward's
    −λ·KL_t(π_old‖π_teacher) after the estimator (any baseline, whitening or critic sees only
    the task reward, and λ stays in nats per token, as slime's ``--use-opd``), or 0 for a
    loss-side distill_loss (gjsd). The critic's targets (returns) stay the task's."""
    term = DISTILL_LOSSES[distill.distill_loss].advantage
    mask = experience.loss_mask.float()
    if term is None:
        return mask.new_zeros(())
    if experience.logprobs is None or experience.teacher_logprobs is None:
        raise ValueError("a teacher's advantage term needs the rollout's log π_old and log π_T")
    return term(
        experience.logprobs,
        experience.teacher_logprobs,
        mask,
        distill.distill_coef,
        distill.distill_kl_estimator,
    )
