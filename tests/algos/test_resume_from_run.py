"""``--resume`` starts from the run itself (issue 23): ``proxrl <command> --output-dir D --resume``
needs no other option (the run's saved config.yaml is the starting point); a run that is already
complete says so in one line and exits 0, touching nothing; a directory whose first iteration
failed (no checkpoint, no logged row) can be started afresh without --overwrite, while one that
holds work stays protected."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from proxrl.cli import main
from proxrl.runtime.checkpoint import RUN_MARKER, CheckpointManager, planned_steps
from proxrl.runtime.metrics import read_metrics
from tests.algos.lm_tasks import preference_rows, sft_rows, write_jsonl

PROMPTS = [{"prompt": f"say: {w} ->"} for w in ["abc", "def", "ghi", "jkl"]]
REWARD = "tests.algos.online_rewards:target_fraction"


def _snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def _losses(run: Path) -> list[float]:
    return [row["train/loss"] for row in read_metrics(run)]


def test_resume_with_only_the_output_dir_continues_with_the_runs_options(tiny_lm, tmp_path, capsys):
    """A run of 4 steps with non-default options, cut back to its checkpoint at step 2 (as a
    crash after that save leaves it), resumes from ``--output-dir D --resume`` alone and ends
    where the uninterrupted run ended."""
    data = write_jsonl(tmp_path / "train.jsonl", sft_rows(32, seed=0))
    run = tmp_path / "run"
    argv = ["sft", "--model", tiny_lm, "--data", data, "--output-dir", str(run)]
    argv += ["--batch-size", "8", "--learning-rate", "0.01", "--seed", "5", "--no-progress"]
    assert main([*argv, "--save-every", "1", "--keep-checkpoints", "10"]) == 0
    uninterrupted = _losses(run)
    assert len(uninterrupted) == 4
    assert planned_steps(run) == 4  # what `proxrl report` compares the last step with
    for step in (3, 4):
        shutil.rmtree(run / "checkpoints" / f"step_{step:09d}")
    capsys.readouterr()

    assert main(["sft", "--output-dir", str(run), "--resume", "--no-progress"]) == 0
    assert _losses(run) == uninterrupted
    assert CheckpointManager.step_of(CheckpointManager(run).latest()) == 4
    assert "learning_rate: 0.01\n" in (run / "config.yaml").read_text()

    # Complete now: a further resume says so on one line, exit 0, and touches nothing.
    before = _snapshot(run)
    assert main(["sft", "--output-dir", str(run), "--resume"]) == 0
    out = capsys.readouterr()
    assert out.out == (
        f"proxrl sft: the run in {run} is already finished (step 4 of 4); nothing to do "
        "(to train longer: --resume-with-changes --epochs N)\n"
    )
    assert "Traceback" not in out.err
    assert _snapshot(run) == before


def test_flags_still_change_only_what_the_policy_allows(tiny_lm, tmp_path, capsys):
    """The saved config is the starting point, not a licence: a changed option is still refused
    (and --config files and flags are compared the same way)."""
    data = write_jsonl(tmp_path / "train.jsonl", sft_rows(16, seed=0))
    run = tmp_path / "run"
    base = ["sft", "--model", tiny_lm, "--data", data, "--output-dir", str(run), "--no-progress"]
    assert main([*base, "--batch-size", "8", "--max-steps", "1"]) == 0
    capsys.readouterr()
    assert main(["sft", "--output-dir", str(run), "--resume", "--max-steps", "2"]) == 2
    assert capsys.readouterr().err == (
        f"proxrl sft: error: --resume: max_steps is 2 but the run in {run} ran with 1; "
        "pass --resume-with-changes to continue with the new values\n"
    )
    assert main(["sft", "--output-dir", str(run), "--resume", "--max-steps", "2",
                 "--resume-with-changes", "--no-progress"]) == 0  # fmt: skip
    assert [row["step"] for row in read_metrics(run)] == [1, 2]


@pytest.mark.parametrize("command", ["rm", "dpo", "grpo", "ppo"])
def test_resuming_a_finished_run_says_it_is_finished(command, tiny_lm, tmp_path, capsys):
    online = command in ("ppo", "grpo")
    run = tmp_path / "run"
    if online:
        prompts = write_jsonl(tmp_path / "prompts.jsonl", PROMPTS)
        argv = [command, "--model", tiny_lm, "--prompts", prompts, "--reward-fn", REWARD]
        argv += ["--iterations", "1", "--rollout-batch-size", "4", "--mini-batch-size", "4"]
        argv += ["--max-new-tokens", "4"]
        unit, longer = "iteration 1 of 1", "--iterations"
    else:
        pairs = write_jsonl(tmp_path / "pairs.jsonl", preference_rows(8, seed=0))
        argv = [command, "--model", tiny_lm, "--data", pairs, "--batch-size", "8"]
        unit, longer = "step 1 of 1", "--epochs"
    assert main([*argv, "--output-dir", str(run), "--no-progress"]) == 0
    assert planned_steps(run) == 1
    before = _snapshot(run)
    capsys.readouterr()
    assert main([command, "--output-dir", str(run), "--resume"]) == 0
    assert capsys.readouterr().out == (
        f"proxrl {command}: the run in {run} is already finished ({unit}); nothing to do "
        f"(to train longer: --resume-with-changes {longer} N)\n"
    )
    assert _snapshot(run) == before


def test_a_run_whose_first_iteration_failed_can_be_started_afresh(tiny_lm, tmp_path, capsys):
    """A reward function that raises stops grpo in its first iteration: the directory holds a
    marker, config.yaml and an empty metrics.jsonl. ``--resume`` says how to start it afresh;
    a plain start (no --overwrite) then runs."""
    prompts = write_jsonl(tmp_path / "prompts.jsonl", PROMPTS)
    run = tmp_path / "run"
    argv = ["grpo", "--model", tiny_lm, "--prompts", prompts, "--output-dir", str(run)]
    argv += ["--iterations", "1", "--rollout-batch-size", "4", "--mini-batch-size", "4"]
    argv += ["--max-new-tokens", "4", "--no-progress"]
    assert main([*argv, "--reward-fn", "tests.algos.online_rewards:raises"]) == 2
    assert (run / RUN_MARKER).exists() and not read_metrics(run)
    capsys.readouterr()

    assert main(["grpo", "--output-dir", str(run), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.endswith(
        f"--resume: no complete checkpoint in {run / 'checkpoints'}; it stopped before its "
        "first step: run without --resume to start it afresh\n"
    ), err

    assert main([*argv, "--reward-fn", REWARD]) == 0
    assert [row["step"] for row in read_metrics(run)] == [1]


@pytest.mark.parametrize(
    "work",
    [
        "metrics.jsonl",  # a logged row
        "checkpoints/step_000000001/manifest.json",  # a checkpoint
        "model.safetensors",  # a saved model
        "notes.txt",  # a file the run did not write
    ],
)
def test_a_directory_that_holds_work_is_still_protected(work, tiny_lm, tmp_path, capsys):
    data = write_jsonl(tmp_path / "train.jsonl", sft_rows(8, seed=0))
    run = tmp_path / "run"
    run.mkdir()
    (run / RUN_MARKER).write_text("")
    (run / "config.yaml").write_text(f"model: {tiny_lm}\n")
    (run / "metrics.jsonl").write_text("")
    (run / work).parent.mkdir(parents=True, exist_ok=True)
    (run / work).write_text('{"step": 1, "train/loss": 1.0}\n')
    before = _snapshot(run)
    argv = ["sft", "--model", tiny_lm, "--data", data, "--output-dir", str(run)]
    assert main([*argv, "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        f"proxrl sft: error: output directory {run} already holds a run; pass --resume to "
        "continue it or --overwrite to replace it\n"
    )
    assert _snapshot(run) == before
