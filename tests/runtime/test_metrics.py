"""MetricsLogger: JSON lines flushed per call, TensorBoard events, truncation for resume."""

from __future__ import annotations

import json

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


def test_truncate_after_drops_a_line_a_killed_process_cut_in_half(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "m": 1.0}\n{"step": 2, "m": 2.0}\n{"step": 3, "m'
    )
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.truncate_after(2)
    logger.log(3, {"m": 3})
    logger.close()
    assert [(r["step"], r["m"]) for r in read_metrics(tmp_path)] == [(1, 1.0), (2, 2.0), (3, 3.0)]
