"""One run context: what every trainer shares around its algorithm — the output directory and its
policy, the config file, the resume policy, the checkpointer, the non-finite guard, the metrics
logger, the progress bar, signals (graceful stop) and the learning-rate schedule.

A trainer reads as its algorithm between the calls below, in this order::

    run = Run(cfg)
    run.check(total, "step", "--epochs")  # 1. read only: directory, changed options, finished
    ...load tokenizer, data, models...      #    (a bad input leaves nothing behind)
    run.prepare()                           # 2. create / clear / keep output_dir
    optimizer = ...
    run.track(model=TrainableWeights(model), optimizer=optimizer)   # 3. checkpoint state
    run.schedule(optimizer, warmup_then_decay(total, cfg.warmup_steps, cfg.lr_schedule))
    restored = run.start(total)             # 4. restore → config.yaml → metrics.jsonl
    start = restored.step if restored else 0
    with run.running(total, "sft", completed=start,         # 5. progress bar + signals,
                     save_on_error=run.save_finished):      #    a save when the loop raises
        for step in range(start + 1, total + 1):
            lr = run.learning_rate(step)    #    the schedule's rate for this step
            ...the algorithm...; run.guard.check(step, ...)
            run.log(step, row); run.bar.update(1, loss=...)
            if ...: run.save(step, step=step)
            run.finished(step, step=step)   #    consistent here: what a save on error writes
            if run.stop_requested:          #    SIGINT/SIGTERM: save, exit 130/143
                raise run.interrupted(run.save(step, step=step))
    run.save(total, step=total)             # 6. final checkpoint
    run.close()

What each piece does, and the rules it keeps:

- ``check`` raises, before anything loads or is written, what ``prepare`` would
  (``runtime.run_dir.check_output_dir``), refuses a ``--resume`` whose options changed
  (``runtime.resume.check_resume``) and raises ``RunFinished`` for a resumed run that already took
  ``total`` steps. Each check is also a method of its own for a trainer that knows ``total``
  only after loading its data (``check_not_finished``) or keeps another order.
- ``prepare`` takes the directory's lock (``runtime.run_dir.RunLock``: one live run per
  directory; another — fresh, ``--resume`` or ``--overwrite`` — is refused naming the live
  run's pid, host and command; ``check`` refuses it already) and makes the directory ready
  (fresh, ``--overwrite``, ``--resume``) on rank 0. The lock is held until ``release`` or the
  ``Run`` is collected (the kernel drops it when the process dies, SIGKILL included).
- ``check`` and ``write_config`` also keep the command that made the run: the run marker
  records it (``command``: by default named from the config's module,
  ``runtime.resume.command_of_config``) and ``--resume`` with another command is refused.
- ``track`` registers checkpoint entries by name (``runtime.checkpointer.Checkpointer``); the
  run adds ``guard`` (the ``NonFiniteGuard``), ``rng`` (the global generators) and, with a
  schedule, ``lr_scheduler`` (a list, one per optimizer) when it starts. Entry names are the
  ones the trainers always used, so older checkpoints resume (one without ``lr_scheduler`` is
  fine: the rate comes from the step number).
- ``schedule`` makes one ``runtime.lr_schedule.StepSchedule`` per optimizer;
  ``learning_rate(step)`` sets every one to ``step`` (1-based, the step about to be taken).
- ``start`` restores the newest checkpoint (``--resume``) before anything in ``output_dir`` is
  touched, so a failed resume leaves the run as it was; then writes ``config.yaml`` and the
  planned steps (rank 0), opens ``metrics.jsonl`` and its trackers and, on resume, drops the rows
  logged after the checkpoint.
- ``running`` shows the progress bar (``cfg.progress``, rank 0) and turns SIGINT/SIGTERM into
  ``stop_requested`` (true on every rank when any rank saw one); ``interrupted(path)`` returns
  the ``Interrupted`` to raise (exit 130/143). An exception leaving ``running`` closes the
  metrics. A ``stop`` context manager yielding a ``GracefulStop`` may be passed instead (one
  that also hears a forwarded signal: the online loop's ``roles.stop()``).
- Saving on an exception. After each step (or iteration) is complete — its optimizer step
  taken, its row logged, any save done — the trainer calls ``run.finished(step, **counters)``:
  the state is consistent there. It notes ``step`` and ``counters`` and a snapshot of the small
  tracked states (the RNGs as they were then, the guard, the schedules, controllers, environment
  state; a failed partial step advances them) and the version counters of the weights' and
  optimizers' tensors (``Checkpointer.snapshot``: nothing large is copied). When an exception
  (any but ``Interrupted``, which saved already; ``KeyboardInterrupt`` from a second Ctrl-C
  saves nothing) leaves ``running(..., save_on_error=fn)``, the run puts the snapshot back and
  calls ``fn()`` — the trainer's save of the finished step; ``run.save_finished`` saves
  ``finished_step`` with the noted counters — and logs where the checkpoint is, so ``--resume``
  continues exactly as an uninterrupted run would from there. Nothing is saved (and the log
  says why) when no step finished since the newest checkpoint, when the failed step already
  changed the weights or an optimizer (its update was under way), or with several processes
  (a rank that raised cannot join the others' collective save). The exception is re-raised.
  The online loop: ``running(..., save_on_error=lambda: run.save(context.finished_step))``
  after ``context.finished(iteration + 1)`` at the end of each iteration.

``cfg`` needs ``output_dir``, ``resume``, ``overwrite`` and ``resume_with_changes``; ``start`` and
the checkpointer also read ``keep_checkpoints``, ``max_consecutive_skips``, ``report_to`` and
``progress``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from functools import cached_property
from pathlib import Path
from typing import Any

from torch.optim import Optimizer

from proxrl.runtime import distributed as dist
from proxrl.runtime.checkpointer import Checkpointer, GlobalRNG, Restored, Snapshot
from proxrl.runtime.config import CONFIG_FILE, config_to_dict, save_config_file
from proxrl.runtime.errors import Interrupted, RunFinished
from proxrl.runtime.guard import NonFiniteGuard
from proxrl.runtime.lr_schedule import Rate, StepSchedule
from proxrl.runtime.metrics import MetricsLogger, ProgressBar, progress_bar
from proxrl.runtime.resume import (
    check_command,
    check_not_finished,
    check_resume,
    command_of_config,
)
from proxrl.runtime.run_dir import RunLock, check_output_dir, prepare_output_dir, record_run
from proxrl.runtime.signals import GracefulStop

log = logging.getLogger(__name__)

__all__ = ["Run"]

LR_SCHEDULER = "lr_scheduler"  # the checkpoint entry of the schedules' positions


class Run:
    """The run context of one training run (see the module docstring for the order of calls).

    Args:
        cfg: the run's config (``output_dir``, ``resume``, ``overwrite``, ...).
        config_file: the name of the saved config in ``output_dir`` (what ``--resume`` compares).
        what: names the run in the changed-options message (``"run"``, ``"demo"``).
        overwrite: the overwrite policy when it is not ``cfg.overwrite`` (the demo's).
        rank_rng, reseed: passed to the ``Checkpointer`` (several processes, each with its own
            sampler stream).
        command: the command that makes the run, recorded in the run marker and compared on
            ``--resume`` (default: named from ``cfg``'s module).
    """

    def __init__(
        self,
        cfg: Any,
        *,
        config_file: str = CONFIG_FILE,
        what: str = "run",
        overwrite: bool | None = None,
        rank_rng: bool = False,
        reseed: Callable[[int], None] | None = None,
        command: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.output_dir = Path(cfg.output_dir)
        self.resume = bool(cfg.resume)
        self.overwrite = bool(cfg.overwrite if overwrite is None else overwrite)
        self.config_file = config_file
        self.what = what
        self._rank_rng = rank_rng
        self._reseed = reseed
        self.schedules: list[StepSchedule] = []
        self.metrics: MetricsLogger | None = None
        self.bar: ProgressBar | None = None
        self.stop: GracefulStop | None = None
        self.command = command or command_of_config(cfg)
        self.lock = RunLock(self.output_dir)
        self._config_written = False
        self._started = False
        self._finished: tuple[int, dict[str, Any], Snapshot] | None = None

    # -- 1. checks (read only) -----------------------------------------------------------------

    def check_output_dir(self) -> None:
        """Raise the ``ProxrlError`` that ``prepare`` would, touching nothing."""
        check_output_dir(self.output_dir, self.resume, self.overwrite)

    def check_resume(self) -> dict[str, tuple[Any, Any]]:
        """With ``--resume``: refuse a run another command made, and changed options unless
        ``--resume-with-changes`` (then log them); returns the changes."""
        check_command(self.cfg, self.command)
        return check_resume(self.cfg, self.config_file, self.what)

    def check_not_finished(self, total: int, unit: str = "step", longer: str = "--epochs") -> None:
        """With ``--resume``: raise ``RunFinished`` when the newest checkpoint is at ``total``
        (a run another command made is refused first)."""
        check_command(self.cfg, self.command)
        check_not_finished(self.cfg, total, unit, longer)

    def check(self, total: int | None = None, unit: str = "step", longer: str = "--epochs") -> None:
        """``check_output_dir``, ``check_resume`` and (with ``total``) ``check_not_finished``."""
        self.check_output_dir()
        self.check_resume()
        if total is not None:
            self.check_not_finished(total, unit, longer)

    # -- 2. the directory ----------------------------------------------------------------------

    def prepare(self) -> Path:
        """Take ``output_dir``'s lock, then create, clear (``--overwrite``) or keep
        (``--resume``) it; return it."""
        check_command(self.cfg, self.command)
        return prepare_output_dir(self.output_dir, self.resume, self.overwrite, self.lock)

    def release(self) -> None:
        """Let another run have ``output_dir`` (idempotent; also when the ``Run`` is collected
        or the process ends)."""
        self.lock.release()

    def write_config(self, planned_steps: int | None = None) -> None:
        """Write the config file and the run marker's command and (with ``planned_steps``)
        planned steps, on rank 0. ``start`` calls it unless the trainer already did."""
        if dist.is_main():
            save_config_file(self.cfg, self.output_dir / self.config_file)
            record_run(self.output_dir, planned_steps, self.command)
        self._config_written = True

    # -- 3. what a checkpoint holds ------------------------------------------------------------

    @cached_property
    def checkpointer(self) -> Checkpointer:
        """Checkpoints under ``output_dir/checkpoints``, the newest ``cfg.keep_checkpoints``
        kept."""
        return Checkpointer(
            self.output_dir,
            keep=self.cfg.keep_checkpoints,
            rank_rng=self._rank_rng,
            reseed=self._reseed,
        )

    @cached_property
    def guard(self) -> NonFiniteGuard:
        """Skips non-finite steps; ``cfg.max_consecutive_skips`` in a row stop the run."""
        return NonFiniteGuard(self.cfg.max_consecutive_skips, checkpoint_dir=self.checkpointer.root)

    def track(self, **entries: Any) -> Run:
        """Register checkpoint entries by name (``Checkpointer.track``); returns self."""
        self.checkpointer.track(**entries)
        return self

    def schedule(self, optimizers: Optimizer | Sequence[Optimizer], rate: Rate) -> None:
        """Schedule every optimizer's learning rate with ``rate`` (``runtime.lr_schedule``)."""
        if isinstance(optimizers, Optimizer):
            optimizers = [optimizers]
        self.schedules = [StepSchedule(opt, rate) for opt in optimizers]

    def learning_rate(self, step: int) -> float:
        """Set every scheduled optimizer to the rate of ``step`` (1-based, about to be taken);
        return the first optimizer's."""
        rates = [schedule.at(step) for schedule in self.schedules]
        return rates[0]

    # -- 4. start: restore, config, metrics ----------------------------------------------------

    def start(self, planned_steps: int | None = None) -> Restored | None:
        """Register the run's own entries, restore the newest checkpoint (``--resume``; None for
        a fresh run), write the config (and ``planned_steps``) unless written, and open the
        metrics, dropping rows a resumed run logged after its checkpoint."""
        self.checkpointer.track(guard=self.guard, rng=GlobalRNG())
        if self.schedules:
            self.checkpointer.track(**{LR_SCHEDULER: self.schedules})
            self.checkpointer.optional.add(LR_SCHEDULER)  # older checkpoints have none
        restored = self.checkpointer.restore() if self.resume else None
        if not self._config_written:
            self.write_config(planned_steps)
        self.metrics = MetricsLogger(
            self.output_dir,
            dist.is_main(),
            report_to=self.cfg.report_to,
            config=config_to_dict(self.cfg),
        )
        if restored is not None:
            self.metrics.truncate_after(restored.step)
        self._started = True
        return restored

    # -- 5. the loop ---------------------------------------------------------------------------

    @contextmanager
    def running(
        self,
        total: int,
        description: str,
        completed: int = 0,
        stop: AbstractContextManager[GracefulStop] | None = None,
        save_on_error: Callable[[], object] | None = None,
    ) -> Iterator[Run]:
        """The progress bar (``total`` units, ``completed`` done) and the signal handlers around
        the loop; ``stop``: another source of the stop flag. An exception closes the metrics;
        with ``save_on_error`` it first saves the last finished step (module docstring)."""
        enabled = bool(self.cfg.progress) and dist.is_main()
        with (
            stop if stop is not None else GracefulStop() as signals,
            progress_bar(total, description, completed=completed, enabled=enabled) as bar,
        ):
            self.bar, self.stop = bar, signals
            # A run that ends in an exception lets the directory go at once: a run resumed from
            # another process (a new Ray trainer actor) must not wait for this one's collection.
            try:
                yield self
            except (Interrupted, RunFinished):
                self.close()
                self.release()
                raise
            except Exception as exc:
                if save_on_error is not None:
                    self._save_on_error(save_on_error, exc)
                self.close()
                self.release()
                raise
            except BaseException:
                self.close()
                self.release()
                raise

    def finished(self, step: int, /, **counters: Any) -> None:
        """Mark ``step`` as finished, the state consistent: what a save on an exception writes
        (``counters`` as ``save`` takes them; the small states and the RNGs as they are now)."""
        self._finished = (step, counters, self.checkpointer.snapshot())

    @property
    def finished_step(self) -> int | None:
        """The step ``finished`` last marked; None before any."""
        return self._finished[0] if self._finished is not None else None

    def save_finished(self) -> Path:
        """Checkpoint the step ``finished`` last marked, with its counters (the usual
        ``save_on_error``)."""
        assert self._finished is not None, "save_finished() before finished()"
        step, counters, _ = self._finished
        return self.save(step, **counters)

    def _save_on_error(self, save: Callable[[], object], exc: Exception) -> None:
        """Put the last finished step's state back and ``save`` it, unless that is not safe."""
        failed = f"{type(exc).__name__} in the run"
        newest = self.checkpointer.manager.latest()
        saved_step = self.checkpointer.manager.step_of(newest) if newest is not None else 0
        if self._finished is None or self._finished[0] <= saved_step:
            where = f"the newest checkpoint is {newest}" if newest else "no checkpoint was saved"
            log.warning("%s before a step finished since the last save; %s", failed, where)
            return
        step, _, snapshot = self._finished
        why = ""
        if dist.world_size() > 1:
            why = "several processes cannot save after one of them failed"
        elif not self.checkpointer.unchanged(snapshot):
            why = f"the weights changed after step {step} finished (its update was under way)"
        if why:
            kept = f"; the newest checkpoint is {newest}" if newest else ""
            log.warning("%s; not saving step %d: %s%s", failed, step, why, kept)
            return
        self.checkpointer.put_back(snapshot)
        try:
            path = save()
        except Exception as second:  # the first exception is the one to report
            log.warning("%s; saving step %d failed too: %s", failed, step, second)
            return
        log.warning(
            "%s after step %d finished; saved it in %s; continue with --resume",
            failed,
            step,
            path,
        )

    @property
    def stop_requested(self) -> bool:
        """Whether SIGINT/SIGTERM arrived on any rank (every rank must call it)."""
        assert self.stop is not None, "stop_requested outside running()"
        return dist.any_rank(self.stop.requested)

    def log(self, step: int, row: dict[str, Any]) -> dict[str, float]:
        """Append ``row`` at ``step`` to metrics.jsonl and the trackers; return it as floats."""
        assert self.metrics is not None, "log() before start()"
        return self.metrics.log(step, row)

    def save(self, step: int, /, **counters: Any) -> Path:
        """Checkpoint ``step`` with ``counters`` (every rank calls it; rank 0 writes)."""
        return self.checkpointer.save(step, **counters)

    def interrupted(self, checkpoint: str | Path | None) -> Interrupted:
        """After a stop signal: the exception to raise (exit 128 + signal; ``running`` closes
        the metrics as it leaves)."""
        assert self.stop is not None, "interrupted() outside running()"
        return self.stop.interrupted(checkpoint)

    # -- 6. the end ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close metrics.jsonl and the trackers (idempotent)."""
        if self.metrics is not None:
            self.metrics.close()
