"""proxrl: RLHF centred on PPO. ``proxrl.core`` is the pure math; the Python API
(``proxrl.train``, ``proxrl.sft`` … ``proxrl.grpo``, ``proxrl.config``,
``proxrl.TrainingClient``) is ``proxrl.api``, imported on first use so that ``import
proxrl.core`` needs only torch."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Run", "TrainingClient", "config", "dpo", "grpo", "ppo", "rm", "sft", "train"]


def __getattr__(name: str) -> Any:
    if name in __all__:  # imported by name: the package (and mypy's check of core) stays light
        return getattr(importlib.import_module("proxrl.api"), name)
    raise AttributeError(f"module 'proxrl' has no attribute {name!r}")
