"""``--resume`` with changed options, through the command line of every language-model trainer:
refused (exit 2, one line naming each changed option with its old and new value, nothing on disk
touched) unless ``--resume-with-changes``, which continues the run and writes the new
config.yaml. An unchanged resume still continues (the SIGKILL tests check it bit for bit)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from proxrl.algos.offline import dpo, reward, sft
from proxrl.algos.online import grpo, ppo
from proxrl.cli import main
from proxrl.runtime.checkpoint import RUN_MARKER, CheckpointManager
from proxrl.runtime.config import save_config_file
from tests.algos.lm_tasks import sft_rows, write_jsonl

CONFIGS = {
    "sft": sft.Config,
    "rm": reward.Config,
    "dpo": dpo.Config,
    "ppo": ppo.Config,
    "grpo": grpo.Config,
}


def _snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("command", list(CONFIGS))
def test_changed_options_are_refused_before_anything_loads(command, tiny_lm, tmp_path, capsys):
    """The run directory holds only a marker and the config.yaml the run started with: the
    refusal comes before any model, data or checkpoint is read."""
    run = tmp_path / "run"
    run.mkdir()
    (run / RUN_MARKER).write_text("")
    online = command in ("ppo", "grpo")
    data = "prompts" if online else "data"
    rows = write_jsonl(
        tmp_path / "d.jsonl", sft_rows(4, seed=0)
    )  # never read: the refusal comes first
    extra = {"reward_fn": ("os:getcwd",)} if online else {}
    started = CONFIGS[command](model=tiny_lm, output_dir=str(run), **{data: rows}, **extra)
    save_config_file(started, run / "config.yaml")
    before = _snapshot(run)
    argv = [
        command,
        "--model",
        tiny_lm,
        f"--{data}",
        rows,
        "--output-dir",
        str(run),
        "--resume",
        "--seed",
        "7",
        "--learning-rate",
        "0.5",
        *(["--reward-fn", "os:getcwd"] if online else []),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"proxrl {command}: error: --resume: seed is 7 but the run in {run} ran with 1, "
        f"learning_rate is 0.5 (was {started.learning_rate!r}); "
        "pass --resume-with-changes to continue with the new values\n"
    )
    assert _snapshot(run) == before


def test_resume_with_changes_continues_with_the_new_options(tiny_lm, tmp_path, caplog, capsys):
    data = write_jsonl(tmp_path / "train.jsonl", sft_rows(32, seed=0))
    run = tmp_path / "run"
    common = [
        "sft",
        "--model",
        tiny_lm,
        "--data",
        data,
        "--output-dir",
        str(run),
        "--batch-size",
        "8",
        "--lr-schedule",
        "constant",
        "--no-progress",
    ]
    assert main([*common, "--max-steps", "2"]) == 0
    assert main([*common, "--max-steps", "2", "--resume"]) == 0  # unchanged: nothing left to train
    assert main([*common, "--max-steps", "4", "--resume"]) == 2
    assert "--resume: max_steps is 4 but the run in" in capsys.readouterr().err
    with caplog.at_level(logging.WARNING, logger="proxrl.runtime.resume"):
        assert main([*common, "--max-steps", "4", "--resume", "--resume-with-changes"]) == 0
    assert "--resume-with-changes: max_steps changed from 2 to 4" in caplog.text
    assert [
        json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
    ] == [1, 2, 3, 4]
    assert CheckpointManager.step_of(CheckpointManager(run).latest()) == 4
    assert "max_steps: 4\n" in (run / "config.yaml").read_text()
    assert main([*common, "--max-steps", "4", "--resume"]) == 0  # the new options are the run's now
