"""What the offline trainers (SFT, reward model, DPO family) share before the loop: the config
fields every one of them takes and the model/data set-up helpers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from proxrl.data.readers import check_data_source
from proxrl.models.lora import apply_lora
from proxrl.models.options import ModelRunConfig
from proxrl.models.tokenizer import check_model_source
from proxrl.runtime import distributed as dist
from proxrl.runtime.errors import ProxrlError


@dataclass
class OfflineConfig(ModelRunConfig):
    """Fields shared by ``proxrl sft``, ``proxrl rm`` and ``proxrl dpo``."""

    model: str = ""
    """Hub id or local directory of the model to start from."""
    data: str = ""
    """Training data: a .jsonl/.json/.csv/.parquet file, a saved datasets directory, or a datasets hub name (name or name:split)."""
    eval_data: str | None = None
    """Held-out data in the same format (default: hold out eval_fraction of data)."""
    eval_fraction: float = 0.0
    """Share of data held out for evaluation when eval_data is not given (0: no evaluation)."""
    max_length: int = 512
    """Longest prompt + response, in tokens; longer examples follow the overlong policy."""
    overlong: Literal["truncate", "drop"] = "truncate"
    """What to do with an example longer than max_length: cut its end, or drop it (counted in the log)."""
    batch_size: int = 8
    """Examples per forward pass; one optimizer step sees batch_size × grad_accum examples."""
    grad_accum: int = 1
    """Micro-batches accumulated into one optimizer step."""
    epochs: int = 1
    """Passes over the training data."""
    max_steps: int = 0
    """Stop after this many optimizer steps (0: run every epoch)."""
    learning_rate: float = 1e-5
    """Peak AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    warmup_steps: int = 0
    """Linear warm-up from 0 to learning_rate over this many steps."""
    lr_schedule: Literal["constant", "linear"] = "linear"
    """After warm-up: keep the rate, or decay it linearly to 0 at the last step."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this (0: no clipping)."""
    log_every: int = 1
    """Write metrics every this many optimizer steps."""
    max_consecutive_skips: int = 5
    """Stop the run after this many optimizer steps in a row skipped for a NaN/Inf loss or gradient."""
    eval_every: int = 0
    """Evaluate every this many optimizer steps (0: only at the end)."""
    progress: bool = True
    """Show a progress bar with loss and ETA."""

    @property
    def examples_per_step(self) -> int:
        """Examples (or packed rows) one optimizer step sees: batch_size × grad_accum."""
        return self.batch_size * self.grad_accum

    def validate(self) -> None:
        super().validate()
        checks = [
            (bool(self.model), "model: expected a hub id or a local directory"),
            (bool(self.data), "data: expected a data file, directory or datasets name"),
            (self.batch_size >= 1, f"batch_size: expected >= 1, got {self.batch_size}"),
            (self.grad_accum >= 1, f"grad_accum: expected >= 1, got {self.grad_accum}"),
            (self.epochs >= 1, f"epochs: expected >= 1, got {self.epochs}"),
            (self.max_steps >= 0, f"max_steps: expected >= 0, got {self.max_steps}"),
            (self.max_length >= 2, f"max_length: expected >= 2, got {self.max_length}"),
            (self.learning_rate > 0, f"learning_rate: expected > 0, got {self.learning_rate}"),
            (0 <= self.eval_fraction < 1, f"eval_fraction: expected in [0, 1), got {self.eval_fraction}"),
            (self.warmup_steps >= 0, f"warmup_steps: expected >= 0, got {self.warmup_steps}"),
            (self.log_every >= 1, f"log_every: expected >= 1, got {self.log_every}"),
            (self.eval_every >= 0, f"eval_every: expected >= 0, got {self.eval_every}"),
            (self.max_grad_norm >= 0, f"max_grad_norm: expected >= 0, got {self.max_grad_norm}"),
            (self.weight_decay >= 0, f"weight_decay: expected >= 0, got {self.weight_decay}"),
            (
                self.max_consecutive_skips >= 1,
                f"max_consecutive_skips: expected >= 1, got {self.max_consecutive_skips}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ProxrlError(message)
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


def model_kwargs(cfg: OfflineConfig) -> dict[str, Any]:
    """The loader options of ``models.load_causal_lm`` / ``load_score_model`` from a config."""
    return cfg.loader_kwargs() | {"gradient_checkpointing": cfg.gradient_checkpointing}


def training_device() -> torch.device:
    """The first GPU when there is one, else the CPU; under ``accelerate launch`` / ``torchrun``
    this process's device (``runtime.distributed``)."""
    return dist.device()


def device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


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
        raise ProxrlError(f"eval_fraction={fraction} leaves no training example out of {len(items)}")
    held = set(order[:n_eval])
    return [x for i, x in enumerate(items) if i not in held], [items[i] for i in order[:n_eval]]
