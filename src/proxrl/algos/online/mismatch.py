"""The sampler/trainer mismatch of a rollout whose log π_old is the sampler's (sampler_logprobs
without a rollout correction: ``sampler: vllm``'s defaults), measured by the update at no
forward of its own: until its first optimizer step π is the weights the sampler drew from, so
that step's forward, kept detached, is the trainer's log π_old at the step's rows. With a
rollout correction the rollout's own pass measures it, over every row (``collect``)."""

from __future__ import annotations

import torch
from torch import Tensor

from proxrl.algos.online.collect import mismatch_metrics
from proxrl.rollout.experience import Experience
from proxrl.rollout.forward import PolicyOutput
from proxrl.runtime import distributed as dist


class MismatchRecord:
    """log π at the rows of the update's first optimizer step, as that step's forward computes
    them (each rank its own micro-batches), to be set against the sampler's log π_old."""

    def __init__(self, experience: Experience) -> None:
        mask = experience.response_mask
        self.logprobs = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device)
        self.seen = torch.zeros(mask.shape[0], dtype=torch.float64, device=mask.device)

    def add(self, rows: Tensor, out: PolicyOutput) -> None:
        width = out.logprobs.shape[1]  # (a micro-batch is trimmed of all-pad columns)
        self.logprobs[rows, :width] = out.logprobs.detach().double()
        self.seen[rows] += 1

    def metrics(self, experience: Experience) -> dict[str, float]:
        """``core.mismatch_stats`` of the trainer's against the sampler's log-probs over the
        model's tokens of the measured rows (summed over ranks first, so every rank logs the
        whole step's, as one process would), named as the rollout correction logs them:
        ``rollout/mismatch_kl``, …; {} where no step ran."""
        logprobs, seen = (dist.all_reduce_sum(x) for x in (self.logprobs, self.seen))
        rows = seen > 0
        sampler = experience.logprobs
        if sampler is None or not bool(rows.any()):
            return {}
        return mismatch_metrics(logprobs, sampler, experience, rows)
