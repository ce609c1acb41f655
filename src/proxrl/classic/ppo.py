"""The PPO update: K epochs over shuffled minibatches of one iteration's batch.

Every formula comes from ``proxrl.core``: the surrogate (``ppo_clip_loss`` for ``clip``,
``ppo_penalty_loss`` with β for ``adaptive-kl``/``fixed-kl`` and β = 0 for ``none``), the
(clipped) value loss, the entropy bonus and advantage whitening.

Departures from the PPO paper, all following CleanRL: actor and critic are separate networks but
share one Adam optimiser and one global gradient-norm clip; advantages are whitened per
minibatch; the value loss is clipped; for the penalty objectives the per-sample KL in the loss
is core's k3 estimate, while the d that drives the adaptive β is the exact mean
KL[π_old ‖ π_new] over the whole batch after the update (as in the paper).

A minibatch whose loss or a gradient holds a NaN/Inf is skipped (``runtime.guard``); its
numbers are left out of the iteration's means, and β is not updated by an iteration that took
no step at all.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from proxrl.classic.agent import Agent, detach_dist
from proxrl.classic.config import OBJECTIVE_TABLE, ClassicConfig
from proxrl.classic.rollout import Batch
from proxrl.core import (
    FixedKL,
    entropy_bonus,
    masked_whiten,
    ppo_clip_loss,
    ppo_penalty_loss,
    value_loss,
)
from proxrl.runtime.guard import NonFiniteGuard


def guarded_step(
    optimizer: torch.optim.Optimizer,
    loss: Tensor,
    parameters: list[tuple[str, nn.Parameter]],
    max_grad_norm: float,
    guard: NonFiniteGuard,
    iteration: int,
) -> bool:
    """Backward ``loss``, clip the gradient norm of the named ``parameters`` and take the
    optimizer step, unless ``guard`` finds a NaN/Inf in the loss or a gradient: then the
    gradients are dropped and ``False`` is returned (after ``guard.max_consecutive`` skips in a
    row it raises)."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    # The norm is checked before clipping, which would spread one NaN gradient over all of
    # them; only a non-finite norm sends the guard looking for the parameter to blame.
    norm = nn.utils.get_total_norm([p.grad for _, p in parameters if p.grad is not None])
    suspects = None if bool(torch.isfinite(norm)) else parameters
    if not guard.check(iteration, loss=loss, parameters=suspects):
        optimizer.zero_grad(set_to_none=True)
        return False
    nn.utils.clip_grads_with_norm_([p for _, p in parameters], max_grad_norm, norm)
    optimizer.step()
    return True


def policy_loss(
    cfg: ClassicConfig, logprobs: Tensor, old_logprobs: Tensor, adv: Tensor, beta: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """The chosen surrogate as a loss, plus clip-style statistics for every objective."""
    mask = torch.ones_like(adv)
    if OBJECTIVE_TABLE.trait(cfg.objective, "clipped"):
        return ppo_clip_loss(logprobs, old_logprobs, adv, mask, clip_low=cfg.clip)
    penalised = OBJECTIVE_TABLE.trait(cfg.objective, "penalty")
    loss, stats = ppo_penalty_loss(logprobs, old_logprobs, adv, mask, beta=beta if penalised else 0)
    with torch.no_grad():  # clipfrac at ε = cfg.clip, for comparison across objectives
        _, clip_stats = ppo_clip_loss(logprobs, old_logprobs, adv, mask, clip_low=cfg.clip)
    stats["clipfrac"] = clip_stats["clipfrac"]
    return loss, stats


def ppo_update(
    cfg: ClassicConfig,
    agent: Agent,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    kl_ctrl: FixedKL,
    guard: NonFiniteGuard,
    iteration: int,
) -> dict[str, float]:
    """Run the epochs, update β, and return the iteration's mean losses and diagnostics (over
    the minibatch steps taken; ``guard`` skips those with a NaN/Inf loss or gradient)."""
    assert (
        cfg.ppo_epochs is not None
        and cfg.mini_batch_size is not None
        and cfg.entropy_coef is not None
    )
    with torch.no_grad():
        old_dist = detach_dist(agent.dist(batch.obs))
    beta = kl_ctrl.value if OBJECTIVE_TABLE.trait(cfg.objective, "penalty") else 0.0
    parameters = list(agent.named_parameters())
    sums: dict[str, float] = {}
    count = 0
    epochs_run = 0
    for _ in range(cfg.ppo_epochs):
        for minibatch in batch.minibatches(cfg.mini_batch_size):
            dist = agent.dist(minibatch.obs)
            logprobs = agent.log_prob(dist, minibatch.actions)
            adv = minibatch.advantages
            mask = torch.ones_like(adv)
            if cfg.whiten_advantages:
                adv = masked_whiten(adv, mask)
            pg_loss, pg_stats = policy_loss(cfg, logprobs, minibatch.logprobs, adv, beta)
            v_loss, _ = value_loss(
                agent.value(minibatch.obs),
                minibatch.values,
                minibatch.returns,
                mask,
                clip=cfg.value_clip,
            )
            ent_loss, ent_stats = entropy_bonus(agent.entropy(dist), mask)
            loss = pg_loss + cfg.vf_coef * v_loss + cfg.entropy_coef * ent_loss

            if not guarded_step(optimizer, loss, parameters, cfg.max_grad_norm, guard, iteration):
                continue

            for name, value in (
                ("losses/policy_loss", pg_loss.detach()),
                ("losses/value_loss", v_loss.detach()),
                ("losses/entropy", ent_stats["entropy"]),
                ("losses/approx_kl", pg_stats["approx_kl"]),
                ("losses/approx_kl_k1", pg_stats["approx_kl_k1"]),
                ("losses/clipfrac", pg_stats["clipfrac"]),
                ("losses/ratio_max", pg_stats["ratio_max"]),
            ):
                sums[name] = sums.get(name, 0.0) + float(value)
            count += 1
        epochs_run += 1
        if cfg.early_stop_kl is not None and float(pg_stats["approx_kl"]) > cfg.early_stop_kl:
            break

    with torch.no_grad():
        measured_kl = float(agent.kl(old_dist, agent.dist(batch.obs)).mean())
    stats = {name: total / count for name, total in sums.items()}
    stats["losses/kl"] = measured_kl
    stats["losses/kl_beta"] = beta
    stats["losses/epochs"] = float(epochs_run)
    if count:  # an iteration whose every step was skipped left the policy (and d) unchanged
        kl_ctrl.update(measured_kl)
    return stats
