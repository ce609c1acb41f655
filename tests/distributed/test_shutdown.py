"""proxrl's exit handler really stops the process group: after ``destroy_process_group`` no
gloo thread is left running into interpreter shutdown, where one can abort the process
("terminate called without an active exception", exit -6 after the work is done). torch._dynamo
imported after the group exists keeps the group alive past ``destroy_process_group``; proxrl
imports it before creating the group."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.distributed.launch import check, torchrun

SCRIPT = Path(__file__).with_name("shutdown_script.py")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for thread names")
def test_exit_handler_stops_gloo_threads_after_dynamo_was_imported(tmp_path):
    check(torchrun([str(SCRIPT), str(tmp_path)]))
    for rank in (0, 1):
        report = json.loads((tmp_path / f"threads_{rank}.json").read_text())
        assert report["value"] == 4.0  # the group summed over 2 ranks
        assert any("gloo" in name for name in report["before"]), report
        assert not any("gloo" in name for name in report["after"]), report
