"""Atomic, verified, resumable checkpoints (the output directory's policy: ``runtime.run_dir``).

Layout of one checkpoint, ``OUTPUT_DIR/checkpoints/step_000001234/``::

    <group>.safetensors   one file per tensor group (a model's state_dict, ...)
    state.pt              everything else: optimizer/scheduler state_dicts, RNG states,
                          counters, controller states (tensors, numbers, strings, lists, dicts)
    manifest.json         step, groups, tied-tensor aliases and the sha256 of every file

A checkpoint is written into a hidden temporary directory and renamed into place with
``os.replace`` only after every file is flushed and fsynced, so a crash leaves either the old
set of checkpoints or the new one, never a half-written ``step_*`` directory. ``latest()`` still
re-hashes every file and skips (with a warning) any checkpoint whose files are missing or do not
match the manifest, e.g. after a disk error or a manual edit. Nothing is unpickled:
``state.pt`` is read with ``torch.load(weights_only=True)``. Weights holding a NaN or Inf are
refused (``ProxrlError``) before anything is written, so a poisoned step can never replace a good
checkpoint.

Trainers do not call ``CheckpointManager`` directly: they register their state with
``runtime.checkpointer.Checkpointer``, which packs it into this layout.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.guard import assert_finite_weights

# The run directory's policy moved to runtime.run_dir; these names stay importable from here until
# every caller imports them from there (algos/online/loop.py, report.py and tests).
from proxrl.runtime.run_dir import (  # noqa: F401
    CHECKPOINT_DIR,
    CHECKPOINT_PREFIX,
    RUN_MARKER,
    check_output_dir,
    holds_run,
    holds_work,
    planned_steps,
    prepare_output_dir,
    record_planned_steps,
)

MANIFEST = "manifest.json"
STATE_FILE = "state.pt"
_PREFIX = CHECKPOINT_PREFIX


class CorruptCheckpointWarning(UserWarning):
    """A checkpoint on disk failed verification and was skipped."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_state(value: Any, where: str) -> None:
    """Fail early (at save, not at resume) on values ``weights_only`` loading would refuse."""
    if value is None or isinstance(value, (bool, int, float, str, Tensor, torch.dtype)):
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_state(v, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, (str, int)):
                raise TypeError(f"checkpoint state key {where}[{k!r}] must be a str or int")
            _check_state(v, f"{where}[{k!r}]")
        return
    raise TypeError(
        f"checkpoint state {where} is a {type(value).__name__}; only tensors, numbers, strings, "
        "lists, tuples and dicts can be loaded with weights_only=True"
    )


def _dedupe(group: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Split a state_dict into tensors to write and aliases (tied weights: name → kept name).

    Tensors that are the same view of the same storage (tied embeddings) are written once.
    Other tensors that overlap a storage already written are copied, since safetensors
    refuses shared storage.
    """
    kept: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    seen_views: dict[tuple[Any, ...], str] = {}
    seen_storages: set[int] = set()
    for name, tensor in group.items():
        if not isinstance(tensor, Tensor):
            raise TypeError(f"tensor group entry {name!r} is a {type(tensor).__name__}")
        t = tensor.detach()
        view = (
            t.untyped_storage().data_ptr(),
            t.storage_offset(),
            tuple(t.shape),
            tuple(t.stride()),
            t.dtype,
            t.device,
        )
        if view in seen_views and t.numel() > 0:
            aliases[name] = seen_views[view]
            continue
        storage = t.untyped_storage().data_ptr()
        if storage in seen_storages and t.numel() > 0:
            t = t.clone()
        seen_views[view] = name
        seen_storages.add(storage)
        kept[name] = t.cpu().contiguous()
    return kept, aliases


class CheckpointManager:
    """Save, find and load checkpoints under ``OUTPUT_DIR/checkpoints``.

    Args:
        output_dir: the run directory.
        keep: how many of the newest checkpoints to keep; older ones are deleted after a save.
    """

    def __init__(self, output_dir: str | Path, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root = Path(output_dir) / CHECKPOINT_DIR
        self.keep = keep

    # -- writing ---------------------------------------------------------------------------

    def save(self, step: int, tensors: dict[str, dict[str, Tensor]], state: dict[str, Any]) -> Path:
        """Write checkpoint ``step`` atomically and prune old ones; return its path.

        Raises ``ProxrlError`` (and writes nothing) when a tensor holds a NaN or Inf."""
        _check_state(state, "state")
        for group in tensors:
            if not group.replace("_", "").replace("-", "").isalnum():
                raise ValueError(f"tensor group name {group!r} must be alphanumeric")
        for group, state_dict in tensors.items():
            assert_finite_weights(state_dict, f"checkpoint step {step} in {self.root} ({group})")
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"{_PREFIX}{step:09d}"
        tmp = self.root / f".tmp-{final.name}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        aliases: dict[str, dict[str, str]] = {}
        for group, state_dict in tensors.items():
            kept, group_aliases = _dedupe(state_dict)
            save_file(kept, str(tmp / f"{group}.safetensors"))
            aliases[group] = group_aliases
        torch.save(state, tmp / STATE_FILE)
        files = sorted(p.name for p in tmp.iterdir())
        for name in files:
            _fsync(tmp / name)
        manifest = {
            "format": 1,
            "step": int(step),
            "groups": list(tensors),
            "aliases": aliases,
            "sha256": {name: _sha256(tmp / name) for name in files},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        _fsync(tmp / MANIFEST)
        if final.exists():  # re-saving the same step: move the old one aside first
            trash = self.root / f".old-{final.name}-{os.getpid()}"
            os.replace(final, trash)
            os.replace(tmp, final)
            shutil.rmtree(trash)
        else:
            os.replace(tmp, final)
        _fsync(self.root)
        self._prune()
        return final

    def _prune(self) -> None:
        for path in self.checkpoints()[: -self.keep]:
            shutil.rmtree(path)
        for stale in self.root.glob(".tmp-*"):  # left by a crash mid-save
            if not stale.name.endswith(f"-{os.getpid()}"):
                shutil.rmtree(stale, ignore_errors=True)

    # -- finding ---------------------------------------------------------------------------

    def checkpoints(self) -> list[Path]:
        """Every ``step_*`` directory, oldest first (not verified)."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if p.is_dir() and p.name.startswith(_PREFIX)]
        return sorted(found, key=lambda p: int(p.name[len(_PREFIX) :]))

    @staticmethod
    def verify(path: str | Path) -> str | None:
        """``None`` if the checkpoint at ``path`` is complete and intact, else the reason."""
        path = Path(path)
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except FileNotFoundError:
            return "no manifest.json (the save did not finish)"
        except (json.JSONDecodeError, UnicodeDecodeError):
            return "manifest.json is not valid JSON"
        for name, digest in manifest.get("sha256", {}).items():
            file = path / name
            if not file.is_file():
                return f"{name} is missing"
            if _sha256(file) != digest:
                return f"{name} does not match its sha256 in manifest.json"
        expected = {f"{g}.safetensors" for g in manifest.get("groups", [])} | {STATE_FILE}
        missing = expected - set(manifest.get("sha256", {}))
        if missing:
            return f"manifest.json lists no hash for {sorted(missing)}"
        return None

    def latest(self) -> Path | None:
        """The newest complete, verified checkpoint; broken ones are skipped with a warning."""
        for path in reversed(self.checkpoints()):
            problem = self.verify(path)
            if problem is None:
                return path
            warnings.warn(
                f"skipping corrupt checkpoint {path}: {problem}",
                CorruptCheckpointWarning,
                stacklevel=2,
            )
        return None

    # -- reading ---------------------------------------------------------------------------

    @staticmethod
    def step_of(path: str | Path) -> int:
        """The step a checkpoint was saved at (from its manifest)."""
        return int(json.loads((Path(path) / MANIFEST).read_text())["step"])

    def load(self, path: str | Path) -> tuple[dict[str, dict[str, Tensor]], dict[str, Any]]:
        """``(tensors, state)`` of a checkpoint, verified first; tied tensors stay tied."""
        path = Path(path)
        problem = self.verify(path)
        if problem is not None:
            raise ProxrlError(f"checkpoint {path} is corrupt: {problem}")
        manifest = json.loads((path / MANIFEST).read_text())
        tensors: dict[str, dict[str, Tensor]] = {}
        for group in manifest["groups"]:
            loaded = load_file(str(path / f"{group}.safetensors"))
            for name, target in manifest["aliases"].get(group, {}).items():
                loaded[name] = loaded[target]
            tensors[group] = loaded
        state = torch.load(path / STATE_FILE, weights_only=True)
        return tensors, state
