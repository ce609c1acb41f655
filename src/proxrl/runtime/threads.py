"""How many CPU threads torch gets, chosen the same way by every way in (the command line, the
Python API, ``TrainingClient``).

``cpu_threads``: ``PROXRL_NUM_THREADS`` if set, else ``OMP_NUM_THREADS`` if set, else half the
cores this process may use, at most ``DEFAULT_MAX_THREADS``. torch's own default (every physical
core) thrashes on a shared or loaded machine for the small models a CPU trains: 20 GRPO
iterations of the README example took 26.5-35.9 s through ``proxrl.grpo(...)`` with torch's
default against 3.4-5.8 s through the command line on a many-core machine (issue 51).

The command line owns its process and sets the choice before torch is imported
(``set_cpu_threads``). The Python API runs in the user's process, where the user may already have
chosen: ``choose_cpu_threads`` applies the same choice unless torch's count is not torch's own
default (a ``torch.set_num_threads`` of the user's) or ``OMP_NUM_THREADS`` is set;
``PROXRL_NUM_THREADS`` is proxrl's own setting and always applies.
"""

from __future__ import annotations

import os
import sys

from proxrl.runtime.errors import ProxrlError

DEFAULT_MAX_THREADS = 4
"""CPU threads a command uses by default, at most (half the cores on a smaller machine)."""

THREADS_VARIABLE = "PROXRL_NUM_THREADS"


def cpu_threads(environ: dict[str, str] | os._Environ[str] = os.environ) -> int:
    """The CPU threads torch gets: ``PROXRL_NUM_THREADS``, else ``OMP_NUM_THREADS``, else
    half the cores this process may use, at most ``DEFAULT_MAX_THREADS``, at least 1 (the other
    half left to the tokenizer, data loading and whatever else the machine runs); a bad value is
    one line."""
    for name in (THREADS_VARIABLE, "OMP_NUM_THREADS"):
        value = environ.get(name, "").strip()
        if value:
            if not value.isdigit() or int(value) < 1:
                raise ProxrlError(f"{name}: expected a whole number >= 1, got {value!r}")
            return int(value)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min((cores or 1) // 2, DEFAULT_MAX_THREADS))


def set_cpu_threads(threads: int) -> None:
    """Before torch is imported: its OpenMP pool reads ``OMP_NUM_THREADS`` (child processes
    inherit it too); after, ``torch.set_num_threads``."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)


def torch_default_threads() -> int:
    """The intra-op thread count torch starts with when no variable names one: its inter-op
    default, the same physical-core count (``get_num_interop_threads`` reports it without
    starting the pool; nothing in proxrl sets the inter-op count)."""
    import torch

    return int(torch.get_num_interop_threads())


def user_chose_threads(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether the user has already set torch's CPU threads: ``OMP_NUM_THREADS`` (or
    ``MKL_NUM_THREADS``) in the environment, or ``torch.set_num_threads`` to a count other than
    torch's own default. Before torch is imported nobody has called it."""
    if any(environ.get(name, "").strip() for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and torch.get_num_threads() != torch_default_threads()


def choose_cpu_threads(environ: dict[str, str] | os._Environ[str] = os.environ) -> int:
    """For the Python API and ``TrainingClient``: the command line's choice, applied unless the
    user chose (``user_chose_threads``); ``PROXRL_NUM_THREADS`` always applies. Returns the
    count torch runs with (or will, when imported)."""
    if environ.get(THREADS_VARIABLE, "").strip() or not user_chose_threads(environ):
        threads = cpu_threads(environ)
        set_cpu_threads(threads)
        return threads
    torch = sys.modules.get("torch")
    return int(torch.get_num_threads()) if torch is not None else cpu_threads(environ)
