"""TRPO (Schulman et al. 2015) as the baseline of the PPO paper: one natural-gradient step per
iteration, found by conjugate gradient on Fisher-vector products and accepted by a
KL-constrained backtracking line search. It shares the rollout, GAE and critic with PPO.

Policy step: maximise the surrogate ``L(θ) = E[r_θ·A]`` (``ppo_penalty_loss`` with β = 0 is its
negative) subject to ``KL̄[π_old ‖ π_θ] ≤ δ``:

1. g = ∇L at θ_old; F·v = ∇(∇KL̄ · v) + damping·v (Hessian of the mean exact KL at θ_old,
   which equals the Fisher information matrix there);
2. x ≈ F⁻¹g by ``cg_iters`` of conjugate gradient; the full step s = √(2δ / xᵀFx)·x puts the
   quadratic KL model exactly on the boundary;
3. try θ_old + c^k·s for k = 0, 1, …: accept the first with KL̄ ≤ δ and L improved; if none,
   keep θ_old.

A NaN/Inf in the surrogate, its gradient or the step skips the policy step, and one in a
critic minibatch's loss or gradient skips that minibatch (``runtime.guard``).

Departures: advantages are whitened over the whole batch (``whiten_advantages``); the critic is
trained with Adam on the same (optionally clipped) value loss as PPO, over the same epochs and
minibatches, instead of the original's L-BFGS.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from proxrl.classic.agent import Agent, detach_dist
from proxrl.classic.config import ClassicConfig
from proxrl.classic.ppo import guarded_step
from proxrl.classic.rollout import Batch
from proxrl.core import masked_whiten, ppo_penalty_loss, value_loss
from proxrl.runtime.guard import NonFiniteGuard


def conjugate_gradient(fvp: Callable[[Tensor], Tensor], b: Tensor, iters: int) -> Tensor:
    """Approximately solve ``F x = b`` for symmetric positive-definite F given as ``fvp``."""
    x = torch.zeros_like(b)
    r = b.clone()
    p = b.clone()
    rr = r @ r
    for _ in range(iters):
        fp = fvp(p)
        alpha = rr / (p @ fp)
        x += alpha * p
        r -= alpha * fp
        new_rr = r @ r
        if new_rr < 1e-10:
            break
        p = r + (new_rr / rr) * p
        rr = new_rr
    return x


def _flat(tensors: list[Tensor]) -> Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _assign(params: list[nn.Parameter], flat: Tensor) -> None:
    offset = 0
    for p in params:
        n = p.numel()
        p.data.copy_(flat[offset : offset + n].view_as(p))
        offset += n


def trpo_policy_step(
    cfg: ClassicConfig, agent: Agent, batch: Batch, guard: NonFiniteGuard, iteration: int
) -> dict[str, float]:
    """One natural-gradient step of the actor within the KL trust region (none when ``guard``
    finds a NaN/Inf in the surrogate, its gradient or the step)."""
    params = agent.actor_parameters()
    adv = batch.advantages
    mask = torch.ones_like(adv)
    if cfg.whiten_advantages:
        adv = masked_whiten(adv, mask)
    with torch.no_grad():
        old_dist = detach_dist(agent.dist(batch.obs))

    def surrogate() -> Tensor:
        logprobs = agent.log_prob(agent.dist(batch.obs), batch.actions)
        loss, _ = ppo_penalty_loss(logprobs, batch.logprobs, adv, mask, beta=0.0)
        return -loss

    def mean_kl() -> Tensor:
        return agent.kl(old_dist, agent.dist(batch.obs)).mean()

    def fvp(v: Tensor) -> Tensor:
        grads = torch.autograd.grad(mean_kl(), params, create_graph=True)
        hv = torch.autograd.grad(_flat(list(grads)) @ v, params)
        return _flat(list(hv)) + cfg.trpo_damping * v

    objective = surrogate()
    g = _flat(list(torch.autograd.grad(objective, params)))
    x = conjugate_gradient(fvp, g, cfg.trpo_cg_iters)
    xfx = float(x @ fvp(x))
    step = x * (2 * cfg.trpo_max_kl / max(xfx, 1e-12)) ** 0.5
    old_flat = _flat([p.detach() for p in params]).clone()
    old_objective = float(objective.detach())
    accepted, frac, kl, improvement = 0.0, 0.0, 0.0, 0.0
    # A NaN/Inf surrogate, gradient or step: no try at all, and the else branch keeps θ_old.
    finite = guard.check(
        iteration, loss=objective, tensors={"policy gradient": g, "natural-gradient step": step}
    )
    with torch.no_grad():
        for k in range(cfg.trpo_backtrack_iters if finite else 0):
            frac = cfg.trpo_backtrack_coef**k
            _assign(params, old_flat + frac * step)
            kl = float(mean_kl())
            improvement = float(surrogate()) - old_objective
            if kl <= cfg.trpo_max_kl and improvement > 0:
                accepted = 1.0
                break
        else:
            _assign(params, old_flat)
            frac, kl, improvement = 0.0, 0.0, 0.0
    return {
        "losses/policy_loss": -old_objective - improvement,
        "losses/kl": kl,
        "losses/approx_kl": kl,
        "losses/trpo_step_frac": frac,
        "losses/trpo_accepted": accepted,
        "losses/trpo_grad_norm": float(g.norm()),
    }


def critic_update(
    cfg: ClassicConfig,
    agent: Agent,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    guard: NonFiniteGuard,
    iteration: int,
) -> dict[str, float]:
    """Fit the critic with the PPO value loss over the configured epochs and minibatches
    (skipping those with a NaN/Inf loss or gradient)."""
    assert cfg.ppo_epochs is not None and cfg.mini_batch_size is not None
    total, count = 0.0, 0
    parameters = list(agent.critic.named_parameters())
    for _ in range(cfg.ppo_epochs):
        for minibatch in batch.minibatches(cfg.mini_batch_size):
            loss, _ = value_loss(
                agent.value(minibatch.obs),
                minibatch.values,
                minibatch.returns,
                torch.ones_like(minibatch.returns),
                clip=cfg.trpo_value_clip,
            )
            if guarded_step(optimizer, loss, parameters, cfg.max_grad_norm, guard, iteration):
                total += float(loss.detach())
                count += 1
    return {"losses/value_loss": total / count} if count else {}


def trpo_update(
    cfg: ClassicConfig,
    agent: Agent,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    guard: NonFiniteGuard,
    iteration: int,
) -> dict[str, float]:
    """The TRPO iteration: the policy step, then the critic fit; returns diagnostics."""
    with torch.no_grad():
        entropy = float(agent.entropy(agent.dist(batch.obs)).mean())
    stats = trpo_policy_step(cfg, agent, batch, guard, iteration)
    stats.update(critic_update(cfg, agent, optimizer, batch, guard, iteration))
    stats["losses/entropy"] = entropy
    return stats
