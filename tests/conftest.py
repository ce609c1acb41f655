"""Suite-wide settings. ``make test`` runs the suite on pytest-xdist workers, one per core
(``-n auto --dist worksteal`` in the Makefile; a plain ``pytest`` runs in one process), so every
test must be safe beside any other test running at the same moment in another process:

- Files only under ``tmp_path`` / ``tmp_path_factory`` (each worker has its own base directory),
  never a fixed path in /tmp, the repository or the working directory; a subprocess gets an
  explicit ``--output-dir`` / ``cwd`` inside ``tmp_path``.
- Network ports: never a fixed one (29500 is everyone's default). ``launch.free_port()`` for
  ``--main_process_port`` / ``--master_port``; ``torchrun --standalone`` picks its own. A
  literal MASTER_PORT is fine only where nothing binds it (a check refusing before launch).
- Environment variables and module attributes only through ``monkeypatch`` (undone after the
  test); no module-level state that one test writes and another reads — the order and the
  worker a test runs on are not fixed.
- Expensive setup shared by a module: a ``scope="module"`` fixture is built once per worker that
  runs any of the module's tests; it must not depend on which tests ran before.
- Tests that start processes of their own that talk to each other (torchrun, accelerate
  launch, a Ray cluster) may run beside another such test: free ports only (above), a
  subprocess timeout that allows for 4 processes on 2 cores, no assumption of an idle machine.
  (pytest-xdist's ``--dist loadgroup`` could keep them on one worker, but with pytest 9.2 it
  silently ignores ``xdist_group`` marks: pytest-xdist issue 1386.)
- Signal handlers: a test that installs one restores the previous handler. SIGINT is as in an
  interactive shell in every worker (``pytest_configure`` below), not ignored as xdist has it.
- Hypothesis keeps no example database (both workers would write failing examples into the
  checkout's .hypothesis/); a failure prints its falsifying example and ``@reproduce_failure``
  line instead. (Hypothesis still caches constants there, in a directory that git-ignores
  itself.)
- A test that times something or waits for a subprocess must allow for a loaded machine (the
  other worker runs beside it): wait on a condition with a generous deadline, not a sleep.

tests/vllm needs the vllm package, which lives in an environment of its own (.venv-vllm, built
by ``make test``): elsewhere those tests are not collected at all, rather than shown as
skipped."""

from __future__ import annotations

import importlib.util
import signal

import pytest
from hypothesis import settings

# tests/ is the package `tests` (pytest puts the repository root on sys.path: `pythonpath` in
# pyproject.toml), so `vllm` here is the vllm package, never tests/vllm.
collect_ignore = [] if importlib.util.find_spec("vllm") is not None else ["vllm"]

settings.register_profile("proxrl", database=None)
settings.load_profile("proxrl")


def pytest_configure(config: pytest.Config) -> None:
    """xdist's workers (and any process started in the background by a non-interactive shell)
    inherit SIGINT ignored; Python then installs no KeyboardInterrupt handler, and a
    subprocess started from there inherits the ignored signal too. The Ctrl-C tests need
    SIGINT as an interactive ``pytest`` has it."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
