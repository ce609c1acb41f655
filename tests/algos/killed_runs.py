"""A run killed with SIGKILL in a subprocess once its first checkpoint is complete, and the
metrics rows two runs must share: what the online SIGKILL-and-resume tests have in common."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the tests package (reward functions)
SRC = REPO / "src"  # this checkout's proxrl, not an installed one


def sigkill_after_first_checkpoint(argv: list[str], run: Path, log: Path) -> None:
    """``python -m proxrl ARGV`` writing into ``run``, killed as soon as a checkpoint's manifest
    exists; its stderr goes to ``log``. Fails if the run ends, finishes or never saves first."""
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join([str(SRC), str(REPO)]),
        "OMP_NUM_THREADS": "1",
    }
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "proxrl", *argv],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    deadline = time.time() + 300
    while not any((run / "checkpoints").glob("step_*/manifest.json")):
        assert process.poll() is None, log.read_text()
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL
    assert not (run / "model.safetensors").exists(), "the run finished before it was killed"


def comparable(rows: list[dict]) -> list[dict]:
    """Metrics rows less the wall-clock fields (``time/``, ``perf/``), which no two runs share."""
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows]
