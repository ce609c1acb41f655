"""The loop every online algorithm shares, in named stages:
rollout (sample → score → forward passes → gather) → advantages → update → controllers →
log and save.

PPO, GRPO, RLOO, ReMax, REINFORCE++ and REINFORCE differ only in what an ``Algorithm`` says:
whether a critic is trained, whether the KL to the reference is paid in the reward or in the
loss, how advantages are estimated and which policy loss is minimised. Each algorithm file
builds one, and ``launch`` runs ``train_online`` (the driver) with the placement the config
names; the stages live in ``rollout``, ``dapo`` (dynamic
sampling), ``advantages`` and ``update``; what a run holds in ``run``; where its roles live
and which engine samples in the placement it is handed (``placement``).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from types import MappingProxyType

from torch import Tensor

from proxrl.algos.online.advantages import estimate
from proxrl.algos.online.algorithm import Algorithm
from proxrl.algos.online.collect import RolloutBatch, collect_rollout
from proxrl.algos.online.config import OnlineConfig
from proxrl.algos.online.dapo import dynamic_rollout, without_truncated
from proxrl.algos.online.placement.base import Placement
from proxrl.algos.online.prompts import PromptDraw
from proxrl.algos.online.roles import Models
from proxrl.algos.online.rollouts_file import recorded_rollout
from proxrl.algos.online.run import OnlineRun, health_monitor, open_run
from proxrl.algos.online.run_settings import LoopSettings
from proxrl.algos.online.update import NAMESPACES, UpdateStep, update
from proxrl.core import informative_groups
from proxrl.data.formats import PromptExample
from proxrl.models.lora import save_model
from proxrl.models.options import autocast
from proxrl.models.tokenizer import save_tokenizer
from proxrl.rollout.experience import Experience
from proxrl.rollout.rewards import TrainerState
from proxrl.runtime import distributed as dist
from proxrl.runtime.health import HealthMonitor
from proxrl.runtime.logs import rendered

log = logging.getLogger(__name__)

__all__ = ["Algorithm", "OnlineConfig", "train_online"]


def train_online(cfg: OnlineConfig, algo: Algorithm, placement: Placement) -> dict[str, float]:
    """The driver: run ``cfg.iterations`` of the online loop for ``algo`` with the roles where
    ``placement`` keeps them. ``launch.launch`` has checked the config and the output
    directory and chosen the placement (Ray's trainer actors call this too)."""
    # 1. Roles, prompts, output directory, optimizers, checkpoint, resume, engine.
    run = open_run(cfg, algo, placement)
    settings = run.settings.loop
    health = health_monitor(run)
    done = run.start
    end = run.start if run.held_out is not None and run.held_out.stopped else settings.iterations
    # 2. Iterate; a stop signal ends an iteration with a checkpoint.
    stop = placement.stop()
    # An exception mid-run saves the last finished iteration (runtime.run: save_on_error).
    with run.context.running(
        settings.iterations, algo.name, run.start, stop, save_on_error=run.context.save_finished
    ) as context:
        for iteration in range(run.start, end):
            row, stop_early = run_iteration(run, iteration, health)
            figures = progress_figures(settings.task_reward, row)
            context.bar.update(1, **figures)  # type: ignore[union-attr]
            if context.stop_requested and iteration + 1 < settings.iterations:
                raise context.interrupted(run.save(iteration + 1))
            if save_due(settings.save_every, settings.iterations, iteration + 1) and not stop_early:
                run.save(iteration + 1)
            done = iteration + 1
            # the state is consistent: what a save on an exception writes (the data position)
            context.finished(done, iteration=done, extra_rounds=run.extra_rounds)
            if stop_early:
                break
    # 3. Final checkpoint and the policy (and critic) for transformers.
    return finish(run, done)


def run_iteration(
    run: OnlineRun, iteration: int, health: HealthMonitor
) -> tuple[dict[str, float], bool]:
    """One iteration (0-based) in its stages; returns its metrics row and whether the run
    stops early (held-out patience)."""
    settings, algo, models = run.settings.loop, run.algo, run.models
    started = time.perf_counter()
    learning_rate = run.context.learning_rate(iteration + 1)  # (sets this iteration's rates)
    timings: dict[str, float] = {}
    # 1. Rollout: sample → score → forward passes → gather (dynamic sampling: rounds, filter).
    models.actor.eval()
    run.rewards.trainer_state = TrainerState(iteration, iteration + 1, settings.iterations)
    batch = rollout(run, iteration, timings)
    # 2. Advantages, once, over the rows that are trained on.
    experience = estimate(algo, batch.experience, run.kl.value, settings.distill)
    trained = without_truncated(experience) if settings.mask_truncated else experience
    rollout_ok = inspect_rollout(run, experience, iteration)
    # 3. Update: the critic alone during warm-up, then both; the engine gets the new weights.
    train_policy = iteration >= models.critic.warmup_iterations
    stats = train(run, trained, UpdateStep(run.kl.value, train_policy, iteration + 1), rollout_ok)
    timings["time/update_s"] = stats.pop("time/update_s")
    end_warmup_if_stalled(run, iteration, stats, train_policy)
    timings |= run.engine.after_update(models.actor, iteration + 1)
    # 4. Controllers: KL-in-reward β, PPO-Penalty β, reference reset.
    controlled = update_controllers(run, batch, stats, rollout_ok, train_policy, iteration)
    if train_policy and rollout_ok:
        warn_if_mostly_empty(run, iteration, stats)
    # 5. Metrics, held-out evaluation, samples.
    row = iteration_metrics(run, learning_rate, batch, experience, stats | controlled, rollout_ok)
    row |= run.guard.metrics()
    elapsed = time.perf_counter() - started
    row["perf/tokens_per_s"] = experience.response_mask.float().sum().item() / elapsed
    row["time/iteration_s"] = elapsed
    row.update(timings)
    stop_early = run.held_out is not None and run.held_out.step(iteration + 1, row, models)
    run.last = run.context.log(iteration + 1, row)
    if dist.is_main():
        health.observe(iteration + 1, run.last)
        write_samples_if_due(run, iteration, batch, experience)
    return row, stop_early


def end_warmup_if_stalled(
    run: OnlineRun, iteration: int, stats: dict[str, float], train_policy: bool
) -> None:
    """A critic warming up alone may end its warm-up when its value loss stops falling."""
    warming = not train_policy and "value_loss" in stats
    if warming and run.models.critic.end_warmup_iteration(iteration, stats["value_loss"]):
        log.info("iteration %d: the critic's warm-up ends (value loss stalled)", iteration + 1)


def iteration_metrics(
    run: OnlineRun,
    learning_rate: float,
    batch: RolloutBatch,
    experience: Experience,
    stats: dict[str, float],
    rollout_ok: bool,
) -> dict[str, float]:
    """The iteration's metrics from its stages' records: the rollout's, the learning rate, the
    groups whose scores were all equal, the update's stats in their namespaces (without a π_old
    pass objective/kl comes from the update) and the critic's view of the rollout."""
    row = batch.metrics | {"train/lr": learning_rate}  # the policy's (sft's name)
    group_size = run.settings.loop.drawing.group_size
    if group_size > 1:
        constant = ~informative_groups(experience.scores, group_size)
        row["sampling/constant_groups"] = float(constant.sum())
    row |= namespaced(stats)
    if rollout_ok:
        row.update(run.models.critic.rollout_metrics(experience))
    return row


def namespaced(stats: dict[str, float]) -> dict[str, float]:
    """The update's stats under their metric names (``update.NAMESPACES``, else policy/…)."""
    return {NAMESPACES.get(k, k if "/" in k else f"policy/{k}"): v for k, v in stats.items()}


def progress_figures(task_reward: bool, row: dict[str, float]) -> dict[str, float]:
    """What the progress bar (or line) shows of an iteration: the score (none without a
    ``task_reward``: it is 0 throughout), the KL to the reference where it is tracked, with a
    teacher the reverse KL to it and its loss (what distillation optimises), and the learning
    rate."""
    figures = {"score": row["objective/scores"]} if task_reward else {}
    for key, shown in PROGRESS_FIGURES.items():
        if key in row:
            figures[shown] = row[key]
    return figures | {"lr": row["train/lr"]}


PROGRESS_FIGURES = MappingProxyType(
    {
        "objective/kl": "kl",
        "distill/reverse_kl": "teacher_kl",
        "distill/loss": "distill_loss",
    }
)


def rollout(run: OnlineRun, iteration: int, timings: dict[str, float]) -> RolloutBatch:
    """The rollout of ``iteration``: one batch of the prompt schedule, or dynamic sampling's
    rounds until enough informative groups are kept."""
    settings, collecting = run.settings.loop, run.settings.collecting
    drawing = settings.drawing
    if settings.recorded.rollouts_file is not None:  # trajectories produced elsewhere
        with autocast(settings.mixed_precision):
            return recorded_rollout(
                settings.recorded, collecting, run.models, run.kl.value, timings
            )

    def sample_round(
        draw: PromptDraw, round_timings: dict[str, float]
    ) -> tuple[Experience, list[str], dict[str, float]]:
        with autocast(settings.mixed_precision):
            return collect_rollout(
                collecting,
                run.algo,
                run.models,
                run.rewards,
                [run.prompts[i] for i in draw.local],
                [run.prompt_ids[i] for i in draw.local],
                run.kl.value,
                round_timings,
                run.engine,
            )

    n = len(run.prompts)
    if drawing.dynamic_sampling:
        pad_id = run.models.tokenizer.pad_token_id
        draw_index = iteration + run.extra_rounds
        batch = dynamic_rollout(drawing, sample_round, n, pad_id, timings, draw_index)
        run.extra_rounds += batch.extra_rounds
        return batch
    draw = drawing.draw(n, iteration)
    experience, completions, metrics = sample_round(draw, timings)
    return RolloutBatch(experience, completions, draw.rows, metrics)


def inspect_rollout(run: OnlineRun, experience: Experience, iteration: int) -> bool:
    """Whether the rollout's scores, rewards and advantages are finite (else it is skipped
    whole). A finite rollout is only inspected: counting it as a success would reset the
    in-a-row count, and a run with fewer steps per iteration than max_consecutive_skips whose
    gradients are always NaN would then never stop."""
    tensors = {
        "scores": experience.scores,
        "rewards": experience.rewards,
        "advantages": experience.advantages,
    }
    guard = run.guard
    return guard.problem(tensors=tensors) is None or guard.check(iteration + 1, tensors=tensors)


def train(
    run: OnlineRun, trained: Experience, step: UpdateStep, rollout_ok: bool
) -> dict[str, float]:
    """The update (none for a skipped rollout), the engine told before it starts; its stats
    and ``time/update_s``."""
    run.models.actor.train()
    run.engine.before_update(step.iteration - 1)  # a GPU engine sleeps through the update
    started = time.perf_counter()
    stats: dict[str, float] = {}
    if rollout_ok:
        stats = update(
            run.settings.updating,
            run.algo,
            run.train_models,
            trained,
            run.optimizers,
            step,
            run.generator,
            run.guard,
        )
    stats["time/update_s"] = time.perf_counter() - started
    return stats


def update_controllers(
    run: OnlineRun,
    batch: RolloutBatch,
    stats: dict[str, float],
    rollout_ok: bool,
    train_policy: bool,
    iteration: int,
) -> dict[str, float]:
    """β of the KL in the reward (proportional controller), PPO-Penalty's β, and the reference
    copied from the policy every ref_reset_every iterations; returns PPO-Penalty's new β as a
    metric (none without it)."""
    settings, algo, models = run.settings.controlling, run.algo, run.models
    metrics: dict[str, float] = {}
    if rollout_ok:  # the rollout's KL, or the update's where the rollout ran no π_old pass
        observed = (batch.metrics | stats).get("objective/kl", 0.0)
        run.kl.update(observed, settings.samples_per_measure)
    if algo.penalty is not None and train_policy and stats.get("steps"):
        algo.penalty.update(stats.get("approx_kl", 0.0))
        metrics["policy/penalty_beta"] = algo.penalty.value
    every = settings.ref_reset_every
    reset = every and (iteration + 1) % every == 0
    if reset and models.reference is not None:
        models.reference.load_state_dict(dist.full_state(models.actor.state_dict()))
    return metrics


EMPTY_WARNING_AFTER = 3
"""Iterations of policy training before ``warn_if_mostly_empty`` may warn."""


def warn_if_mostly_empty(run: OnlineRun, iteration: int, stats: dict[str, float]) -> None:
    """Count the iterations whose update took no policy step (every group's scores equal, or
    an exactly zero gradient: ``update.has_gradient``), and warn once, when most of those so
    far (at least ``EMPTY_WARNING_AFTER``) were empty, that the policy is not learning. Warn
    once, the first time, that mask_truncated left a step nothing to train on: its cause is
    the length limit, not the scores."""
    masked = stats.get("masked_steps", 0.0)
    if masked and not run.warned_masked and dist.is_main():
        run.warned_masked = True
        log.warning(
            "iteration %d: in %d of %d optimizer steps every response hit max_new_tokens, and "
            "mask_truncated left nothing to train on (counted in policy/masked_steps): raise "
            "max_new_tokens, or set mask_truncated: false",
            iteration + 1,
            masked,
            stats.get("steps", 0.0) + stats.get("skipped_steps", 0.0),
        )
    zero_gradient = stats.get("skipped_steps", 0.0) > masked
    run.policy_iterations += 1
    run.empty_iterations += zero_gradient and not stats.get("steps", 0.0)
    empty, total = run.empty_iterations, run.policy_iterations
    if run.warned_empty or total < EMPTY_WARNING_AFTER or 2 * empty <= total:
        return
    run.warned_empty = True
    if dist.is_main():
        log.warning(
            "iteration %d: %d of %d iterations so far took no policy step (every group's "
            "scores equal: a zero gradient, see policy/skipped_steps); the policy learns "
            "nothing from them: try dynamic_sampling: true, a larger group_size or a higher "
            "temperature",
            iteration + 1,
            empty,
            total,
        )


def save_due(save_every: int, iterations: int, done: int) -> bool:
    """A periodic checkpoint after ``done`` of the run's ``iterations`` (every ``save_every``;
    the last one is saved by ``finish``)."""
    return bool(save_every) and done % save_every == 0 and done < iterations


def write_samples_if_due(
    run: OnlineRun, iteration: int, batch: RolloutBatch, experience: Experience
) -> None:
    settings: LoopSettings = run.settings.loop
    due = settings.sample_every and (
        iteration % settings.sample_every == 0 or iteration + 1 == settings.iterations
    )
    if due:
        prompts = batch.prompts or [run.prompts[i] for i in batch.rows]
        write_samples(
            run.output_dir,
            iteration + 1,
            prompts,
            batch.completions,
            experience.scores,
            show=settings.progress,
        )


def finish(run: OnlineRun, done: int) -> dict[str, float]:
    """The final checkpoint, the policy (and critic) for transformers, the held-out summary."""
    if done > run.start:
        run.save(done)
    save_policy(run.models, run.output_dir)  # every rank: FSDP gathers the weights first
    if dist.is_main() and run.held_out is not None:
        run.held_out.finish(run.output_dir)
    run.engine.close()
    dist.barrier()
    run.context.close()
    return run.last


def write_samples(
    output_dir: Path,
    iteration: int,
    prompts: list[PromptExample],
    completions: list[str],
    scores: Tensor,
    show: bool = False,
    shown: int = 3,
) -> None:
    """Append every sample to samples.jsonl; with ``show``, log the first few as a table."""
    rows = list(zip(prompts, completions, scores.tolist(), strict=True))
    with open(output_dir / "samples.jsonl", "a", encoding="utf-8") as f:
        for prompt, completion, score in rows:
            f.write(
                json.dumps(
                    {
                        "iteration": iteration,
                        # as the data set had it: a string, or a conversation's messages
                        "prompt": prompt.prompt if prompt.messages is None else prompt.messages,
                        "completion": completion,
                        "score": score,
                    }
                )
                + "\n"
            )
    if show:
        from rich.table import Table

        table = Table(title=f"samples at iteration {iteration}", show_lines=True)
        for column in ("prompt", "completion", "score"):
            table.add_column(column, overflow="fold")
        for prompt, completion, score in rows[:shown]:
            table.add_row(prompt.prompt or str(prompt.messages), completion, f"{score:.3f}")
        log.info("%s", rendered(table))


def save_policy(models: Models, output_dir: Path) -> None:
    """The policy via ``save_pretrained`` (safetensors; under LoRA the merged model, the adapter
    in ``adapter/``: ``models.lora.save_model``) plus the tokenizer, and the critic as it saves
    itself (a separate one under ``critic/``, a value head in ``value_head.safetensors``).
    Every rank calls it (under FSDP each joins the gathers); rank 0 writes."""
    sharded = dist.is_sharded()
    actor = dist.full_state(models.actor.state_dict()) if sharded else None
    critic = [dist.full_state(m.state_dict()) for m in models.critic.modules()] if sharded else []
    if not dist.is_main():
        return
    save_model(models.actor, output_dir, actor)
    save_tokenizer(models.tokenizer, output_dir, "left")  # for a user's batched generate
    models.critic.save_pretrained(output_dir, critic[0] if critic else None)
