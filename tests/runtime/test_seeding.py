"""RNG capture and restore across Python, NumPy and torch, through a weights-only load."""

from __future__ import annotations

import random

import numpy as np
import torch

from proxrl.runtime.seeding import capture_rng_state, restore_rng_state, seed_everything


def _draws() -> tuple[float, list[float], list[float]]:
    return random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist()


def test_same_seed_same_draws():
    seed_everything(7)
    a = _draws()
    seed_everything(7)
    assert _draws() == a
    seed_everything(8)
    assert _draws() != a


def test_restore_after_weights_only_round_trip(tmp_path):
    seed_everything(3)
    _draws()
    state = capture_rng_state()
    expected = _draws()
    torch.save(state, tmp_path / "rng.pt")
    _draws()
    restore_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert _draws() == expected
    assert isinstance(state["numpy"][1], list)
