"""How a run lays out its forward passes: packed or padded micro-batches, a group's prompt once
or repeated. Decided once from the options and the launch, read by every pass (the rollout's
and the update's, the separate critic's, the training client's), so that they agree.

Packing (``rollout.packing``) saves a micro-batch's padding; the shared prefix
(``rollout.prefix``) saves a group's G − 1 repeats of its prompt. The packed forward lays rows
end to end and repeats each prompt, so a run has one or the other. By default (neither option
set) the shared prefix wins wherever it applies: it removes (G − 1)·P tokens of every group,
whole prompts at a user's lengths (a chat template, a system prompt, few-shot examples: 100 to
2,000 tokens), where packing removes only the gaps between ragged responses; and it removes them
from every pass. Everywhere else the default packs.
"""

from __future__ import annotations

from proxrl.algos.online.config import OnlineConfig
from proxrl.core import DISTILL_LOSSES
from proxrl.runtime import distributed as dist


def prefix_off(cfg: OnlineConfig) -> str | None:
    """Why this run's passes repeat each prompt although ``shared_prefix`` is on, or None where
    they forward a group's prompt once (``OnlineConfig.prefix_off``)."""
    return cfg.prefix_off()


def token_budget(cfg: OnlineConfig) -> int | None:
    """``rollout.packing.micro_batch_plan``'s ``max_tokens`` for this run: the option where the
    user set it (0: padded), else padded where packing cannot or should not run, else None (the
    budget from each batch's own lengths)."""
    if cfg.max_tokens_per_micro_batch is not None:
        return cfg.max_tokens_per_micro_batch
    if dist.is_sharded():  # every rank must run as many forwards as the others
        return 0
    if cfg.distills and DISTILL_LOSSES.trait(cfg.distill_loss, "logits"):  # the padded layout
        return 0
    if cfg.shares_prefix and prefix_off(cfg) is None:  # the prompt once: the larger saving
        return 0
    return None


def packs(cfg: OnlineConfig) -> bool:
    """Whether this run's micro-batches are packed (``token_budget`` not 0)."""
    return token_budget(cfg) != 0


def prefix_note(cfg: OnlineConfig) -> str | None:
    """The start-up line where ``shared_prefix`` is on but a part of the run repeats each
    prompt, or None."""
    if not cfg.shares_prefix:
        return None
    reason = prefix_off(cfg)
    if reason is not None:
        return f"shared_prefix: off for this run ({reason})"
    if cfg.compile_sampler:
        return "shared_prefix: off in the sampler for this run (compile_sampler's loop)"
    return None
