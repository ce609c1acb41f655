"""NonFiniteGuard: finite steps pass, a NaN/Inf loss, gradient or named tensor is skipped and
named, counters survive a state_dict round trip, N skips in a row stop the run; non-finite
weights are never written by the checkpoint manager."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from proxrl.runtime.checkpoint import CheckpointManager
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.guard import NonFiniteGuard, assert_finite_weights, first_nonfinite_grad


def _model_with_grads(bad: float | None = None) -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    model(torch.ones(1, 2)).sum().backward()
    if bad is not None:
        model[1].weight.grad[0, 1] = bad
    return model


def test_finite_step_is_taken_and_resets_the_run_of_skips():
    guard = NonFiniteGuard(max_consecutive=3)
    guard.consecutive = 2
    assert guard.check(
        1,
        loss=torch.tensor(0.5),
        parameters=_model_with_grads(),
        tensors={"rewards": torch.tensor([1.0, -2.0])},
    )
    assert guard.state_dict() == {"consecutive": 0, "skipped": 0}
    assert guard.metrics() == {"guard/skipped_updates": 0.0}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(loss=float("nan")), "loss is NaN"),
        (dict(loss=torch.tensor(float("-inf"))), "loss is Inf"),
        (dict(loss=1.0, parameters="nan-grad"), "grad of 1.weight holds NaN"),
        (dict(loss=1.0, parameters="inf-grad"), "grad of 1.weight holds Inf"),
        (dict(tensors={"rewards": torch.tensor([1.0, math.nan])}), "rewards holds NaN"),
        (
            dict(tensors={"advantages": torch.tensor([math.inf, math.nan])}),
            "advantages holds NaN and Inf",
        ),
    ],
)
def test_nonfinite_input_is_skipped_counted_and_named(kwargs, message, caplog):
    if kwargs.get("parameters") == "nan-grad":
        kwargs["parameters"] = _model_with_grads(math.nan)
    elif kwargs.get("parameters") == "inf-grad":
        kwargs["parameters"] = _model_with_grads(math.inf)
    guard = NonFiniteGuard(max_consecutive=3)
    with caplog.at_level(logging.WARNING, logger="proxrl.runtime.guard"):
        assert guard.check(7, **kwargs) is False
    assert guard.state_dict() == {"consecutive": 1, "skipped": 1}
    assert guard.metrics() == {"guard/skipped_updates": 1.0}
    assert [r.getMessage() for r in caplog.records] == [
        f"step 7: {message}; update skipped (1 in a row, 1 in total)"
    ]


def test_plain_parameter_lists_are_named_by_index():
    model = _model_with_grads(math.nan)
    assert first_nonfinite_grad(list(model.parameters())) == "parameters[2]"
    assert first_nonfinite_grad(_model_with_grads()) is None


def test_stop_after_n_consecutive_skips_names_the_checkpoint_dir(tmp_path):
    guard = NonFiniteGuard(max_consecutive=3, checkpoint_dir=tmp_path / "checkpoints")
    assert not guard.check(1, loss=math.nan)
    assert guard.check(2, loss=1.0)  # a good step in between restarts the count
    assert not guard.check(3, loss=math.nan)
    assert not guard.check(4, loss=math.nan)
    with pytest.raises(ProxrlError) as info:
        guard.check(5, loss=math.inf)
    assert str(info.value) == (
        "stopped at step 5: 3 updates in a row were skipped for non-finite values "
        f"(last: loss is Inf); the last good checkpoint in {tmp_path / 'checkpoints'} is intact"
    )
    assert guard.skipped == 4


def test_counters_round_trip_through_state_dict():
    guard = NonFiniteGuard(max_consecutive=5)
    guard.check(1, loss=math.nan)
    guard.check(2, loss=math.nan)
    other = NonFiniteGuard(max_consecutive=5)
    other.load_state_dict(guard.state_dict())
    assert (other.consecutive, other.skipped) == (2, 2)


def test_checkpoint_refuses_nonfinite_weights_and_writes_nothing(tmp_path):
    manager = CheckpointManager(tmp_path, keep=3)
    good = manager.save(1, {"model": {"w": torch.ones(3)}}, {"step": 1})
    before = sorted(p.name for p in manager.root.iterdir())
    with pytest.raises(ProxrlError) as info:
        manager.save(2, {"model": {"w": torch.tensor([1.0, math.nan, 2.0])}}, {"step": 2})
    assert str(info.value) == (
        f"refusing to save checkpoint step 2 in {manager.root} (model): tensor 'w' holds NaN; "
        "nothing was written"
    )
    assert sorted(p.name for p in manager.root.iterdir()) == before  # no temp dir either
    assert manager.latest() == good
    # Integer tensors (token counts, RNG states) are never "non-finite".
    assert_finite_weights({"ids": torch.tensor([1, 2])}, "ids")
