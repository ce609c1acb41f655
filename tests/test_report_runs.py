"""``proxrl report`` on runs that are not the demo's (issue 23): a classic run gets the plots of
its own metrics and its summary.json as a table (not the demo's KeyError), a run without a
summary.json still gets its plots, and a run stopped before its last step is marked incomplete."""

from __future__ import annotations

import pytest
import torch

from proxrl import cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = ["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "64", "--minibatch-size", "32"]
TINY += ["--epochs", "1", "--no-progress", "--save-every", "1", "--total-steps", "256"]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_a_classic_run_gets_its_plots_its_summary_and_the_incomplete_mark(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli.main(["classic", "--output-dir", str(run), *TINY, "--stop-at-step", "128"]) == 0
    assert cli.main(["report", str(run)]) == 0
    report = (run / "report.md").read_text()
    for panel in ("episodic_return", "value_loss", "entropy", "clip_fraction"):
        assert (run / "plots" / f"{panel}.png").read_bytes().startswith(PNG_MAGIC), panel
        assert f"![{panel}](plots/{panel}.png)" in report
    assert "Runs: run (**incomplete**: stopped at step 128 of 256)." in report
    assert "## Summary" in report and "| env | CartPole-v1 |" in report
    assert "| complete | False |" in report

    # Without its summary.json the plots are still drawn.
    (run / "summary.json").unlink()
    for png in (run / "plots").iterdir():
        png.unlink()
    assert cli.main(["report", str(run)]) == 0
    assert (run / "plots" / "episodic_return.png").read_bytes().startswith(PNG_MAGIC)
    assert "## Summary" not in (run / "report.md").read_text()

    # Finished: no longer marked.
    assert cli.main(["classic", "--output-dir", str(run), "--resume"]) == 0
    assert cli.main(["report", str(run)]) == 0
    assert "Runs: run.\n" in (run / "report.md").read_text()
