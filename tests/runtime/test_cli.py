"""The proxrl command: dispatch, one-line errors with exit code 2, --debug tracebacks."""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
import types
import warnings
from types import MappingProxyType

import pytest

from proxrl import api, cli
from proxrl.runtime.errors import ProxrlError


@dataclasses.dataclass
class _Config:
    steps: int = 1
    """Steps."""


def _fake_module(monkeypatch, calls):
    module = types.ModuleType("proxrl_fake_cmd")
    module.Config = _Config

    def train(cfg):
        calls.append(cfg)
        if cfg.steps < 0:
            raise ProxrlError("--steps must be >= 0")

    module.train = train
    monkeypatch.setitem(sys.modules, "proxrl_fake_cmd", module)
    add_command(monkeypatch, "fake", ("proxrl_fake_cmd", "a test command"))


def add_command(monkeypatch, name, entry):
    """``name`` a command for the test (the table itself is immutable)."""
    commands = MappingProxyType({**api.COMMANDS, name: entry})
    monkeypatch.setattr(api, "COMMANDS", commands)
    monkeypatch.setattr(cli, "COMMANDS", commands)


def test_dispatch_parses_the_config_and_trains(monkeypatch):
    calls = []
    _fake_module(monkeypatch, calls)
    assert cli.main(["fake", "--steps", "3"]) == 0
    assert calls == [_Config(steps=3)]


def test_user_error_is_one_line_on_stderr_with_exit_2(monkeypatch, capsys):
    _fake_module(monkeypatch, [])
    assert cli.main(["fake", "--steps", "-1"]) == 2
    err = capsys.readouterr().err
    assert err == "proxrl fake: error: --steps must be >= 0\n"
    assert cli.main(["fake", "--stepz", "1"]) == 2
    assert capsys.readouterr().err == (
        "proxrl fake: error: unknown option --stepz; did you mean --steps?\n"
    )


def test_debug_shows_the_traceback(monkeypatch, capsys):
    _fake_module(monkeypatch, [])
    assert cli.main(["fake", "--steps", "-1", "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.endswith("proxrl fake: error: --steps must be >= 0\n")


def test_unknown_and_missing_commands(capsys):
    assert cli.main(["clasic"]) == 2
    assert "unknown command 'clasic'; did you mean classic?" in capsys.readouterr().err
    assert cli.main([]) == 2
    assert cli.main(["--help"]) == 0
    assert "classic-eval" in capsys.readouterr().out


def test_python_dash_m_proxrl_exit_code():
    proc = subprocess.run(
        [sys.executable, "-m", "proxrl", "classic", "--seeed", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr == "proxrl classic: error: unknown option --seeed; did you mean --seed?\n"


def test_command_whose_module_is_missing(monkeypatch, capsys):
    add_command(monkeypatch, "ghost", ("proxrl.no_such_module", "x"))
    assert cli.main(["ghost"]) == 2
    assert "command 'ghost' is not available" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["classic", "--help"], ["classic-eval", "--help"]])
def test_help_of_registered_commands(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 0
    assert "--output-dir" in capsys.readouterr().out or argv[0] == "classic-eval"


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_help_shows_no_raw_markup(command, capsys):
    """--help prints docstrings as text: no reST ``literal`` or rich [markup] left in them."""
    with pytest.raises(SystemExit) as e:
        cli.main([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: proxrl {command}")
    assert "``" not in out and "[bold" not in out and "[/" not in out


def _plain_process_logging(monkeypatch):
    """The logging set-up of a plain ``proxrl`` process: pytest's capture handlers taken off the
    root logger (``configure_logging`` leaves an already configured root alone)."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(logging.getLogger("proxrl"), "level", logging.NOTSET)
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)


CLASSIC_TINY = [
    "--env",
    "CartPole-v1",
    "--num-envs",
    "1",
    "--num-steps",
    "32",
    "--mini-batch-size",
    "32",
    "--ppo-epochs",
    "1",
    "--total-steps",
    "64",
    "--no-progress",
]


def test_resume_message_reaches_the_users_stderr(tmp_path, capsys, monkeypatch):
    _plain_process_logging(monkeypatch)
    for run, quiet in ((tmp_path / "r", []), (tmp_path / "q", ["--quiet"])):
        argv = ["classic", "--output-dir", str(run), *CLASSIC_TINY]
        assert cli.main([*argv, "--stop-at-step", "32"]) == 0
        capsys.readouterr()
        assert cli.main([*argv, "--resume", *quiet]) == 0
        err = capsys.readouterr().err
        resumed = f"resumed {run / 'checkpoints' / 'step_000000032'} at step 32\n"
        assert (resumed in err) is not bool(quiet), err
    # a complete run: one line on stdout, no traceback, exit 0
    assert cli.main(["classic", "--output-dir", str(tmp_path / "r"), "--resume"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("proxrl classic: the run in") and out.out.count("\n") == 1
