"""The one prompt schedule of the online loop: which prompts an iteration (or a dynamic-sampling
round, or a batch launched ahead) samples, and on which process.

The data position is a pure function of the draw number, so a resumed run samples what the
uninterrupted one would."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from proxrl.runtime import distributed as dist


def prompt_order(n_prompts: int, batch: int, draw: int, seed: int) -> list[int]:
    """The prompt indices of batch ``draw`` (0-based): a fresh seeded permutation per pass over
    the data."""
    start = draw * batch
    order: list[int] = []
    while len(order) < batch:
        epoch, offset = divmod(start + len(order), n_prompts)
        permutation = torch.randperm(
            n_prompts, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)
        ).tolist()
        order.extend(permutation[offset : offset + batch - len(order)])
    return order


def per_response(prompts: list[int], group_size: int) -> list[int]:
    """Each prompt repeated once per response of its group (a group's rows consecutive)."""
    return [i for i in prompts for _ in range(group_size)]


@dataclass(frozen=True)
class PromptDraw:
    """One batch of the schedule, as the processes share it."""

    local: list[int]  # (rollout_batch_size / world,) the prompts this process samples
    rows: list[int]  # (rollout_batch_size · G,) the prompt of each row of the gathered rollout:
    # rank 0's rows first, as ``gather.gather_rollout`` joins them


def draw_prompts(n_prompts: int, batch: int, draw: int, seed: int, group_size: int) -> PromptDraw:
    """Batch ``draw`` of the schedule: rank r samples prompts r, r + world, …"""
    order = prompt_order(n_prompts, batch, draw, seed)
    world = dist.world_size()
    gathered = [i for r in range(world) for i in order[r::world]]
    return PromptDraw(dist.shard(order), per_response(gathered, group_size))
