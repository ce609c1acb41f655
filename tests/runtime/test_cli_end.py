"""How ``proxrl`` ends: every trainer's last line (``cli.final_line``, one place: ppo, grpo and
classic printed none when piped), the exit code when the pipe's reader is gone (Ctrl-C under
``| tee`` kills it too: 130, not a traceback and 1), and one copy of each INFO message when
several processes run (rank 0 alone logs INFO)."""

from __future__ import annotations

import io
import logging
import signal

import pytest

from proxrl import cli
from proxrl.runtime.errors import Interrupted
from proxrl.runtime.logs import configure_logging


@pytest.mark.parametrize("command", ["ppo", "grpo", "sft"])
def test_every_model_command_ends_with_the_same_line(command, tmp_path):
    metrics = {"objective/scores": 0.53125, "objective/kl": 0.0123456, "policy/loss": 1.0}
    assert cli.final_line(command, tmp_path, metrics) == (
        f"{command}: finished; model saved in {tmp_path}; objective/scores 0.5312; "
        "objective/kl 0.01235"
    )


def test_a_distillation_run_ends_with_what_it_optimised(tmp_path):
    """A teacher alone scores nothing (objective/scores 0 throughout): the line also shows the
    reverse KL to the teacher, what the run lowered (issue 51)."""
    metrics = {"objective/scores": 0.0, "distill/reverse_kl": 0.1534, "distill/loss": 0.25}
    assert cli.final_line("grpo", tmp_path, metrics) == (
        f"grpo: finished; model saved in {tmp_path}; objective/scores 0; "
        "distill/reverse_kl 0.1534; distill/loss 0.25"
    )


@pytest.mark.timeout(120)
def test_classic_ends_with_a_final_line_when_piped(tmp_path, caplog):
    out = tmp_path / "run"
    argv = ["classic", "--output-dir", str(out), "--total-steps", "256", "--num-steps", "64"]
    with caplog.at_level(logging.INFO, logger="proxrl"):
        assert cli.main([*argv, "--no-progress"]) == 0
    last = caplog.records[-1].getMessage()
    assert last.startswith(
        f"classic: finished; policy saved in {out / 'checkpoints' / 'step_000000256'}"
    ), last
    assert "mean_return_last_100" in last


class ClosedPipe(io.StringIO):
    """A stream whose reader is gone."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_signal_exits_128_plus_it_when_the_pipe_is_closed(monkeypatch, signum, code):
    def stopped(command, argv):
        raise Interrupted("checkpoint saved in runs/x; continue with --resume", signum)

    monkeypatch.setattr(cli, "_run", stopped)
    monkeypatch.setattr("sys.stderr", ClosedPipe())
    monkeypatch.setattr("sys.stdout", ClosedPipe())
    assert cli.main(["sft"]) == code


@pytest.fixture
def proxrl_level():
    logger = logging.getLogger("proxrl")
    level = logger.level
    yield logger
    logger.setLevel(level)


@pytest.mark.parametrize(("rank", "level"), [("0", logging.INFO), ("1", logging.WARNING)])
def test_only_rank_0_logs_info(monkeypatch, proxrl_level, rank, level):
    monkeypatch.setenv("RANK", rank)
    configure_logging(logging.INFO)
    assert proxrl_level.level == level
    configure_logging(logging.DEBUG)
    assert proxrl_level.level == (logging.DEBUG if rank == "0" else logging.WARNING)
