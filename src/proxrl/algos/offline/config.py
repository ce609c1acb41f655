"""What the offline trainers (SFT, reward model, DPO family) share before the loop: the config
fields every one of them takes and the model/data set-up helpers."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Annotated, Any, TypeVar

import torch
from torch import nn

from proxrl.data.encoding import OVERLONG, Overlong
from proxrl.data.readers import check_data_source
from proxrl.models.context import model_context
from proxrl.models.lora import apply_lora
from proxrl.models.options import ModelRunConfig
from proxrl.models.tokenizer import check_model_source
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.fields import Range

log = logging.getLogger(__name__)

C = TypeVar("C", bound="OfflineConfig")


@dataclass
class OfflineConfig(ModelRunConfig):
    """Fields shared by ``proxrl sft``, ``proxrl rm`` and ``proxrl dpo``."""

    model: str = ""
    """Hub id or local directory of the model to start from."""
    data: str = ""
    """Training data: a .jsonl/.json/.csv/.parquet file, a saved datasets directory, or a datasets
    hub name (name or name:split)."""
    eval_data: str | None = None
    """Held-out data in the same format (default: hold out eval_fraction of data)."""
    eval_fraction: Annotated[float, Range(ge=0, lt=1)] = 0.0
    """Share of data held out for evaluation when eval_data is not given (0: no evaluation)."""
    max_length: Annotated[int, Range(ge=2)] = 512
    """Longest prompt + response, in tokens; longer examples follow the overlong policy."""
    overlong: Overlong = "truncate"
    """What to do with an example longer than max_length: cut its end, or drop it (counted in the
    log)."""
    batch_size: Annotated[int, Range(ge=1)] = 8
    """Examples per forward pass; one optimizer step sees batch_size × grad_accum examples."""
    grad_accum: Annotated[int, Range(ge=1)] = 1
    """Micro-batches accumulated into one optimizer step."""
    epochs: Annotated[int, Range(ge=1)] = 1
    """Passes over the training data."""
    save_every: int = 500
    """Save a checkpoint every this many optimizer steps (0: only at the end; an exception
    saves the last finished one either way), as TRL's Trainer does by default."""
    max_steps: Annotated[int, Range(ge=0)] = 0
    """Stop after this many optimizer steps (0: run every epoch)."""
    weight_decay: Annotated[float, Range(ge=0)] = 0.0
    """AdamW weight decay."""
    warmup_steps: Annotated[int, Range(ge=0)] = 0
    """Linear warm-up from 0 to learning_rate over this many steps."""
    log_every: Annotated[int, Range(ge=1)] = 1
    """Write metrics every this many optimizer steps."""
    eval_every: Annotated[int, Range(ge=0)] = 0
    """Evaluate every this many optimizer steps (0: only at the end)."""

    @property
    def examples_per_step(self) -> int:
        """Examples (or packed rows) one optimizer step sees: batch_size × grad_accum."""
        return self.batch_size * self.grad_accum

    def validate(self) -> None:
        super().validate()
        if not self.model:
            raise ProxrlError("model: expected a hub id or a local directory")
        if not self.data:
            raise ProxrlError("data: expected a data file, directory or datasets name")
        for name in ("model", "data", "eval_data"):
            source = getattr(self, name)
            try:
                if source and name == "model":
                    check_model_source(source)
                elif source:
                    check_data_source(source)
            except ProxrlError as exc:
                raise ProxrlError(f"{name}: {exc}") from None


# ------------------------------------------------------------------------------------------
# Setup helpers


def fit_to_context(cfg: C) -> C:
    """``cfg`` with ``max_length`` held to the model's context, saying so: a longer example
    then follows the ``overlong`` policy at the context (a longer sequence would fail mid-run in
    a learned-position model, and run past the trained positions in a rotary one). A copy: the
    run keeps, writes and compares on ``--resume`` the options as they were given."""
    context = model_context(cfg.model, cfg.trust_remote_code)
    if context is None or cfg.max_length <= context:
        return cfg
    log.warning(
        "max_length %d is longer than the model's context (%d positions, its config.json): "
        "max_length is %d for this run; longer examples are %s",
        cfg.max_length,
        context,
        context,
        "dropped" if OVERLONG.trait(cfg.overlong, "drops") else "cut at it",
    )
    return replace(cfg, max_length=context)


def maybe_lora(model: nn.Module, cfg: OfflineConfig, task: str = "causal_lm") -> nn.Module:
    """Wrap with LoRA when ``cfg.lora_r > 0``."""
    if cfg.lora_r == 0:
        return model
    return apply_lora(model, cfg.lora_r, cfg.lora_alpha or None, task=task)


def split_eval(items: list[Any], fraction: float, seed: int) -> tuple[list[Any], list[Any]]:
    """Hold out ``fraction`` of ``items`` (at least one when fraction > 0), chosen by ``seed``."""
    if fraction <= 0:
        return items, []
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(items), generator=generator).tolist()
    n_eval = max(1, round(fraction * len(items)))
    if n_eval >= len(items):
        raise ProxrlError(
            f"eval_fraction={fraction} leaves no training example out of {len(items)}"
        )
    held = set(order[:n_eval])
    return [x for i, x in enumerate(items) if i not in held], [items[i] for i in order[:n_eval]]
