"""Non-finite guard: a NaN or Inf in a loss, a gradient, a reward or an advantage skips the
update instead of reaching the weights.

One ``NonFiniteGuard`` per run; call ``check`` after the backward pass and before
``optimizer.step()``::

    guard = NonFiniteGuard(max_consecutive=5, checkpoint_dir=out / "checkpoints")
    ...
    loss.backward()
    if guard.check(step, loss=loss, parameters=model, tensors={"rewards": r, "advantages": a}):
        optimizer.step()
    optimizer.zero_grad()          # either way: a skipped step's gradients are dropped
    metrics |= guard.metrics()     # {"guard/skipped_updates": total so far}

``check`` returns ``True`` (take the step) or ``False`` (skip it; a warning names what was
non-finite and where: ``loss``, ``grad of model.layers.0.mlp.weight``, ``rewards``). After
``max_consecutive`` skips in a row it raises ``ProxrlError`` saying the last good checkpoint is
intact. ``state_dict()`` / ``load_state_dict()`` carry the counters through a checkpoint, so a
resumed run counts as the uninterrupted one would.

``assert_finite_weights`` is the last line of defence for anything that writes weights
(``runtime.checkpoint`` refuses to save a non-finite tensor with it).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from proxrl.runtime.errors import ProxrlError

log = logging.getLogger(__name__)

Parameters = nn.Module | Iterable[tuple[str, Tensor]] | Iterable[Tensor]


def _is_finite(value: Tensor | float) -> bool:
    if isinstance(value, Tensor):
        if not value.is_floating_point() and not value.is_complex():
            return True
        return bool(torch.isfinite(value.detach()).all())
    return math.isfinite(float(value))


def _kind(value: Tensor | float) -> str:
    t = value.detach() if isinstance(value, Tensor) else torch.tensor(float(value))
    has_nan = bool(torch.isnan(t).any())
    has_inf = bool(torch.isinf(t).any())
    return "NaN and Inf" if has_nan and has_inf else "NaN" if has_nan else "Inf"


def _named(parameters: Parameters) -> list[tuple[str, Tensor]]:
    if isinstance(parameters, nn.Module):
        return list(parameters.named_parameters())
    out = []
    for i, item in enumerate(parameters):
        out.append(item if isinstance(item, tuple) else (f"parameters[{i}]", item))
    return out


def first_nonfinite_grad(parameters: Parameters) -> str | None:
    """Name of the first parameter whose gradient holds a NaN/Inf (``None`` if all are finite)."""
    grads = [(name, p.grad) for name, p in _named(parameters) if p.grad is not None]
    if not grads:
        return None
    # Fast path: one reduction over every gradient; only on failure look for the culprit.
    norms = torch._foreach_norm([g.detach() for _, g in grads])
    if bool(torch.isfinite(torch.stack([n.float().cpu() for n in norms]).sum())):
        return None
    for name, grad in grads:
        if not _is_finite(grad):
            return name
    return None  # the norms overflowed, the values themselves are finite


class NonFiniteGuard:
    """Decide skip-or-step and count skips (see the module docstring).

    Args:
        max_consecutive: stop the run (``ProxrlError``) after this many skips in a row.
        checkpoint_dir: named in the stop message as the place of the last good checkpoint.
    """

    def __init__(self, max_consecutive: int = 5, checkpoint_dir: str | Path | None = None):
        if max_consecutive < 1:
            raise ValueError(f"max_consecutive must be >= 1, got {max_consecutive}")
        self.max_consecutive = max_consecutive
        self.checkpoint_dir = checkpoint_dir
        self.consecutive = 0
        self.skipped = 0

    def problem(
        self,
        loss: Tensor | float | None = None,
        parameters: Parameters | None = None,
        tensors: Mapping[str, Tensor | float] | None = None,
    ) -> str | None:
        """What is non-finite (``"loss is NaN"``, ``"grad of w is Inf"``, ...), or ``None``."""
        for name, value in (tensors or {}).items():
            if not _is_finite(value):
                return f"{name} holds {_kind(value)}"
        if loss is not None and not _is_finite(loss):
            return f"loss is {_kind(loss)}"
        if parameters is not None:
            named = _named(parameters)
            culprit = first_nonfinite_grad(named)
            if culprit is not None:
                grad = dict(named)[culprit].grad
                assert grad is not None
                return f"grad of {culprit} holds {_kind(grad)}"
        return None

    def check(
        self,
        step: int,
        loss: Tensor | float | None = None,
        parameters: Parameters | None = None,
        tensors: Mapping[str, Tensor | float] | None = None,
    ) -> bool:
        """``True``: everything is finite, take the optimizer step. ``False``: skip it (the
        caller drops the gradients). Raises ``ProxrlError`` on the ``max_consecutive``-th skip
        in a row."""
        problem = self.problem(loss, parameters, tensors)
        if problem is None:
            self.consecutive = 0
            return True
        self.consecutive += 1
        self.skipped += 1
        log.warning(
            "step %d: %s; update skipped (%d in a row, %d in total)",
            step,
            problem,
            self.consecutive,
            self.skipped,
        )
        if self.consecutive >= self.max_consecutive:
            where = (
                f"; the last good checkpoint in {self.checkpoint_dir} is intact"
                if self.checkpoint_dir is not None
                else ""
            )
            raise ProxrlError(
                f"stopped at step {step}: {self.consecutive} updates in a row were skipped for "
                f"non-finite values (last: {problem}){where}"
            )
        return False

    def metrics(self) -> dict[str, float]:
        return {"guard/skipped_updates": float(self.skipped)}

    def state_dict(self) -> dict[str, int]:
        return {"consecutive": self.consecutive, "skipped": self.skipped}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.consecutive = int(state["consecutive"])
        self.skipped = int(state["skipped"])


def assert_finite_weights(tensors: Mapping[str, Tensor], what: str) -> None:
    """Raise ``ProxrlError`` naming the first floating tensor of ``tensors`` with a NaN/Inf."""
    for name, tensor in tensors.items():
        if isinstance(tensor, Tensor) and not _is_finite(tensor):
            raise ProxrlError(
                f"refusing to save {what}: tensor {name!r} holds {_kind(tensor)}; "
                "nothing was written"
            )
