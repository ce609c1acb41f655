"""Several processes' rollouts joined: each rank sampled its own prompts (whole groups), and
advantages, whitening, group baselines, the KL measurement and metrics must be global."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from proxrl.core import combine_correction_stats
from proxrl.data.batching import pad_to
from proxrl.rollout.experience import Experience
from proxrl.runtime import distributed as dist


def gathered_correction_stats(stats: dict[str, float], tokens: float) -> dict[str, float]:
    """This rank's ``correction_stats`` over its ``tokens`` valid tokens → the whole rollout's,
    on every rank: token means weighted by each rank's tokens, the ratio's min and max as the
    least and greatest over ranks (``core.combine_correction_stats``)."""
    shards = dist.all_gather_objects((stats, tokens))
    return combine_correction_stats([part for part, _ in shards], [n for _, n in shards])


def gather_rollout(
    experience: Experience,
    raw_scores: torch.Tensor,
    ended: torch.Tensor,
    entropy: torch.Tensor,
    completions: list[str],
    pad_id: int,
) -> tuple[Experience, torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
    """Every rank's rollout concatenated in rank order (rows of rank 0 first), prompts re-padded
    on the left and responses on the right to the widest rank's (B, P) and (B, T)."""
    device = experience.prompt_ids.device
    local = {name: None if x is None else x.cpu() for name, x in experience.tensors().items()}
    parts = dist.all_gather_objects(
        {
            "experience": local,
            "raw_scores": raw_scores.cpu(),
            "ended": ended.cpu(),
            "entropy": entropy.cpu(),
            "completions": completions,
        }
    )
    P = max(p["experience"]["prompt_ids"].shape[1] for p in parts)
    T = max(p["experience"]["response_ids"].shape[1] for p in parts)
    columns: dict[str, Any] = {}
    for name in local:
        if local[name] is None:  # an optional field this algorithm leaves empty, on every rank
            columns[name] = None
            continue
        rows = []
        for p in parts:
            x = p["experience"][name]
            if name in ("prompt_ids", "prompt_mask"):
                x = pad_to(x, P, pad_id if name == "prompt_ids" else 0, left=True)
            elif x.dim() == 2:
                x = pad_to(x, T, pad_id if name == "response_ids" else 0, left=False)
            rows.append(x)
        columns[name] = torch.cat(rows).to(device)
    entropy_all = torch.cat([pad_to(p["entropy"], T, 0.0, left=False) for p in parts]).to(device)
    return (
        replace(experience, **columns),
        torch.cat([p["raw_scores"] for p in parts]),
        torch.cat([p["ended"] for p in parts]),
        entropy_all,
        [c for p in parts for c in p["completions"]],
    )
