"""The Python API and ``TrainingClient`` give torch the CLI's thread count (issue 51: 20 GRPO
iterations took 26.5-35.9 s through ``proxrl.grpo(...)`` with torch's default, every core,
against 3.4-5.8 s through the CLI), unless the user chose one: ``torch.set_num_threads`` or
``OMP_NUM_THREADS``; ``PROXRL_NUM_THREADS`` is proxrl's own and always applies.

torch's default is simulated (``torch_default_threads`` patched to 3, on 8 cores the CLI's choice
is 4), so the checks hold on any machine; the entry points are called with input they refuse at
once, after the threads are chosen."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import proxrl
from proxrl.runtime import threads
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.threads import cpu_threads

TORCH_DEFAULT = 3
ENTRY_POINTS = {
    "api": lambda: proxrl.grpo(no_such_option=1),
    "client": lambda: proxrl.TrainingClient(),
}


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch):
    """8 cores, no thread variable set, torch at its (simulated) default; restored after."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PROXRL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(threads, "torch_default_threads", lambda: TORCH_DEFAULT)
    before = torch.get_num_threads()
    torch.set_num_threads(TORCH_DEFAULT)
    yield
    torch.set_num_threads(before)


def enter(entry: str) -> None:
    with pytest.raises(ProxrlError):
        ENTRY_POINTS[entry]()


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_the_cli_choice_replaces_torch_default(machine, entry):
    enter(entry)
    assert torch.get_num_threads() == cpu_threads({}) == 4
    assert os.environ["OMP_NUM_THREADS"] == "4"  # as the CLI: child processes inherit it


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_users_set_num_threads_is_kept(machine, entry):
    torch.set_num_threads(2)
    enter(entry)
    assert torch.get_num_threads() == 2 and "OMP_NUM_THREADS" not in os.environ


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_users_omp_num_threads_is_kept(machine, monkeypatch, entry):
    """Even where torch's count looks like its default (set after OMP_NUM_THREADS was read)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    enter(entry)
    assert torch.get_num_threads() == TORCH_DEFAULT


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_proxrl_num_threads_always_applies(machine, monkeypatch, entry):
    monkeypatch.setenv("PROXRL_NUM_THREADS", "2")
    torch.set_num_threads(1)
    enter(entry)
    assert torch.get_num_threads() == 2


def test_torch_default_is_read_as_torch_starts(tmp_path):
    """Unpatched, in a fresh process with no thread variable: torch's starting count."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PROXRL_NUM_THREADS")
    }
    code = (
        "import torch; from proxrl.runtime.threads import torch_default_threads, "
        "user_chose_threads; print(torch.get_num_threads() == torch_default_threads(), "
        "user_chose_threads())"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["True", "False"], out.stderr
