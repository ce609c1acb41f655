"""Load a causal language model (``AutoModelForCausalLM``) from a hub id or a local directory.

Options map one to one onto transformers: ``dtype`` (``"float32"``, ``"bfloat16"``,
``"float16"``, ``"float64"`` or ``"auto"``), ``attn_implementation`` (``"eager"``, ``"sdpa"``,
``"flash_attention_2"``; None lets transformers choose), gradient checkpointing
(non-reentrant, so it composes with LoRA and frozen embeddings), and ``trust_remote_code``,
which stays off unless the user turns it on. Dropout is disabled in every model loaded for
RLHF: with dropout on, the log-probs of the same tokens differ between the rollout and the
update, and the PPO ratio is no longer 1 at the first step.

A policy, reference or teacher must be a causal LM whose LM head came from its checkpoint:
transformers loads a reward model (a sequence classifier) or a transformer body as a causal LM
with a random LM head and only warns, and a run would then distill towards noise. The config's
recorded architecture refuses such a checkpoint before any weight loads (``check_causal_lm``);
a head reported missing at load time refuses the rest (``check_lm_head``; a head tied to the
input embeddings is never saved apart, and is fine). A model object given to the Python API is
judged by its class.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from proxrl.models.lora import (
    adapter_base,
    adapter_config,
    adapter_head_modules,
    is_peft_model,
    merge_adapter,
)
from proxrl.models.tokenizer import check_model_source
from proxrl.runtime import objects
from proxrl.runtime.errors import ProxrlError

if TYPE_CHECKING:  # transformers loads with the first model or tokenizer, not with a config
    from transformers import PreTrainedModel

DTYPES: Mapping[str, torch.dtype | str] = MappingProxyType(
    {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
        "float64": torch.float64,
        "auto": "auto",
    }
)


NOTHING_MISSING: Mapping[str, list[str]] = MappingProxyType(
    {"missing_keys": [], "unexpected_keys": []}
)
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
    role: str = "model",
) -> PreTrainedModel:
    """A causal LM ready for RLHF: dropout off, optional gradient checkpointing. A checkpoint
    that is not a causal LM with its LM head is refused in one line that names ``role`` (the
    config field it was given as): by its config before any weight loads, else by its load
    report."""
    check_causal_lm(name_or_path, role, trust_remote_code)
    kwargs = from_pretrained_kwargs(dtype, attn_implementation, trust_remote_code)
    from transformers import AutoModelForCausalLM

    model, info = load_pretrained(
        AutoModelForCausalLM, name_or_path, output_loading_info=True, **kwargs
    )
    check_lm_head(model, info, name_or_path, role)
    prepare_for_training(model, gradient_checkpointing)
    return model


NOT_A_CAUSAL_LM = "not a causal LM with its LM head"

OTHER_HEADS = MappingProxyType(
    {
        "ForTokenClassification": "a token classifier",
        "ForQuestionAnswering": "a question-answering model",
        "ForMultipleChoice": "a multiple-choice model",
    }
)
"""Class-name endings of transformers models with a head other than an LM head."""


def other_head(architecture: str, config: Any = None) -> str | None:
    """What a model of class ``architecture`` is, in words, when it is known not to be a causal
    LM (a classifier, a transformer body without a head); None for a causal LM or a class not
    known here (a model with remote code: its load report decides)."""
    if architecture.endswith("ForSequenceClassification"):
        labels = getattr(config, "num_labels", None)
        return (
            "a scalar-head reward model"
            if labels == 1
            else f"a sequence classifier, {labels} labels"
        )
    for ending, kind in OTHER_HEADS.items():
        if architecture.endswith(ending):
            return kind
    if architecture in _transformer_bodies():
        return "a transformer body without an LM head"
    return None


@functools.cache
def _transformer_bodies() -> frozenset[str]:
    """transformers' bare model classes (``LlamaModel``) that are not also a causal LM."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_MAPPING_NAMES,
    )

    def names(mapping: Any) -> set[str]:
        return {n for v in mapping.values() for n in ((v,) if isinstance(v, str) else v)}

    return frozenset(names(MODEL_MAPPING_NAMES) - names(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))


def check_causal_lm(
    name_or_path: str, role: str = "model", trust_remote_code: bool = False
) -> None:
    """Refuse, before any weight loads, a model for ``role`` (a policy, reference or teacher)
    that is not a causal LM: a checkpoint whose config records only classes with another head
    (``architectures``), a LoRA adapter trained for a sequence classifier or on such a base, or
    a model object (``runtime.objects``) without an output embedding. A source that cannot be
    read is left to the loader, which says why."""
    what = _not_causal_lm(name_or_path, trust_remote_code)
    if what is not None:
        raise ProxrlError(f"{role}: {name_or_path} is {what}, {NOT_A_CAUSAL_LM}")


def _not_causal_lm(name_or_path: str, trust_remote_code: bool) -> str | None:
    """What ``name_or_path`` is ("a LlamaForSequenceClassification checkpoint (a scalar-head
    reward model)") when it is known not to be a causal LM, else None."""
    if objects.is_handle(name_or_path):
        model = objects.lookup(name_or_path)
        inner = model.get_base_model() if is_peft_model(model) else model
        output = getattr(inner, "get_output_embeddings", None)
        if output is not None and output() is not None:
            return None
        name = type(inner).__name__
        kind = other_head(name, getattr(inner, "config", None)) or "no LM head"
        return f"a {name} object ({kind})"
    try:
        check_model_source(name_or_path)
    except ProxrlError:
        return None  # (the loader says what is wrong with the source)
    path = os.path.expanduser(name_or_path)
    adapter = adapter_config(path)
    if adapter is not None:
        if str(adapter.get("task_type") or "").upper() == "SEQ_CLS":
            return "a LoRA adapter for a sequence classifier (task_type SEQ_CLS)"
        base = adapter.get("base_model_name_or_path")
        under = _not_causal_lm(str(base), trust_remote_code) if base else None
        return None if under is None else f"a LoRA adapter on {base}, {under}"
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return None
    saved = [a for a in getattr(config, "architectures", None) or [] if isinstance(a, str)]
    kinds = [other_head(a, config) for a in saved]
    if not saved or not all(kinds):
        return None
    return f"a {saved[0]} checkpoint ({kinds[0]})"


def check_lm_head(
    model: nn.Module, info: dict[str, Any], name_or_path: str, role: str = "model"
) -> None:
    """Refuse a loaded causal LM whose LM head the checkpoint lacked (``info``:
    ``output_loading_info``, whose ``missing_keys`` transformers filled with random weights).
    A head tied to the input embeddings is never saved apart: it came with the embeddings."""
    head = model.get_output_embeddings()
    if head is None:
        return
    weight = getattr(head, "weight", None)
    if weight is not None and weight is getattr(model.get_input_embeddings(), "weight", None):
        return
    names = {
        f"{name}.{p}"
        for name, module in model.named_modules()
        if module is head
        for p in ("weight", "bias")
    }
    missing = sorted(names & set(info.get("missing_keys") or ()))
    if not missing:
        return
    saved = [a for a in getattr(model.config, "architectures", None) or [] if isinstance(a, str)]
    kind = f"a {saved[0]} checkpoint" if saved else "a checkpoint"
    raise ProxrlError(
        f"{role}: {name_or_path} is {kind} without {missing[0]} (its LM head would be newly "
        f"initialised), {NOT_A_CAUSAL_LM}"
    )


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
