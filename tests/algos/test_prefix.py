"""rollout.prefix's small helpers one by one (issue 54), no model: why a run repeats the prompt
(each reason, the first one given winning), when a model drops its cache, and the two calls a
shared-prefix pass makes (the prompts' and the responses'), each value exact.
test_shared_prefix.py checks the passes themselves against the repeated forward."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from proxrl.rollout import prefix


def test_the_reason_a_run_repeats_the_prompt_the_first_one_wins():
    reason = prefix.unshared_reason
    assert reason(1, False) is None and reason(1, False, 0, False) is None
    assert reason(2, True, 64, True) == "2 processes"
    assert reason(3, False) == "3 processes"
    assert reason(1, True, 64, True) == "gradient_checkpointing drops the prompt's cache"
    assert reason(1, False, 64, True) == "max_tokens_per_micro_batch 64 packs rows end to end"
    assert reason(1, False, 1) == "max_tokens_per_micro_batch 1 packs rows end to end"
    assert reason(1, False, 0, True) == "group_size 1: no two responses share a prompt"


def _checkpointed(flag: bool | None) -> nn.Module:
    """A wrapper whose inner module has ``gradient_checkpointing`` = flag (None: no such
    attribute), as transformers sets it on the model under a peft or DDP wrapper."""
    inner = nn.Linear(1, 1)
    if flag is not None:
        inner.gradient_checkpointing = flag  # type: ignore[assignment]
    return nn.Sequential(nn.Linear(1, 1), nn.Sequential(inner))


def test_a_model_drops_its_cache_only_checkpointing_while_training():
    model = _checkpointed(True)
    assert prefix.drops_its_cache(model.train())
    assert not prefix.drops_its_cache(model.eval())
    assert not prefix.drops_its_cache(_checkpointed(False).train())
    assert not prefix.drops_its_cache(_checkpointed(None).train())


def test_a_model_shares_in_one_process_without_checkpointing(monkeypatch):
    assert prefix.can_share(_checkpointed(None).train())
    assert prefix.can_share(_checkpointed(True).eval())
    assert not prefix.can_share(_checkpointed(True).train())
    monkeypatch.setattr(prefix.dist, "world_size", lambda: 2)
    assert not prefix.can_share(_checkpointed(None).eval())


# rows 0 and 2 share a prompt (ids and mask), row 1 and row 3 have their own (row 3 the same
# ids as row 1, another mask); prompts are 3 columns, responses 2
IDS = torch.tensor([[0, 5, 6, 7, 8], [4, 5, 6, 9, 9], [0, 5, 6, 1, 2], [4, 5, 6, 3, 0]])
MASK = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1], [0, 1, 1, 1, 0]])
POSITIONS = torch.tensor([[0, 0, 1, 2, 3], [0, 1, 2, 3, 4], [0, 0, 1, 2, 3], [0, 0, 1, 2, 3]])


def test_the_prefix_call_is_each_distinct_prompt_once_with_the_cache_on():
    found = prefix.shared_prefix_inputs(IDS, MASK, POSITIONS, 3)
    assert found is not None
    groups, call = found
    assert groups.firsts.tolist() == [0, 1, 3] and groups.inverse.tolist() == [0, 1, 0, 2]
    assert set(call) == {"input_ids", "attention_mask", "position_ids", "use_cache"}
    assert call["input_ids"].tolist() == [[0, 5, 6], [4, 5, 6], [4, 5, 6]]
    assert call["attention_mask"].tolist() == [[0, 1, 1], [1, 1, 1], [0, 1, 1]]
    assert call["position_ids"].tolist() == [[0, 0, 1], [0, 1, 2], [0, 0, 1]]
    assert call["use_cache"] is True
    assert prefix.shared_prefix_inputs(IDS[:2], MASK[:2], POSITIONS[:2], 3) is None


class _Cache:
    def __init__(self) -> None:
        self.reordered: list[list[int]] = []

    def reorder_cache(self, index: torch.Tensor) -> None:
        self.reordered.append(index.tolist())


class _OldForward(nn.Module):
    def forward(self, input_ids: Any, past_key_values: Any = None) -> Any:  # transformers 4.x
        return input_ids


class _NewForward(nn.Module):
    def forward(self, input_ids: Any, cache: Any = None) -> Any:  # transformers 5.x
        return input_ids


def test_the_responses_call_reads_the_prompts_cache_gathered_to_every_row():
    groups = prefix.prompt_groups(IDS, MASK, 3)
    assert groups is not None
    for model, keyword in ((_OldForward(), "past_key_values"), (_NewForward(), "cache")):
        cache = _Cache()
        call = prefix.response_inputs(model, cache, groups, IDS, MASK, POSITIONS, 3)
        assert cache.reordered == [[0, 1, 0, 2]]
        assert set(call) == {"input_ids", "attention_mask", "position_ids", keyword, "use_cache"}
        assert call["input_ids"].tolist() == [[7, 8], [9, 9], [1, 2], [3, 0]]
        assert call["attention_mask"] is MASK  # the whole (B, P + T) mask
        assert call["position_ids"].tolist() == [[2, 3], [3, 4], [2, 3], [2, 3]]
        assert call[keyword] is cache and call["use_cache"] is False
