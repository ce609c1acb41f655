"""Metrics: one JSON line per logged step in ``OUTPUT_DIR/metrics.jsonl``, the same scalars in
every tracker of ``report_to`` (TensorBoard events in ``OUTPUT_DIR/tensorboard/`` by default;
wandb, mlflow, trackio: ``runtime.trackers``), and a rich progress bar for the terminal (a
plain log line every ~5% of the run where stderr is a file or a pipe).

``metrics.jsonl`` is the source of truth (tests and benchmarks read it); each line is
``{"step": <int>, "<namespace>/<name>": <float>, ...}`` and is flushed as soon as it is written,
so a killed run keeps every line it logged. On resume, ``truncate_after(step)`` drops the lines a
crashed run wrote after its last checkpoint (and a last line a SIGKILL cut in half), so the file
reads as one uninterrupted run.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from proxrl.runtime.trackers import Tracker, open_trackers

METRICS_FILE = "metrics.jsonl"
PROGRESS_LINES = 20
"""Lines a run without a terminal logs in place of the bar: one every ``total / 20`` units."""

log = logging.getLogger(__name__)


def _scalar(value: Any) -> float:
    """A Python float from a float, int, 0-d tensor or NumPy scalar."""
    if hasattr(value, "item"):
        value = value.item()
    return float(value)


def _parse_line(line: str) -> dict[str, Any] | None:
    """A row, or ``None`` for a blank line or one a killed process left half-written."""
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return row if isinstance(row, dict) and isinstance(row.get("step"), int) else None


class MetricsLogger:
    """Append-only scalar log (JSON lines + the trackers of ``report_to``).

    Args:
        output_dir: the run directory; created if missing.
        enabled: ``False`` makes every method a no-op (e.g. on non-zero ranks).
        tensorboard: with ``report_to`` None, whether TensorBoard is the tracker.
        report_to: tracker names (``runtime.trackers.TRACKERS``; ``none``: only the file).
        config: the run's options, sent to each tracker once as its parameters.
    """

    def __init__(
        self,
        output_dir: str | Path,
        enabled: bool = True,
        tensorboard: bool = True,
        report_to: Sequence[str] | None = None,
        config: Mapping[str, Any] | None = None,
    ):
        self.enabled = enabled
        self.path = Path(output_dir) / METRICS_FILE
        self._file: Any = None
        self._trackers: list[Tracker] = []
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
            names = report_to if report_to is not None else ["tensorboard"] * tensorboard
            self._trackers = open_trackers(names, Path(output_dir), config or {})

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        """Append ``{"step": step, **metrics}`` (values made floats) and flush, send the row to
        every tracker; return the row."""
        row = {name: _scalar(v) for name, v in metrics.items()}
        if not self.enabled:
            return row
        line = json.dumps({"step": int(step), **row})
        self._file.write(line + "\n")
        self._file.flush()
        for tracker in self._trackers:
            tracker.log(int(step), row)
        return row

    def truncate_after(self, step: int) -> None:
        """Drop every logged line whose step is greater than ``step`` (resume from ``step``)."""
        if not self.enabled:
            return
        self._file.close()
        kept = [
            line
            for line in self.path.read_text(encoding="utf-8").splitlines()
            if (row := _parse_line(line)) is not None and row["step"] <= step
        ]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        tmp.replace(self.path)
        self._file = self.path.open("a", encoding="utf-8")
        for tracker in self._trackers:
            tracker.resume_at(step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        for tracker in self._trackers:
            tracker.close()
        self._trackers = []

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(output_dir: str | Path) -> list[dict[str, float]]:
    """Every row of ``OUTPUT_DIR/metrics.jsonl``, in order."""
    path = Path(output_dir) / METRICS_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class ProgressBar:
    """A rich progress bar: done/total, rate, ETA and a few live metrics.

    Use as a context manager; ``update(n, **metrics)`` advances by ``n`` and shows the metrics.
    With ``enabled=False`` nothing is shown. Without a terminal (stderr a file or a pipe: a log
    someone tails) nothing is drawn; a plain INFO line with done/total and the metrics is logged
    instead each time another ``total / PROGRESS_LINES`` units are done, and at the end.
    """

    def __init__(self, total: int, description: str, completed: int = 0, enabled: bool = True):
        # Importing rich.progress draws from Python's global generator; the run's stream must
        # not depend on whether this is the first bar of the process (a resumed run's is).
        state = random.getstate()
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        random.setstate(state)

        console = Console(stderr=True)
        self.enabled = enabled and console.is_terminal
        self.lines = enabled and not console.is_terminal
        self._description, self._total, self._done = description, total, completed
        self._every = max(1, round(total / PROGRESS_LINES))
        self._start = time.perf_counter()
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"),
            console=console,
            disable=not self.enabled,
        )
        self._task = self._progress.add_task(description, total=total, completed=completed, info="")

    def update(self, advance: int, **metrics: float) -> None:
        info = "  ".join(f"{k} {v:.4g}" for k, v in metrics.items())
        self._progress.update(self._task, advance=advance, info=info)
        before, self._done = self._done, self._done + advance
        if self.lines and (
            self._done // self._every > before // self._every or self._done >= self._total
        ):
            log.info("%s %d/%d  %s", self._description, self._done, self._total, info)

    def __enter__(self) -> ProgressBar:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()


def progress_bar(
    total: int, description: str, completed: int = 0, enabled: bool = True
) -> ProgressBar:
    """A ``ProgressBar`` for ``total`` units (e.g. environment steps), starting at ``completed``."""
    return ProgressBar(total, description, completed=completed, enabled=enabled)
