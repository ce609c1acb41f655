"""benchmarks/paper_table.py: setting names → options, and the paper's normalisation."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from proxrl.runtime.errors import ProxrlError

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "paper_table.py"
_spec = importlib.util.spec_from_file_location("paper_table", _PATH)
assert _spec is not None and _spec.loader is not None
paper_table = importlib.util.module_from_spec(_spec)
sys.modules["paper_table"] = paper_table  # dataclasses look their module up there
_spec.loader.exec_module(paper_table)


def test_setting_names_map_to_classic_options():
    assert paper_table.setting_args("none") == ["--objective", "none"]
    assert paper_table.setting_args("clip-0.3") == ["--objective", "clip", "--clip", "0.3"]
    assert paper_table.setting_args("adaptive-kl-0.003") == [
        "--objective",
        "adaptive-kl",
        "--kl-target",
        "0.003",
    ]
    assert paper_table.setting_args("fixed-kl-10") == ["--objective", "fixed-kl", "--kl-beta", "10"]
    assert paper_table.setting_args("trpo") == ["--algo", "trpo"]
    for bad in ("clip-x", "kl-0.1", "clip"):
        with pytest.raises(ProxrlError, match="unknown setting"):
            paper_table.setting_args(bad)


def test_normalisation_random_zero_best_ppo_setting_one(tmp_path):
    """Env A: random 0; clip-0.2 scores 10, 20 (mean 15, the best PPO setting); none 5, 5;
    trpo 30, 30 (not in the paper's table, so not the yardstick).
    Env B: random 10; clip-0.2 scores 110, 110; none 210, 210 (the best); trpo 10, 10.
    clip-0.2: mean(10/15, 20/15, 100/200, 100/200) = 0.75;
    none: mean(5/15, 5/15, 200/200, 200/200) = 0.666… → "0.67";
    trpo: mean(30/15, 30/15, 0/200, 0/200) = 1.00."""
    cfg = paper_table.TableConfig(
        envs=["A-v0", "B-v0"],
        settings=["clip-0.2", "none", "trpo"],
        seeds=[1, 2],
        total_steps=100,
        output_dir=str(tmp_path),
    )
    scores = {
        ("A-v0", "clip-0.2"): [10, 20],
        ("A-v0", "none"): [5, 5],
        ("B-v0", "clip-0.2"): [110, 110],
        ("B-v0", "none"): [210, 210],
        ("A-v0", "trpo"): [30, 30],
        ("B-v0", "trpo"): [10, 10],
    }
    for (env, setting), values in scores.items():
        for seed, value in zip(cfg.seeds, values, strict=True):
            d = paper_table.run_dir(cfg, env, setting, seed)
            d.mkdir(parents=True)
            (d / "summary.json").write_text(
                json.dumps({"complete": True, "mean_return_last_100": value, "wall_time_s": 1.0})
            )
            rows = [
                {"step": s, "global_step": s, "charts/episodic_return": value} for s in (50, 100)
            ]
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "random_returns.json").write_text(json.dumps({"A-v0": 0.0, "B-v0": 10.0}))
    table = paper_table.report(cfg)
    lines = {line.split(" | ")[0]: line for line in table.splitlines() if line.startswith("| ")}
    assert lines["| clip-0.2"] == ("| clip-0.2 | 15 ± 5 (n=2) | 110 ± 0 (n=2) | 0.75 | 0.82 |")
    assert lines["| none"] == "| none | 5 ± 0 (n=2) | 210 ± 0 (n=2) | 0.67 | -0.39 |"
    assert lines["| trpo"] == "| trpo | 30 ± 0 (n=2) | 10 ± 0 (n=2) | 1.00 | — |"
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_mean_curve_interpolates_each_seed_and_averages_those_started():
    """Seed 1 climbs 0 → 100 over steps 0..100; seed 2's first episode ends at step 50 (return
    50) and it falls to 0 at step 100. At step 25 only seed 1 has a return (25); at 75 they
    are 75 and 25 (mean 50); at 100, 100 and 0 (50). Before any episode: NaN."""
    curves = [[[0, 0], [100, 100]], [[50, 50], [100, 0]]]
    got = paper_table.mean_curve(curves, np.array([25.0, 75.0, 100.0]))
    assert got.tolist() == [25.0, 50.0, 50.0]
    late = paper_table.mean_curve([[[50, 1], [100, 1]]], np.array([0.0, 50.0]))
    assert np.isnan(late[0]) and late[1] == 1.0


def test_trailing_mean_averages_the_returns_of_the_window_ending_at_each_point():
    """Window 20 over steps 10, 20, 30, 50: step 10 sees (…, 10] → 4; step 20 sees (0, 20] →
    (4 + 8) / 2 = 6; step 30 sees (10, 30] → (8 + 0) / 2 = 4; step 50 sees (30, 50] → 2."""
    curve = [[10, 4], [20, 8], [30, 0], [50, 2]]
    got = paper_table.trailing_mean(curve, window=20)
    assert got == [[10.0, 4.0], [20.0, 6.0], [30.0, 4.0], [50.0, 2.0]]


def _finished_run(cfg, env, setting, seed, value):
    d = paper_table.run_dir(cfg, env, setting, seed)
    d.mkdir(parents=True)
    (d / "summary.json").write_text(
        json.dumps({"complete": True, "mean_return_last_100": value, "wall_time_s": 2.0})
    )
    rows = [{"global_step": s, "charts/episodic_return": value + s / 1000} for s in (50, 100)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_records_rebuild_the_table_and_skip_runs_once_the_run_directories_are_gone(
    tmp_path, monkeypatch
):
    """Records written from the finished runs give the same table without the run directories,
    and a run with a record is not started again."""
    cfg = paper_table.TableConfig(
        envs=["A-v0"],
        settings=["clip-0.2", "none"],
        seeds=[1],
        total_steps=100,
        output_dir=str(tmp_path / "runs"),
        results_dir=str(tmp_path / "records"),
    )
    _finished_run(cfg, "A-v0", "clip-0.2", 1, 30.0)
    _finished_run(cfg, "A-v0", "none", 1, 12.0)
    (tmp_path / "runs" / "random_returns.json").write_text(json.dumps({"A-v0": 0.0}))
    before = paper_table.report(cfg)
    record = json.loads((tmp_path / "records" / "A-v0_none_s1.json").read_text())
    assert record["mean_return_last_100"] == 12.0
    assert record["curve"] == [[50, 12.1], [100, 12.1]]  # rounded to 0.1

    for setting in cfg.settings:
        shutil.rmtree(paper_table.run_dir(cfg, "A-v0", setting, 1))
    assert paper_table.report(cfg) == before
    assert "| none | 12 ± 0 (n=1) | 0.40 |" in before  # (12 - 0) / (30 - 0)
    monkeypatch.setattr(paper_table.subprocess, "call", lambda *a, **k: pytest.fail("ran"))
    assert paper_table.run_one(cfg, "A-v0", "none", 1).startswith("skip")


def test_a_record_of_another_budget_is_refused(tmp_path):
    cfg = paper_table.TableConfig(
        envs=["A-v0"],
        settings=["none"],
        seeds=[1],
        total_steps=100,
        output_dir=str(tmp_path / "runs"),
        results_dir=str(tmp_path / "records"),
    )
    _finished_run(cfg, "A-v0", "none", 1, 12.0)
    paper_table.finished_run(cfg, "A-v0", "none", 1)
    shutil.rmtree(paper_table.run_dir(cfg, "A-v0", "none", 1))
    bigger = paper_table.TableConfig(**{**cfg.__dict__, "total_steps": 1000})
    with pytest.raises(ProxrlError, match=r"A-v0_none_s1\.json: total_steps is 100, expected 1000"):
        paper_table.finished_run(bigger, "A-v0", "none", 1)
