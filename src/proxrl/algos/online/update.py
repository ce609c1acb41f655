"""The update stage of the online loop: epochs × shuffled minibatches × micro-batches of the
algorithm's policy loss, the KL and entropy terms, and the critic's value loss, with a guard
that skips any optimizer step whose loss, statistics or gradient is not finite, and no step for
an optimizer whose gradient is exactly zero (``clipped_step``)."""

from __future__ import annotations

import contextlib
import logging
import math
from collections import defaultdict
from dataclasses import dataclass, replace
from functools import partial
from types import MappingProxyType
from typing import Protocol

import torch
from torch import Tensor

from proxrl.algos.online.algorithm import Algorithm, corrected
from proxrl.algos.online.collect import mismatch_metrics, old_policy_metrics
from proxrl.algos.online.critic import CriticGradient
from proxrl.algos.online.distill_fields import DistillFields
from proxrl.algos.online.mismatch import MismatchRecord
from proxrl.algos.online.roles import Models
from proxrl.algos.online.rollout_settings import PassSettings
from proxrl.core import DISTILL_LOSSES, DRAWING_LOSSES, Aggregation, entropy_bonus
from proxrl.models.options import autocast
from proxrl.rollout.experience import Experience
from proxrl.rollout.forward import PolicyOutput, policy_forward, response_logits
from proxrl.rollout.packing import micro_batch_plan
from proxrl.runtime import distributed as dist
from proxrl.runtime.accumulation import accumulate_gradients
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.fsdp import is_dtensor
from proxrl.runtime.guard import NonFiniteGuard, first_nonfinite_grad
from proxrl.runtime.memory import return_freed_memory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpdateStep:
    """What the loop tells one iteration's update."""

    kl_coef: float  # β of a KL paid in the loss
    train_policy: bool  # False while the critic warms up alone
    iteration: int  # 1-based: the guard's count of the iteration


@dataclass(frozen=True)
class UpdateSettings:
    """What the update stage reads of the run's options, built once when the run opens
    (``run_settings.run_settings``): where π_old comes from is decided there, not at each
    step."""

    ppo_epochs: int  # passes over the rollout batch
    responses_per_step: int  # rows of one optimizer step (a minibatch)
    mini_batch_size: int | None  # as set (a rollout without log π_old takes one step of it)
    early_stop_kl: float | None  # stop the epochs above this approx-KL(π_old‖π)
    aggregation: Aggregation  # how per-token terms reduce (loss_aggregation, its horizon)
    entropy_coef: float
    max_grad_norm: float  # 0: no clipping
    grad_accum: int
    max_tokens_per_micro_batch: int | None  # as set (refused under FSDP)
    passes: PassSettings  # the micro-batch plan, shared prefix and distribution replayed: the
    # rollout's passes' own record, so that the two lay out their forwards alike
    mixed_precision: str  # the forwards' autocast (models.options.autocast)
    policy_loss: str  # its name: whether its selection draws (core.DRAWING_LOSSES)
    distill: DistillFields | None  # a teacher's options (None: no teacher)
    old_is_trainers_pass: bool  # π_old is π at the update's start (the run's OldPolicySource:
    # ``reused_by_update``)
    measures_mismatch: bool  # π_old is the sampler's: measure it (``OldPolicySource``)


@dataclass(frozen=True)
class Losses:
    """What every micro-batch's loss reads besides its rows."""

    settings: UpdateSettings
    algo: Algorithm
    models: Models
    prompt_width: int  # P: the prompt columns before the response's
    step: UpdateStep
    drawing: torch.Generator | None = None  # what a TOKEN_SELECTIONS entry draws from
    # (``loss_generator``: seeded by the run's generator), passed to it explicitly


@dataclass
class Optimization:
    """The trained parameters and their optimizers, as the steps need them."""

    optimizers: list[torch.optim.Optimizer]
    parameters: list[Tensor]  # every optimizer's parameters, in order
    named: list[tuple[str, Tensor]]  # the actor's and the critic's, for the guard's report

    @classmethod
    def of(cls, models: Models, optimizers: list[torch.optim.Optimizer]) -> Optimization:
        return cls(
            optimizers,
            [p for opt in optimizers for group in opt.param_groups for p in group["params"]],
            list(models.actor.named_parameters())
            + [(f"critic.{n}", p) for n, p in models.critic.named_parameters()],
        )

    def zero_grad(self) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)


def update(
    settings: UpdateSettings,
    algo: Algorithm,
    models: Models,
    experience: Experience,
    optimizers: list[torch.optim.Optimizer],
    step: UpdateStep,
    generator: torch.Generator,
    guard: NonFiniteGuard,
) -> dict[str, float]:
    """``ppo_epochs`` passes of shuffled minibatches, one optimizer step each; a step whose
    loss or gradient is not finite is skipped by ``guard``, and an optimizer whose gradient is
    exactly zero does not step (``clipped_step``). Returns the mean of each stat over the steps
    past the guard, ``steps``: those in which the policy's optimizer (the first) stepped,
    ``skipped_steps``: those in which it did not, its gradient being exactly zero or every
    response masked out (0 while the critic warms up alone: the policy is not trained then),
    and ``masked_steps``: the steps whose every response ``mask_truncated`` masked out.

    Several processes: every rank holds the whole (gathered) rollout and draws the same
    minibatches; rank r runs micro-batches r, r + world, … of each, and the gradients and stats
    are summed over ranks before the step, so the update equals the single-process one.

    A critic in its own process (placement ray's critic actor) runs its forward and backward on
    the same micro-batches while the policy's run here; its gradient norm joins the policy's in
    the one global norm, and its step takes the same clip coefficient, or is skipped with the
    policy's.

    A rollout without log π_old (``experience.logprobs`` None: ``old_policy.old_logprobs_pass``)
    gets one step, whose forward gives π_old = π; the rollout metrics that read π_old are then
    computed from that forward and returned with the stats. A rollout whose log π_old is the
    sampler's (``OldPolicySource.measures_mismatch``) gets the sampler/trainer mismatch
    measured from the forward of its first step (``rollout/mismatch_kl``, …: over that step's
    rows)."""
    record = check_update(settings, experience)
    mismatch = None
    if record is None and settings.measures_mismatch:
        mismatch = MismatchRecord(experience)
    drawing = loss_generator(settings.policy_loss, generator)
    losses = Losses(settings, algo, models, experience.prompt_ids.shape[1], step, drawing)
    totals, measured, taken = _epochs(
        losses, experience, optimizers, generator, guard, record or mismatch
    )
    counts = ("early_stopped", "masked_steps")
    stats_out = {k: v / max(measured, 1) for k, v in totals.items() if k not in counts}
    stats_out["early_stopped"] = totals.get("early_stopped", 0.0)
    stats_out["masked_steps"] = masked = totals.get("masked_steps", 0.0)
    stats_out["steps"] = float(taken)
    # a policy trained this iteration whose gradient was exactly zero (no informative group),
    # or whose step had nothing left to train on (mask_truncated)
    stats_out["skipped_steps"] = float(measured - taken) + masked if step.train_policy else 0.0
    if record is not None:
        stats_out |= record.metrics(experience, step.kl_coef, models.tracks_kl)
    if mismatch is not None:
        stats_out |= mismatch.metrics(experience)
    return stats_out


def loss_generator(policy_loss: str, generator: torch.Generator) -> torch.Generator | None:
    """The generator a policy loss's selection that draws (``core.DRAWING_LOSSES``: clip_cov)
    draws from in this update (``Losses.drawing``, passed to it explicitly): seeded by one draw
    from the run's ``generator``, taken before the update on every rank alike, so the run's
    generator (checkpointed: a resumed run draws the same) moves by that one draw however many
    steps draw, and every rank keeps drawing the same minibatches. None (the run's generator
    untouched) for the other losses."""
    if policy_loss not in DRAWING_LOSSES:
        return None
    seed = int(torch.randint(0, 2**62, (), generator=generator))
    return torch.Generator().manual_seed(seed)


def _epochs(
    losses: Losses,
    experience: Experience,
    optimizers: list[torch.optim.Optimizer],
    generator: torch.Generator,
    guard: NonFiniteGuard,
    record: ForwardRecord | None,
) -> tuple[dict[str, float], int, int]:
    """``update``'s loop: the summed stats (and ``masked_steps``: the steps with nothing to
    train on), the steps past the guard and those the policy took. ``record`` keeps log π from
    the forward of the first step run, the one before π moves."""
    settings, models = losses.settings, losses.models
    optimization = Optimization.of(models, optimizers)
    totals: dict[str, float] = defaultdict(float)
    measured = taken = 0  # steps past the guard; those in which the policy's optimizer stepped
    for _ in range(settings.ppo_epochs):
        epoch_kl = []
        for minibatch in minibatches(settings.responses_per_step, len(experience), generator):
            if nothing_to_train(losses, experience, minibatch):
                totals["masked_steps"] += 1.0
                continue
            current = taken == 0 and settings.old_is_trainers_pass  # π has not moved from π_old
            stats = optimizer_step(
                losses, experience, minibatch, optimization, guard, record, current
            )
            record = None  # (a later step's forward is of a π that may have moved)
            if stats is None:
                continue
            measured += 1
            taken += int(stats.pop(POLICY_STEPPED))
            for key, value in stats.items():
                totals[key] += value
            epoch_kl.append(stats.get("approx_kl", 0.0))
        limit = settings.early_stop_kl
        if limit and epoch_kl and sum(epoch_kl) / len(epoch_kl) > limit:
            totals["early_stopped"] = 1.0
            break
    return totals, measured, taken


def minibatches(per_step: int, rows: int, generator: torch.Generator) -> list[Tensor]:
    """One epoch's minibatches: the ``rows`` rollout rows shuffled by ``generator``, split into
    ``per_step`` each (``TrainingClient.minibatches`` draws them the same way)."""
    return list(torch.randperm(rows, generator=generator).split(per_step))


def check_update(settings: UpdateSettings, experience: Experience) -> OnPolicyRecord | None:
    """Refuse what the update cannot do; the record of π where the rollout ran no pass."""
    world, sharded = dist.world_size(), dist.is_sharded()
    if sharded and settings.grad_accum % world:  # each rank must run as many forwards as the others
        raise ProxrlError(
            f"grad_accum: under FSDP/DeepSpeed {settings.grad_accum} micro-batches per step "
            f"must divide across {world} processes"
        )
    if sharded and settings.max_tokens_per_micro_batch:  # packed micro-batches vary in number
        raise ProxrlError(
            "max_tokens_per_micro_batch: not under FSDP/DeepSpeed (each process must run as "
            "many forwards as the others); use grad_accum"
        )
    if experience.logprobs is not None:
        return None
    if settings.ppo_epochs > 1 or settings.mini_batch_size < len(experience):
        raise ValueError(
            "a rollout without log π_old takes exactly one optimizer step (π moves after it)"
        )
    return OnPolicyRecord(experience)


def optimizer_step(
    losses: Losses,
    experience: Experience,
    minibatch: Tensor,
    optimization: Optimization,
    guard: NonFiniteGuard,
    record: ForwardRecord | None,
    old_is_current: bool = False,
) -> dict[str, float] | None:
    """One optimizer step on the rows ``minibatch``: this rank's micro-batches accumulated (a
    critic in its own process meanwhile), gradients summed over ranks, the global norm clipped,
    the guard asked. Returns the step's stats, or None where no step was taken."""
    if nothing_to_train(losses, experience, minibatch):
        return None
    optimization.zero_grad()
    step_stats, elsewhere = accumulate(
        losses, experience, minibatch, optimization, record, old_is_current
    )
    return clipped_step(losses, step_stats, elsewhere, optimization, guard)


def nothing_to_train(losses: Losses, experience: Experience, minibatch: Tensor) -> bool:
    """Whether every response of the rows ``minibatch`` is masked out (mask_truncated): the
    step has no loss term to learn from."""
    return losses.settings.aggregation.units(experience.loss_mask[minibatch]) == 0


def accumulate(
    losses: Losses,
    experience: Experience,
    minibatch: Tensor,
    optimization: Optimization,
    record: ForwardRecord | None,
    old_is_current: bool = False,
) -> tuple[dict[str, float], CriticGradient | None]:
    """The backward of one optimizer step's rows ``minibatch`` added to the gradients (this
    rank's micro-batches; a critic in its own process meanwhile), summed over ranks; the step's
    stats and that critic's gradient. ``TrainingClient.forward_backward`` runs it too.

    What the policy loss chooses over the whole step (``Algorithm.step_selection``) is chosen
    first, from log π at every row of the step: the rows' log π_old where ``old_is_current``
    (π has not moved since the rollout's pass for it), else a forward without gradient over the
    step's micro-batches (``step_logprobs``)."""
    settings, critic = losses.settings, losses.models.critic
    world, rank, sharded = dist.world_size(), dist.rank(), dist.is_sharded()
    # The normaliser of every loss term is counted on the whole minibatch before its
    # micro-batches run, so 1, 2 or 4 micro-batches (or processes) give the same gradient.
    total_units = settings.aggregation.units(experience.loss_mask[minibatch])
    plan = micro_batch_plan(
        experience.attention_mask[minibatch],
        settings.passes.micro_batch_size,
        settings.passes.token_budget,
    )
    mine = [minibatch[rows] for rows in plan][rank::world]
    units = partial(_units, settings.aggregation, experience)
    chosen: dict[str, float] = {}
    if losses.algo.step_selection is not None and losses.step.train_policy:
        experience, chosen = select_for_step(losses, experience, minibatch, mine, old_is_current)
    # FSDP / DeepSpeed average gradients over ranks themselves: weigh by world.
    step_units = float(total_units) / world if sharded else float(total_units)
    no_sync = contextlib.ExitStack()
    for model in (losses.models.actor, *critic.modules()) if world > 1 else ():
        no_sync.enter_context(dist.no_sync(model))
    critic.start_step(experience, mine, units, step_units, settings.aggregation)
    with no_sync:
        step_stats: dict[str, float] = defaultdict(float)
        step_stats.update(
            accumulate_gradients(
                losses.models.actor,
                mine,
                partial(_rows_loss, losses, experience, record),
                units,
                step_units,
            )
        )
    elsewhere = critic.finish_step()
    for key, value in elsewhere.stats.items() if elsewhere is not None else ():
        step_stats[key] += value  # (its ``loss``: the value loss's share of the step's)
    if world > 1:  # one all-reduce per optimizer step
        if not sharded:
            dist.all_reduce_gradients(optimization.parameters)
        step_stats = defaultdict(float, dist.all_reduce_sum(dict(step_stats)))
        if sharded:
            step_stats = defaultdict(float, {k: v / world for k, v in step_stats.items()})
    step_stats.update(chosen)  # (the same on every rank: over the whole step)
    return dict(step_stats), elsewhere


def select_for_step(
    losses: Losses,
    experience: Experience,
    minibatch: Tensor,
    mine: list[Tensor],
    old_is_current: bool,
) -> tuple[Experience, dict[str, float]]:
    """``Algorithm.step_selection`` over the rows ``minibatch`` (every rank alike), written into
    a copy of ``experience`` that the step's micro-batches read; and the selection's stats."""
    rows = experience.select(minibatch)
    if old_is_current and rows.logprobs is not None:
        logprobs = rows.logprobs
    else:
        logprobs = step_logprobs(losses, experience, minibatch, mine)
    if rows.logprobs is None:  # π_old is π at this, the rollout's only, step
        rows = replace(rows, logprobs=logprobs)
    chosen, stats = losses.algo.step_selection(logprobs, rows, losses.drawing)  # type: ignore[misc]
    width = rows.response_ids.shape[1]
    advantages = experience.advantages.clone()  # type: ignore[union-attr]
    advantages[minibatch, :width] = chosen.advantages.to(advantages.dtype)  # type: ignore[union-attr]
    selection = None
    if chosen.loss_selection is not None:
        selection = torch.zeros_like(advantages)
        selection[minibatch, :width] = chosen.loss_selection.to(advantages.dtype)
    return replace(experience, advantages=advantages, loss_selection=selection), stats


def step_logprobs(
    losses: Losses, experience: Experience, minibatch: Tensor, mine: list[Tensor]
) -> Tensor:
    """(len(minibatch), T') log π at the rows ``minibatch`` now, T' their trimmed width, without
    gradient: a forward over this rank's micro-batches ``mine``, summed over ranks (each row is
    one rank's), in the dtype of log π_old (of the advantages without it)."""
    dtype = (
        experience.logprobs if experience.logprobs is not None else experience.advantages
    ).dtype  # type: ignore[union-attr]
    width = experience.select(minibatch).response_ids.shape[1]
    at = torch.full((len(experience),), -1, dtype=torch.long, device=minibatch.device)
    at[minibatch] = torch.arange(len(minibatch), device=minibatch.device)
    logprobs = torch.zeros(
        len(minibatch), width, dtype=torch.float64, device=experience.response_mask.device
    )
    with torch.no_grad(), autocast(losses.settings.mixed_precision):
        for rows in mine:
            out = policy_output(losses, experience.select(rows), with_entropy=False)
            logprobs[at[rows], : out.logprobs.shape[1]] = out.logprobs.double()
    return dist.all_reduce_sum(logprobs).to(dtype)


def clipped_step(
    losses: Losses,
    step_stats: dict[str, float],
    elsewhere: CriticGradient | None,
    optimization: Optimization,
    guard: NonFiniteGuard,
) -> dict[str, float] | None:
    """Clip the accumulated gradients by their global norm and step, unless the guard finds a
    non-finite stat or gradient (then the step is skipped: None)."""
    # The global norm doubles as the finiteness check: only a non-finite one makes the
    # guard look for the culprit tensor.
    grad_norm, coefficient = clip_global_norm(
        optimization.parameters, elsewhere, losses.settings.max_grad_norm or float("inf")
    )
    tensors = dict(step_stats)
    named = optimization.named
    if not math.isfinite(grad_norm) and first_nonfinite_grad(named) is None:
        culprit = elsewhere.nonfinite if elsewhere is not None else None
        # an overflowed norm, or the gradient of the critic in its own process
        tensors["gradient norm" if culprit is None else f"grad of critic.{culprit}"] = grad_norm
    finite = math.isfinite(grad_norm)
    iteration = losses.step.iteration
    if not guard.check(iteration, tensors=tensors, parameters=None if finite else named):
        optimization.zero_grad()
        return None
    step_stats["grad_norm"] = grad_norm
    losses.models.critic.clip(coefficient)
    stepped = [has_gradient(opt, elsewhere) for opt in optimization.optimizers]
    for opt, moves in zip(optimization.optimizers, stepped, strict=True):
        if moves:
            opt.step()
    step_stats[POLICY_STEPPED] = float(bool(stepped) and stepped[0])
    return dict(step_stats)


POLICY_STEPPED = "_policy_stepped"
"""The stat by which ``clipped_step`` tells ``update`` whether the policy's optimizer stepped."""


def has_gradient(optimizer: torch.optim.Optimizer, elsewhere: CriticGradient | None) -> bool:
    """Whether ``optimizer`` is to step: some gradient of its parameters is not exactly zero.

    An optimizer whose parameters' gradients are all exactly zero or None does not step, so
    neither its weights nor its state move: AdamW (weight decay 0 included) would still move
    every weight by its first moment ``lr · m̂ / (√v̂ + ε)`` (the size of a real step, whatever
    the gradient's), decay both moments and count the step in its bias correction. An update
    with no informative group (every group's scores equal: every advantage 0, no KL or entropy
    term in the loss) has an exactly zero policy gradient; stepping on it is a random walk on
    the moments of earlier steps (issue 40: KL to the start 0.4 → 16 over 60 such iterations).

    The decision is per optimizer: under PPO a zero policy gradient may come with a non-zero
    value-loss gradient, and the critic's optimizer (the value head's, or a separate critic's)
    steps then while the policy's does not. With a value head the value loss's gradient also
    reaches the backbone, so the policy's optimizer steps on it, as it always did. A KL or
    entropy term in the loss gives the policy a non-zero gradient, and it steps on that.

    The learning-rate schedule is not moved by a step: the loop sets every rate from the
    iteration number (``runtime.lr_schedule``, ``Run.learning_rate(iteration)``), so a skipped
    step shifts no later rate.

    An optimizer with no parameters here (placement ray's ``RemoteOptimizer``: the critic in its
    own process) steps when that critic's reported gradient norm (``elsewhere``) is not 0.
    Under FSDP each rank holds a shard of the gradient: the ranks agree (any rank's non-zero
    shard steps every rank); under DDP the gradients are already summed over ranks."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if not params:
        return elsewhere is not None and elsewhere.norm != 0.0
    grads = [p.grad for p in params if p.grad is not None]
    local = [g.to_local() if is_dtensor(g) else g for g in grads]
    nonzero = bool(torch.stack([g.ne(0).any() for g in local]).any()) if local else False
    return dist.any_rank(nonzero) if dist.is_sharded() else nonzero


def _units(aggregation: Aggregation, experience: Experience, rows: Tensor) -> float:
    """The loss units (tokens, sequences) of the rows ``rows``: a micro-batch's weight."""
    return float(aggregation.units(experience.loss_mask[rows]))


def clip_global_norm(
    parameters: list[Tensor], elsewhere: CriticGradient | None, max_norm: float
) -> tuple[float, float]:
    """Clip the gradients of ``parameters`` and of a critic in its own process (``elsewhere``:
    its norm) by their one global 2-norm, as ``clip_grad_norm_`` over all of them would;
    returns that norm and the coefficient min(max_norm / (norm + 1e-6), 1) the critic's
    gradients are to be scaled by. A non-finite norm scales nothing: the step is skipped, and
    its coefficient (NaN) would turn every gradient NaN, hiding from the guard which one was
    not finite (``clipped_step`` names it)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads)  # clip_grad_norm_'s two halves, split here
    if elsewhere is not None:
        there = torch.tensor(elsewhere.norm, dtype=torch.float64)
        norm = torch.linalg.vector_norm(torch.stack([norm.double().cpu(), there]))
    if torch.isfinite(norm):
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
    if elsewhere is None:
        return float(norm), 1.0
    return float(norm), float(torch.clamp(max_norm / (norm + 1e-6), max=1.0))


class ForwardRecord(Protocol):
    """What keeps log π as an optimizer step's forward computes it (``OnPolicyRecord``,
    ``mismatch.MismatchRecord``)."""

    def add(self, rows: Tensor, out: PolicyOutput) -> None: ...


class OnPolicyRecord:
    """log π and its entropy at every rollout row as the update's forward computes them: π_old
    of a rollout that ran no pass for it, from which its π_old metrics are computed."""

    def __init__(self, experience: Experience) -> None:
        mask = experience.response_mask
        self.logprobs = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device)
        self.entropy = torch.zeros_like(self.logprobs)
        self.seen = torch.zeros(mask.shape[0], dtype=torch.float64, device=mask.device)

    def add(self, rows: Tensor, out: PolicyOutput) -> None:
        width = out.logprobs.shape[1]  # (a micro-batch is trimmed of all-pad columns)
        self.logprobs[rows, :width] = out.logprobs.detach().double()
        self.entropy[rows, :width] = out.entropy.double()  # type: ignore[union-attr]
        self.seen[rows] += 1

    def metrics(self, experience: Experience, kl_coef: float, tracks_kl: bool) -> dict[str, float]:
        """``collect.old_policy_metrics`` over every row (each rank ran some: summed over them),
        and the sampler's mismatch against this π_old where its log-probs were kept to measure
        (``Experience.sampler_logprobs``)."""
        logprobs, entropy, seen = (
            dist.all_reduce_sum(x) for x in (self.logprobs, self.entropy, self.seen)
        )
        if not bool((seen == 1).all()):
            raise ValueError("every rollout row must reach the update's forward exactly once")
        reference = logprobs if experience.ref_logprobs is None else experience.ref_logprobs
        mask = experience.loss_mask.double()
        metrics = old_policy_metrics(
            logprobs, reference, entropy, experience.scores, mask, kl_coef, tracks_kl
        )
        if experience.sampler_logprobs is not None:
            metrics |= mismatch_metrics(logprobs, experience.sampler_logprobs, experience)
        return metrics


def _rows_loss(
    losses: Losses,
    experience: Experience,
    record: ForwardRecord | None,
    model: torch.nn.Module,
    rows: Tensor,
) -> tuple[Tensor, dict[str, Tensor]]:
    """``terms`` on the rows ``rows`` of ``experience``, π at them kept in ``record`` (when the
    rollout ran no pass for π_old, or its π_old is the sampler's). ``model`` is the actor (the
    accumulation's signature)."""
    # the previous micro-batch's (or the rollout's) freed activations back to the system: a
    # larger micro-batch after a smaller one would otherwise grow the process on top of them
    return_freed_memory()
    with autocast(losses.settings.mixed_precision):  # the forwards and losses, not the backward
        loss, stats, out = terms(losses, experience.select(rows))
    if record is not None:
        record.add(rows, out)
    return loss, stats


def terms(losses: Losses, mb: Experience) -> tuple[Tensor, dict[str, Tensor], PolicyOutput]:
    """Policy loss (+ KL in the loss, − entropy bonus) + the critic's weighted value loss on one
    micro-batch, every term reduced by the aggregation in the micro-batch's own units."""
    settings, algo, step = losses.settings, losses.algo, losses.step
    critic, distill = losses.models.critic, settings.distill
    agg = settings.aggregation
    mask = mb.loss_mask.float()  # model tokens: observations take no loss
    full_distill = DISTILL_LOSSES[distill.distill_loss].per_token_loss if distill else None
    with_entropy = settings.entropy_coef > 0 or mb.logprobs is None
    with_logits = full_distill is not None and step.train_policy
    out = policy_output(losses, mb, with_entropy, critic.needs_hidden, with_logits)
    if mb.logprobs is None:  # π_old is π at this step (the rollout ran no pass for it)
        mb = replace(mb, logprobs=out.logprobs.detach())
    loss = torch.zeros((), device=mask.device)
    stats: dict[str, Tensor] = {}
    if step.train_policy:
        loss, stats = algo.policy_loss(out.logprobs, corrected(mb))
        if algo.kl_loss is not None and step.kl_coef:
            kl_loss = agg(algo.kl_loss(out.logprobs, mb.ref_logprobs), mask)
            loss = loss + step.kl_coef * kl_loss
            stats["kl_loss"] = kl_loss.detach()
        if settings.entropy_coef:  # (the rollout's entropy is logged either way)
            bonus, entropy_stats = entropy_bonus(out.entropy, mask, agg)  # type: ignore[arg-type]
            stats.update(entropy_stats)
            loss = loss + settings.entropy_coef * bonus
        if full_distill is not None:
            loss = loss + distill_loss_term(losses, mb, out, mask, stats)
    v_loss, v_stats = critic.loss(mb, out.hidden, agg)  # 0 and {} without a critic
    loss = loss + v_loss
    stats.update(v_stats)
    return loss, stats, out


def distill_loss_term(
    losses: Losses, mb: Experience, out: PolicyOutput, mask: Tensor, stats: dict[str, Tensor]
) -> Tensor:
    """λ × the full-vocabulary distillation loss (distill_loss gjsd) of one micro-batch: the
    teacher's logits at every response position (no gradient), the divergence per position in
    chunks (``core.chunked_generalized_jsd``), reduced as every other term; stat
    ``distill_loss``."""
    settings, distill = losses.settings, losses.settings.distill
    assert distill is not None and out.logits is not None
    per_token_loss = DISTILL_LOSSES[distill.distill_loss].per_token_loss
    assert per_token_loss is not None
    with torch.no_grad():
        teacher = response_logits(
            losses.models.teacher, mb.input_ids, mb.attention_mask, losses.prompt_width
        )
    temperature = settings.passes.distribution.temperature
    per_token = per_token_loss(
        out.logits, teacher, distill.distill_beta, temperature, distill.distill_chunk_size
    )
    divergence = settings.aggregation(per_token, mask)
    stats["distill_loss"] = divergence.detach()
    return distill.distill_coef * divergence


def policy_output(
    losses: Losses,
    mb: Experience,
    with_entropy: bool,
    with_hidden: bool = False,
    with_logits: bool = False,
) -> PolicyOutput:
    """The actor's forward over the rows ``mb``: log π on the distribution that was sampled
    from (its temperature, top-k, top-p, min-p, as π_old)."""
    settings = losses.settings
    return policy_forward(
        losses.models.actor,
        mb.input_ids,
        mb.attention_mask,
        losses.prompt_width,
        settings.passes.distribution.temperature,
        with_entropy=with_entropy,
        with_hidden=with_hidden,
        **settings.passes.distribution.truncation,
        packed=settings.passes.packed,
        with_logits=with_logits,
        shared_prefix=settings.passes.shares_prefix,
    )


NAMESPACES = MappingProxyType(
    {
        "loss": "policy/total_loss",
        "value_loss": "value/loss",
        "value_clipfrac": "value/clipfrac",
        "value_mean": "value/mean",
        "entropy": "policy/entropy",
        "grad_norm": "policy/grad_norm",
        "early_stopped": "policy/early_stopped",
        "steps": "policy/optimizer_steps",
        "skipped_steps": "policy/skipped_steps",
        "masked_steps": "policy/masked_steps",
        "distill_loss": "distill/loss",
    }
)
