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
import netrc
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol
from urllib.parse import urlparse

from proxrl.registry import Registry
from proxrl.runtime.errors import ProxrlError

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

        try:
            self._run = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "proxrl"),
                name=_run_name(output_dir),
                dir=str(output_dir),
                config=dict(config),
                reinit="create_new",
            )
        except wandb.errors.Error as exc:  # a rejected key, an unreachable server
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ProxrlError(
                f"report_to: wandb could not start a run ({first}); set WANDB_MODE=offline to "
                "keep its logs in OUTPUT_DIR/wandb"
            ) from exc

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


TRACKERS: Registry[type] = Registry("tracker")
"""``report_to`` name → the tracker class; trait ``package``: the import it needs (mlflow:
mlflow or mlflow-skinny)."""
TRACKERS.add("tensorboard", TensorBoardTracker, "TensorBoard event files", package="tensorboard")
TRACKERS.add("wandb", WandbTracker, "Weights & Biases", package="wandb")
TRACKERS.add("mlflow", MlflowTracker, "MLflow (MLFLOW_TRACKING_URI or ./mlruns)", package="mlflow")
TRACKERS.add("trackio", TrackioTracker, "Trackio, Hugging Face's local tracker", package="trackio")
PACKAGES = MappingProxyType({name: TRACKERS.trait(name, "package") for name in TRACKERS})
"""The import each tracker needs."""
TrackerName = TRACKERS.choice(off=("none",))


def check_report_to(names: Sequence[str]) -> None:
    """``report_to``: ``none`` alone, or trackers whose library is installed; wandb logged in
    or offline (without either, ``wandb.init`` raises a traceback mid-start-up, or on a
    terminal stops the run at its login prompt)."""
    if "none" in names and len(names) > 1:
        raise ProxrlError(f"report_to: none excludes the other trackers, got {list(names)}")
    for name in names:
        if name != "none" and importlib.util.find_spec(PACKAGES[name]) is None:
            raise ProxrlError(
                f"report_to: {name} needs the {PACKAGES[name]} package (pip install {name})"
            )
    if "wandb" in names and not wandb_can_log():
        raise ProxrlError(
            "report_to: wandb is not logged in on this machine (no WANDB_API_KEY, no "
            f"{wandb_host()} entry in ~/.netrc): run wandb login, or set WANDB_MODE=offline "
            "to keep the run's wandb logs in OUTPUT_DIR/wandb (wandb sync uploads them later)"
        )


WANDB_LOCAL_MODES = ("offline", "disabled", "dryrun")
"""``WANDB_MODE`` values that need no login."""


def wandb_host(environ: Mapping[str, str] = os.environ) -> str:
    """The wandb server a login is for (``WANDB_BASE_URL``, default api.wandb.ai)."""
    return urlparse(environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or ""


def wandb_can_log(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``wandb.init`` can start without a login prompt: an offline ``WANDB_MODE``, a
    ``WANDB_API_KEY``, or the key ``wandb login`` writes to the netrc file for the host."""
    if environ.get("WANDB_MODE", "").lower() in WANDB_LOCAL_MODES or environ.get("WANDB_API_KEY"):
        return True
    path = environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        return netrc.netrc(path).authenticators(wandb_host(environ)) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def open_trackers(
    names: Sequence[str], output_dir: Path, config: Mapping[str, Any]
) -> list[Tracker]:
    """One tracker per name in ``names`` (``none`` and repeats skipped)."""
    return [TRACKERS[n](output_dir, config) for n in dict.fromkeys(names) if n != "none"]
