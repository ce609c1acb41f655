"""Supervised fine-tuning: next-token cross-entropy on the completion, the prompt masked.

Stage one of Ouyang et al. 2022 ("Training language models to follow instructions with human
feedback", InstructGPT) and Stiennon et al. 2020. Departures from the papers:
- The loss is the mean over every completion token of an optimizer step (all micro-batches
  together), not a per-sequence mean: long and short answers weigh per token, and gradient
  accumulation gives exactly the large-batch gradient.
- For ``messages`` rows only the final assistant turn is trained on; earlier turns are prompt.
  A tool-use conversation trains on every assistant turn after the last user message, its tool
  results masked (``data.formats``).
- Padding is kept small by length bucketing, or removed by ``packing`` (several examples per
  row, attention kept within each through position ids; the packing is fixed, the row order
  shuffled each epoch).
Metrics: ``train/loss``, ``eval/loss``, ``eval/perplexity`` (exp of the per-token eval loss),
``perf/nonpad_share``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from torch import Tensor, nn

from proxrl.algos.offline.config import (
    OfflineConfig,
    fit_to_context,
    maybe_lora,
    split_eval,
)
from proxrl.algos.offline.loop import Task, evaluate_batches, fit, log_summary, save_final
from proxrl.core.losses import sft_loss
from proxrl.data.batching import Batch, bucket_batches, collate, collate_packed, pack_sequences
from proxrl.data.encoding import EncodedSequence, encode_sft
from proxrl.data.formats import load_sft_examples
from proxrl.models.causal_lm import load_causal_lm
from proxrl.models.tokenizer import load_tokenizer, resize_for_tokenizer
from proxrl.runtime import distributed as dist
from proxrl.runtime.run import Run
from proxrl.runtime.seeding import seed_everything

log = logging.getLogger(__name__)


@dataclass
class Config(OfflineConfig):
    """proxrl sft: fine-tune a causal LM on prompt → completion pairs (or conversations)."""

    output_dir: str = "runs/sft"
    """Directory for metrics, checkpoints and the final model."""
    learning_rate: float = 2e-5
    """Peak AdamW learning rate."""
    packing: bool = False
    """Pack several examples into each row of max_length tokens (no padding; attention kept within
    each example through position ids). batch_size then counts rows."""


def completion_loss(model: nn.Module, batch: Batch) -> tuple[Tensor, dict[str, Tensor]]:
    """Mean next-token NLL over the batch's completion tokens: position t predicts token t+1,
    counted when token t+1 is in the completion (``loss_mask``), never on the prompt."""
    batch = batch.to(next(model.parameters()).device)
    logits = model(**batch.model_inputs()).logits
    return sft_loss(logits[:, :-1], batch.input_ids[:, 1:], batch.loss_mask[:, 1:])


def completion_tokens(batch: Batch) -> int:
    """The units the SFT loss averages over."""
    return int(batch.loss_mask[:, 1:].sum())


def eval_metrics(model: nn.Module, batches: list[Batch]) -> dict[str, float]:
    """``eval/loss`` (per completion token) and ``eval/perplexity``."""
    stats = evaluate_batches(model, batches, completion_loss, completion_tokens)
    return {"eval/loss": stats["loss"], "eval/perplexity": math.exp(min(stats["loss"], 50.0))}


def make_batches(items: list[EncodedSequence], batch_size: int, pad_id: int) -> list[Batch]:
    """Length-sorted batches of ``items`` (for evaluation)."""
    order = bucket_batches([len(s) for s in items], batch_size, seed=0, shuffle=False)
    return [collate([items[i] for i in indices], pad_id) for indices in order]


def train(cfg: Config) -> dict[str, float]:
    """Run SFT; returns the last logged metrics."""
    # 1. Tokenizer: pad ≠ EOS, round-trip checked. Inputs are checked before anything is
    #    written, so a typo leaves no half-made run directory behind.
    cfg.validate()
    run = Run(cfg)
    run.check()  # the output directory, and changed options refused before anything loads
    cfg = fit_to_context(cfg)  # max_length held to the model's context (the run keeps cfg)
    tokenizer = load_tokenizer(cfg.model, trust_remote_code=cfg.trust_remote_code)

    # 2. Data: validated rows → token ids with the prompt masked; a held-out split.
    train_items = encode_sft(load_sft_examples(cfg.data), tokenizer, cfg.max_length, cfg.overlong)
    if cfg.eval_data:
        eval_items = encode_sft(
            load_sft_examples(cfg.eval_data),
            tokenizer,
            cfg.max_length,
            cfg.overlong,
            name="eval data",
        )
    else:
        train_items, eval_items = split_eval(train_items, cfg.eval_fraction, cfg.seed)
    log.info("sft: %d training and %d eval examples", len(train_items), len(eval_items))
    pad_id = tokenizer.pad_token_id
    eval_batches = make_batches(eval_items, cfg.batch_size, pad_id) if eval_items else []

    # 3. Seeds, the model (dropout off; LoRA if asked), then the output directory: created only
    #    once every input has loaded, so a bad one leaves no half-made run behind.
    seed_everything(cfg.seed)
    model = load_causal_lm(
        cfg.model, **cfg.loader_kwargs(), gradient_checkpointing=cfg.gradient_checkpointing
    )
    resize_for_tokenizer(model, tokenizer)
    model = maybe_lora(model, cfg).to(dist.device())
    output_dir = run.prepare()

    # 4. Train: mean NLL over the completion tokens of each optimizer step, on padded
    #    length-bucketed batches or on packed rows.
    if cfg.packing:
        rows = pack_sequences(train_items, cfg.max_length)
        log.info(
            "sft: packed %d examples into %d rows of <= %d tokens",
            len(train_items),
            len(rows),
            cfg.max_length,
        )
        items, collate_fn = rows, collate_packed
    else:
        items, collate_fn = train_items, collate
    task = Task(
        name="sft",
        train_items=items,
        make_batch=lambda indices: collate_fn([items[i] for i in indices], pad_id),
        loss_fn=completion_loss,
        units_fn=completion_tokens,
        evaluate=(lambda m: eval_metrics(m, eval_batches)) if eval_batches else None,
        nonpad_share=lambda batch: batch.nonpad_share,
    )
    metrics = fit(cfg, model, task, run)

    # 5. Save: a plain transformers model (or peft adapter) plus tokenizer.
    save_final(model, tokenizer, output_dir)
    log_summary("sft", output_dir, metrics)
    return metrics
