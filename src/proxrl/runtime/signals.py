"""Graceful stop: SIGINT / SIGTERM become a flag the training loop checks between steps.

A trainer wraps its loop in ``GracefulStop`` and, after each optimizer step (or iteration),
asks ``stop.requested``; when set, it saves a checkpoint and raises ``stop.interrupted(path)``,
which ``proxrl`` prints as one line and turns into exit code 130 (SIGINT) or 143 (SIGTERM)::

    with GracefulStop() as stop:
        for step in ...:
            train_one_step()
            if stop.requested:
                path = save_checkpoint(step)
                raise stop.interrupted(path)

A second signal while the first is being handled (e.g. a slow save and an impatient Ctrl-C)
is not swallowed: SIGINT raises ``KeyboardInterrupt`` at once and SIGTERM gets its default
action. Checkpoints are atomic (``runtime.checkpoint``), so even then the previous one is intact.

Handlers can only be installed from the main thread; elsewhere (a worker thread, some test
runners) ``GracefulStop`` installs nothing and ``requested`` stays ``False``.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from proxrl.runtime.errors import Interrupted

HANDLED = (signal.SIGINT, signal.SIGTERM)


class GracefulStop:
    """Context manager that records the first SIGINT/SIGTERM instead of dying on it.

    Attributes:
        signum: the first signal received, or ``None``.
    """

    def __init__(self, signals: tuple[int, ...] = HANDLED):
        self.signals = signals
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        """Whether a stop signal arrived; check it after each step."""
        return self.signum is not None

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def request(self, signum: int) -> None:
        """Record ``signum`` as if it had arrived here: a signal another process caught and
        forwarded (``placement: ray``'s driver to its trainer actor). The first one counts."""
        if self.signum is None:
            self.signum = signum

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.request(signum)
            return
        # Second signal: stop waiting for the loop.
        previous = self._previous.get(signum, signal.SIG_DFL)
        self._restore()
        if callable(previous):
            previous(signum, frame)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            signal.raise_signal(signum)

    def interrupted(self, checkpoint: str | Path | None) -> Interrupted:
        """The exception to raise once the checkpoint is saved (exit code 128 + signal)."""
        assert self.signum is not None, "interrupted() without a signal"
        where = (
            f"checkpoint saved in {checkpoint}; continue with --resume"
            if checkpoint is not None
            else "no checkpoint was saved"
        )
        return Interrupted(f"received {self.signal_name}; {where}", self.signum)

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                if signal.getsignal(signum) is signal.SIG_IGN:  # e.g. nohup: keep ignoring it
                    continue
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()
