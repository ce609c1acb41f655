"""Shared-prefix passes: a group's prompt forwarded once (Prefix Grouper, Liu et al. 2025,
arXiv 2506.05433; Unsloth's shared-prefix GRPO).

The G responses to one prompt repeat it in every pass over prompt + response: G·(P + T) tokens
where P + G·T would do. Here the distinct prompts of a batch run once (``use_cache``), their
keys and values are indexed out to every row that shares them, and the rows' responses run
against that cache: each response token attends to its prompt's keys and values and to its own
earlier tokens, exactly as in the full forward. The index is a gather, so the gradient that
reaches a prompt's keys and values is the sum over the rows that read them, as the repeated
forward's G copies would give; the results are the repeated forward's up to float rounding.

Where it cannot apply, the caller runs the repeated forward: no two rows share a prompt, the
model gives no cache (a model under gradient checkpointing while training drops it, and would
append to it twice when it recomputes a layer), or the run has several processes (``can_share``).
The results equal the repeated forward's to float rounding, not to the bit: π_old, π_ref and π
computed on other batchings (or on weights that take no gradient, whose CPU kernels differ)
agree to that rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from proxrl.rollout.generation import cache_keyword, distinct_rows
from proxrl.runtime import distributed as dist


@dataclass(frozen=True)
class PromptGroups:
    """The rows of a batch grouped by their prompt."""

    firsts: Tensor  # (U,) int64 the first row of each distinct prompt, in row order
    inverse: Tensor  # (B,) int64 which of the U distinct prompts each row has


def prompt_groups(
    input_ids: Tensor, attention_mask: Tensor, prompt_length: int
) -> PromptGroups | None:
    """The distinct prompts of (B, P + T) rows (the first ``prompt_length`` ids and mask
    columns, left padding included: the sampler's ``distinct_rows``), or None where no two rows
    share one."""
    found = distinct_rows(input_ids[:, :prompt_length], attention_mask[:, :prompt_length])
    return None if found is None else PromptGroups(*found)


def drops_its_cache(model: nn.Module) -> bool:
    """Whether ``model`` (any wrapper of a transformers model) runs under gradient checkpointing
    while training: transformers then drops ``use_cache``."""
    for module in model.modules():
        if getattr(module, "gradient_checkpointing", False) and module.training:
            return True
    return False


def unshared_reason(
    processes: int, checkpointing: bool, packing: int = 0, alone: bool = False
) -> str | None:
    """Why a run's passes repeat each prompt although ``shared_prefix`` is on, in a few words, or
    None where a group's prompt may be forwarded once: several ``processes`` (ranks whose
    micro-batches share prompts differently would call a sharded model's forward a different
    number of times, and FSDP's gathers would wait on each other), ``checkpointing`` (gradient
    checkpointing, ``drops_its_cache``), ``packing`` (packed micro-batches of at most that many
    tokens lay rows end to end), ``alone`` (one response per prompt: nothing to share)."""
    if processes > 1:
        return f"{processes} processes"
    if checkpointing:
        return "gradient_checkpointing drops the prompt's cache"
    if packing:
        return f"max_tokens_per_micro_batch {packing} packs rows end to end"
    if alone:
        return "group_size 1: no two responses share a prompt"
    return None


def can_share(model: nn.Module) -> bool:
    """Whether a pass of ``model`` may forward shared prompts once (``unshared_reason``): in
    one process only, and not under gradient checkpointing."""
    return unshared_reason(dist.world_size(), drops_its_cache(model)) is None


def shared_prefix_inputs(
    input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, prompt_length: int
) -> tuple[PromptGroups, dict[str, Any]] | None:
    """The groups and the prefix call's inputs (the U distinct prompts, ``use_cache``), or
    None where no two rows share a prompt."""
    groups = prompt_groups(input_ids, attention_mask, prompt_length)
    if groups is None:
        return None
    first, P = groups.firsts, prompt_length
    prefix = {
        "input_ids": input_ids[first, :P],
        "attention_mask": attention_mask[first, :P],
        "position_ids": position_ids[first, :P],
        "use_cache": True,
    }
    return groups, prefix


def response_inputs(
    model: nn.Module,
    cache: Any,
    groups: PromptGroups,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    prompt_length: int,
) -> dict[str, Any]:
    """The responses' call: every row's response ids against its prompt's cached keys and
    values (``cache`` indexed out to the B rows in place), the whole (B, P + T) mask."""
    cache.reorder_cache(groups.inverse)  # as the sampler gathers its prefill; a gather:
    # the backward sums the rows' gradients into the prompt's keys and values
    return {
        "input_ids": input_ids[:, prompt_length:],
        "attention_mask": attention_mask,
        "position_ids": position_ids[:, prompt_length:],
        cache_keyword(model): cache,
        "use_cache": False,
    }
