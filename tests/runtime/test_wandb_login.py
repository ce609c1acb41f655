"""``--report-to wandb`` on a machine that is not logged in is one line before anything starts
(issue 40: wandb.init raised a traceback after start-up, or waited at its login prompt on a
terminal), naming the two ways out: ``wandb login`` or ``WANDB_MODE=offline``."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxrl.cli import main
from proxrl.runtime.trackers import wandb_can_log


def test_a_login_is_a_key_a_netrc_entry_or_an_offline_mode(tmp_path: Path) -> None:
    nowhere = {"NETRC": str(tmp_path / "missing")}
    assert not wandb_can_log(nowhere)
    assert wandb_can_log(nowhere | {"WANDB_MODE": "offline"})
    assert wandb_can_log(nowhere | {"WANDB_MODE": "disabled"})
    assert not wandb_can_log(nowhere | {"WANDB_MODE": "online"})
    assert wandb_can_log(nowhere | {"WANDB_API_KEY": "k" * 40})
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    assert wandb_can_log({"NETRC": str(netrc)})
    # a key for another server does not log in to a self-hosted one
    assert not wandb_can_log({"NETRC": str(netrc), "WANDB_BASE_URL": "https://wandb.example.org"})


def test_report_to_wandb_without_a_login_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n')
    argv = ["sft", "--model", str(model), "--data", str(data), "--report-to", "wandb"]
    code = main([*argv, "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [
        "proxrl sft: error: report_to: wandb is not logged in on this machine (no WANDB_API_KEY, "
        "no api.wandb.ai entry in ~/.netrc): run wandb login, or set WANDB_MODE=offline to "
        "keep the run's wandb logs in OUTPUT_DIR/wandb (wandb sync uploads them later)"
    ]
    assert not (tmp_path / "out").exists()
