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

One run at a time: ``prepare_output_dir`` takes ``OUTPUT_DIR/.proxrl-lock`` (``RunLock``, an
``fcntl.flock`` held for the life of the run, by rank 0 of several processes) and writes the
holder's pid, host and command into it. Another run on the directory — fresh, ``--resume`` or
``--overwrite`` — is refused in one line naming that process (``check_output_dir`` tests the
lock without taking it, so the refusal comes before anything loads). The kernel drops the lock
when its process ends, however it ends (SIGKILL included), so a killed run leaves none stale;
the file itself stays (an ``--overwrite`` deletes everything else) and means nothing unlocked.
Where ``fcntl`` is missing (Windows) nothing is locked.

The marker also records the command that made the run (``record_run``); ``--resume`` with
another command is refused (``runtime.resume.check_command``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import shutil
import socket
import sys
import weakref
from pathlib import Path
from typing import Any

from proxrl.runtime import distributed
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.metrics import METRICS_FILE
from proxrl.runtime.trackers import TRACKER_DIRS

RUN_MARKER = ".proxrl-run"
LOCK_FILE = ".proxrl-lock"
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_PREFIX = "step_"  # checkpoints/step_000001234


def has_checkpoint(output_dir: str | Path) -> bool:
    """Whether ``output_dir/checkpoints`` holds a ``step_*`` directory (not verified)."""
    root = Path(output_dir) / CHECKPOINT_DIR
    return root.is_dir() and any(
        p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX) for p in root.iterdir()
    )


def _marker(run_dir: str | Path) -> dict[str, Any]:
    """What the run marker notes (``{}`` for an older, empty or unreadable one)."""
    try:
        noted = json.loads((Path(run_dir) / RUN_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return noted if isinstance(noted, dict) else {}


def record_run(
    output_dir: str | Path, total: int | None = None, command: str | None = None
) -> None:
    """Note in the run marker how many steps (metrics.jsonl's ``step``) the run is configured
    for, so that a report tells a complete run from one stopped early (``planned_steps``), and
    the command that made it (``run_command``); what is not given is kept."""
    noted = _marker(output_dir)
    if total is not None:
        noted["planned_steps"] = int(total)
    if command is not None:
        noted["command"] = command
    (Path(output_dir) / RUN_MARKER).write_text(json.dumps(noted) + "\n")


def record_planned_steps(output_dir: str | Path, total: int) -> None:
    """``record_run`` of the planned steps alone."""
    record_run(output_dir, total)


def planned_steps(run_dir: str | Path) -> int | None:
    """The steps ``record_planned_steps`` noted for the run in ``run_dir``; None if none."""
    try:
        return int(_marker(run_dir)["planned_steps"])
    except (KeyError, TypeError, ValueError):
        return None


def run_command(run_dir: str | Path) -> str | None:
    """The command ``record_run`` noted for the run in ``run_dir``; None (an older run) if none."""
    command = _marker(run_dir).get("command")
    return command if isinstance(command, str) else None


# -- one run at a time -------------------------------------------------------------------------

try:
    import fcntl
except ImportError:  # Windows: no flock; runs are not locked
    fcntl = None  # type: ignore[assignment]

_HELD: dict[Path, tuple[int, int]] = {}  # lock file → (fd, holders in this process)


def _this_command() -> str:
    """This process's command line as a user would type it."""
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    if program == "__main__.py":
        program = f"python -m {Path(sys.argv[0]).parent.name}"
    return " ".join([program, *map(shlex.quote, sys.argv[1:])])


def _holder(path: Path) -> str:
    """Who holds the lock in ``path``, as its holder wrote it."""
    try:
        noted = json.loads(path.read_text(encoding="utf-8"))
        return f"pid {noted['pid']} on {noted['host']}: {noted['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that did not say which"


def _in_use(d: Path, holder: str) -> ProxrlError:
    return ProxrlError(
        f"output directory {d} is in use by a live run ({holder}); wait for it to end, stop "
        "it, or choose another output directory"
    )


def check_not_locked(output_dir: str | Path) -> None:
    """Raise ``ProxrlError`` naming the live run that holds ``output_dir``'s lock; touches
    nothing (the lock is tested and released at once; a directory or lock file that does not
    exist is not locked)."""
    path = Path(output_dir) / LOCK_FILE
    if fcntl is None or path.resolve() in _HELD or not path.is_file():
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # unreadable: the run itself will say why when it writes
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use(Path(output_dir), _holder(path)) from None
    finally:
        os.close(fd)


class RunLock:
    """``output_dir``'s lock, taken (``acquire``) for this run and released by ``release`` or
    when the object is collected (the kernel releases it when the process ends). Re-entrant
    within one process: two ``Run``s of one directory in a process (a run, then its resume)
    share it."""

    def __init__(self, output_dir: str | Path) -> None:
        self.output_dir = Path(output_dir)
        self.path = self.output_dir / LOCK_FILE
        self._key: Path | None = None
        self._finalizer: Any = None

    def acquire(self) -> RunLock:
        """Create ``output_dir`` if needed and lock it; ``ProxrlError`` naming the holder when
        another process holds it."""
        if fcntl is None or self._key is not None:
            return self
        self.output_dir.mkdir(parents=True, exist_ok=True)
        key = self.path.resolve()
        if key in _HELD:
            fd, count = _HELD[key]
            _HELD[key] = (fd, count + 1)
        else:
            fd = _locked(self.path)
            if fd is None:
                raise _in_use(self.output_dir, _holder(self.path))
            holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": _this_command()}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
            _HELD[key] = (fd, 1)
        self._key = key
        self._finalizer = weakref.finalize(self, _release, key)
        return self

    def release(self) -> None:
        """Let another run have the directory (idempotent)."""
        if self._finalizer is not None:
            self._finalizer()
        self._key = self._finalizer = None


def _locked(path: Path) -> int | None:
    """A descriptor of ``path`` holding its exclusive flock, or None while another process holds
    it. The lock file is removed on release, so a descriptor opened just before another run
    removed it may lock a file no longer at ``path``: then try the new one."""
    assert fcntl is not None
    for _ in range(3):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)
    return None


def _release(key: Path) -> None:
    if key not in _HELD:
        return
    fd, count = _HELD[key]
    if count > 1:
        _HELD[key] = (fd, count - 1)
        return
    del _HELD[key]
    # The file goes with the lock, while still held: a run that ends (or a refused --resume)
    # leaves the directory as it found it.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(key)
    os.close(fd)  # closing the last descriptor drops the flock


def holds_run(output_dir: str | Path) -> bool:
    """Whether ``output_dir`` holds a proxrl run (a marker, metrics or checkpoints)."""
    d = Path(output_dir)
    return any((d / name).exists() for name in (RUN_MARKER, METRICS_FILE, CHECKPOINT_DIR))


# What a run writes before it finishes its first step. A run directory holding nothing else (its
# first iteration failed) has no work to lose: a new run may replace it without --overwrite.
_BEFORE_FIRST_STEP = frozenset({RUN_MARKER, LOCK_FILE, "config.yaml", "demo_config.yaml"})


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
    check_creatable(d, "output directory")
    check_not_locked(d)
    if holds_run(d):
        if not resume and not overwrite and holds_work(d):
            raise ProxrlError(
                f"output directory {d} already holds a run; pass --resume to continue it or "
                "--overwrite to replace it"
            )
    elif resume:
        raise ProxrlError(f"--resume: output directory {d} holds no run to resume")
    elif d.is_dir() and any(p.name != LOCK_FILE for p in d.iterdir()):
        raise ProxrlError(
            f"output directory {d} is not empty and holds no proxrl run; choose another one"
        )


def prepare_output_dir(
    output_dir: str | Path, resume: bool, overwrite: bool, lock: RunLock | None = None
) -> Path:
    """Make ``output_dir`` ready for a run and return it.

    - a fresh or empty directory is created and marked as a run;
    - a directory holding a run is refused unless ``resume`` (keep it and continue) or
      ``overwrite`` (delete the old run first); one whose run stopped before its first step
      (``holds_work`` is false) is replaced as a fresh start;
    - ``resume`` with nothing to resume is refused too, rather than silently starting over;
    - a non-empty directory that is not a run is never deleted;
    - with ``lock``, it is taken (rank 0) before anything is deleted or written, so a run live
      in the directory is refused rather than cleared under its feet.
    """
    check_output_dir(output_dir, resume, overwrite)
    d = Path(output_dir)
    if distributed.world_size() > 1:  # every rank has checked; rank 0 alone creates or clears
        distributed.barrier()
        refused = ""
        if distributed.is_main():
            try:
                _make_run_dir(d, resume, overwrite, lock)
            except ProxrlError as e:
                refused = str(e)
        refused = distributed.broadcast_object(refused)
        if refused:
            raise ProxrlError(refused)
        return d
    return _make_run_dir(d, resume, overwrite, lock)


def check_creatable(path: str | Path, what: str) -> None:
    """Refuse a directory ``path`` that cannot be created, or written in, because it is a plain
    file or one sits where a parent would be (``runs/notes.txt/run``): mkdir would end in
    NotADirectoryError or FileExistsError."""
    d = Path(path)
    blocking = next((p for p in (d, *d.parents) if p.exists()), None)  # the nearest that exists
    if blocking is None or blocking.is_dir():
        return
    where = "" if blocking == d else f": {blocking}"
    raise ProxrlError(f"{what} {d}{where} is a file, not a directory; choose another path")


def not_writable(path: str | Path, exc: OSError) -> ProxrlError | None:
    """The one-line error for ``exc`` when it says ``path`` cannot be written (no permission,
    a read-only file system, a full disk); None for another error."""
    if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT):
        return None
    return ProxrlError(f"cannot write in {path}: {exc.strerror}; choose a writable directory")


def _make_run_dir(d: Path, resume: bool, overwrite: bool, lock: RunLock | None) -> Path:
    try:
        return _make_run_dir_unchecked(d, resume, overwrite, lock)
    except OSError as exc:
        refused = not_writable(d, exc)
        if refused is None:
            raise
        raise refused from None


def _make_run_dir_unchecked(d: Path, resume: bool, overwrite: bool, lock: RunLock | None) -> Path:
    if lock is not None:
        lock.acquire()  # creates d; refuses a directory a live run holds
        check_output_dir(d, resume, overwrite)  # as it is now that no other run can change it
    if holds_run(d):
        if resume:
            return d
        for path in d.iterdir():  # the lock file stays: it is what other runs wait on
            if path.name == LOCK_FILE:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    d.mkdir(parents=True, exist_ok=True)
    (d / RUN_MARKER).write_text("")
    return d
