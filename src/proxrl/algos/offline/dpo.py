"""Direct preference optimisation and two relatives, on preference pairs, without a reward
model or an RL loop.

- ``loss="sigmoid"``: DPO (Rafailov et al. 2023), −log σ(β[(π_c − ref_c) − (π_r − ref_r)]) with
  summed response log-probs; ``label_smoothing`` > 0 is conservative DPO (cDPO).
- ``loss="ipo"``: IPO (Azar et al. 2023), (h − 1/(2β))². Like TRL, log-probs are averaged over
  response tokens; the paper writes sums.
- ``loss="simpo"``: SimPO (Meng et al. 2024), reference-free, length-averaged log-probs,
  −log σ(β(π̄_c − π̄_r) − γ) with γ = ``simpo_gamma_beta_ratio``·β (the paper uses β ≈ 2–2.5).

Departures: the reference log-probs are computed once, before the first step, by the starting
policy (or by ``ref_model`` when given, which is then freed; under LoRA by the same model with
the adapter disabled), so no second model is held during training. Batches are bucketed by
length; ``packing`` also lays each batch's chosen and rejected rows end to end, several to a
line (``rollout.packing``), for the same losses with fewer pad positions. The formulas live in
``proxrl.core.losses``. Metrics: ``rewards/chosen``, ``rewards/rejected``, ``rewards/margins``,
``rewards/accuracies`` (training) and the same under ``eval/``, plus ``train/loss``.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Protocol

import torch
from torch import Tensor, nn

from proxrl.algos.offline.config import (
    OfflineConfig,
    fit_to_context,
    maybe_lora,
    split_eval,
)
from proxrl.algos.offline.loop import Task, evaluate_batches, fit, log_summary, save_final
from proxrl.core.logprobs import logprobs_from_logits
from proxrl.core.losses import dpo_loss, ipo_loss, simpo_loss
from proxrl.core.masked import masked_mean, masked_sum
from proxrl.data.batching import Batch, PairBatch, bucket_batches, collate_pairs
from proxrl.data.encoding import EncodedPair, encode_preferences
from proxrl.data.formats import load_preference_examples
from proxrl.models.causal_lm import check_causal_lm, load_causal_lm
from proxrl.models.lora import adapter_disabled
from proxrl.models.tokenizer import check_model_source, load_tokenizer, resize_for_tokenizer
from proxrl.registry import Registry
from proxrl.rollout.forward import policy_forward
from proxrl.runtime import distributed as dist
from proxrl.runtime.config import check_knobs
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.fields import Range
from proxrl.runtime.run import Run
from proxrl.runtime.seeding import seed_everything

if TYPE_CHECKING:  # transformers loads with the first model, not with a config
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


PairLossFn = Callable[[Tensor, Tensor, Tensor, Tensor, Any], tuple[Tensor, dict[str, Tensor]]]
DPO_LOSSES: Registry[PairLossFn] = Registry("DPO loss")
"""``loss`` → (chosen log π (B,), rejected log π (B,), their reference log-probs (B,) each,
options) → (loss, stats) (formulas in ``core.losses``). Traits: ``average`` (log π is the
response's mean token log-prob, not its sum), ``reference`` (reads a reference model)."""
DPO_LOSSES.add(
    "sigmoid",
    lambda c, r, ref_c, ref_r, o: dpo_loss(c, r, ref_c, ref_r, o.beta, o.label_smoothing),
    "DPO; cDPO with label_smoothing",
    knobs=("label_smoothing", "ref_model"),
    reference=True,
    card_name="dpo",
)
DPO_LOSSES.add(
    "ipo",
    lambda c, r, ref_c, ref_r, o: ipo_loss(c, r, ref_c, ref_r, o.beta),
    "IPO: the squared distance of the margin to 1/(2β)",
    knobs=("ref_model",),
    reference=True,
    average=True,
)
DPO_LOSSES.add(
    "simpo",
    lambda c, r, ref_c, ref_r, o: simpo_loss(
        c, r, o.beta, o.simpo_gamma_beta_ratio, o.label_smoothing
    ),
    "SimPO: length-normalised margin, no reference model",
    knobs=("label_smoothing", "simpo_gamma_beta_ratio"),
    average=True,
)
DPOLossChoice = DPO_LOSSES.choice()


@dataclass
class Config(OfflineConfig):
    """proxrl dpo: DPO, IPO or SimPO on {"prompt", "chosen", "rejected"} pairs."""

    output_dir: str = "runs/dpo"
    """Directory for metrics, checkpoints and the final model."""
    learning_rate: float = 5e-7
    """Peak AdamW learning rate (DPO needs small ones: 5e-7 for 7B models)."""
    loss: DPOLossChoice = "sigmoid"
    """sigmoid: DPO / cDPO; ipo: IPO; simpo: SimPO (no reference model)."""
    beta: Annotated[float, Range(gt=0)] = 0.1
    """Strength of the implicit KL constraint (SimPO: reward scale, 2.0-2.5 in the paper)."""
    label_smoothing: Annotated[float, Range(ge=0, lt=0.5)] = 0.0
    """cDPO / SimPO: probability that a preference label is flipped (0: plain DPO)."""
    simpo_gamma_beta_ratio: Annotated[float, Range(ge=0)] = 0.5
    """SimPO target margin γ divided by β."""
    ref_model: str | None = None
    """Reference model for the log-prob ratios (default: the starting policy)."""
    packing: bool = False
    """Run each batch's chosen and rejected rows padding-free, several to a line (attention kept
    within each row through position ids): the same losses, fewer pad positions computed."""

    def validate(self) -> None:
        super().validate()
        check_knobs(self)
        if self.ref_model:
            try:
                check_model_source(self.ref_model)
            except ProxrlError as exc:
                raise ProxrlError(f"ref_model: {exc}") from None


@dataclass(frozen=True)
class DPOBatch:
    pairs: PairBatch  # chosen rows then rejected rows
    ref_chosen: Tensor  # (B,) reference log-prob of each chosen response (0 for SimPO)
    ref_rejected: Tensor  # (B,)

    def to(self, device: torch.device | str) -> DPOBatch:
        return DPOBatch(
            self.pairs.to(device), self.ref_chosen.to(device), self.ref_rejected.to(device)
        )


def response_logps(
    model: nn.Module, sequences: Batch, average: bool, packed: bool = False
) -> Tensor:
    """(N,) log π(response | prompt): the sum (or mean) of the response tokens' log-probs.
    ``packed``: the padding-free forward (``rollout.packing``), the same (N, T−1) log-probs."""
    if packed:
        token_logps = policy_forward(
            model, sequences.input_ids, sequences.attention_mask, 1, 1.0, packed=True
        ).logprobs
    else:
        logits = model(**sequences.model_inputs()).logits
        token_logps = logprobs_from_logits(logits[:, :-1], sequences.input_ids[:, 1:])
    mask = sequences.loss_mask[:, 1:]
    return (
        masked_mean(token_logps, mask, dim=-1) if average else masked_sum(token_logps, mask, dim=-1)
    )


def uses_average(loss: str) -> bool:
    return DPO_LOSSES.trait(loss, "average")


class PairLossOptions(Protocol):
    """The fields ``preference_loss`` reads: a ``Config``'s, or a ``PairLoss`` without one."""

    @property
    def loss(self) -> str: ...
    @property
    def beta(self) -> float: ...
    @property
    def label_smoothing(self) -> float: ...
    @property
    def simpo_gamma_beta_ratio(self) -> float: ...
    @property
    def packing(self) -> bool: ...


@dataclass(frozen=True)
class PairLoss:
    """``preference_loss``'s options outside a ``proxrl dpo`` run (the training client's),
    with ``Config``'s defaults."""

    loss: str = "sigmoid"
    beta: float = Config.beta
    label_smoothing: float = Config.label_smoothing
    simpo_gamma_beta_ratio: float = Config.simpo_gamma_beta_ratio
    packing: bool = False


def preference_loss(
    model: nn.Module, batch: DPOBatch, cfg: PairLossOptions
) -> tuple[Tensor, dict[str, Tensor]]:
    """The configured loss of one batch of pairs (formulas in ``core.losses``)."""
    batch = batch.to(next(model.parameters()).device)
    logps = response_logps(model, batch.pairs.sequences, uses_average(cfg.loss), cfg.packing)
    b = batch.pairs.num_pairs
    chosen, rejected = logps[:b], logps[b:]
    loss = DPO_LOSSES[cfg.loss]
    return loss(chosen, rejected, batch.ref_chosen, batch.ref_rejected, cfg)


@torch.no_grad()
def reference_logps(
    model: nn.Module,
    items: list[EncodedPair],
    batch_size: int,
    pad_id: int,
    average: bool,
    packed: bool = False,
) -> tuple[Tensor, Tensor]:
    """(N,) chosen and (N,) rejected log-probs of every pair under ``model`` (eval mode).

    With several processes each computes every world-th batch and the sums over ranks fill in
    the rest (the same batches as one process, so the same numbers). ``model`` must be a plain
    module here: FSDP would need every rank in every forward pass."""
    was_training = model.training
    model.eval()
    chosen = torch.zeros(len(items), dtype=torch.float64)
    rejected = torch.zeros(len(items), dtype=torch.float64)
    for indices in dist.shard(
        bucket_batches([len(x) for x in items], batch_size, seed=0, shuffle=False)
    ):
        pairs = collate_pairs([items[i] for i in indices], pad_id).to(
            next(model.parameters()).device
        )
        logps = response_logps(model, pairs.sequences, average, packed).double().cpu()
        chosen[indices] = logps[: len(indices)]
        rejected[indices] = logps[len(indices) :]
    model.train(was_training)
    return dist.all_reduce_sum(chosen), dist.all_reduce_sum(rejected)


def make_batch(
    items: list[EncodedPair],
    indices: list[int],
    ref: tuple[Tensor, Tensor],
    pad_id: int,
    dtype: torch.dtype,
) -> DPOBatch:
    pairs = collate_pairs([items[i] for i in indices], pad_id)
    return DPOBatch(pairs, ref[0][indices].to(dtype), ref[1][indices].to(dtype))


def reference_pairs(
    cfg: Config,
    policy: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    train_items: list[EncodedPair],
    eval_items: list[EncodedPair],
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """The (chosen, rejected) reference log-probs of the training and the eval pairs: zeros for
    SimPO (no reference), else under ``cfg.ref_model`` or the starting policy (LoRA: the
    adapter disabled)."""
    average, pad_id = uses_average(cfg.loss), tokenizer.pad_token_id
    if not DPO_LOSSES.trait(cfg.loss, "reference"):
        ref_train = (torch.zeros(len(train_items)), torch.zeros(len(train_items)))
        ref_eval = (torch.zeros(len(eval_items)), torch.zeros(len(eval_items)))
    elif cfg.ref_model:
        reference = load_causal_lm(
            cfg.ref_model,
            **cfg.loader_kwargs(),
            gradient_checkpointing=cfg.gradient_checkpointing,
            role="ref_model",
        ).to(dist.device())
        resize_for_tokenizer(reference, tokenizer)
        with cfg.autocast():
            ref_train = reference_logps(
                reference, train_items, cfg.batch_size, pad_id, average, cfg.packing
            )
            ref_eval = reference_logps(
                reference, eval_items, cfg.batch_size, pad_id, average, cfg.packing
            )
        del reference
        gc.collect()
    else:
        with adapter_disabled(policy) as reference, cfg.autocast():
            ref_train = reference_logps(
                reference, train_items, cfg.batch_size, pad_id, average, cfg.packing
            )
            ref_eval = reference_logps(
                reference, eval_items, cfg.batch_size, pad_id, average, cfg.packing
            )
    return ref_train, ref_eval


def train(cfg: Config) -> dict[str, float]:
    """Run DPO / IPO / SimPO; returns the last logged metrics."""
    # 1. Tokenizer; inputs are checked before anything is written.
    cfg.validate()
    run = Run(cfg)
    run.check()  # the output directory, and changed options refused before anything loads
    cfg = fit_to_context(cfg)  # max_length held to the model's context (the run keeps cfg)
    if cfg.ref_model and DPO_LOSSES.trait(cfg.loss, "reference"):  # checked before any loads
        check_causal_lm(cfg.ref_model, "ref_model", cfg.trust_remote_code)
    tokenizer = load_tokenizer(cfg.model, trust_remote_code=cfg.trust_remote_code)
    pad_id = tokenizer.pad_token_id

    # 2. Data: validated pairs (chosen == rejected dropped); a held-out split.
    def load(source: str, name: str) -> list[EncodedPair]:
        return encode_preferences(
            load_preference_examples(source), tokenizer, cfg.max_length, cfg.overlong, name
        )

    train_items = load(cfg.data, "training data")
    if cfg.eval_data:
        eval_items = load(cfg.eval_data, "eval data")
    else:
        train_items, eval_items = split_eval(train_items, cfg.eval_fraction, cfg.seed)
    log.info("dpo: %d training and %d eval pairs", len(train_items), len(eval_items))

    # 3. Seeds and the policy (dropout off; LoRA if asked).
    seed_everything(cfg.seed)
    policy = load_causal_lm(
        cfg.model, **cfg.loader_kwargs(), gradient_checkpointing=cfg.gradient_checkpointing
    )
    resize_for_tokenizer(policy, tokenizer)
    policy = maybe_lora(policy, cfg).to(dist.device())

    # 4. Reference log-probs, once: ref_model, or the starting policy (adapter disabled).
    ref_train, ref_eval = reference_pairs(cfg, policy, tokenizer, train_items, eval_items)
    # Every input has loaded: now the output directory (a bad input leaves no run behind).
    output_dir = run.prepare()
    # The policy's log-probs come out in float32 for half-precision weights (core.logprobs).
    dtype = torch.promote_types(next(policy.parameters()).dtype, torch.float32)

    # 5. Train on the preference loss (mean over the pairs of each optimizer step).
    order = bucket_batches([len(x) for x in eval_items], cfg.batch_size, seed=0, shuffle=False)
    eval_batches = [make_batch(eval_items, ix, ref_eval, pad_id, dtype) for ix in order]
    loss_fn = lambda m, b: preference_loss(m, b, cfg)  # noqa: E731

    def evaluate(model: nn.Module) -> dict[str, float]:
        stats = evaluate_batches(model, eval_batches, loss_fn, lambda b: b.pairs.num_pairs)
        return {f"eval/{key}": value for key, value in stats.items()}

    task = Task(
        name=DPO_LOSSES.trait(cfg.loss, "card_name", cfg.loss),
        train_items=train_items,
        make_batch=lambda ix: make_batch(train_items, ix, ref_train, pad_id, dtype),
        loss_fn=loss_fn,
        units_fn=lambda b: b.pairs.num_pairs,
        evaluate=evaluate if eval_batches else None,
        nonpad_share=lambda b: b.pairs.sequences.nonpad_share,
    )
    metrics = fit(cfg, policy, task, run)

    # 6. Save the policy (or its LoRA adapter) and the tokenizer.
    save_final(policy, tokenizer, output_dir)
    log_summary(task.name, output_dir, metrics)
    return metrics
