"""LoRA through ``peft``: wrap a model, read back only what trains, and run the frozen base.

A LoRA run saves a peft adapter (``adapter_config.json`` + ``adapter_model.safetensors``) that
``peft.PeftModel.from_pretrained(base, dir)`` loads. With LoRA the reference policy of DPO and
PPO is the same model with the adapter disabled (``adapter_disabled``), so no second copy of
the weights is held.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from peft import LoraConfig, PeftModel, TaskType, get_peft_model
from torch import Tensor, nn

from proxrl.runtime.checkpointer import TrainableWeights


def apply_lora(
    model: nn.Module,
    r: int,
    alpha: float | None = None,
    dropout: float = 0.0,
    target_modules: str | list[str] = "all-linear",
    task: str = "causal_lm",
) -> PeftModel:
    """Wrap ``model`` with rank-``r`` LoRA on ``target_modules`` ("all-linear": every linear
    layer but the output head). ``task="seq_cls"`` also trains the scalar head in full."""
    config = LoraConfig(
        r=r,
        lora_alpha=alpha if alpha is not None else 2 * r,
        lora_dropout=dropout,
        target_modules=target_modules,
        task_type=TaskType.SEQ_CLS if task == "seq_cls" else TaskType.CAUSAL_LM,
    )
    return get_peft_model(model, config)


def trainable_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """Only the parameters that train (all of them without LoRA; adapters + head with it):
    what a checkpoint must hold to resume, as ``runtime.checkpointer.TrainableWeights`` saves it."""
    return TrainableWeights(model).state_dict()


@contextlib.contextmanager
def adapter_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Run the base model under a peft wrapper (the reference policy); a no-op without LoRA."""
    if isinstance(model, PeftModel):
        with model.disable_adapter():
            yield model
    else:
        yield model
