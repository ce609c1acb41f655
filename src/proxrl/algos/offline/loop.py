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
(``runtime.signals``); a step whose loss or gradient holds a NaN/Inf is skipped and counted in
``guard/skipped_updates``, and ``max_consecutive_skips`` of them in a row stop the run with the
last good checkpoint intact (``runtime.guard``). Non-finite weights are never saved.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from proxrl.algos.offline.config import OfflineConfig
from proxrl.data.batching import bucket_batches
from proxrl.models.lora import save_model
from proxrl.models.options import ModelRunConfig
from proxrl.models.tokenizer import save_tokenizer
from proxrl.runtime import distributed as dist
from proxrl.runtime.accumulation import COUNT_STATS, LossFn, UnitsFn, accumulate_gradients
from proxrl.runtime.checkpoint import record_planned_steps
from proxrl.runtime.checkpointer import Checkpointer, GlobalRNG, TrainableWeights
from proxrl.runtime.config import config_to_dict, save_config_file
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.guard import NonFiniteGuard, assert_finite_weights
from proxrl.runtime.metrics import MetricsLogger, progress_bar
from proxrl.runtime.resume import check_not_finished
from proxrl.runtime.signals import GracefulStop

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


def learning_rate_at(step: int, total_steps: int, cfg: OfflineConfig) -> float:
    """Linear warm-up to ``cfg.learning_rate``, then constant or linear decay to 0 (``step`` is
    the 1-based index of the optimizer step about to be taken)."""
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return cfg.learning_rate * step / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return cfg.learning_rate
    remaining = max(total_steps - cfg.warmup_steps, 1)
    return cfg.learning_rate * max(0.0, 1 - (step - 1 - cfg.warmup_steps) / remaining)


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


def fit(cfg: OfflineConfig, model: nn.Module, task: Task, output_dir: Path) -> dict[str, float]:
    """Train ``model`` on ``task`` for ``cfg.epochs`` (or ``cfg.max_steps``) optimizer steps,
    logging to ``output_dir/metrics.jsonl``, checkpointing every ``cfg.save_every`` steps and
    resuming from the newest checkpoint when ``cfg.resume``. Returns the last logged row."""
    # 1. The step plan: micro-batches of similar length, grad_accum of them per step.
    lengths = [len(item) for item in task.train_items]
    micro_per_epoch = math.ceil(len(lengths) / cfg.batch_size)
    steps_per_epoch = math.ceil(micro_per_epoch / cfg.grad_accum)
    total_steps = steps_per_epoch * cfg.epochs
    if cfg.max_steps:
        total_steps = min(total_steps, cfg.max_steps)
    check_not_finished(cfg, total_steps, "step", "--epochs")

    log.info(
        "%s: %d items, %d per optimizer step (batch_size %d × grad_accum %d), %d steps",
        task.name,
        len(lengths),
        cfg.examples_per_step,
        cfg.batch_size,
        cfg.grad_accum,
        total_steps,
    )

    # 2. Optimizer over what trains (LoRA: adapters and head only). Several processes: each
    #    takes a 1/world share of every micro-batch (batch_size is global), the model is
    #    sharded under FSDP (the launch config) and only rank 0 writes.
    world = dist.world_size()
    if world > 1:
        dist.split_global(cfg.batch_size, "batch_size")
    train_model = dist.wrap_model(model)
    sharded = dist.is_sharded()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    loss_fn = under_autocast(task.loss_fn, cfg)
    checkpointer = Checkpointer(output_dir, keep=cfg.keep_checkpoints)
    guard = NonFiniteGuard(cfg.max_consecutive_skips, checkpoint_dir=checkpointer.root)

    # 3. What a checkpoint holds: trainable weights, optimizer, RNG, skip counters and, as a
    #    counter, the step (which fixes the data position). Resume is checked before anything in
    #    output_dir is touched, so a failed resume leaves the run as it was.
    checkpointer.track(
        model=TrainableWeights(model), optimizer=optimizer, rng=GlobalRNG(), guard=guard
    )
    step = 0
    if cfg.resume:
        restored = checkpointer.restore()
        step = int(restored.counters["step"])
    logger = MetricsLogger(
        output_dir, dist.is_main(), report_to=cfg.report_to, config=config_to_dict(cfg)
    )
    if dist.is_main():
        save_config_file(cfg, output_dir / "config.yaml")
        record_planned_steps(output_dir, total_steps)
    if cfg.resume:
        logger.truncate_after(step)
        log.info("resumed from %s at step %d of %d", restored.path, step, total_steps)

    def save(at_step: int) -> Path:
        return checkpointer.save(at_step, step=at_step)

    # 4. Train.
    model.train()
    last: dict[str, float] = {}
    done = 0  # optimizer steps counted from the start of the run (resumed ones skipped)
    started = time.perf_counter()
    tokens_seen = 0
    with (
        GracefulStop() as stop,
        progress_bar(
            total_steps, task.name, completed=step, enabled=cfg.progress and dist.is_main()
        ) as bar,
    ):
        for epoch in range(cfg.epochs):
            micro = bucket_batches(lengths, cfg.batch_size, seed=cfg.seed, epoch=epoch)
            groups = [micro[i : i + cfg.grad_accum] for i in range(0, len(micro), cfg.grad_accum)]
            for group in groups:
                if done >= total_steps:
                    break
                done += 1
                if done <= step:  # taken before the checkpoint we resumed from
                    continue
                local = [dist.shard(indices) for indices in group] if world > 1 else group
                batches = [task.make_batch(indices) for indices in local if indices]
                lr = learning_rate_at(done, total_steps, cfg)
                for param_group in optimizer.param_groups:
                    param_group["lr"] = lr
                if world == 1:
                    stats = accumulate_gradients(model, batches, loss_fn, task.units_fn)
                else:  # local sums weighted by the global unit count, then summed over ranks
                    global_units = int(
                        dist.all_reduce_sum(float(sum(task.units_fn(b) for b in batches)))
                    )
                    if sharded and len(batches) < len(
                        group
                    ):  # FSDP: every rank must run every forward
                        raise ProxrlError(
                            "batch_size: under FSDP every micro-batch needs "
                            f">= {world} examples; step {done} has fewer (use a data size "
                            f"whose remainder by batch_size is 0 or >= {world})"
                        )
                    with dist.no_sync(train_model):
                        # FSDP averages gradients over ranks: weigh by world / units.
                        stats = accumulate_gradients(
                            train_model,
                            batches,
                            loss_fn,
                            task.units_fn,
                            total_units=global_units / world if sharded else global_units,
                        )
                    if not sharded:
                        dist.all_reduce_gradients(params)
                    stats = dist.all_reduce_sum(stats)
                    if sharded:
                        stats = {k: v if k in COUNT_STATS else v / world for k, v in stats.items()}
                # NaN/Inf loss or gradient: drop this step's gradients (checked before clipping,
                # which would spread a NaN over every gradient and hide where it came from).
                finite = guard.check(done, loss=stats["loss"], parameters=model)
                grad_norm = (
                    (
                        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                        if cfg.max_grad_norm > 0
                        else torch.nn.utils.clip_grad_norm_(params, float("inf"))
                    )
                    if finite
                    else torch.tensor(float("nan"))
                )
                if finite:
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                tokens_seen += sum(lengths[i] for indices in group for i in indices)
                row = (
                    _namespaced(stats, "train")
                    | {
                        "train/lr": lr,
                        "train/grad_norm": float(grad_norm),
                        "train/epoch": epoch + 1,
                        "perf/tokens_per_s": tokens_seen / max(time.perf_counter() - started, 1e-9),
                    }
                    | guard.metrics()
                )
                if task.nonpad_share is not None and batches:
                    row["perf/nonpad_share"] = sum(task.nonpad_share(b) for b in batches) / len(
                        batches
                    )
                if world > 1 and task.nonpad_share is not None:
                    row["perf/nonpad_share"] = dist.all_reduce_mean(
                        row.get("perf/nonpad_share", 1.0)
                    )
                evaluate_now = done == total_steps or (
                    cfg.eval_every and done % cfg.eval_every == 0
                )
                if task.evaluate is not None and evaluate_now:
                    with cfg.autocast():
                        row |= task.evaluate(model)
                row = {k: v for k, v in row.items() if math.isfinite(v)}  # a skipped step's NaNs
                if done % cfg.log_every == 0 or done == total_steps:
                    last = logger.log(done, row)
                bar.update(1, loss=stats["loss"])
                saved = None
                if cfg.save_every and done % cfg.save_every == 0 and done < total_steps:
                    saved = save(done)
                if dist.any_rank(stop.requested) and done < total_steps:
                    saved = saved or save(done)
                    logger.close()
                    log.warning(
                        "%s: stopping at step %d of %d on %s",
                        task.name,
                        done,
                        total_steps,
                        stop.signal_name,
                    )
                    raise stop.interrupted(saved)

    # 5. Final checkpoint (the last step was evaluated and logged above).
    if done > step:
        save(done)
    logger.close()
    return last


def log_summary(name: str, output_dir: Path, metrics: dict[str, float]) -> None:
    """The line a finished trainer ends with, also when no progress bar showed anything (piped
    output, --no-progress): where the model is, the last training loss and the evaluation's
    loss, perplexity and accuracy."""
    headline = ("train/loss", "eval/loss", "eval/perplexity", "eval/accuracy")
    shown = {k: v for k, v in metrics.items() if k in headline or k == "eval/rewards/accuracies"}
    figures = "".join(f"; {key} {value:.4g}" for key, value in shown.items())
    log.info("%s: finished; model saved in %s%s", name, output_dir, figures)


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
