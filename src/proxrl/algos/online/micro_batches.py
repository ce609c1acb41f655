"""How a run lays out its forward passes: packed or padded micro-batches, a group's prompt once
or repeated. Decided once from the options and the launch (``PassLayout``, built when the run
opens), read by every pass (the rollout's and the update's, the separate critic's, the training
client's), so that they agree.

Packing (``rollout.packing``) saves a micro-batch's padding; the shared prefix
(``rollout.prefix``) saves a group's G − 1 repeats of its prompt. The packed forward lays rows
end to end and repeats each prompt, so a run has one or the other. By default (neither option
set) the shared prefix wins wherever it applies: it removes (G − 1)·P tokens of every group,
whole prompts at a user's lengths (a chat template, a system prompt, few-shot examples: 100 to
2,000 tokens), where packing removes only the gaps between ragged responses; and it removes them
from every pass. Everywhere else the default packs.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxrl.core import DISTILL_LOSSES
from proxrl.runtime import distributed as dist


@dataclass(frozen=True)
class PassLayout:
    """What the passes' layout is decided from: the options of the same names, and
    ``prefix_off`` (``OnlineConfig.prefix_off``: why this run's passes repeat each prompt
    although ``shared_prefix`` is on, or None where they forward a group's prompt once),
    derived when the run opens (it reads the launch's world size)."""

    max_tokens_per_micro_batch: int | None  # as set (None: decided here)
    distills: bool  # a teacher's term joins the loss
    distill_loss: str
    shares_prefix: bool  # shared_prefix unset or true
    prefix_off: str | None
    compile_sampler: bool


def token_budget(layout: PassLayout) -> int | None:
    """``rollout.packing.micro_batch_plan``'s ``max_tokens`` for this run: the option where the
    user set it (0: padded), else padded where packing cannot or should not run, else None (the
    budget from each batch's own lengths)."""
    if layout.max_tokens_per_micro_batch is not None:
        return layout.max_tokens_per_micro_batch
    if dist.is_sharded():  # every rank must run as many forwards as the others
        return 0
    if layout.distills and DISTILL_LOSSES.trait(layout.distill_loss, "logits"):  # padded layout
        return 0
    if layout.shares_prefix and layout.prefix_off is None:  # the prompt once: the larger saving
        return 0
    return None


def packs(layout: PassLayout) -> bool:
    """Whether this run's micro-batches are packed (``token_budget`` not 0)."""
    return token_budget(layout) != 0


def prefix_note(layout: PassLayout) -> str | None:
    """The start-up line where ``shared_prefix`` is on but a part of the run repeats each
    prompt, or None."""
    if not layout.shares_prefix:
        return None
    if layout.prefix_off is not None:
        return f"shared_prefix: off for this run ({layout.prefix_off})"
    if layout.compile_sampler:
        return "shared_prefix: off in the sampler for this run (compile_sampler's loop)"
    return None
