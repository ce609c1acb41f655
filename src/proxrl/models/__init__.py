"""Hugging Face plumbing: tokenizers, causal LMs, scalar-head (reward / value) models, LoRA.

Everything here returns ordinary ``transformers`` / ``peft`` objects, so what proxrl trains
loads anywhere else and what was trained elsewhere loads here. The names below load with
their module on first use (``__getattr__``): a command's config imports ``models.options``
without pulling in the loaders, so ``--help`` and a typo are answered before transformers is
imported.
"""

from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import Any

_HOMES = MappingProxyType(
    {
        "disable_dropout": "causal_lm",
        "load_causal_lm": "causal_lm",
        "adapter_disabled": "lora",
        "apply_lora": "lora",
        "trainable_state_dict": "lora",
        "last_token_index": "scalar_head",
        "load_score_model": "scalar_head",
        "sequence_scores": "scalar_head",
        "store_score_normalization": "scalar_head",
        "token_values": "scalar_head",
        "load_tokenizer": "tokenizer",
        "padding_side": "tokenizer",
        "resize_for_tokenizer": "tokenizer",
    }
)
"""Public name → the submodule that defines it."""

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
