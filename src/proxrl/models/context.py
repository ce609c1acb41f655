"""How many positions a model attends over (its context), read from its config: what the
trainers hold their sequence lengths to before any training (issue 40: a longer sequence was
an IndexError mid-run in a learned-position model such as GPT-2, and silently past the trained
range in a rotary one such as Llama)."""

from __future__ import annotations

import os
from typing import Any

from proxrl.models.lora import adapter_base
from proxrl.models.tokenizer import check_model_source
from proxrl.runtime import objects
from proxrl.runtime.errors import ProxrlError

CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length")
"""Where transformers' configs record the context, asked in this order (GPT-2: n_positions)."""


def context_of(config: Any) -> int | None:
    """The context of a transformers ``config`` (its text model's, for a multimodal one), or
    None when it records none."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in CONTEXT_FIELDS:
        value = getattr(text, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def model_context(name_or_path: str, trust_remote_code: bool = False) -> int | None:
    """The context of the model in ``name_or_path`` (a directory, a hub id, a directory that
    holds a LoRA adapter, or a model given to the Python API), read from its config without
    loading weights; None when it records none or cannot be read (its loader then says why)."""
    if objects.is_handle(name_or_path):
        config = getattr(objects.lookup(name_or_path), "config", None)
        return None if config is None else context_of(config)
    try:  # a directory that is not there, or a hub that cannot be reached: transformers would
        # retry the hub for ~25 s per lookup before giving up (twice for a LoRA adapter's base)
        check_model_source(name_or_path)
    except ProxrlError:
        return None
    base = adapter_base(os.path.expanduser(name_or_path))
    if base:
        return model_context(base, trust_remote_code)
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(
            os.path.expanduser(name_or_path), trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError):
        return None
    return context_of(config)
