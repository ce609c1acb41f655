"""Start a proxrl command (or a script) on N CPU processes over gloo, as a user would.

``accelerate launch --multi_gpu`` on a machine without GPUs runs ``torch.distributed.run`` and
proxrl's ``runtime.distributed`` picks the CPU and gloo; ``torchrun`` is the other launcher.
(``accelerate launch --cpu --num_processes N`` on one machine goes through ``mpirun`` in
accelerate 1.x, which needs an MPI install and a hostfile.)"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
GLOO_CONFIG = REPO / "configs" / "accelerate" / "cpu_gloo_2proc.yaml"
FSDP_CONFIG = REPO / "configs" / "accelerate" / "cpu_fsdp_2proc.yaml"
FSDP_ENV = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}  # what accelerate launch exports


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ) | (extra or {})
    env["OMP_NUM_THREADS"] = "1"
    # the repository root: the tests package (tests.algos.online_rewards:<name>) in each rank
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def accelerate_launch(
    args: list[str],
    nproc: int = 2,
    cwd: Path | None = None,
    timeout: int = 120,
    config: Path = GLOO_CONFIG,
):
    cmd = [
        str(BIN / "accelerate"),
        "launch",
        "--config_file",
        str(config),
        "--num_processes",
        str(nproc),
        "--main_process_port",
        str(free_port()),
        *args,
    ]
    return _run(cmd, _env(), cwd, timeout)


def torchrun(
    args: list[str],
    nproc: int = 2,
    cwd: Path | None = None,
    timeout: int = 120,
    env: dict[str, str] | None = None,
):
    cmd = [
        str(BIN / "torchrun"),
        "--standalone",
        f"--nproc_per_node={nproc}",
        f"--master_port={free_port()}",
        *args,
    ]
    return _run(cmd, _env(env), cwd, timeout)


def _run(cmd: list[str], env: dict[str, str], cwd: Path | None, timeout: int):
    """``subprocess.run`` in a session of its own: on a timeout the launcher and every rank it
    started are killed (a hung collective must not leave ranks behind)."""
    with subprocess.Popen(
        cmd,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise
    return subprocess.CompletedProcess(cmd, process.returncode, stdout, stderr)


def check(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
