"""Hugging Face plumbing: tokenizers, causal LMs, scalar-head (reward / value) models, LoRA.

Everything here returns ordinary ``transformers`` / ``peft`` objects, so what proxrl trains
loads anywhere else and what was trained elsewhere loads here.
"""

from proxrl.models.causal_lm import disable_dropout, load_causal_lm
from proxrl.models.lora import adapter_disabled, apply_lora, trainable_state_dict
from proxrl.models.scalar_head import (
    last_token_index,
    load_score_model,
    sequence_scores,
    store_score_normalization,
    token_values,
)
from proxrl.models.tokenizer import (
    load_tokenizer,
    padding_side,
    resize_for_tokenizer,
)

__all__ = [
    "adapter_disabled",
    "apply_lora",
    "disable_dropout",
    "last_token_index",
    "load_causal_lm",
    "load_score_model",
    "load_tokenizer",
    "padding_side",
    "resize_for_tokenizer",
    "sequence_scores",
    "store_score_normalization",
    "token_values",
    "trainable_state_dict",
]
