"""Experiment trackers: where a run's metric rows go besides ``metrics.jsonl``.

``report_to`` (TRL's option name) picks any of ``tensorboard``, ``wandb``, ``mlflow`` and
``trackio`` (``none``: none of them); each gets every finite value of every row, under the
row's own names (``objective/kl``, ``train/loss``…) at the row's step, through the tracker's
own library, and the run's config once as its parameters. Where a tracker writes is its own
business, set as its users already set it:

- ``tensorboard``: event files in ``OUTPUT_DIR/tensorboard`` (a resumed run hides the events
  the crashed one wrote after its checkpoint, ``purge_step``);
- ``wandb``: ``wandb.init`` with project ``$WANDB_PROJECT`` (default ``proxrl``), the run named
  after the output directory, files under ``OUTPUT_DIR/wandb``; ``WANDB_MODE=offline`` keeps it
  on this machine;
- ``mlflow``: ``MlflowClient`` on ``$MLFLOW_TRACKING_URI`` (default a local file store,
  ``OUTPUT_DIR/mlruns``, which mlflow 3 keeps behind ``MLFLOW_ALLOW_FILE_STORE``, set for it),
  experiment ``$MLFLOW_EXPERIMENT_NAME`` (default ``proxrl``);
- ``trackio``: ``trackio.init`` with project ``$TRACKIO_PROJECT`` (default ``proxrl``), stored
  where trackio stores (``$TRACKIO_DIR``; local unless a Space is configured).

A resumed run opens a new tracker run that starts at the resumed step.
"""

from __future__ import annotations

import importlib.util
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from proxrl.runtime.errors import ProxrlError

TrackerName = Literal["tensorboard", "wandb", "mlflow", "trackio", "none"]

TENSORBOARD_DIR = "tensorboard"
MLFLOW_DIR = "mlruns"
WANDB_DIR = "wandb"
# What the trackers write inside a run directory: logs of the metrics, never work of their own.
TRACKER_DIRS = frozenset({TENSORBOARD_DIR, MLFLOW_DIR, WANDB_DIR})


class Tracker(Protocol):
    def log(self, step: int, row: Mapping[str, float]) -> None: ...
    def resume_at(self, step: int) -> None: ...
    def close(self) -> None: ...


def _finite(row: Mapping[str, float]) -> dict[str, float]:
    return {k: v for k, v in row.items() if math.isfinite(v)}


def _run_name(output_dir: Path) -> str:
    return output_dir.resolve().name


class TensorBoardTracker:
    def __init__(self, output_dir: Path, config: Mapping[str, Any]):
        self._dir = output_dir / TENSORBOARD_DIR
        self._writer: Any = None

    def _open(self, purge_step: int | None = None) -> Any:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self._dir), purge_step=purge_step)
        return self._writer

    def log(self, step: int, row: Mapping[str, float]) -> None:
        writer = self._open()
        for name, value in _finite(row).items():
            writer.add_scalar(name, value, step)

    def resume_at(self, step: int) -> None:
        self.close()
        self._open(purge_step=step + 1)  # hides the events a crashed run wrote after step

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class WandbTracker:
    def __init__(self, output_dir: Path, config: Mapping[str, Any]):
        import wandb

        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "proxrl"),
            name=_run_name(output_dir),
            dir=str(output_dir),
            config=dict(config),
            reinit="create_new",
        )

    def log(self, step: int, row: Mapping[str, float]) -> None:
        self._run.log(_finite(row), step=step)

    def resume_at(self, step: int) -> None:
        pass  # a new run: its first step is the resumed one

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


class MlflowTracker:
    def __init__(self, output_dir: Path, config: Mapping[str, Any]):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # the local file store (mlflow 3 asks for this opt-in; sqlite needs sqlalchemy)
            uri = (output_dir / MLFLOW_DIR).resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "proxrl")
        experiment = self._client.get_experiment_by_name(name)
        experiment_id = (
            experiment.experiment_id if experiment else self._client.create_experiment(name)
        )
        self._run_id: str | None = self._client.create_run(
            experiment_id, run_name=_run_name(output_dir)
        ).info.run_id
        params = [Param(k, str(v)[:500]) for k, v in config.items()]
        for start in range(0, len(params), 100):  # mlflow takes at most 100 params a call
            self._client.log_batch(self._run_id, params=params[start : start + 100])

    def log(self, step: int, row: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in _finite(row).items()]
        self._client.log_batch(self._run_id, metrics=metrics)  # type: ignore[arg-type]

    def resume_at(self, step: int) -> None:
        pass

    def close(self) -> None:
        if self._run_id is not None:
            self._client.set_terminated(self._run_id)
            self._run_id = None


class TrackioTracker:
    def __init__(self, output_dir: Path, config: Mapping[str, Any]):
        import trackio

        self._run: Any = trackio.init(
            project=os.environ.get("TRACKIO_PROJECT", "proxrl"),
            name=_run_name(output_dir),
            config=dict(config),
            auto_log_cpu=False,  # the run's own metrics only
            auto_log_gpu=False,
        )

    def log(self, step: int, row: Mapping[str, float]) -> None:
        self._run.log(_finite(row), step=step)

    def resume_at(self, step: int) -> None:
        pass

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


TRACKERS: dict[str, type] = {
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "mlflow": MlflowTracker,
    "trackio": TrackioTracker,
}
"""``report_to`` name → the tracker class."""

PACKAGES = {
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "mlflow": "mlflow",
    "trackio": "trackio",
}
"""The import each tracker needs (mlflow: mlflow or mlflow-skinny)."""


def check_report_to(names: Sequence[str]) -> None:
    """``report_to``: ``none`` alone, or trackers whose library is installed."""
    if "none" in names and len(names) > 1:
        raise ProxrlError(f"report_to: none excludes the other trackers, got {list(names)}")
    for name in names:
        if name != "none" and importlib.util.find_spec(PACKAGES[name]) is None:
            raise ProxrlError(
                f"report_to: {name} needs the {PACKAGES[name]} package (pip install {name})"
            )


def open_trackers(
    names: Sequence[str], output_dir: Path, config: Mapping[str, Any]
) -> list[Tracker]:
    """One tracker per name in ``names`` (``none`` and repeats skipped)."""
    return [TRACKERS[n](output_dir, config) for n in dict.fromkeys(names) if n != "none"]
