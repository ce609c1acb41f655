"""``Checkpointer``: the one component that saves and restores a trainer's whole state.

A trainer registers what it owns once and then only calls ``save(step, **counters)`` and
``restore()``::

    checkpointer = Checkpointer(output_dir, keep=cfg.keep_checkpoints).track(
        model=TrainableWeights(model), optimizer=optimizer, kl=kl, guard=guard, rng=GlobalRNG(),
    )
    ...
    checkpointer.save(step, step=step)          # counters: plain values, given back by restore()
    restored = checkpointer.restore()           # → Restored(path, step, counters)

What can be tracked, and where it goes in a checkpoint (``runtime.checkpoint`` writes it:
atomic, sha256-verified ``step_*`` directories, the newest ``keep`` kept):

- weights, one safetensors group each, named after the entry: an ``nn.Module`` (its whole
  ``state_dict``, loaded strictly) or ``TrainableWeights(module)`` (only the parameters that
  train — LoRA: adapters and head — loaded over the frozen ones);
- anything with ``state_dict()`` / ``load_state_dict()`` (optimizers, schedulers, KL
  controllers, the non-finite guard, environment state...), a list of such things (one state
  each), a ``torch.Generator``, ``GlobalRNG()`` (Python, NumPy, torch and CUDA generators) or
  ``Accessors(get, set)`` for an object whose methods take extra arguments: their states go
  into ``state.pt`` under the entry's name;
- counters (iteration, data position, ...): passed to ``save`` as keywords, stored beside them
  and returned by ``restore``.

Entry names are the keys the trainers always used, so checkpoints written before this component
existed still resume. A tracked entry the checkpoint lacks keeps its fresh state (with a warning).

Several processes: every rank calls ``save`` and ``restore``; rank 0 alone writes and the
others receive its path. With ``rank_rng=True`` every rank's global RNG state is gathered into
``rng_ranks``; on restore each rank takes its own stream back when the world size is the same,
and otherwise calls ``reseed(step)`` (a fresh stream per rank).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from proxrl.runtime import distributed as dist
from proxrl.runtime import fsdp
from proxrl.runtime.checkpoint import CheckpointManager
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.run_dir import holds_work
from proxrl.runtime.seeding import capture_rng_state, restore_rng_state

log = logging.getLogger(__name__)

RANK_RNG = "rng_ranks"  # state.pt key of the per-rank RNG streams


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


@dataclass(frozen=True)
class Accessors:
    """A state read and put back by two functions (for objects without the usual methods)."""

    state_dict: Callable[[], Any]
    load_state_dict: Callable[[Any], Any]


class GlobalRNG:
    """The process-global generators (Python, NumPy, torch, CUDA) of ``runtime.seeding``."""

    def state_dict(self) -> dict[str, Any]:
        return capture_rng_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        restore_rng_state(state)


class TrainableWeights:
    """The parameters of ``module`` that train (all of them without LoRA): what a checkpoint
    must hold to resume. Loaded over the frozen ones; a tensor the module lacks is an error."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def state_dict(self) -> dict[str, Tensor]:
        return {
            name: p.detach().clone()
            for name, p in self.module.named_parameters()
            if p.requires_grad
        }

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        current = dict(self.module.named_parameters())  # FSDP: each rank keeps its shard
        state = {k: fsdp.shard_like(v, current[k]) if k in current else v for k, v in state.items()}
        _, unexpected = self.module.load_state_dict(state, strict=False)
        if unexpected:
            raise ValueError(f"found {len(unexpected)} unknown tensors such as {unexpected[0]!r}")


@dataclass(frozen=True)
class Restored:
    """What ``Checkpointer.restore`` found: the checkpoint, its step and the saved counters."""

    path: Path
    step: int
    counters: dict[str, Any] = field(default_factory=dict)


def _as_stateful(obj: Any) -> Stateful | Sequence[Stateful]:
    if isinstance(obj, torch.Generator):
        return Accessors(obj.get_state, obj.set_state)
    if isinstance(obj, (list, tuple)):
        return [_as_stateful(o) for o in obj]  # type: ignore[misc]
    if not (
        callable(getattr(obj, "state_dict", None))
        and callable(getattr(obj, "load_state_dict", None))
    ):
        raise TypeError(f"{type(obj).__name__} has no state_dict()/load_state_dict() to checkpoint")
    return obj  # type: ignore[no-any-return]


class Checkpointer:
    """Save and restore every registered weight, state and counter (see the module docstring).

    Args:
        output_dir: the run directory (checkpoints go to ``output_dir/checkpoints``).
        keep: how many of the newest checkpoints to keep.
        rank_rng: several processes each draw from their own global RNG stream (the online
            samplers): gather them all on save and give each rank its own back on restore.
        reseed: with ``rank_rng``, how a rank starts a fresh stream from ``step`` when the
            checkpoint was written by another number of processes.
    """

    def __init__(
        self,
        output_dir: str | Path,
        keep: int = 3,
        *,
        rank_rng: bool = False,
        reseed: Callable[[int], None] | None = None,
    ) -> None:
        self.manager = CheckpointManager(output_dir, keep=keep)
        self.rank_rng = rank_rng
        self.reseed = reseed
        self._weights: dict[str, Stateful] = {}
        self._states: dict[str, Stateful | Sequence[Stateful]] = {}
        self.optional: set[str] = set()
        """Entries a checkpoint may lack without a warning (state a trainer can do without,
        e.g. the learning-rate schedule's position, which older checkpoints did not hold)."""

    @property
    def root(self) -> Path:
        """``output_dir/checkpoints``."""
        return self.manager.root

    def track(self, **entries: Any) -> Checkpointer:
        """Register what is saved and restored, by name (``None``: skipped); returns self."""
        for name, obj in entries.items():
            if name in self._weights or name in self._states or name == RANK_RNG:
                raise ValueError(f"checkpoint entry {name!r} is registered twice or reserved")
            if obj is None:
                continue
            if isinstance(obj, (nn.Module, TrainableWeights)):
                self._weights[name] = obj
            else:
                self._states[name] = _as_stateful(obj)
        return self

    # -- saving ----------------------------------------------------------------------------

    def save(self, step: int, /, **counters: Any) -> Path:
        """Write checkpoint ``step`` (every rank calls this; rank 0 writes) and return its path."""
        clash = set(counters) & (set(self._states) | set(self._weights) | {RANK_RNG})
        if clash:
            raise ValueError(f"counters {sorted(clash)} clash with tracked entries")
        world = dist.world_size()
        rng_ranks = (
            dist.all_gather_objects(capture_rng_state()) if self.rank_rng and world > 1 else None
        )
        saved = ""
        if dist.is_main() or dist.is_sharded():  # FSDP: every rank joins each gather
            tensors = dist.full_state(
                {name: obj.state_dict() for name, obj in self._weights.items()}
            )
            state: dict[str, Any] = dist.full_state(
                {name: _state_of(obj) for name, obj in self._states.items()}
            )
        if dist.is_main():
            state.update(counters)
            if rng_ranks is not None:
                state[RANK_RNG] = rng_ranks
            saved = str(self.manager.save(step, tensors, state))
        return Path(dist.broadcast_object(saved))

    # -- restoring -------------------------------------------------------------------------

    def restore(self) -> Restored:
        """Load the newest verified checkpoint into everything tracked; raise ``ProxrlError``
        when there is none or when it does not fit this run's model."""
        path = self.manager.latest()
        if path is None:
            afresh = (
                "pass --overwrite to start it afresh"
                if holds_work(self.root.parent)
                else "it stopped before its first step: run without --resume to start it afresh"
            )
            raise ProxrlError(f"--resume: no complete checkpoint in {self.root}; {afresh}")
        tensors, state = self.manager.load(path)
        mismatch = f"checkpoint {path} does not match this run's model (another model or lora_r?)"
        try:  # weights first: a foreign checkpoint is reported by its tensors' names
            for name, obj in self._weights.items():
                _load(obj, tensors, name, path)
            for name, entry in self._states.items():
                _load(entry, state, name, path, quiet=name in self.optional)
        except (RuntimeError, ValueError) as exc:
            raise ProxrlError(f"{mismatch}: {str(exc).strip().splitlines()[-1].strip()}") from None
        step = CheckpointManager.step_of(path)
        if self.rank_rng and dist.world_size() > 1:  # this rank's stream, or a fresh one per rank
            ranks = state.get(RANK_RNG, [])
            if len(ranks) == dist.world_size():
                restore_rng_state(ranks[dist.rank()])
            elif self.reseed is not None:
                self.reseed(step)
        counters = {k: v for k, v in state.items() if k not in self._states and k != RANK_RNG}
        return Restored(path, step, counters)

    # -- the state as of a finished step (``Run.finished``) ----------------------------------

    def snapshot(self) -> Snapshot:
        """What ``put_back`` needs to return every tracked entry to this moment, as cheaply as
        it can be had: a copy of each small state (everything but weights and optimizers: the
        RNGs, the guard, the schedules, controllers, environment state), and of the weights and
        optimizers only the version counters of their tensors — they are not copied, so
        ``unchanged`` says whether they are still as they were."""
        states = {
            name: copy.deepcopy(_state_of(entry))
            for name, entry in self._states.items()
            if not _holds_optimizer(entry)
        }
        return Snapshot(states, self._versions())

    def unchanged(self, snapshot: Snapshot) -> bool:
        """Whether no weight or optimizer tensor was written since ``snapshot``."""
        return self._versions() == snapshot.versions

    def put_back(self, snapshot: Snapshot) -> None:
        """Load ``snapshot``'s small states back into their entries (weights and optimizers are
        left as they are: check ``unchanged`` first)."""
        for name, state in snapshot.states.items():
            entry = self._states[name]
            for e, s in zip(
                *((entry, state) if isinstance(entry, list) else ([entry], [state])), strict=True
            ):
                e.load_state_dict(copy.deepcopy(s))

    def _versions(self) -> tuple[int, ...]:
        tensors: list[Tensor] = []
        for obj in self._weights.values():
            module = getattr(obj, "module", obj)  # (a TrainableWeights' module, or the module)
            if not isinstance(module, torch.nn.Module):  # weights in another process (a Ray
                continue  # critic actor's RemoteWeights): nothing here tells whether they changed
            tensors += [*module.parameters(), *module.buffers()]
        for entry in self._states.values():
            for e in entry if isinstance(entry, list) else [entry]:
                if isinstance(e, torch.optim.Optimizer):
                    tensors += [
                        v for st in e.state.values() for v in st.values() if isinstance(v, Tensor)
                    ]
        return tuple(t._version for t in tensors)


@dataclass(frozen=True)
class Snapshot:
    """``Checkpointer.snapshot``: copies of the small states, version counters of the rest."""

    states: dict[str, Any]
    versions: tuple[int, ...]


def _holds_optimizer(entry: Stateful | Sequence[Stateful]) -> bool:
    entries = entry if isinstance(entry, list) else [entry]
    return any(isinstance(e, torch.optim.Optimizer) for e in entries)


def _state_of(entry: Stateful | Sequence[Stateful]) -> Any:
    if isinstance(entry, list):
        return [e.state_dict() for e in entry]
    return entry.state_dict()  # type: ignore[union-attr]


def _load(
    entry: Stateful | Sequence[Stateful],
    saved: dict[str, Any],
    name: str,
    path: Path,
    quiet: bool = False,
) -> None:
    if name not in saved:
        if not quiet:
            log.warning("checkpoint %s holds no %r; it keeps its fresh state", path, name)
        return
    for e, s in zip(
        *((entry, saved[name]) if isinstance(entry, list) else ([entry], [saved[name]])),
        strict=True,
    ):
        # FSDP: each rank keeps its shard of the state (an optimizer whose parameters live in
        # another process, as a Ray critic actor's, holds none here to shard)
        local = isinstance(e, torch.optim.Optimizer) and any(g["params"] for g in e.param_groups)
        if local:
            s = fsdp.shard_optimizer_state(e, s)
        e.load_state_dict(s)
