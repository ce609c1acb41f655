"""What the command line settles before any command runs: ``--version``; the CPU thread count
(``PROXRL_NUM_THREADS``, else ``OMP_NUM_THREADS``, else at most ``DEFAULT_MAX_THREADS``: torch's
own default, every core, thrashed on a shared machine: the example SFT took 1 min 49 s there
against 8.8 s in the demo, which uses one); and a ``--help`` or a typo answered before the
trainer's modules (transformers) are imported."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version

import pytest
import torch

from proxrl.cli import main
from proxrl.runtime.threads import DEFAULT_MAX_THREADS, THREADS_VARIABLE, cpu_threads


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag, capsys):
    assert main([flag]) == 0
    assert capsys.readouterr().out.strip() == f"proxrl {version('proxrl')}"


def test_usage_names_version(capsys):
    assert main(["--help"]) == 0
    assert "proxrl --version" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("environ", "threads"),
    [
        ({"PROXRL_NUM_THREADS": "3"}, 3),
        ({"PROXRL_NUM_THREADS": "3", "OMP_NUM_THREADS": "5"}, 3),
        ({"OMP_NUM_THREADS": "5"}, 5),
        ({"PROXRL_NUM_THREADS": " ", "OMP_NUM_THREADS": "2"}, 2),
    ],
)
def test_the_thread_count_a_user_sets(environ, threads):
    assert cpu_threads(environ) == threads


def test_the_default_is_half_the_cores_at_most_four(monkeypatch):
    """On the 2-core machine these sessions share, the example SFT took 12–27 s with one
    thread and 63–101 s with two (torch's default there)."""
    for cores, threads in ((64, DEFAULT_MAX_THREADS), (6, 3), (2, 1), (1, 1)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cores: set(range(n)))
        assert cpu_threads({}) == threads


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5"])
def test_a_bad_thread_count_is_one_line(value, monkeypatch, capsys):
    monkeypatch.setenv("PROXRL_NUM_THREADS", value)
    assert main(["report", "nowhere"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"proxrl report: error: PROXRL_NUM_THREADS: expected a whole number >= 1, got {value!r}"
    )


def test_a_command_runs_with_the_chosen_threads(monkeypatch, tmp_path):
    """main sets torch's thread count once, before the command (here a report that fails)."""
    monkeypatch.setenv("PROXRL_NUM_THREADS", "2")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    try:
        main(["report", str(tmp_path / "nowhere")])
        assert torch.get_num_threads() == 2 and os.environ["OMP_NUM_THREADS"] == "2"
    finally:
        torch.set_num_threads(1)


def test_a_fresh_process_gets_the_default(tmp_path):
    """torch imported after the choice reads it: no set_num_threads call needed in a trainer."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PROXRL_NUM_THREADS")
    }
    code = (
        "from proxrl import cli;"
        "cli.set_cpu_threads(cli.cpu_threads()); import torch;"
        "print(torch.get_num_threads())"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert int(out.stdout) == cpu_threads({})
    assert THREADS_VARIABLE == "PROXRL_NUM_THREADS"
