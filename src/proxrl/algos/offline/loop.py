"""What the offline language-model trainers (SFT, reward model, DPO family) share: the config
fields every one of them takes, model/tokenizer/data setup, and the optimizer loop with
gradient accumulation, evaluation, metrics, checkpoints and resume.

Batch-size semantics, stated once: ``batch_size`` examples go through the model per forward
pass (a micro-batch); an optimizer step accumulates ``grad_accum`` micro-batches, so it sees
``batch_size × grad_accum`` examples. The loss of a step is the mean over all of its units
(tokens for SFT, pairs for reward models and DPO), so 1 micro-batch of 8 and 8 micro-batches of
1 give the same gradient (``accumulate_gradients``).

Resume: the batch order of an epoch depends only on ``(seed, epoch)``, so a resumed run skips
the steps its checkpoint already took and sees exactly the batches an uninterrupted run would.

Reliability: SIGINT/SIGTERM finish the current step, save a checkpoint and exit 130/143
(``runtime.signals``); an exception (a loss, a data reader, a callback raising) saves the last
finished step before it propagates (``runtime.run``: ``save_on_error``); a step whose loss or
gradient holds a NaN/Inf is skipped and counted in
``guard/skipped_updates``, and ``max_consecutive_skips`` of them in a row stop the run with the
last good checkpoint intact (``runtime.guard``). Non-finite weights are never saved.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn

from proxrl.algos.offline.config import OfflineConfig
from proxrl.data.batching import bucket_batches
from proxrl.models.lora import save_model
from proxrl.models.options import ModelRunConfig
from proxrl.models.tokenizer import save_tokenizer
from proxrl.runtime import distributed as dist
from proxrl.runtime.accumulation import COUNT_STATS, LossFn, UnitsFn, accumulate_gradients
from proxrl.runtime.checkpointer import TrainableWeights
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.guard import NonFiniteGuard, assert_finite_weights
from proxrl.runtime.lr_schedule import warmup_then_decay
from proxrl.runtime.run import Run

if TYPE_CHECKING:  # transformers loads with the first model, not with a config
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------------
# One optimizer step


def under_autocast(loss_fn: LossFn, cfg: ModelRunConfig) -> LossFn:
    """``loss_fn`` with its forward pass under ``cfg.autocast()`` (the backward stays outside)."""

    def loss_in_precision(model: nn.Module, batch: Any) -> tuple[Tensor, dict[str, Tensor]]:
        with cfg.autocast():
            return loss_fn(model, batch)

    return loss_in_precision


@torch.no_grad()
def evaluate_batches(
    model: nn.Module, batches: Sequence[Any], loss_fn: LossFn, units_fn: UnitsFn
) -> dict[str, float]:
    """Unit-weighted mean of the loss and stats over ``batches``, no gradient. The weighted sums
    are divided once, at the end, so a mean of counts is exact (an accuracy of 1 is 1.0, not
    the 1.0000000000000002 of a sum of fractions)."""
    was_training = model.training
    model.eval()
    sums: dict[str, float] = defaultdict(float)
    total = sum(units_fn(b) for b in batches)
    for batch in batches:
        n = units_fn(batch)
        if n == 0:
            continue
        loss, batch_stats = loss_fn(model, batch)
        sums["loss"] += float(loss) * n
        for key, value in batch_stats.items():
            if key != "loss":
                sums[key] += float(value) * (1.0 if key in COUNT_STATS else n)
    model.train(was_training)
    return {key: value if key in COUNT_STATS else value / total for key, value in sums.items()}


# ------------------------------------------------------------------------------------------
# The loop


@dataclass
class Task:
    """What a trainer hands the loop: how to batch its items and what loss to take."""

    name: str  # progress bar label
    train_items: Sequence[Any]  # encoded examples with len() = token length
    make_batch: Callable[[list[int]], Any]  # indices into train_items → a batch
    loss_fn: LossFn
    units_fn: UnitsFn
    evaluate: Callable[[nn.Module], dict[str, float]] | None = None  # → "eval/..." metrics
    nonpad_share: Callable[[Any], float] | None = None  # of a batch, logged as perf/nonpad_share


def _namespaced(stats: dict[str, float], prefix: str) -> dict[str, float]:
    return {key if "/" in key else f"{prefix}/{key}": value for key, value in stats.items()}


def fit(cfg: OfflineConfig, model: nn.Module, task: Task, run: Run) -> dict[str, float]:
    """Train ``model`` on ``task`` for ``cfg.epochs`` (or ``cfg.max_steps``) optimizer steps in
    the prepared ``run`` (``runtime.run``): metrics to ``metrics.jsonl``, a checkpoint every
    ``cfg.save_every`` steps, resumed from the newest one with ``cfg.resume``. Returns the last
    logged row."""
    # 1. The step plan: micro-batches of similar length, grad_accum of them per step.
    lengths = [len(item) for item in task.train_items]
    total_steps = plan_steps(cfg, task.name, len(lengths))
    run.check_not_finished(total_steps, "step", "--epochs")

    # 2. Optimizer over what trains, its schedule and what a checkpoint holds: trainable
    #    weights, optimizer (with the run's guard, RNG and schedule) and, as a counter, the step
    #    (which fixes the data position). The resume comes before anything in output_dir is
    #    touched, so a failed one leaves the run as it was.
    opt = make_optimization(cfg, model, task)
    run.track(model=TrainableWeights(model), optimizer=opt.optimizer)
    run.schedule(opt.optimizer, warmup_then_decay(total_steps, cfg.warmup_steps, cfg.lr_schedule))
    restored = run.start(total_steps)
    step = restored.step if restored is not None else 0
    if restored is not None:
        log.info("resumed from %s at step %d of %d", restored.path, step, total_steps)

    # 3. Train: one optimizer step per group of micro-batches, then its row, checkpoint, stop.
    model.train()
    last: dict[str, float] = {}
    done = step  # the last optimizer step taken
    started = time.perf_counter()
    tokens_seen = 0
    with run.running(total_steps, task.name, completed=step, save_on_error=run.save_finished):
        for done, epoch, group in step_groups(cfg, lengths, total_steps, start=step):
            lr = run.learning_rate(done)
            batches, stats = accumulate(cfg, opt, task, group, done)
            grad_norm = apply_step(cfg, opt, stats, run.guard, done)
            tokens_seen += sum(lengths[i] for indices in group for i in indices)
            figures = {
                "train/lr": lr,
                "train/grad_norm": float(grad_norm),
                "train/epoch": epoch + 1,
                "perf/tokens_per_s": tokens_seen / max(time.perf_counter() - started, 1e-9),
            }
            row = step_row(
                cfg, task, model, stats, figures | run.guard.metrics(), batches, done, total_steps
            )
            if done % cfg.log_every == 0 or done == total_steps:
                last = run.log(done, row)
            run.bar.update(1, loss=stats["loss"])  # type: ignore[union-attr]
            saved = None
            if cfg.save_every and done % cfg.save_every == 0 and done < total_steps:
                saved = run.save(done, step=done)
            if run.stop_requested and done < total_steps:
                saved = saved or run.save(done, step=done)
                log.warning(
                    "%s: stopping at step %d of %d on %s",
                    task.name,
                    done,
                    total_steps,
                    run.stop.signal_name,  # type: ignore[union-attr]
                )
                raise run.interrupted(saved)
            run.finished(done, step=done)  # consistent: an exception later saves this step

    # 4. Final checkpoint (the last step was evaluated and logged above).
    if done > step:
        run.save(done, step=done)
    run.close()
    return last


def plan_steps(cfg: OfflineConfig, name: str, items: int) -> int:
    """The optimizer steps of the run: ``ceil(ceil(items / batch_size) / grad_accum)`` per epoch,
    at most ``cfg.max_steps``."""
    micro_per_epoch = math.ceil(items / cfg.batch_size)
    steps_per_epoch = math.ceil(micro_per_epoch / cfg.grad_accum)
    total_steps = steps_per_epoch * cfg.epochs
    if cfg.max_steps:
        total_steps = min(total_steps, cfg.max_steps)
    log.info(
        "%s: %d items, %d per optimizer step (batch_size %d × grad_accum %d), %d steps",
        name,
        items,
        cfg.examples_per_step,
        cfg.batch_size,
        cfg.grad_accum,
        total_steps,
    )
    return total_steps


def step_groups(
    cfg: OfflineConfig, lengths: list[int], total_steps: int, start: int
) -> Iterator[tuple[int, int, list[list[int]]]]:
    """``(step, epoch, micro-batches)`` of every optimizer step after ``start`` (1-based steps).
    An epoch's batch order depends only on ``(seed, epoch)``, so a resumed run skips the steps
    its checkpoint took and sees exactly the batches an uninterrupted run would."""
    done = 0
    for epoch in range(cfg.epochs):
        micro = bucket_batches(lengths, cfg.batch_size, seed=cfg.seed, epoch=epoch)
        for i in range(0, len(micro), cfg.grad_accum):
            if done >= total_steps:
                return
            done += 1
            if done > start:  # earlier ones were taken before the checkpoint we resumed from
                yield done, epoch, micro[i : i + cfg.grad_accum]


@dataclass
class Optimization:
    """What an optimizer step works on. Several processes: each takes a 1/world share of every
    micro-batch (batch_size is global), the model is wrapped (DDP) or sharded (FSDP, the launch
    config) for the forward passes, and only rank 0 writes."""

    model: nn.Module  # the plain module: guard, clipping, evaluation, checkpoints
    train_model: nn.Module  # what the forward passes go through (the DDP/FSDP wrapper)
    params: list[Tensor]  # what trains (LoRA: adapters and head only)
    optimizer: torch.optim.Optimizer
    loss_fn: LossFn  # the task's loss under cfg.autocast()
    world: int
    sharded: bool


def make_optimization(cfg: OfflineConfig, model: nn.Module, task: Task) -> Optimization:
    """AdamW over the parameters that train, at ``cfg.learning_rate`` (the schedule's base)."""
    world = dist.world_size()
    if world > 1:
        dist.split_global(cfg.batch_size, "batch_size")
    train_model = dist.wrap_model(model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    loss_fn = under_autocast(task.loss_fn, cfg)
    return Optimization(model, train_model, params, optimizer, loss_fn, world, dist.is_sharded())


def accumulate(
    cfg: OfflineConfig, opt: Optimization, task: Task, group: list[list[int]], step: int
) -> tuple[list[Any], dict[str, float]]:
    """The step's batches and the gradient of the mean loss over all their units (summed over
    ranks: local sums weighted by the global unit count)."""
    world, sharded = opt.world, opt.sharded
    local = [dist.shard(indices) for indices in group] if world > 1 else group
    batches = [task.make_batch(indices) for indices in local if indices]
    if world == 1:
        return batches, accumulate_gradients(opt.model, batches, opt.loss_fn, task.units_fn)
    global_units = int(dist.all_reduce_sum(float(sum(task.units_fn(b) for b in batches))))
    if sharded and len(batches) < len(group):  # FSDP: every rank must run every forward
        raise ProxrlError(
            "batch_size: under FSDP every micro-batch needs "
            f">= {world} examples; step {step} has fewer (use a data size "
            f"whose remainder by batch_size is 0 or >= {world})"
        )
    with dist.no_sync(opt.train_model):
        # FSDP averages gradients over ranks: weigh by world / units.
        stats = accumulate_gradients(
            opt.train_model,
            batches,
            opt.loss_fn,
            task.units_fn,
            total_units=global_units / world if sharded else global_units,
        )
    if not sharded:
        dist.all_reduce_gradients(opt.params)
    stats = dist.all_reduce_sum(stats)
    if sharded:
        stats = {k: v if k in COUNT_STATS else v / world for k, v in stats.items()}
    return batches, stats


def apply_step(
    cfg: OfflineConfig, opt: Optimization, stats: dict[str, float], guard: NonFiniteGuard, step: int
) -> Tensor:
    """Clip and take the optimizer step; return the gradient norm (NaN for a skipped step). A
    NaN/Inf loss or gradient drops the step's gradients (checked before clipping, which would
    spread a NaN over every gradient and hide where it came from)."""
    finite = guard.check(step, loss=stats["loss"], parameters=opt.model)
    grad_norm = (
        (
            torch.nn.utils.clip_grad_norm_(opt.params, cfg.max_grad_norm)
            if cfg.max_grad_norm > 0
            else torch.nn.utils.clip_grad_norm_(opt.params, float("inf"))
        )
        if finite
        else torch.tensor(float("nan"))
    )
    if finite:
        opt.optimizer.step()
    opt.optimizer.zero_grad(set_to_none=True)
    return grad_norm


def step_row(
    cfg: OfflineConfig,
    task: Task,
    model: nn.Module,
    stats: dict[str, float],
    figures: dict[str, float],
    batches: list[Any],
    step: int,
    total_steps: int,
) -> dict[str, float]:
    """The metrics row of a step: ``train/`` stats, ``figures``, the non-pad share and, every
    ``eval_every`` steps and at the last, the task's evaluation. A skipped step's NaNs are
    left out."""
    row = _namespaced(stats, "train") | figures
    if task.nonpad_share is not None and batches:
        row["perf/nonpad_share"] = sum(task.nonpad_share(b) for b in batches) / len(batches)
    if dist.world_size() > 1 and task.nonpad_share is not None:
        row["perf/nonpad_share"] = dist.all_reduce_mean(row.get("perf/nonpad_share", 1.0))
    evaluate_now = step == total_steps or (cfg.eval_every and step % cfg.eval_every == 0)
    if task.evaluate is not None and evaluate_now:
        with cfg.autocast():
            row |= task.evaluate(model)
    return {k: v for k, v in row.items() if math.isfinite(v)}


def log_summary(name: str, output_dir: Path, metrics: dict[str, float]) -> None:
    """A DEBUG record of the trainer's end: where the model is, the last training loss and the
    evaluation's loss, perplexity and accuracy. The line every command ends with, also when no
    progress bar showed anything (piped output, --no-progress), is ``proxrl``'s: one place for
    every trainer (``cli.final_line``)."""
    headline = ("train/loss", "eval/loss", "eval/perplexity", "eval/accuracy")
    shown = {k: v for k, v in metrics.items() if k in headline or k == "eval/rewards/accuracies"}
    figures = "".join(f"; {key} {value:.4g}" for key, value in shown.items())
    log.debug("%s: finished; model saved in %s%s", name, output_dir, figures)


def save_final(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    output_dir: Path,
    padding: Literal["left", "right"] = "left",
) -> None:
    """``save_pretrained`` (safetensors) of the model (under LoRA merged, the adapter in
    ``adapter/``: ``models.lora.save_model``) plus the tokenizer, so
    ``AutoModelFor….from_pretrained(output_dir)`` loads it without proxrl. Refuses
    (``ProxrlError``, nothing written) weights that hold a NaN or Inf. The tokenizer is saved
    padding on ``padding``'s side: left for a policy (what a batched ``generate`` needs; proxrl
    sets its own side when it loads one), right for a reward model."""
    gathered = dist.full_state(model.state_dict()) if dist.is_sharded() else None  # FSDP
    assert_finite_weights(gathered or model.state_dict(), f"the final model in {output_dir}")
    if dist.is_main():  # several processes: rank 0 writes, the others wait for it
        save_model(model, output_dir, gathered)  # transformers 5 and peft write safetensors only
        save_tokenizer(tokenizer, output_dir, padding)
    dist.barrier()
