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
- The order: ``--dist worksteal`` first hands worker k the k-th contiguous share of the
  collection and a worker that runs dry steals the *end* of another's queue, so the modules of
  HEAVY_MODULES (Ray runs, torchrun launches, SIGKILL-resumes: over half the suite's time) are
  dealt to the workers' shares, longest first, and each share starts with its own: both
  workers begin on heavy modules at once, each module stays whole on one worker (its module
  fixtures, the local Ray among them, built once) and the tail is of short tests. Without
  xdist (or with one worker) the order is pytest's.

tests/vllm needs the vllm package, which lives in an environment of its own (.venv-vllm, built
by ``make test``): elsewhere those tests are not collected at all, rather than shown as
skipped."""

from __future__ import annotations

import importlib.util
import os
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


# Seconds a module took in ``make test`` (2 workers on a shared 2-core machine, load ~5, the
# calls and setups pytest's --durations listed): only their ratios matter, to deal the heavy
# modules evenly between the workers. A module not listed counts as light.
HEAVY_MODULES = {
    "tests/ray/test_placement.py": 500,
    "tests/ray/test_ray_weight_transport.py": 190,
    "tests/ray/test_ray_trainer_group.py": 125,
    "tests/algos/test_online.py": 125,
    "tests/algos/test_kill_resume.py": 100,
    "tests/distributed/test_dp_online.py": 100,
    "tests/distributed/test_dp_offline.py": 65,
    "tests/ray/test_ray_critic.py": 42,
    "tests/distributed/test_fsdp_offline.py": 42,
    "tests/distributed/test_fsdp_online.py": 40,
    "tests/ray/test_ray_teacher.py": 39,
    "tests/algos/test_issue37_runs.py": 33,
    "tests/classic/test_train.py": 30,
    "tests/classic/test_reliability.py": 26,
    "tests/distributed/test_dp_rollouts_file.py": 26,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deal HEAVY_MODULES to the xdist workers' first shares (module docstring: the order)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2 or len(items) < workers:
        return
    modules: dict[str, list[pytest.Item]] = {}
    light: list[pytest.Item] = []
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        if module in HEAVY_MODULES:
            modules.setdefault(module, []).append(item)
        else:
            light.append(item)
    bins: list[list[pytest.Item]] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for module in sorted(modules, key=lambda m: -HEAVY_MODULES[m]):  # longest first, to the
        k = min(range(workers), key=lambda i: (load[i], i))  # least loaded share so far
        bins[k] += modules[module]
        load[k] += HEAVY_MODULES[module]
    # the shares' sizes as worksteal cuts them: len(pending) // workers remaining, in turn
    ordered: list[pytest.Item] = []
    left = len(items)
    for k in range(workers):
        size = left // (workers - k)
        left -= size
        fill = max(0, size - len(bins[k]))
        ordered += bins[k] + light[:fill]
        light = light[fill:]
    items[:] = ordered + light
