"""Joining a Ray cluster started on its own (``ray start --head``, then ``ray_address`` or
``$RAY_ADDRESS``), as docs/scaling.md tells a user to: the cluster runs with token
authentication, as Ray starts it once ``~/.ray/auth_token`` exists (any earlier local Ray
writes one), and the run sends that token.

The cluster is started with ``--block`` in a process of the test's own and stopped by ending
that process (``ray stop`` would stop every Ray on the machine, other runs' included); every
wait has a deadline and names what it waited for."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxrl.algos.online.placement.ray_run import connect
from proxrl.algos.online.roles import role_settings
from tests.ray.test_placement import config

RAY = Path(sys.executable).with_name("ray")
AUTH = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")
START_DEADLINE_S = 90.0
STOP_DEADLINE_S = 30.0


def free_port() -> int:
    """A TCP port free on this machine now; the test is skipped where none can be bound."""
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    except OSError as error:
        pytest.skip(f"no TCP port can be bound here ({error})")


def reset_ray_token_state() -> None:
    """Ray's cached config and token, re-read from this process's environment now."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def wait_started(process: subprocess.Popen[bytes], log: Path, port: int) -> None:
    """Until ``ray start --block`` says it blocks (its node is up), within START_DEADLINE_S."""
    deadline = time.monotonic() + START_DEADLINE_S
    while "block forever" not in log.read_text(errors="replace"):
        tail = log.read_text(errors="replace")[-1500:]
        if process.poll() is not None:
            if "already in use" in tail or "Address already" in tail:
                pytest.skip(f"port {port} was taken before ray start bound it")
            raise AssertionError(f"ray start --head exited {process.returncode}:\n{tail}")
        assert time.monotonic() < deadline, (
            f"ray start --head --port {port} not up within {START_DEADLINE_S:.0f} s:\n{tail}"
        )
        time.sleep(0.5)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM ends ``ray start --block`` and its node's processes; SIGKILL to its process group
    if it is not gone within STOP_DEADLINE_S."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=STOP_DEADLINE_S)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, Path, str]]:
    """A one-node cluster started by ``ray start --head`` in a home of its own holding a token:
    (its address, that home, ray start's output)."""
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    port = free_port()
    # Ray's socket paths must stay under 108 characters: a short temp dir, not tmp_path
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k not in AUTH}
    env |= {"HOME": str(home), "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    log = tmp_path / "ray_start.log"
    command = [str(RAY), "start", "--head", f"--port={port}", "--num-cpus=1"]
    command += ["--include-dashboard=false", f"--temp-dir={temp}", "--block"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_started(process, log, port)
        yield f"127.0.0.1:{port}", home, log.read_text(errors="replace")
    finally:
        stop(process)


def worker_pid() -> int:
    return os.getpid()


def test_a_run_joins_a_cluster_started_with_a_token_by_its_address(cluster, tmp_path):
    """RAY_ADDRESS=host:port of a ``ray start --head`` cluster that requires this machine's
    token: the run's connect joins it (within Ray's own connect deadline, not a minute of
    "Failed to connect") and a task runs on the cluster's node."""
    import ray

    address, home, started = cluster
    assert "Token authentication is enabled" in started, started[-1500:]
    saved = {k: os.environ.get(k) for k in (*AUTH, "HOME")}
    for key in AUTH:
        os.environ.pop(key, None)
    os.environ |= {"HOME": str(home), "RAY_ADDRESS": address}
    reset_ray_token_state()
    try:
        cfg = config("unused-model", "unused-prompts", tmp_path / "run", placement="ray")
        began = time.monotonic()
        assert connect(role_settings(cfg).ray) is True
        try:
            joined = time.monotonic() - began
            assert ray.cluster_resources().get("CPU") == 1.0  # the cluster's, not this machine's
            pid = ray.get(ray.remote(worker_pid).remote(), timeout=60)
            assert pid != os.getpid()
            assert joined < 15, f"joining took {joined:.0f} s"
        finally:
            ray.shutdown()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        reset_ray_token_state()
