"""On-policy distillation: a student samples, a teacher scores, in one of two forms.

- ``reverse_kl_reward`` (Thinking Machines' on-policy distillation, slime ``--use-opd``): each
  sampled token's advantage gets ``−λ·KL_t(π‖π_T)``, a per-token KL estimator (k1: log π −
  log π_T) of the student π_old against the teacher on that token alone (a per-token reward
  with discount 0), added to whatever the estimator made of the task reward:
  ``Â_t = A_t − λ·(log π − log π_T)``. It reads two (B, T) log-probs, never a distribution.
- ``gjsd`` (TRL's GKD, ``generalized_jsd_loss``): a supervised loss on the same samples over
  the whole vocabulary, the generalised Jensen–Shannon divergence with β: 0 = KL(π_T‖π)
  (forward), 1 = KL(π‖π_T) (reverse), between them ``β·KL(π_T‖M) + (1−β)·KL(π‖M)`` with the
  mixture ``M = β·π_T + (1−β)·π``. As TRL, the endpoints are the KLs themselves (the mixture
  form tends to 0 at either end). Computed over chunks of positions so that no (B, T, V)
  log-softmax of either model, nor their mixture, is ever held.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from proxrl.core.kl import KL_ESTIMATORS
from proxrl.registry import Registry


def distill_advantage(
    logprobs: Tensor, teacher_logprobs: Tensor, mask: Tensor, coef: float, estimator: str = "k1"
) -> Tensor:
    """The reverse-KL term added to each sampled token's advantage: ``−λ·KL_t``, with KL_t the
    ``estimator`` (``KL_ESTIMATORS``: k1 = log π − log π_T) of the student against the teacher.

    Args:
        logprobs: (B, T) log π_old(a_t|s_t) of the sampled tokens (the student that sampled).
        teacher_logprobs: (B, T) log π_T(a_t|s_t) of the same tokens under the teacher.
        mask: (B, T) 1 at the tokens the student sampled.
        coef: λ ≥ 0.
    Returns:
        (B, T) the term, 0 where masked.
    """
    kl = KL_ESTIMATORS[estimator](logprobs, teacher_logprobs)
    return torch.where(mask.bool(), -coef * kl, 0.0)


def generalized_jsd(
    student_logits: Tensor, teacher_logits: Tensor, beta: float, temperature: float = 1.0
) -> Tensor:
    """The generalised JSD at every position, both distributions whole (no chunking: the
    reference the chunked form is checked against, and its per-chunk body).

    Args:
        student_logits: (..., V) the student's unnormalised scores (they carry the gradient).
        teacher_logits: (..., V) the teacher's, at the same positions (no gradient needed).
        beta: in [0, 1]; 0 = KL(π_T‖π), 1 = KL(π‖π_T), else β·KL(π_T‖M) + (1−β)·KL(π‖M),
            M = β·π_T + (1−β)·π.
        temperature: both logits are divided by it first (TRL's GKD does the same).
    Returns:
        (...) the divergence per position, float32 at least (float64 kept).
    """
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    student = torch.log_softmax(student_logits.to(dtype) / temperature, dim=-1)
    teacher = torch.log_softmax(teacher_logits.to(dtype) / temperature, dim=-1)
    if beta == 0:
        return _kl(teacher, student)
    if beta == 1:
        return _kl(student, teacher)
    mixture = torch.logsumexp(
        torch.stack([student + math.log(1 - beta), teacher + math.log(beta)]), dim=0
    )
    return beta * _kl(teacher, mixture) + (1 - beta) * _kl(student, mixture)


def _kl(log_p: Tensor, log_q: Tensor) -> Tensor:
    """KL(p‖q) = Σ p (log p − log q) over the last dim; p = 0 contributes 0."""
    p = log_p.exp()
    return torch.where(p > 0, p * (log_p - log_q), 0.0).sum(-1)


class _ChunkedJSD(torch.autograd.Function):
    """The generalised JSD one chunk of positions at a time. Each position's divergence depends
    on its own logits row only, so a chunk's backward (run here, in the forward) gives exactly
    the rows of d JSD_t / d logits_t; they are written into one (B, T, V) buffer — the size of
    the logits' own gradient, which the backward returns scaled in place — and every chunk's
    log-softmaxes, mixture and graph are freed before the next chunk starts."""

    @staticmethod
    def forward(
        ctx: Any,
        student_logits: Tensor,
        teacher_logits: Tensor,
        beta: float,
        temperature: float,
        chunk_size: int,
    ) -> Tensor:
        width = student_logits.shape[1]
        out = torch.empty(
            student_logits.shape[:2],
            dtype=torch.promote_types(student_logits.dtype, torch.float32),
            device=student_logits.device,
        )
        grad = torch.empty_like(student_logits) if ctx.needs_input_grad[0] else None
        for start in range(0, width, chunk_size):
            columns = slice(start, start + chunk_size)
            with torch.enable_grad():
                piece = student_logits[:, columns].detach().requires_grad_(grad is not None)
                values = generalized_jsd(piece, teacher_logits[:, columns], beta, temperature)
                if grad is not None:
                    (grad[:, columns],) = torch.autograd.grad(values.sum(), piece)
            out[:, columns] = values.detach()
        ctx.save_for_backward(grad)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, None, None, None, None]:
        (grad,) = ctx.saved_tensors
        return grad.mul_(grad_out.unsqueeze(-1).to(grad.dtype)), None, None, None, None


def chunked_generalized_jsd(
    student_logits: Tensor,
    teacher_logits: Tensor,
    beta: float,
    temperature: float = 1.0,
    chunk_size: int = 64,
) -> Tensor:
    """``generalized_jsd`` per position, computed ``chunk_size`` positions (columns) at a time.

    Args:
        student_logits: (B, T, V), the gradient flows back to it.
        teacher_logits: (B, T, V), read only (detached).
        beta, temperature: as ``generalized_jsd``.
        chunk_size: positions per chunk; the largest tensor made besides the (B, T, V) gradient
            is one chunk's (B, chunk_size, V).
    Returns:
        (B, T) divergences, equal to ``generalized_jsd``'s to rounding, with its gradient.
    """
    if not 0 <= beta <= 1:
        raise ValueError(f"beta must lie in [0, 1], got {beta}")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student and teacher logits differ in shape: {tuple(student_logits.shape)} vs "
            f"{tuple(teacher_logits.shape)}"
        )
    result: Tensor = _ChunkedJSD.apply(  # type: ignore[no-untyped-call]
        student_logits, teacher_logits.detach(), beta, temperature, chunk_size
    )
    return result


class DistillLoss(NamedTuple):
    """Where a ``distill_loss`` acts: one of the two is set."""

    advantage: Callable[[Tensor, Tensor, Tensor, float, str], Tensor] | None
    """(log π_old (B, T), log π_T (B, T), mask, λ, estimator) → (B, T) added to the advantages."""
    per_token_loss: Callable[[Tensor, Tensor, float, float, int], Tensor] | None
    """(student logits (B, T, V), teacher logits, β, temperature, chunk) → (B, T), λ × its
    aggregate added to the loss."""


DISTILL_LOSSES: Registry[DistillLoss] = Registry("distillation loss")
"""``distill_loss`` → where the teacher's signal enters the update."""
DISTILL_LOSSES.add(
    "reverse_kl_reward",
    DistillLoss(distill_advantage, None),
    "−λ·KL(π‖π_T) of each sampled token added to its advantage (Thinking Machines, slime)",
    knobs=("distill_kl_estimator",),
)
DISTILL_LOSSES.add(
    "gjsd",
    DistillLoss(None, chunked_generalized_jsd),
    "full-vocabulary generalised JSD with distill_beta on the student's samples (TRL GKD)",
    knobs=("distill_beta", "distill_chunk_size"),
    logits=True,
)
