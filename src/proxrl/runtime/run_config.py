"""``RunConfig``: the fields every trainer shares (output directory, seed, resume and checkpoint
policy, trackers); each algorithm's config dataclass subclasses it. A schema only: reading it
from flags, YAML or a mapping is ``runtime.config``'s job (which re-exports it)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from proxrl.runtime.config import FREE_ON_RESUME, SESSION_OPTION, Range, check_ranges
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.trackers import TrackerName, check_report_to


@dataclasses.dataclass
class RunConfig:
    """Fields every trainer shares; algorithm configs subclass it."""

    # a run directory may be moved or copied and resumed there
    output_dir: Annotated[str, SESSION_OPTION] = "runs/run"
    """Directory for metrics, TensorBoard events, checkpoints and the summary."""
    seed: Annotated[int, Range(ge=0, le=2**32 - 1)] = 1
    """Random seed for Python, NumPy, torch and the environments."""
    resume: Annotated[bool, SESSION_OPTION] = False  # how this invocation treats the directory
    """Continue the run in output_dir from its newest complete checkpoint."""
    resume_with_changes: Annotated[bool, SESSION_OPTION] = False
    """With --resume: continue even though options differ from the run's config.yaml (without
    it such a resume is refused, naming the changed options)."""
    overwrite: Annotated[bool, SESSION_OPTION] = False
    """Delete a previous run in output_dir and start afresh."""
    # how the run is saved and guarded: no step it takes changes
    save_every: Annotated[int, Range(ge=0), FREE_ON_RESUME] = 0
    """Save a checkpoint every this many iterations (0: only at the end)."""
    keep_checkpoints: Annotated[int, Range(ge=1), FREE_ON_RESUME] = 3
    """How many of the newest checkpoints to keep on disk."""
    max_consecutive_skips: Annotated[int, Range(gt=0), FREE_ON_RESUME] = 5
    """Stop after this many updates in a row skipped for a NaN/Inf (loss, gradient, advantages)."""
    progress: Annotated[bool, SESSION_OPTION] = True  # what is shown
    """Show a progress bar on a terminal (elsewhere, a log line every 1/20 of the run)."""
    # where the metrics are sent
    report_to: Annotated[tuple[TrackerName, ...], FREE_ON_RESUME] = ("tensorboard",)
    """Trackers that also get every metric: tensorboard, wandb, mlflow, trackio (several), none."""

    def validate(self) -> None:
        """Raise ``ProxrlError`` for values no run can use."""
        from proxrl.runtime.distributed import check_launch

        if self.resume and self.overwrite:
            raise ProxrlError("--resume and --overwrite exclude each other; pick one")
        check_ranges(self)
        check_launch()  # a launch that asked for several processes and got one
        check_report_to(self.report_to)
