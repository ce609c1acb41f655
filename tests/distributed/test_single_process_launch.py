"""``accelerate launch --cpu --num_processes 2`` without MPI starts one ordinary process and no
error (accelerate 1.x): proxrl notices that several were asked for and one came, and says how
to launch them, in one line, exit code 2 (which accelerate passes on as its child's status),
before anything is loaded or written."""

from __future__ import annotations

import subprocess

import pytest

from proxrl.runtime import distributed as dist
from proxrl.runtime.errors import ProxrlError
from tests.distributed.launch import BIN, REPO, _env, free_port


def test_accelerate_cpu_with_two_processes_is_refused_with_the_command_that_works(tmp_path):
    cmd = [
        str(BIN / "accelerate"),
        "launch",
        "--cpu",
        "--num_processes",
        "2",
        "--main_process_port",
        str(free_port()),
        "-m",
        "proxrl",
        "sft",
        "--model",
        "nowhere/model",
        "--data",
        "nowhere.jsonl",
        "--output-dir",
        str(tmp_path / "run"),
    ]
    done = subprocess.run(cmd, env=_env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    # accelerate reports its child's exit status (and its own traceback) after proxrl's line.
    lines = [line.strip() for line in done.stderr.splitlines()]
    assert lines.count(f"proxrl sft: error: {dist.SINGLE_PROCESS_LAUNCH}") == 1, done.stderr
    assert "returned non-zero exit status 2." in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("env", "refused"),
    [
        ({"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, True),
        ({"ACCELERATE_USE_CPU": "True"}, False),  # --num_processes 1: no rendezvous set
        ({"ACCELERATE_USE_CPU": "True", "MASTER_PORT": "29500", "WORLD_SIZE": "2"}, False),
        ({"ACCELERATE_USE_CPU": "True", "MASTER_PORT": "29500", "PMI_SIZE": "2"}, False),  # mpirun
        ({"MASTER_PORT": "29500"}, False),  # not accelerate's launcher
    ],
)
def test_the_check_reads_what_each_launcher_sets(monkeypatch, env, refused):
    for name in ("ACCELERATE_USE_CPU", "MASTER_ADDR", "MASTER_PORT", *dist.WORLD_SIZE_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if refused:
        with pytest.raises(ProxrlError, match="asked for several processes but started only"):
            dist.check_launch()
    else:
        dist.check_launch()
