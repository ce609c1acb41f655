"""Atomic, verified, resumable checkpoints and the output-directory guard.

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

from proxrl.runtime import distributed
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.guard import assert_finite_weights
from proxrl.runtime.metrics import METRICS_FILE
from proxrl.runtime.trackers import TRACKER_DIRS

CHECKPOINT_DIR = "checkpoints"
MANIFEST = "manifest.json"
STATE_FILE = "state.pt"
RUN_MARKER = ".proxrl-run"
_PREFIX = "step_"


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


# --------------------------------------------------------------------------------------------


def record_planned_steps(output_dir: str | Path, total: int) -> None:
    """Note in the run marker how many steps (metrics.jsonl's ``step``) the run is configured
    for, so that a report tells a complete run from one stopped early (``planned_steps``)."""
    (Path(output_dir) / RUN_MARKER).write_text(json.dumps({"planned_steps": int(total)}) + "\n")


def planned_steps(run_dir: str | Path) -> int | None:
    """The steps ``record_planned_steps`` noted for the run in ``run_dir``; None if none."""
    try:
        noted = json.loads((Path(run_dir) / RUN_MARKER).read_text(encoding="utf-8"))
        return int(noted["planned_steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def holds_run(output_dir: str | Path) -> bool:
    """Whether ``output_dir`` holds a proxrl run (a marker, metrics or checkpoints)."""
    d = Path(output_dir)
    return any((d / name).exists() for name in (RUN_MARKER, METRICS_FILE, CHECKPOINT_DIR))


# What a run writes before it finishes its first step. A run directory holding nothing else (its
# first iteration failed) has no work to lose: a new run may replace it without --overwrite.
_BEFORE_FIRST_STEP = frozenset({RUN_MARKER, "config.yaml", "demo_config.yaml"})


def holds_work(output_dir: str | Path) -> bool:
    """Whether the run in ``output_dir`` holds anything a new start would lose: a checkpoint, a
    non-blank metrics file, or any file other than the run marker, its config, an empty metrics
    file, the trackers' files (TensorBoard's, wandb's, mlflow's: empty of rows while none was
    logged) and a save's leftovers."""
    d = Path(output_dir)
    if not d.is_dir():
        return False
    if CheckpointManager(d).checkpoints():
        return True
    metrics = d / METRICS_FILE
    if metrics.is_file() and metrics.read_bytes().strip():
        return True
    for path in d.iterdir():
        if (path.name == CHECKPOINT_DIR or path.name in TRACKER_DIRS) and path.is_dir():
            continue  # no step_* checkpoint (above); events without a metrics row
        if path.name not in _BEFORE_FIRST_STEP | {METRICS_FILE} or not path.is_file():
            return True
    return False


def check_output_dir(output_dir: str | Path, resume: bool, overwrite: bool) -> None:
    """Raise the ``ProxrlError`` that ``prepare_output_dir`` would, without touching anything.

    Call it first thing, so a wrong directory is reported before minutes of loading; call
    ``prepare_output_dir`` once every input has loaded, so a bad input leaves no run behind.
    """
    d = Path(output_dir)
    if resume and overwrite:
        raise ProxrlError("--resume and --overwrite exclude each other; pick one")
    if d.exists() and not d.is_dir():
        raise ProxrlError(f"output directory {d} is a file")
    if holds_run(d):
        if not resume and not overwrite and holds_work(d):
            raise ProxrlError(
                f"output directory {d} already holds a run; pass --resume to continue it or "
                "--overwrite to replace it"
            )
    elif resume:
        raise ProxrlError(f"--resume: output directory {d} holds no run to resume")
    elif d.is_dir() and any(d.iterdir()):
        raise ProxrlError(
            f"output directory {d} is not empty and holds no proxrl run; choose another one"
        )


def prepare_output_dir(output_dir: str | Path, resume: bool, overwrite: bool) -> Path:
    """Make ``output_dir`` ready for a run and return it.

    - a fresh or empty directory is created and marked as a run;
    - a directory holding a run is refused unless ``resume`` (keep it and continue) or
      ``overwrite`` (delete the old run first); one whose run stopped before its first step
      (``holds_work`` is false) is replaced as a fresh start;
    - ``resume`` with nothing to resume is refused too, rather than silently starting over;
    - a non-empty directory that is not a run is never deleted.
    """
    check_output_dir(output_dir, resume, overwrite)
    d = Path(output_dir)
    if distributed.world_size() > 1:  # every rank has checked; rank 0 alone creates or clears
        distributed.barrier()
        if distributed.is_main():
            _make_run_dir(d, resume)
        distributed.barrier()
        return d
    return _make_run_dir(d, resume)


def _make_run_dir(d: Path, resume: bool) -> Path:
    if holds_run(d):
        if resume:
            return d
        shutil.rmtree(d)
    d.mkdir(parents=True, exist_ok=True)
    (d / RUN_MARKER).write_text("")
    return d
