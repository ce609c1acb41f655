"""Where log records go: set up once, by the ``proxrl`` command, before a command runs.

Library code only logs (``logging.getLogger(__name__)``); this module decides what the user sees:
the ``proxrl`` loggers at INFO (``--debug``: DEBUG, ``--quiet``: warnings only), every other
library at WARNING, Python warnings included, all on stderr: through rich's handler on a
terminal, as plain lines (never wrapped, so paths stay whole) when stderr is a file or a pipe.

Several processes (``accelerate launch``, ``torchrun``: ``RANK`` is set): rank 0 alone shows
INFO; every other rank shows warnings and errors only, so each message is printed once.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import warnings
from typing import Any


class _PlainFormatter(logging.Formatter):
    """``message`` for INFO and below, ``warning: message`` / ``error: message`` above."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text if record.levelno <= logging.INFO else f"{record.levelname.lower()}: {text}"


def _log_warning(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
    """``warnings.showwarning`` replacement: a Python warning becomes a WARNING record."""
    logging.getLogger("py.warnings").warning("%s", message)


def configure_logging(level: int = logging.INFO) -> None:
    """Show ``proxrl`` records at ``level`` and other libraries' warnings on stderr.

    Like ``logging.basicConfig``, it installs no handler when the root logger already has one
    (an application that embeds proxrl, or pytest, decides where records go then); the level
    of the ``proxrl`` loggers is set either way. Calling it again only changes that level.
    A rank other than 0 of a multi-process launch logs warnings and above only.
    """
    if _launch_rank() > 0:
        level = max(level, logging.WARNING)
    logging.getLogger("proxrl").setLevel(level)
    root = logging.getLogger()
    if root.handlers:
        return
    handler: logging.Handler
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.logging import RichHandler

        handler = RichHandler(
            console=Console(stderr=True),
            show_time=False,
            show_path=False,
            markup=False,
            rich_tracebacks=False,
        )
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_PlainFormatter("%(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    warnings.showwarning = _log_warning


def _launch_rank() -> int:
    """This process's rank in a multi-process launch, from the launcher's environment (read
    before any process group exists); 0 without one."""
    for name in ("RANK", "LOCAL_RANK"):
        try:
            return int(os.environ[name])
        except (KeyError, ValueError):
            continue
    return 0


def rendered(renderable: object, width: int = 100) -> str:
    """A rich renderable (a table) as plain text, for a log record."""
    from rich.console import Console

    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text().rstrip("\n")
