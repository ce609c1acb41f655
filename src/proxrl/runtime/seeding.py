"""Seeding and RNG-state capture for exact resume.

``capture_rng_state`` returns only plain lists, ints, floats and tensors, so the state can be
stored with ``torch.save`` and read back with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch (CPU and every GPU)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture_rng_state() -> dict[str, Any]:
    """The state of every global generator, as weights-only-loadable values."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [str(kind), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back what ``capture_rng_state`` returned."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class OwnStreams:
    """Global generators of one's own (Python's, NumPy's, torch's CPU and CUDA ones): ``seed``
    sets them as ``seed_everything`` would, without touching the caller's; ``active()`` swaps
    them in around a block, keeps what it drew and puts the caller's back. What code that
    draws from the global generators (sampling, dropout) draws inside ``active()`` then follows
    ``seed`` alone, whatever is drawn outside between two blocks. Checkpointable
    (``state_dict``/``load_state_dict``: ``capture_rng_state``'s values)."""

    def __init__(self, seed: int) -> None:
        outside = capture_rng_state()
        seed_everything(seed)
        self.state = capture_rng_state()
        restore_rng_state(outside)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        outside = capture_rng_state()
        restore_rng_state(self.state)
        try:
            yield
        finally:
            self.state = capture_rng_state()
            restore_rng_state(outside)

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = state
