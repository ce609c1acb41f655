"""The config fields of on-policy distillation (a teacher scoring the policy's samples), shared
by ``ppo`` and ``grpo``: options on the one online loop rather than a trainer of their own, so
every estimator, placement (offload, Ray roles) and sampler (vLLM) works with a teacher."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from proxrl.core import DISTILL_LOSSES, KL_ESTIMATORS
from proxrl.registry import AppliesWith
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.fields import Range

DistillLossChoice = DISTILL_LOSSES.choice()
DistillKLChoice = KL_ESTIMATORS.choice(exclude=("k3+",))  # a per-token reward has no gradient
TEACHER = AppliesWith("teacher_model")


@dataclass
class DistillFields:
    """A teacher model and how its signal enters the update."""

    teacher_model: str | None = None
    """On-policy distillation: a causal LM with the policy's tokenizer (hub id or local
    directory) that scores every sampled token; the reward sources become optional (None: off)."""
    distill_coef: Annotated[float, Range(ge=0), TEACHER] = 1.0
    """λ of the teacher's signal: reverse_kl_reward adds −λ·KL_t(π‖π_teacher) to each token's
    advantage; gjsd adds λ × the aggregated divergence to the loss."""
    distill_loss: Annotated[DistillLossChoice, TEACHER] = "reverse_kl_reward"
    """reverse_kl_reward: the teacher's log-prob of each sampled token as a per-token reward
    (Thinking Machines, slime --use-opd); gjsd: a full-vocabulary generalised JSD on the same
    samples (TRL GKD)."""
    distill_beta: Annotated[float, Range(ge=0, le=1)] = 0.5
    """gjsd: β of the generalised JSD (0: forward KL(π_teacher‖π), 1: reverse KL(π‖π_teacher));
    TRL GKD's beta."""
    distill_kl_estimator: DistillKLChoice = "k1"
    """reverse_kl_reward: per-token estimator of KL(π‖π_teacher): k1 (log π − log π_teacher, the
    published form), k2 or k3."""
    distill_chunk_size: Annotated[int, Range(ge=1)] = 64
    """gjsd: response positions per chunk of the divergence (its memory: one chunk's
    (rows, chunk, vocabulary) at a time)."""

    @property
    def distills(self) -> bool:
        """Whether a teacher scores the samples."""
        return self.teacher_model is not None

    def validate_distill(self, packed: bool) -> None:
        """What a teacher's options need: a teacher, and the padded forward for gjsd."""
        if self.teacher_model is None:
            return
        if not self.teacher_model:
            raise ProxrlError("teacher_model: expected a hub id or a local directory")
        if DISTILL_LOSSES.trait(self.distill_loss, "logits") and packed:
            raise ProxrlError(
                f"distill_loss: {self.distill_loss} reads both models' logits in the padded "
                "layout; leave max_tokens_per_micro_batch unset or 0 (or distill_loss "
                "reverse_kl_reward)"
            )
