"""RNG capture and restore across Python, NumPy and torch, through a weights-only load."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from proxrl.runtime.seeding import (
    OwnStreams,
    capture_rng_state,
    restore_rng_state,
    seed_everything,
)


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


def test_own_streams_follow_their_seed_and_leave_the_callers():
    seed_everything(1)
    callers = [_draws() for _ in range(3)]
    seed_everything(5)
    seeded = [_draws() for _ in range(4)]
    seed_everything(1)
    own = OwnStreams(5)  # seeding them leaves the caller's where they were
    with own.active():
        first = _draws()
    assert _draws() == callers[0]  # the caller's next draw, as if nothing happened between
    with own.active():
        second = _draws()
    assert [first, second] == seeded[:2] and _draws() == callers[1]
    saved = own.state_dict()
    with pytest.raises(RuntimeError), own.active():
        _draws()
        raise RuntimeError
    assert _draws() == callers[2]  # put back after a block that raised, which kept its draws
    with own.active():
        assert _draws() == seeded[3]
    other = OwnStreams(9)
    other.load_state_dict(saved)
    with other.active():
        assert _draws() == seeded[2]


def test_numpy_takes_the_seed_modulo_2_to_the_32():
    for seed, numpy_seed in ((7, 7), (2**32 + 5, 5)):
        seed_everything(seed)
        drawn = np.random.rand(3)
        np.random.seed(numpy_seed)
        assert np.array_equal(drawn, np.random.rand(3))
