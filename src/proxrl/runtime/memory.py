"""Host memory that the process has freed, handed back to the system.

glibc's malloc keeps the heap pages of freed tensors below the mmap threshold (which rises to
32 MB after the first such tensor is freed: most of a transformer's activations) and reuses
them only for allocations that fit in the holes. An update whose second micro-batch is larger
than its first (the padded plan takes rows in minibatch order) then grows the process by most
of the second's activations on top of the first's freed ones: issue 50's cached PPO held ~1 GB
of freed heap at its second micro-batch. ``malloc_trim`` returns those pages; the values
computed are untouched."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` from the process's C library, or None where it has none (macOS,
    musl, Windows)."""
    try:
        return ctypes.CDLL(None).malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError, TypeError):
        return None


def return_freed_memory() -> bool:
    """Give the heap's free pages back to the system (``malloc_trim(0)``); whether the C library
    could. Cheap next to a forward: it walks the free lists, and the pages it returns are
    faulted in again only as far as a later allocation reaches."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
