"""``proxrl classic --resume`` with changed options follows the one policy (runtime.resume): it
used to warn and continue; it now refuses, naming the changed options, unless
``--resume-with-changes``. Compared are the resolved options the run wrote to config.yaml."""

from __future__ import annotations

import logging

import yaml

from proxrl import cli
from proxrl.runtime.checkpoint import CheckpointManager

TINY = [
    "--env",
    "CartPole-v1",
    "--num-envs",
    "2",
    "--num-steps",
    "64",
    "--minibatch-size",
    "32",
    "--epochs",
    "2",
    "--no-progress",
    "--save-every",
    "1",
]


def test_changed_options_are_refused_unless_resume_with_changes(tmp_path, capsys, caplog):
    run = tmp_path / "run"
    argv = ["classic", "--output-dir", str(run), *TINY]
    assert cli.main([*argv, "--total-steps", "256", "--stop-at-step", "128"]) == 0
    config = (run / "config.yaml").read_text()

    assert (
        cli.main([*argv, "--total-steps", "256", "--gamma", "0.9", "--seed", "4", "--resume"]) == 2
    )
    err = capsys.readouterr().err
    assert err == (
        f"proxrl classic: error: --resume: seed is 4 but the run in {run} ran with 1, "
        "gamma is 0.9 (was 0.99); "
        "pass --resume-with-changes to continue with the new values\n"
    )
    assert (run / "config.yaml").read_text() == config
    assert CheckpointManager.step_of(CheckpointManager(run).latest()) == 128

    # stop_at_step may always change; total_steps sets the schedule, so it needs the flag
    with caplog.at_level(logging.WARNING, logger="proxrl.runtime.resume"):
        assert cli.main([*argv, "--total-steps", "384", "--resume", "--resume-with-changes"]) == 0
    assert "--resume-with-changes: total_steps changed from 256 to 384" in caplog.text
    assert yaml.safe_load((run / "config.yaml").read_text())["total_steps"] == 384
    assert CheckpointManager.step_of(CheckpointManager(run).latest()) == 384


def test_an_unchanged_resume_continues(tmp_path):
    run = tmp_path / "run"
    argv = ["classic", "--output-dir", str(run), *TINY, "--total-steps", "256"]
    assert cli.main([*argv, "--stop-at-step", "128"]) == 0
    assert cli.main([*argv, "--resume"]) == 0  # stop_at_step changed: always free
    assert CheckpointManager.step_of(CheckpointManager(run).latest()) == 256


def test_resume_from_the_run_alone_then_finished(tmp_path, capsys):
    """``--output-dir D --resume`` alone continues with the run's options (stop_at_step, an
    option of the session, is not taken from them), and once complete says so, exit 0."""
    run = tmp_path / "run"
    argv = ["classic", "--output-dir", str(run), *TINY, "--total-steps", "256", "--gamma", "0.9"]
    assert cli.main([*argv, "--stop-at-step", "128"]) == 0
    assert cli.main(["classic", "--output-dir", str(run), "--resume", "--no-progress"]) == 0
    assert CheckpointManager.step_of(CheckpointManager(run).latest()) == 256
    assert yaml.safe_load((run / "config.yaml").read_text())["gamma"] == 0.9
    capsys.readouterr()
    assert cli.main(["classic", "--output-dir", str(run), "--resume"]) == 0
    assert capsys.readouterr().out == (
        f"proxrl classic: the run in {run} is already finished (step 256 of 256); nothing to do "
        "(to train longer: --resume-with-changes --total-steps N)\n"
    )
