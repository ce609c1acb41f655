"""``RunConfig``: the fields every trainer shares (output directory, seed, resume and checkpoint
policy, trackers); each algorithm's config dataclass subclasses it. A schema only: reading it
from flags, YAML or a mapping is ``runtime.config``'s job (which re-exports it)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from proxrl.runtime.config import Range, check_ranges
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.trackers import TrackerName, check_report_to


@dataclasses.dataclass
class RunConfig:
    """Fields every trainer shares; algorithm configs subclass it."""

    output_dir: str = "runs/run"
    """Directory for metrics, TensorBoard events, checkpoints and the summary."""
    seed: Annotated[int, Range(ge=0, le=2**32 - 1)] = 1
    """Random seed for Python, NumPy, torch and the environments."""
    resume: bool = False
    """Continue the run in output_dir from its newest complete checkpoint."""
    resume_with_changes: bool = False
    """With --resume: continue even though options differ from the run's config.yaml (without
    it such a resume is refused, naming the changed options)."""
    overwrite: bool = False
    """Delete a previous run in output_dir and start afresh."""
    save_every: Annotated[int, Range(ge=0)] = 0
    """Save a checkpoint every this many iterations (0: only at the end)."""
    keep_checkpoints: Annotated[int, Range(ge=1)] = 3
    """How many of the newest checkpoints to keep on disk."""
    max_consecutive_skips: Annotated[int, Range(gt=0)] = 5
    """Stop after this many updates in a row skipped for a NaN/Inf (loss, gradient, advantages)."""
    progress: bool = True
    """Show a progress bar on a terminal (elsewhere, a log line every 1/20 of the run)."""
    report_to: tuple[TrackerName, ...] = ("tensorboard",)
    """Trackers that also get every metric: tensorboard, wandb, mlflow, trackio (several), none."""

    def validate(self) -> None:
        """Raise ``ProxrlError`` for values no run can use."""
        from proxrl.runtime.distributed import check_launch

        if self.resume and self.overwrite:
            raise ProxrlError("--resume and --overwrite exclude each other; pick one")
        check_ranges(self)
        check_launch()  # a launch that asked for several processes and got one
        check_report_to(self.report_to)
