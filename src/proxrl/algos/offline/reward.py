"""Reward model: a scalar head trained with the Bradley–Terry loss on human preferences.

Stage two of Ouyang et al. 2022 (InstructGPT) and Stiennon et al. 2020: r(x, y) is read at the
last token of prompt + response, and −log σ(r(x, y_c) − r(x, y_r)) is minimised. K-way rankings
are trained on all C(K,2) ordered pairs of a ranking at once (InstructGPT's batching of a
ranking's comparisons). Departures and additions:
- Optional per-pair ``margin`` from the data (Llama 2: −log σ(r_c − r_r − m)), and a
  reward-centring term coef·mean((r_c + r_r)²) (Eisenstein et al. 2023); neither applies to
  K-way rankings.
- The head is a plain ``AutoModelForSequenceClassification`` (``num_labels=1``) head,
  initialised N(0, 1/√(d+1)); the saved model loads in transformers without proxrl.
- After training, scores are normalised so the mean score over the training responses is 0
  (as in Ziegler et al. 2019 / Stiennon et al. 2020): ``reward_mean``, ``reward_std`` and the
  ``reward_offset`` that ``models.sequence_scores(normalize=True)`` subtracts are stored in
  the model config. HF heads of Llama-type models have no bias to shift, so plain transformers
  returns the raw score (``models.scalar_head`` explains).
- With LoRA the adapter is merged before saving, so the reward model is one ordinary model
  (the adapter is also saved in ``OUTPUT_DIR/adapter``).
Metrics: ``train/accuracy``, ``train/margin_mean``, ``train/chosen_mean``,
``train/rejected_mean``, ``train/loss`` and the same under ``eval/``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import torch
from torch import Tensor, nn

from proxrl.algos.offline.config import (
    OfflineConfig,
    fit_to_context,
    maybe_lora,
    split_eval,
)
from proxrl.algos.offline.loop import Task, evaluate_batches, fit, log_summary, save_final
from proxrl.core.losses import bradley_terry_loss, ranking_loss
from proxrl.data.batching import (
    PairBatch,
    RankingBatch,
    bucket_batches,
    collate,
    collate_pairs,
    collate_rankings,
)
from proxrl.data.encoding import EncodedPair, EncodedRanking, encode_preferences, encode_rankings
from proxrl.data.formats import RankingExample, load_comparison_examples
from proxrl.models.scalar_head import load_score_model, sequence_scores, store_score_normalization
from proxrl.models.tokenizer import load_tokenizer, resize_for_tokenizer
from proxrl.runtime import distributed as dist
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.fields import Range
from proxrl.runtime.run import Run
from proxrl.runtime.seeding import seed_everything

if TYPE_CHECKING:  # transformers loads with the first model, not with a config
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

ScoreBatch = PairBatch | RankingBatch
Item = EncodedPair | EncodedRanking


@dataclass
class Config(OfflineConfig):
    """proxrl rm: train a Bradley–Terry reward model on preference pairs or K-way rankings."""

    output_dir: str = "runs/rm"
    """Directory for metrics, checkpoints and the final reward model."""
    learning_rate: float = 1e-5
    """Peak AdamW learning rate."""
    use_margin: bool = True
    """Use the per-pair 'margin' field of the data when present."""
    center_coef: Annotated[float, Range(ge=0)] = 0.0
    """Weight of the reward-centring term coef·mean((r_c + r_r)²) (pairs only; 0: off)."""
    normalize: bool = True
    """After training, store the mean/std of the training scores and centre scores on 0."""


def reward_loss(
    model: nn.Module, batch: ScoreBatch, center_coef: float = 0.0
) -> tuple[Tensor, dict[str, Tensor]]:
    """Bradley–Terry loss of a batch of pairs, or the all-pairs loss of a batch of rankings."""
    batch = batch.to(next(model.parameters()).device)
    scores = sequence_scores(model, batch.sequences.input_ids, batch.sequences.attention_mask)
    if isinstance(batch, RankingBatch):
        return ranking_loss(scores.view(batch.ranking.shape), batch.ranking)
    b = batch.num_pairs
    return bradley_terry_loss(scores[:b], scores[b:], batch.margin, center_coef=center_coef)


def comparison_units(batch: ScoreBatch) -> int:
    """What the loss averages over: pairs, or ordered pairs of the rankings."""
    return batch.num_ordered_pairs if isinstance(batch, RankingBatch) else batch.num_pairs


def make_batch(items: list[Item], use_margin: bool, pad_id: int) -> ScoreBatch:
    if isinstance(items[0], EncodedRanking):
        return collate_rankings(items, pad_id)  # type: ignore[arg-type]
    batch = collate_pairs(items, pad_id)  # type: ignore[arg-type]
    return batch if use_margin else PairBatch(batch.sequences, None)


def eval_metrics(
    model: nn.Module, batches: list[ScoreBatch], center_coef: float
) -> dict[str, float]:
    stats = evaluate_batches(
        model, batches, lambda m, b: reward_loss(m, b, center_coef), comparison_units
    )
    return {f"eval/{key}": value for key, value in stats.items()}


@torch.no_grad()
def score_statistics(
    model: nn.Module, items: list[Item], batch_size: int, pad_id: int
) -> tuple[float, float]:
    """Mean and std of the raw scores of every response in ``items``."""
    sequences = [s for item in items for s in _responses(item)]
    order = bucket_batches([len(s) for s in sequences], batch_size, seed=0, shuffle=False)
    was_training = model.training
    model.eval()
    scores = []
    for indices in order:
        batch = collate([sequences[i] for i in indices], pad_id).to(next(model.parameters()).device)
        scores.append(sequence_scores(model, batch.input_ids, batch.attention_mask).double())
    model.train(was_training)
    all_scores = torch.cat(scores)
    return float(all_scores.mean()), float(all_scores.std()) if len(all_scores) > 1 else 0.0


def _responses(item: Item) -> list:
    return item.responses if isinstance(item, EncodedRanking) else [item.chosen, item.rejected]


def load_items(
    source: str, tokenizer: PreTrainedTokenizerBase, cfg: Config, name: str
) -> list[Item]:
    """Pairs or rankings, whichever the data holds (rankings have ``responses``)."""
    examples = load_comparison_examples(source)
    if isinstance(examples[0], RankingExample):
        if cfg.center_coef:
            raise ProxrlError(
                f"{name}: center_coef applies to preference pairs, not K-way rankings"
            )
        return encode_rankings(examples, tokenizer, cfg.max_length, cfg.overlong, name)  # type: ignore[arg-type]
    return encode_preferences(examples, tokenizer, cfg.max_length, cfg.overlong, name)  # type: ignore[arg-type]


def train(cfg: Config) -> dict[str, float]:
    """Train a reward model; returns the last logged metrics."""
    # 1. Tokenizer; inputs are checked before anything is written.
    cfg.validate()
    run = Run(cfg)
    run.check()  # the output directory, and changed options refused before anything loads
    cfg = fit_to_context(cfg)  # max_length held to the model's context (the run keeps cfg)
    tokenizer = load_tokenizer(cfg.model, trust_remote_code=cfg.trust_remote_code)

    # 2. Data: pairs (chosen == rejected dropped) or K-way rankings; a held-out split.
    train_items = load_items(cfg.data, tokenizer, cfg, "training data")
    if cfg.eval_data:
        eval_items = load_items(cfg.eval_data, tokenizer, cfg, "eval data")
    else:
        train_items, eval_items = split_eval(train_items, cfg.eval_fraction, cfg.seed)
    if eval_items and type(eval_items[0]) is not type(train_items[0]):
        kinds = {EncodedPair: "preference pairs", EncodedRanking: "K-way rankings"}
        raise ProxrlError(
            f"eval_data: expected {kinds[type(train_items[0])]} like data, "
            f"found {kinds[type(eval_items[0])]}"
        )
    log.info("rm: %d training and %d eval comparisons", len(train_items), len(eval_items))
    pad_id = tokenizer.pad_token_id
    eval_order = bucket_batches([len(x) for x in eval_items], cfg.batch_size, seed=0, shuffle=False)
    eval_batches = [
        make_batch([eval_items[i] for i in ix], cfg.use_margin, pad_id) for ix in eval_order
    ]

    # 3. Seeds, a num_labels=1 classifier (a head missing from the checkpoint is drawn
    #    N(0, 1/√(d+1)), bias 0), then the output directory (once every input has loaded).
    seed_everything(cfg.seed)
    model = load_score_model(
        cfg.model,
        new_head="reward",
        **cfg.loader_kwargs(),
        gradient_checkpointing=cfg.gradient_checkpointing,
    )
    resize_for_tokenizer(model, tokenizer)
    model = maybe_lora(model, cfg, task="seq_cls").to(dist.device())
    output_dir = run.prepare()

    # 4. Train with the Bradley–Terry loss (mean over the pairs of each optimizer step).
    task = Task(
        name="rm",
        train_items=train_items,
        make_batch=lambda ix: make_batch([train_items[i] for i in ix], cfg.use_margin, pad_id),
        loss_fn=lambda m, b: reward_loss(m, b, cfg.center_coef),
        units_fn=comparison_units,
        evaluate=(lambda m: eval_metrics(m, eval_batches, cfg.center_coef))
        if eval_batches
        else None,
        nonpad_share=lambda batch: batch.sequences.nonpad_share,
    )
    metrics = fit(cfg, model, task, run)

    # 5. Normalise: record the training-score mean/std; scores become centred on 0.
    if cfg.normalize:
        with cfg.autocast():  # the statistics of the scores the run's precision gives
            mean, std = score_statistics(model, train_items, cfg.batch_size, pad_id)
        store_score_normalization(model, mean, std)
        log.info("rm: training scores mean %.4f std %.4f (stored in the model config)", mean, std)

    # 6. Save a plain AutoModelForSequenceClassification and the tokenizer.
    save_final(model, tokenizer, output_dir, padding="right")
    log_summary("rm", output_dir, metrics)
    return metrics
