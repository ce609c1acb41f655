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

``proxrl --version`` prints the installed version. Before any command imports torch, the CPU
thread count is chosen once (``runtime.threads.cpu_threads``, as the Python API chooses it):
``PROXRL_NUM_THREADS`` if set, else ``OMP_NUM_THREADS`` if set, else half the cores, at most
``DEFAULT_MAX_THREADS`` — torch's own default (every core) thrashes on a shared or loaded machine
for the small models a CPU trains.

A trainer that returns ends with one line, whatever the output is (a terminal, a pipe, a file):
``<command>: finished; model saved in DIR; <headline metrics>`` (``final_line``; classic names
its final checkpoint). The exit code survives a closed pipe: Ctrl-C under ``| tee`` kills the
reader too, and the last messages then go nowhere instead of turning exit 130 into a traceback.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from typing import Any, TextIO

from proxrl.api import COMMANDS, MODEL_COMMANDS, command_module, train
from proxrl.runtime.errors import Interrupted, ProxrlError, RunFinished
from proxrl.runtime.logs import configure_logging
from proxrl.runtime.threads import cpu_threads, set_cpu_threads


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"proxrl {version('proxrl')}"
    except PackageNotFoundError:  # a source tree on PYTHONPATH, not installed
        return "proxrl (version unknown: not installed)"


def _usage() -> str:
    width = max(len(c) for c in COMMANDS)
    lines = [
        "usage: proxrl <command> [--config FILE] [--option value ...] [--debug | --quiet]",
        "       proxrl --version",
        "",
        "commands:",
    ]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`proxrl <command> --help` lists the options of a command."]
    return "\n".join(lines)


log = logging.getLogger(__name__)

HEADLINE = (
    "train/loss",
    "eval/loss",
    "eval/perplexity",
    "eval/accuracy",
    "eval/rewards/accuracies",
    "objective/scores",
    "objective/kl",
    "distill/reverse_kl",
    "distill/loss",
    "mean_return_last_100",
)
"""The metrics a finished run's last line shows, when it has them."""


def final_line(command: str, output_dir: Any, metrics: dict[str, Any]) -> str | None:
    """The line a finished trainer ends with (None for a command that trains nothing)."""
    figures = "".join(
        f"; {key} {metrics[key]:.4g}"
        for key in HEADLINE
        if isinstance(metrics.get(key), (int, float))
    )
    if command in MODEL_COMMANDS:
        return f"{command}: finished; model saved in {output_dir}{figures}"
    if command == "classic" and metrics.get("checkpoint"):
        return f"classic: finished; policy saved in {metrics['checkpoint']}{figures}"
    return None


COMMON_OPTIONS = (
    ("--config FILE", "options from a YAML file (field: value); flags given beside it win"),
    ("--debug", "on an error, print the traceback too, and log DEBUG records"),
    ("--quiet", "log warnings and errors only"),
)
"""What every command takes besides its config's fields (``--config``: the commands with a
``Config``); ``--help`` lists them after the fields."""


def _common_options(has_config: bool) -> str:
    shown = [
        (flag, help_)
        for flag, help_ in COMMON_OPTIONS
        if has_config or not flag.startswith("--config")
    ]
    width = max(len(flag) for flag, _ in shown)
    return "\n".join(["every command also takes:"] + [f"  {f:<{width}}  {h}" for f, h in shown])


def _run(command: str, argv: list[str]) -> int:
    from proxrl.runtime.config import parse_config

    # Only the command's config (its module and what the module imports) loads before the
    # arguments are parsed: its modules import transformers and peft where a model or
    # tokenizer is loaded, not at import, so `--help` and a typo answer before them.
    module = command_module(command)
    try:
        if hasattr(module, "main"):
            return int(module.main(argv) or 0)
        cfg = parse_config(module.Config, argv, prog=f"proxrl {command}")
    except SystemExit as e:  # --help printed the command's own options
        if e.code in (0, None) and any(a in ("-h", "--help") for a in argv):
            _say(_common_options(hasattr(module, "Config")), sys.stdout)
        raise
    run = train(cfg, command=command)
    line = final_line(command, run.output_dir, run.metrics)
    if line is not None:
        log.info("%s", line)
    return 0


def _say(text: str, stream: TextIO) -> None:
    """Print ``text``; a closed pipe (its reader gone: Ctrl-C under ``| tee``) is not an
    error — the stream is pointed at /dev/null so that nothing else fails on it either."""
    try:
        print(text, file=stream, flush=True)
    except (BrokenPipeError, ValueError):  # ValueError: the stream is already closed
        _silence(stream)


def _silence(stream: TextIO) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, stream.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # not a real file (a test's capture): nothing will flush it at exit
    finally:
        os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``proxrl`` console script; returns the exit code (a rank of a launched
    run ends here instead: ``distributed.end_launched_process``)."""
    exit_code = _main(sys.argv[1:] if argv is None else argv)
    if "torch.distributed" in sys.modules:  # else no group exists (and --help stays torch-free)
        from proxrl.runtime.distributed import end_launched_process

        end_launched_process(exit_code)
    return exit_code


def _main(argv: list[str]) -> int:
    argv = list(argv)
    # Our own progress bar shows the run; Hugging Face's per-file loading bars would only add
    # noise between its lines (read once, when transformers is first imported).
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    debug, quiet = "--debug" in argv, "--quiet" in argv
    argv = [a for a in argv if a not in ("--debug", "--quiet")]
    configure_logging(logging.DEBUG if debug else logging.WARNING if quiet else logging.INFO)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(_version())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(command, list(COMMANDS), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        print(f"proxrl: error: unknown command {command!r}{hint}", file=sys.stderr)
        return 2
    try:
        set_cpu_threads(cpu_threads())
        return _run(command, rest)
    except RunFinished as e:  # --resume of a complete run: nothing to do
        _say(f"proxrl {command}: {e}", sys.stdout)
        return e.exit_code
    except Interrupted as e:  # SIGINT/SIGTERM after the trainer saved a checkpoint
        _say(f"proxrl {command}: stopped: {e}", sys.stderr)
        return e.exit_code
    except ProxrlError as e:
        if debug:
            traceback.print_exc()
        _say(f"proxrl {command}: error: {e}", sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        _say(f"proxrl {command}: interrupted", sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of our output is gone (killed with us by Ctrl-C)
        _silence(sys.stdout)
        _silence(sys.stderr)
        return 141  # as a shell reports a process that SIGPIPE ended
    finally:
        _flush_quietly()


def _flush_quietly() -> None:
    """Flush stdout now, so that a closed pipe is not an error at interpreter exit (which
    would print a warning and turn the exit code into 120)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):
            _silence(stream)
