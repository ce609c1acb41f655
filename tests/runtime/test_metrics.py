"""MetricsLogger: JSON lines flushed per call, TensorBoard events, truncation for resume."""

from __future__ import annotations

import json
import logging

import torch

from proxrl.runtime.metrics import MetricsLogger, progress_bar, read_metrics


def test_log_appends_flushed_json_lines_and_tensorboard(tmp_path):
    logger = MetricsLogger(tmp_path)
    row = logger.log(1, {"a/x": torch.tensor(0.5), "b/y": 2})
    assert row == {"a/x": 0.5, "b/y": 2.0}
    # flushed: readable while the logger is still open
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {
        "step": 1,
        "a/x": 0.5,
        "b/y": 2.0,
    }
    logger.log(2, {"a/x": float("nan")})
    logger.close()
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[1]["a/x"] != rows[1]["a/x"]  # NaN kept as NaN
    assert any(
        p.name.startswith("events.out.tfevents") for p in (tmp_path / "tensorboard").iterdir()
    )


def test_truncate_after_drops_later_steps_and_keeps_appending(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        for step in (10, 20, 30, 40):
            logger.log(step, {"m": step})
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.truncate_after(20)
    logger.log(30, {"m": -1})
    logger.close()
    assert [(r["step"], r["m"]) for r in read_metrics(tmp_path)] == [(10, 10), (20, 20), (30, -1)]


def test_disabled_logger_writes_nothing(tmp_path):
    logger = MetricsLogger(tmp_path / "run", enabled=False)
    assert logger.log(1, {"m": 3}) == {"m": 3.0}
    logger.truncate_after(0)
    logger.close()
    assert not (tmp_path / "run").exists()


def test_progress_bar_runs_without_a_terminal():
    with progress_bar(10, "steps") as bar:
        bar.update(5, SPS=100.0, ret=1.5)
        bar.update(5)
    assert bar._progress.tasks[0].completed == 10


def test_without_a_terminal_the_bar_logs_a_line_every_twentieth_of_the_run(caplog):
    """stderr not a terminal (pytest's capture, as a log file): 40 steps of 1 log a line every
    40 / 20 = 2 steps; 256 units in 4 advances of 64 (classic's batches) a line each; a bar
    that is off logs nothing."""

    def lines(total: int, advance: int, enabled: bool = True) -> list[str]:
        caplog.clear()
        with (
            caplog.at_level(logging.INFO, logger="proxrl.runtime.metrics"),
            progress_bar(total, "run", enabled=enabled) as bar,
        ):
            for _ in range(total // advance):
                bar.update(advance, score=0.5)
        return [r.getMessage() for r in caplog.records]

    steps = lines(40, 1)
    assert steps == [f"run {k}/40  score 0.5" for k in range(2, 41, 2)]
    assert [line.split("  ")[0] for line in lines(256, 64)] == [
        "run 64/256", "run 128/256", "run 192/256", "run 256/256"
    ]  # fmt: skip
    assert lines(40, 1, enabled=False) == []


def test_truncate_after_drops_a_line_a_killed_process_cut_in_half(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "m": 1.0}\n{"step": 2, "m": 2.0}\n{"step": 3, "m'
    )
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.truncate_after(2)
    logger.log(3, {"m": 3})
    logger.close()
    assert [(r["step"], r["m"]) for r in read_metrics(tmp_path)] == [(1, 1.0), (2, 2.0), (3, 3.0)]
