"""How a language-model trainer loads its models: the options sft, rm, dpo, ppo and grpo share."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import Annotated, Any

import torch

from proxrl.models.causal_lm import resolve_dtype
from proxrl.runtime import distributed as dist
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.fields import FREE_ON_RESUME, Range
from proxrl.runtime.lr_schedule import LRScheduleChoice
from proxrl.runtime.run_config import RunConfig


@dataclass
class ModelRunConfig(RunConfig):
    """``RunConfig`` plus how models are loaded; every language-model config subclasses it."""

    learning_rate: Annotated[float, Range(gt=0)] = 1e-5
    """Peak AdamW learning rate."""
    lr_schedule: LRScheduleChoice = "linear"
    """After warm-up: keep the rate, or decay it linearly to 0 at the last step."""
    max_grad_norm: Annotated[float, Range(ge=0)] = 1.0
    """Clip the global gradient norm to this (0: no clipping)."""
    lora_r: Annotated[int, Range(ge=0)] = 0
    """LoRA rank (0: train every weight); saves the merged model plus adapter/; the reference is
    the adapter-disabled starting model."""
    lora_alpha: Annotated[float, Range(ge=0)] = 0.0
    """LoRA scale numerator (0: 2 × lora_r)."""
    dtype: str = "float32"
    """Weights dtype: float32, bfloat16, float16, float64 or auto."""
    mixed_precision: str = "no"
    """Compute precision: no (as the weights), or bf16 (matrix products in bfloat16 under autocast,
    weights, optimizer and losses in float32: TRL's bf16=True)."""
    attn_implementation: str | None = None
    """Attention kernel: eager, sdpa, flash_attention_2 (default: transformers chooses)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    trust_remote_code: bool = False
    """Run model code shipped with a hub repository (off unless you trust it)."""
    # where the model is sent, not what the run computes
    push_to_hub: Annotated[bool, FREE_ON_RESUME] = False
    """After training, upload the saved model, tokenizer and model card to the Hugging Face hub."""
    hub_model_id: Annotated[str | None, FREE_ON_RESUME] = None
    """Hub repository of push_to_hub, org/name (None: the output directory's name)."""
    hub_private: Annotated[bool, FREE_ON_RESUME] = False
    """Create the push_to_hub repository as private."""

    def validate(self) -> None:
        super().validate()
        resolve_dtype(self.dtype)
        if self.mixed_precision not in ("no", "bf16"):
            raise ProxrlError(
                f"mixed_precision: expected no or bf16, got {self.mixed_precision!r} "
                "(fp16 would need loss scaling; use bf16)"
            )

    def autocast(self) -> AbstractContextManager[None]:
        """``autocast(self.mixed_precision)``: the context every forward pass runs in."""
        return autocast(self.mixed_precision)

    def loader_kwargs(self) -> dict[str, Any]:
        """The options every ``from_pretrained`` call of a run shares."""
        return {
            "dtype": self.dtype,
            "attn_implementation": self.attn_implementation,
            "trust_remote_code": self.trust_remote_code,
        }


@contextmanager
def autocast(mixed_precision: str) -> Iterator[None]:
    """The context every forward pass runs in: bfloat16 autocast under ``mixed_precision``
    bf16 (a no-op otherwise) on this process's device and on the CPU, where
    ``offload_frozen_roles`` runs the reference and reward models. Backward passes run outside
    it."""
    enabled = mixed_precision == "bf16"
    with ExitStack() as stack:
        for device_type in {dist.device().type, "cpu"}:
            stack.enter_context(torch.autocast(device_type, dtype=torch.bfloat16, enabled=enabled))
        yield
