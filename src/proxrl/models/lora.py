"""LoRA through ``peft``: wrap a model, read back only what trains, run the frozen base, load a
model directory (or hub repository) that holds an adapter, and save a LoRA-trained model.

One layout for every LoRA run (sft, rm, dpo, ppo, grpo): the output directory holds the
*merged* model (W + ΔW, a plain transformers model that ``from_pretrained(output_dir)`` loads
without peft) and, in ``adapter/``, the peft adapter alone (``adapter_config.json`` +
``adapter_model.safetensors``) for the model the run started from. A model directory that
holds an adapter (``adapter_config.json``: trained elsewhere, or by an older proxrl) is loaded
as its base with the adapter merged in, so every command starts from the adapted model and a
new LoRA trains on top of it. With LoRA the reference policy of DPO and PPO is the same model
with the adapter disabled (``adapter_disabled``): the starting model, adapter merged, so no
second copy of the weights is held.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from proxrl.runtime.checkpointer import TrainableWeights

if TYPE_CHECKING:  # peft and transformers load when a LoRA is made, not when a config is parsed
    from peft import PeftModel
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_SUBDIR = "adapter"

# peft reads transformers' deprecated ``is_gradient_checkpointing`` whenever it wraps a model
# (peft 0.21 with transformers 5): the value is right, the FutureWarning is noise on every run.
PEFT_DEPRECATION = r"`is_gradient_checkpointing` is deprecated"


def is_peft_model(model: object) -> bool:
    """Whether ``model`` is wrapped by peft (never, when peft was not imported: no LoRA)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


@contextlib.contextmanager
def _quiet_peft() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PEFT_DEPRECATION, category=FutureWarning)
        yield


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
    from peft import LoraConfig, TaskType, get_peft_model

    config = LoraConfig(
        r=r,
        lora_alpha=alpha if alpha is not None else 2 * r,
        lora_dropout=dropout,
        target_modules=target_modules,
        task_type=TaskType.SEQ_CLS if task == "seq_cls" else TaskType.CAUSAL_LM,
    )
    with _quiet_peft():
        return get_peft_model(model, config)


def trainable_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """Only the parameters that train (all of them without LoRA; adapters + head with it):
    what a checkpoint must hold to resume, as ``runtime.checkpointer.TrainableWeights`` saves it."""
    return TrainableWeights(model).state_dict()


@contextlib.contextmanager
def adapter_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Run the base model under a peft wrapper (the reference policy); a no-op without LoRA."""
    if is_peft_model(model):
        with model.disable_adapter():
            yield model
    else:
        yield model


# ------------------------------------------------------------------------------------------
# Loading a directory that holds an adapter


def adapter_config(name_or_path: str) -> dict[str, Any] | None:
    """The ``adapter_config.json`` of a local directory or hub repository that holds a peft
    adapter (found as transformers finds it), or None."""
    if os.path.isdir(name_or_path):
        local = os.path.join(name_or_path, ADAPTER_CONFIG)
        found = local if os.path.isfile(local) else None
    else:
        from transformers.utils.peft_utils import find_adapter_config_file

        try:
            found = find_adapter_config_file(name_or_path)
        except (OSError, ValueError):
            found = None  # the model loader reports what is wrong with the id
    if found is None:
        return None
    config = json.loads(Path(found).read_text())
    return config if isinstance(config, dict) else None


def adapter_base(name_or_path: str) -> str | None:
    """The base model of the peft adapter in ``name_or_path`` (``base_model_name_or_path``;
    "" when it names none), or None when ``name_or_path`` holds no adapter."""
    config = adapter_config(name_or_path)
    if config is None:
        return None
    base = config.get("base_model_name_or_path")
    return str(base) if base else ""


def merge_adapter(model: PreTrainedModel, path: str) -> PreTrainedModel:
    """``model`` (the adapter's base) with the adapter in ``path`` (a directory or hub id)
    merged into its weights: a plain transformers model whose every weight trains again (peft
    froze them to load)."""
    # peft's plain wrapper, whatever task the adapter was trained for: a causal-LM adapter
    # merges into a reward or value model's body as well (the task's wrappers would call
    # methods such a model lacks).
    from peft import PeftConfig, PeftModel

    config = PeftConfig.from_pretrained(path)
    config.task_type = None
    with _quiet_peft():
        merged = PeftModel.from_pretrained(model, path, config=config).merge_and_unload()
    merged.requires_grad_(True)
    # A LoRA trained on this model records it as its base: the adapted model, not the original.
    merged.name_or_path = path
    merged.config._name_or_path = path
    log.info("%s: a LoRA adapter on %s, merged into it", path, model.name_or_path)
    return merged


def adapter_head_modules(name_or_path: str) -> list[str]:
    """The modules the adapter in ``name_or_path`` saves in full (``modules_to_save``: a reward
    or value head trained with the LoRA); they are not missing from the merged model."""
    config = adapter_config(name_or_path) or {}
    return list(config.get("modules_to_save") or [])


# ------------------------------------------------------------------------------------------
# Saving


def merged_weights(model: nn.Module, deltas: bool = True) -> Iterator[tuple[str, Tensor]]:
    """The model's weights under the base model's checkpoint names; under LoRA each adapted
    weight is W + ΔW (peft's ``get_delta_weight``) and a head saved in full is its trained copy,
    computed into new tensors so the trained model itself is never merged and unmerged (which
    would round its weights). Each ΔW is computed when its weight is reached: at most one extra
    weight at a time on the model's device. ``deltas=False``: the frozen base's W alone (what an
    engine that applies the adapter itself holds)."""
    base = model.get_base_model() if is_peft_model(model) else model
    adapted: dict[str, nn.Module] = {}  # "model.layers.0.self_attn.q_proj" → its LoRA layer
    copies: dict[str, str] = {}  # "score.modules_to_save.default." → "score."
    skipped: list[str] = []  # "score.original_module."
    peft_utils = sys.modules.get("peft.utils")
    wrapper = peft_utils.ModulesToSaveWrapper if peft_utils is not None else ()
    for name, module in base.named_modules():
        if isinstance(module, wrapper):
            active = module.active_adapters[0]
            copies[f"{name}.modules_to_save.{active}."] = f"{name}."
            skipped.append(f"{name}.")
        elif hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
            adapted[name] = module
    for name, tensor in base.state_dict().items():
        copy = next((prefix for prefix in copies if name.startswith(prefix)), None)
        if copy is not None:
            yield copies[copy] + name[len(copy) :], tensor.detach()
            continue
        if ".lora_" in name or any(name.startswith(prefix) for prefix in skipped):
            continue
        name = name.replace(".base_layer", "")
        owner = name.rsplit(".", 1)[0]
        if deltas and name.endswith(".weight") and owner in adapted:
            layer: Any = adapted[owner]
            for adapter in layer.active_adapters:
                if adapter in getattr(layer, "lora_A", {}):
                    tensor = tensor + layer.get_delta_weight(adapter).to(tensor.dtype)
        yield name, tensor.detach()


def save_model(
    model: nn.Module, output_dir: str | Path, state_dict: dict[str, Tensor] | None = None
) -> None:
    """``save_pretrained`` (safetensors) of ``model`` into ``output_dir``; under LoRA the merged
    model there and the adapter alone in ``output_dir/adapter`` (the layout of every LoRA run).
    ``state_dict``: the weights to write instead of the model's own (an FSDP run's gathered
    ones, ``runtime.distributed.full_state``)."""
    output_dir = Path(output_dir)
    if not is_peft_model(model):
        model.save_pretrained(output_dir, state_dict=state_dict)
        return
    model.save_pretrained(str(output_dir / ADAPTER_SUBDIR))
    with torch.no_grad():  # each weight to the CPU as it is made: one extra on the accelerator
        state = {name: tensor.cpu() for name, tensor in merged_weights(model)}
    model.get_base_model().save_pretrained(output_dir, state_dict=state)
