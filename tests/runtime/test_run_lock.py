"""One live run per output directory (``runtime.run_dir.RunLock``, taken by ``Run.prepare``): a
second run — fresh, ``--resume`` or ``--overwrite`` — is refused in one line naming the live run's
process while it lives, nothing of the live run is touched, and a holder killed with SIGKILL
leaves no stale lock. The live run is a subprocess that took the lock through ``Run.prepare``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.run import Run
from proxrl.runtime.run_dir import LOCK_FILE, RUN_MARKER

SRC = Path(__file__).resolve().parents[2] / "src"


@dataclass
class Cfg:
    output_dir: str
    resume: bool = False
    overwrite: bool = False
    resume_with_changes: bool = False
    keep_checkpoints: int = 3
    max_consecutive_skips: int = 5
    report_to: tuple[str, ...] = ("none",)
    progress: bool = False


HOLDER = textwrap.dedent(
    """
    import sys, time
    from dataclasses import dataclass
    from proxrl.runtime.run import Run

    @dataclass
    class Cfg:
        output_dir: str
        resume: bool = False
        overwrite: bool = False
        resume_with_changes: bool = False

    run = Run(Cfg(sys.argv[1]))
    run.prepare()
    (run.output_dir / "metrics.jsonl").write_text('{"step": 1}\\n')  # work a new run would lose
    print("locked", flush=True)
    time.sleep(120)
    """
)


@pytest.fixture
def holder(tmp_path):
    """A live run holding ``tmp_path/run`` (a subprocess), killed with SIGKILL at the end."""
    out = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out), "--tag"],
        env=os.environ | {"PYTHONPATH": str(SRC)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = _readline(process, deadline_s=60)
        assert line == "locked\n", f"the holder did not take the lock: {line!r}"
        yield process, out
    finally:
        process.kill()
        process.wait(timeout=30)


def _readline(process: subprocess.Popen, deadline_s: float) -> str:
    """The subprocess's first line, or a failure naming the deadline."""
    import selectors

    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
    if not selector.select(timeout=deadline_s):
        pytest.fail(f"the holder printed nothing within {deadline_s} s")
    return process.stdout.readline()  # type: ignore[union-attr]


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "options", [{}, {"resume": True}, {"overwrite": True}], ids=["fresh", "resume", "overwrite"]
)
def test_a_second_run_on_a_live_run_is_refused_naming_its_process(holder, options):
    process, out = holder
    run = Run(Cfg(str(out), **options))
    for step in (run.check_output_dir, run.prepare):  # refused early, and again at prepare
        with pytest.raises(ProxrlError) as refused:
            step()
        message = str(refused.value)
        assert "\n" not in message
        assert f"output directory {out} is in use by a live run" in message
        assert f"pid {process.pid} on " in message and "--tag" in message  # pid, host, command
    assert (out / "metrics.jsonl").read_text() == '{"step": 1}\n'  # nothing of it was touched
    assert (out / RUN_MARKER).is_file()


@pytest.mark.timeout(90)
def test_a_sigkilled_run_leaves_no_stale_lock(holder):
    process, out = holder
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert (out / LOCK_FILE).is_file()  # the file stays; the kernel dropped the lock
    run = Run(Cfg(str(out), overwrite=True))
    run.check_output_dir()
    run.prepare()
    assert not (out / "metrics.jsonl").exists()  # the old run was replaced
    assert (out / LOCK_FILE).is_file()
    # Now this process holds it: another process is refused, naming this one.
    refused = subprocess.run(
        [sys.executable, "-c", HOLDER, str(out)],
        env=os.environ | {"PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1 and f"pid {os.getpid()} on " in refused.stderr
    run.release()


def _held(out: Path) -> bool:
    """Whether ``out``'s lock file is there and flock-ed: a descriptor of its own (another open
    file description, as another process's would be) cannot take it."""
    import fcntl

    try:
        fd = os.open(out / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@pytest.mark.timeout(60)
def test_the_lock_is_reentrant_in_one_process_and_released(tmp_path):
    """A run and then its resume in one process (a notebook, the demo) share the lock: the
    lock stays while either holds it, and once both are released the directory is free for
    another process."""
    out = tmp_path / "run"
    first = Run(Cfg(str(out)))
    first.prepare()
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    second = Run(Cfg(str(out), resume=True))
    second.check_output_dir()
    second.prepare()
    assert _held(out)
    first.release()
    assert _held(out), "releasing the first run dropped the second one's lock"
    first.release()  # idempotent: a second release of the same run takes nothing more
    assert _held(out)
    second.release()
    assert not _held(out) and not (out / LOCK_FILE).exists()
    start = time.time()
    free = subprocess.run(
        [sys.executable, "-c", HOLDER.replace("time.sleep(120)", ""), str(out)],
        env=os.environ | {"PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.time() - start < 60
    assert "already holds a run" in free.stderr and "in use" not in free.stderr, free.stderr


@pytest.mark.timeout(60)
def test_a_live_run_keeps_its_lock_when_an_earlier_run_is_collected(tmp_path):
    """The earlier ``Run`` of the directory dropped (collected, or released after the later
    one took the lock): the live one still holds it, and another process is refused naming
    this one; released last, the directory is free."""
    import gc

    out = tmp_path / "run"
    earlier = Run(Cfg(str(out)))
    earlier.prepare()
    live = Run(Cfg(str(out), resume=True))
    live.prepare()
    del earlier
    gc.collect()
    assert _held(out), "collecting the earlier run dropped the live run's lock"
    refused = subprocess.run(
        [sys.executable, "-c", HOLDER.replace("time.sleep(120)", ""), str(out)],
        env=os.environ | {"PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1 and f"pid {os.getpid()} on " in refused.stderr
    another = Run(Cfg(str(out), resume=True))  # a third in this process: it shares the lock
    another.prepare()
    another.release()
    assert _held(out)
    live.release()
    assert not _held(out)
