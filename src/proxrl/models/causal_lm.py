"""Load a causal language model (``AutoModelForCausalLM``) from a hub id or a local directory.

Options map one to one onto transformers: ``dtype`` (``"float32"``, ``"bfloat16"``,
``"float16"``, ``"float64"`` or ``"auto"``), ``attn_implementation`` (``"eager"``, ``"sdpa"``,
``"flash_attention_2"``; None lets transformers choose), gradient checkpointing
(non-reentrant, so it composes with LoRA and frozen embeddings), and ``trust_remote_code``,
which stays off unless the user turns it on. Dropout is disabled in every model loaded for
RLHF: with dropout on, the log-probs of the same tokens differ between the rollout and the
update, and the PPO ratio is no longer 1 at the first step.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from proxrl.models.lora import adapter_base, adapter_head_modules, merge_adapter
from proxrl.models.tokenizer import check_model_source
from proxrl.runtime import objects
from proxrl.runtime.errors import ProxrlError

if TYPE_CHECKING:  # transformers loads with the first model or tokenizer, not with a config
    from transformers import PreTrainedModel

DTYPES: dict[str, torch.dtype | str] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float64": torch.float64,
    "auto": "auto",
}


NOTHING_MISSING: dict[str, list[str]] = {"missing_keys": [], "unexpected_keys": []}
"""``output_loading_info`` of a model used as it is (nothing was loaded, nothing is missing)."""


def resolve_dtype(name: str) -> torch.dtype | str:
    """``"bf16"`` → ``torch.bfloat16``; an unknown name is a one-line error."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ProxrlError(f"dtype: expected one of {sorted(DTYPES)}, got '{name}'") from None


def from_pretrained_kwargs(
    dtype: str, attn_implementation: str | None, trust_remote_code: bool
) -> dict[str, Any]:
    """The keyword arguments every ``from_pretrained`` call here shares (transformers 5 names:
    ``dtype``, not the deprecated ``torch_dtype``)."""
    kwargs: dict[str, Any] = {"dtype": resolve_dtype(dtype), "trust_remote_code": trust_remote_code}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    return kwargs


def load_pretrained(auto_class: Any, name_or_path: str, **kwargs: Any) -> Any:
    """``auto_class.from_pretrained`` with a one-line error for a bad path or hub id. A handle
    of a model given to the Python API (``runtime.objects``) is that model when it is what
    ``auto_class`` builds for its config; otherwise its saved copy is loaded as a directory. A
    directory or hub repository that holds a LoRA adapter loads as its base with the adapter
    merged in (``models.lora``); with ``output_loading_info`` the head the adapter saves in full
    is not reported missing."""
    if objects.is_handle(name_or_path):
        model = objects.lookup(name_or_path)
        if isinstance(model, auto_class._model_mapping.get(type(model.config), ())):
            model = objects.take_model(name_or_path)
            return (model, NOTHING_MISSING) if kwargs.get("output_loading_info") else model
        name_or_path = objects.saved_copy(name_or_path)
    check_model_source(name_or_path)
    path = os.path.expanduser(name_or_path)
    base = adapter_base(path)
    if base is not None:
        return load_adapted(auto_class, name_or_path, base, **kwargs)
    try:
        return auto_class.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ProxrlError(f"cannot load a model from '{name_or_path}': {first_line}") from exc


ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


def load_adapted(auto_class: Any, name_or_path: str, base: str, **kwargs: Any) -> Any:
    """The adapter in ``name_or_path`` merged into its ``base`` (loaded as
    ``load_pretrained`` loads any model)."""
    path = os.path.expanduser(name_or_path)
    if not base:
        raise ProxrlError(
            f"model '{name_or_path}' holds a LoRA adapter that names no base model "
            "(base_model_name_or_path in adapter_config.json)"
        )
    weights = [os.path.join(path, name) for name in ADAPTER_WEIGHTS]
    if os.path.isdir(path) and not any(os.path.isfile(w) for w in weights):
        raise ProxrlError(
            f"model '{name_or_path}' holds adapter_config.json but no adapter weights "
            f"({' or '.join(ADAPTER_WEIGHTS)})"
        )
    try:
        loaded = load_pretrained(auto_class, base, **kwargs)
    except ProxrlError as exc:
        raise ProxrlError(f"model '{name_or_path}' is a LoRA adapter on '{base}': {exc}") from exc
    model, info = loaded if kwargs.get("output_loading_info") else (loaded, None)
    try:
        model = merge_adapter(model, path)
    except (OSError, ValueError, RuntimeError) as exc:  # shapes of another base, a bad file
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        message = f"cannot load the LoRA adapter in '{name_or_path}': {first_line}"
        raise ProxrlError(message) from exc
    if info is None:
        return model
    heads = adapter_head_modules(path)
    info["missing_keys"] = [
        key for key in info["missing_keys"] if not any(key.startswith(f"{h}.") for h in heads)
    ]
    return model, info


def load_causal_lm(
    name_or_path: str,
    *,
    dtype: str = "float32",
    attn_implementation: str | None = None,
    gradient_checkpointing: bool = False,
    trust_remote_code: bool = False,
) -> PreTrainedModel:
    """A causal LM ready for RLHF: dropout off, optional gradient checkpointing."""
    kwargs = from_pretrained_kwargs(dtype, attn_implementation, trust_remote_code)
    from transformers import AutoModelForCausalLM

    model = load_pretrained(AutoModelForCausalLM, name_or_path, **kwargs)
    prepare_for_training(model, gradient_checkpointing)
    return model


def prepare_for_training(model: PreTrainedModel, gradient_checkpointing: bool) -> None:
    """Disable dropout; turn on non-reentrant gradient checkpointing (which needs the KV cache
    off)."""
    disable_dropout(model)
    if gradient_checkpointing:
        kwargs = {"use_reentrant": False}
        enable = getattr(model, "activation_checkpointing_enable", None)  # the name since 5.x
        if enable is not None:
            enable(kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        model.config.use_cache = False


def disable_dropout(model: nn.Module) -> None:
    """Set every dropout probability to 0: ``nn.Dropout`` modules, functional attention dropout
    stored on modules (``attention_dropout``), and the config fields that would re-create them."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        for attribute in ("attention_dropout", "dropout", "dropout_p"):
            if isinstance(getattr(module, attribute, None), float):
                setattr(module, attribute, 0.0)
    config = getattr(model, "config", None)
    if config is not None:
        for key, value in list(vars(config).items()):
            if "dropout" in key and isinstance(value, float):
                setattr(config, key, 0.0)
