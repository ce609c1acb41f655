"""proxrl's exit handler really stops the process group: after ``destroy_process_group`` no
gloo thread is left running into interpreter shutdown, where one can abort the process
("terminate called without an active exception", exit -6 after the work is done). torch._dynamo
imported after the group exists keeps the group alive past ``destroy_process_group``; proxrl
imports it before creating the group."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed.launch import check, torchrun

SCRIPT = Path(__file__).with_name("shutdown_script.py")
EXIT_SCRIPT = Path(__file__).with_name("exit_script.py")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for thread names")
def test_exit_handler_stops_gloo_threads_after_dynamo_was_imported(tmp_path):
    check(torchrun([str(SCRIPT), str(tmp_path)]))
    for rank in (0, 1):
        report = json.loads((tmp_path / f"threads_{rank}.json").read_text())
        assert report["value"] == 4.0  # the group summed over 2 ranks
        assert any("gloo" in name for name in report["before"]), report
        assert not any("gloo" in name for name in report["after"]), report


def test_a_launched_rank_ends_in_main_after_its_exit_handlers_with_its_output(tmp_path):
    """Each rank ends in ``cli.main`` (no C++ teardown for gloo's threads to race): the exit
    handlers registered before and after the group both ran, proxrl's own destroyed the group
    in between, and what ``main`` and the handlers printed reached the pipe."""
    result = torchrun([str(EXIT_SCRIPT), str(tmp_path)])
    check(result)
    assert result.stdout.count("proxrl ") == 2, result.stdout  # each rank's --version line
    assert result.stdout.count("exit handler first_handler ran") == 2, result.stdout
    written = {p.name: p.read_text() for p in tmp_path.iterdir()}
    for rank in (0, 1):
        assert written.get(f"{rank}_last_handler") == "True", written
        assert written.get(f"{rank}_first_handler") == "False", written
    assert not any(name.count("main_returned") for name in written), written


def test_main_returns_in_a_process_no_launcher_started_even_with_a_group_of_one(tmp_path):
    """vLLM makes a process group of one in the trainer's process: ``cli.main`` (called
    in-process, as the vLLM tests do) must still return, not end the process."""
    script = (
        "import torch.distributed as d\n"
        f"d.init_process_group('gloo', init_method='file://{tmp_path}/store', "
        "rank=0, world_size=1)\n"
        "from proxrl.cli import main\n"
        "print('returned', main(['--version']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0 and "returned 0" in result.stdout, result.stdout + result.stderr
