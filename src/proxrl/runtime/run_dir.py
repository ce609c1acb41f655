"""The run directory and its policy: what marks a directory as a proxrl run, whether it holds work
a new start would lose, and what ``--resume`` / ``--overwrite`` may do with it.

Layout of ``OUTPUT_DIR``: ``.proxrl-run`` (the marker; the planned steps), ``config.yaml``,
``metrics.jsonl``, the trackers' directories, ``checkpoints/step_*/`` (``runtime.checkpoint``)
and whatever the trainer saves at the end (the model, samples, a summary).

The rules (``check_output_dir`` raises, ``prepare_output_dir`` applies them):

- a fresh or empty directory is created and marked as a run;
- a directory holding a run is refused unless ``resume`` (keep it and continue) or
  ``overwrite`` (delete the old run first); one whose run stopped before its first step
  (``holds_work`` is false) is replaced as a fresh start;
- ``resume`` with nothing to resume is refused too, rather than silently starting over;
- a non-empty directory that is not a run is never deleted.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from proxrl.runtime import distributed
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.metrics import METRICS_FILE
from proxrl.runtime.trackers import TRACKER_DIRS

RUN_MARKER = ".proxrl-run"
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_PREFIX = "step_"  # checkpoints/step_000001234


def has_checkpoint(output_dir: str | Path) -> bool:
    """Whether ``output_dir/checkpoints`` holds a ``step_*`` directory (not verified)."""
    root = Path(output_dir) / CHECKPOINT_DIR
    return root.is_dir() and any(
        p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX) for p in root.iterdir()
    )


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
    if has_checkpoint(d):
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
