"""``runtime.memory.return_freed_memory``: the heap's freed pages back to the system (glibc;
the online update calls it before every micro-batch: tests/algos/test_pass_memory.py)."""

from __future__ import annotations

import pytest
import torch

from proxrl.runtime import memory


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20


@pytest.mark.skipif(memory._malloc_trim() is None, reason="no malloc_trim in this C library")
def test_freed_heap_pages_go_back_to_the_system():
    # 4,000 tensors of 64 KiB (below glibc's mmap threshold: heap), the last one kept: the
    # heap cannot shrink from its top, so the 250 MB freed below it stay in the process
    tensors = [torch.ones(16 * 1024) for _ in range(4000)]
    kept = tensors[-1]
    del tensors
    before = _rss_mb()
    assert memory.return_freed_memory()
    assert _rss_mb() < before - 150
    assert float(kept.sum()) == 16 * 1024
