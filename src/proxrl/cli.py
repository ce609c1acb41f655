"""``proxrl <command> [options]``: parse a config, run the command, turn user errors into one line.

A thin layer over the Python API (``proxrl.api``): flags and a YAML file become the command's
config, which ``proxrl.api.train`` runs exactly as a notebook's ``proxrl.train(cfg)`` does. Each
command names a module, imported only when that command runs (so ``proxrl classic`` never
imports transformers). A module exposes either ``Config`` (a dataclass) and ``train(cfg)``, or
``main(argv) -> int | None`` when it parses its own arguments.

A ``ProxrlError`` prints ``proxrl <command>: error: <message>`` to stderr and exits 2; add
``--debug`` anywhere on the command line to see the traceback too (and DEBUG log records), or
``--quiet`` to see warnings and errors only. Logging is configured here, once
(``runtime.logs``); the rest of the library only logs. A trainer stopped by
SIGINT/SIGTERM saves a checkpoint and prints ``proxrl <command>: stopped: <where>``, exit code
130 / 143 (``runtime.signals``). ``--resume`` of a run that is already complete prints
``proxrl <command>: the run in DIR is already finished ...`` on stdout, exit code 0.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback

from proxrl.api import COMMANDS, command_module, train
from proxrl.runtime.errors import Interrupted, ProxrlError, RunFinished
from proxrl.runtime.logs import configure_logging


def _usage() -> str:
    width = max(len(c) for c in COMMANDS)
    lines = [
        "usage: proxrl <command> [--config FILE] [--option value ...] [--debug | --quiet]",
        "",
        "commands:",
    ]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`proxrl <command> --help` lists the options of a command."]
    return "\n".join(lines)


def _run(command: str, argv: list[str]) -> int:
    from proxrl.runtime.config import parse_config

    module = command_module(command)
    if hasattr(module, "main"):
        return int(module.main(argv) or 0)
    train(parse_config(module.Config, argv, prog=f"proxrl {command}"), command=command)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``proxrl`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # Our own progress bar shows the run; Hugging Face's per-file loading bars would only add
    # noise between its lines (read once, when transformers is first imported).
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    debug, quiet = "--debug" in argv, "--quiet" in argv
    argv = [a for a in argv if a not in ("--debug", "--quiet")]
    configure_logging(logging.DEBUG if debug else logging.WARNING if quiet else logging.INFO)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(command, list(COMMANDS), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        print(f"proxrl: error: unknown command {command!r}{hint}", file=sys.stderr)
        return 2
    try:
        return _run(command, rest)
    except RunFinished as e:  # --resume of a complete run: nothing to do
        print(f"proxrl {command}: {e}")
        return e.exit_code
    except Interrupted as e:  # SIGINT/SIGTERM after the trainer saved a checkpoint
        print(f"proxrl {command}: stopped: {e}", file=sys.stderr)
        return e.exit_code
    except ProxrlError as e:
        if debug:
            traceback.print_exc()
        print(f"proxrl {command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"proxrl {command}: interrupted", file=sys.stderr)
        return 130
