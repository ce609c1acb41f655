"""``report_to``: every tracker gets the rows of metrics.jsonl, under the same names, at the same
steps and with the same values, through its own library, offline: TensorBoard event files,
wandb's offline mode, mlflow's local file store, trackio's local store."""

from __future__ import annotations

import glob
import json
import math
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from proxrl.runtime import trackers
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.metrics import MetricsLogger, read_metrics

ROWS = [
    {"train/loss": 2.5, "objective/kl": 0.125, "perf/tokens_per_s": 1234.5678},
    {"train/loss": 1.75, "objective/kl": float("nan"), "perf/tokens_per_s": 1300.25},
    {"train/loss": 1.0 / 3.0, "objective/kl": 0.3, "perf/tokens_per_s": 99.0},
]


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """Every tracker kept on this machine, in tmp_path."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "proxrl-test")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # restored after the test
    store = tmp_path / "trackio"
    monkeypatch.setenv("TRACKIO_DIR", str(store))
    import trackio  # noqa: F401 (its modules copy TRACKIO_DIR at import: point them all here)

    for name, module in list(sys.modules.items()):
        if name.startswith("trackio") and hasattr(module, "TRACKIO_DIR"):
            monkeypatch.setattr(module, "TRACKIO_DIR", store)
    monkeypatch.setenv("TRACKIO_PROJECT", "proxrl-test")
    return tmp_path


def expected(output_dir: Path) -> dict[tuple[int, str], float]:
    """(step, name) → value of every finite value in metrics.jsonl."""
    return {
        (int(row["step"]), k): v
        for row in read_metrics(output_dir)
        for k, v in row.items()
        if k != "step" and math.isfinite(v)
    }


def tensorboard_values(output_dir: Path) -> dict[tuple[int, str], float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(output_dir / "tensorboard")).Reload()
    return {(e.step, tag): e.value for tag in events.Tags()["scalars"] for e in events.Scalars(tag)}


def wandb_values(output_dir: Path) -> dict[tuple[int, str], float]:
    """The history records of the offline run file (LevelDB-style log of protobuf records,
    the format `wandb sync` reads), keys starting with '_' (wandb's own) left out."""
    from wandb.proto import wandb_internal_pb2

    (path,) = glob.glob(str(output_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    data, pos, block, pending, records = Path(path).read_bytes(), 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            records.append(chunk)
        elif kind in (2, 3):
            pending = (pending if kind == 3 else b"") + chunk
        elif kind == 4:
            records.append(pending + chunk)
    values = {}
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                if not key.startswith("_"):
                    values[(record.history.step.num, key)] = json.loads(item.value_json)
    return values


def mlflow_values(output_dir: Path) -> dict[tuple[int, str], float]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(output_dir / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("proxrl").experiment_id])
    assert run.info.run_name == output_dir.name and run.data.params["learning_rate"] == "0.5"
    return {
        (m.step, key): m.value
        for key in run.data.metrics
        for m in client.get_metric_history(run.info.run_id, key)
    }


def trackio_values(output_dir: Path) -> dict[tuple[int, str], float]:
    from trackio.sqlite_storage import SQLiteStorage

    logs = SQLiteStorage.get_logs("proxrl-test", output_dir.name)
    return {
        (row["step"], k): v
        for row in logs
        for k, v in row.items()
        if k not in ("step", "timestamp")
    }


READERS = {
    "tensorboard": tensorboard_values,
    "wandb": wandb_values,
    "mlflow": mlflow_values,
    "trackio": trackio_values,
}


def test_every_tracker_gets_the_rows_of_metrics_jsonl(offline):
    out = offline / "run"
    with MetricsLogger(out, report_to=list(READERS), config={"learning_rate": 0.5}) as logger:
        for step, row in enumerate(ROWS, start=1):
            logger.log(step, row)
    want = expected(out)
    assert len(want) == 8  # the NaN is in metrics.jsonl only (no tracker takes it)
    for name, read in READERS.items():
        got = read(out)
        if name == "tensorboard":  # event files hold float32
            want_here = {k: float(np.float32(v)) for k, v in want.items()}
        else:
            want_here = want
        assert got == want_here, name


def test_report_to_none_writes_metrics_jsonl_only(offline):
    out = offline / "run"
    with MetricsLogger(out, report_to=["none"]) as logger:
        logger.log(1, ROWS[0])
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]


def test_a_tracker_without_its_library_is_refused_in_one_line(monkeypatch):
    real = trackers.importlib.util.find_spec
    monkeypatch.setattr(
        trackers.importlib.util,
        "find_spec",
        lambda name: None if name == "wandb" else real(name),
    )
    with pytest.raises(ProxrlError) as raised:
        trackers.check_report_to(["tensorboard", "wandb"])
    assert str(raised.value) == "report_to: wandb needs the wandb package (pip install wandb)"


def test_an_sft_run_reports_to_several_trackers_at_once(offline):
    from proxrl import api
    from proxrl.models.tiny import build_tiny_lm

    rows = [{"prompt": f"copy: {w} =", "completion": f" {w}"} for w in ["ab", "ba", "ca", "ac"]]
    model = build_tiny_lm(offline / "lm", [r["prompt"] + r["completion"] for r in rows] * 4)
    run = api.sft(
        model=str(model),
        data=rows,
        output_dir=offline / "sft",
        batch_size=2,
        max_steps=2,
        learning_rate=0.5,
        progress=False,
        report_to=["wandb", "mlflow", "trackio"],
    )
    want = expected(run.output_dir)
    assert {name for _, name in want} >= {"train/loss", "train/lr", "train/grad_norm"}
    for name in ("wandb", "mlflow", "trackio"):
        assert READERS[name](run.output_dir) == want, name
    assert not (run.output_dir / "tensorboard").exists()
