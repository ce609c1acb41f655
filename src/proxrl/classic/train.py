"""``proxrl classic``: PPO (Schulman et al. 2017, arXiv 1707.06347) and TRPO on gymnasium.

Defaults follow the paper's MuJoCo table for continuous actions and CleanRL's classic-control
settings for discrete ones (see ``proxrl.classic.config``). The surrogate objective is a choice,
as in the paper's Table 1: ``clip``, ``adaptive-kl``, ``fixed-kl`` or ``none``.

Departures from the paper, all as in CleanRL ``ppo_continuous_action.py``: several environments
per iteration are allowed; the learning rate decays linearly to 0; advantages are whitened per
minibatch; the value loss is clipped; one Adam (eps 1e-5) and one global gradient-norm clip for
actor and critic; observations are normalised and rewards scaled (MuJoCo); time-limit
truncations are bootstrapped with γ·V(final observation) rather than treated as terminal.

Each iteration: collect N×T steps → GAE (``proxrl.core.gae_env``) → update → log → checkpoint.

Reliability (``proxrl.runtime``): SIGINT/SIGTERM finish the current iteration, save a checkpoint
and exit 130/143; an exception (an environment raising) saves the last finished iteration
before it propagates (``runtime.run``: ``save_on_error``); a resumed run continues exactly as
the uninterrupted one. A NaN/Inf in the advantages or returns skips the iteration's update,
one in a loss or gradient skips that minibatch step (TRPO: the policy step); skips are
counted in ``guard/skipped_updates`` and ``max_consecutive_skips`` of them in a row stop the
run with the last good checkpoint intact.
"""

from __future__ import annotations

import json
import logging
import math
import time
import warnings
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from proxrl.classic.agent import Agent
from proxrl.classic.config import ALGOS, OBJECTIVE_TABLE, ClassicConfig
from proxrl.classic.envs import (
    ObsNormalizer,
    RewardScaler,
    make_vec_env,
    snapshot_supported,
)
from proxrl.classic.ppo import ppo_update
from proxrl.classic.rollout import Batch, Collector, Rollout
from proxrl.classic.trpo import trpo_update
from proxrl.core import AdaptiveKL, FixedKL, explained_variance, gae_env
from proxrl.runtime.checkpointer import Accessors
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.guard import NonFiniteGuard
from proxrl.runtime.lr_schedule import warmup_then_decay
from proxrl.runtime.run import Run
from proxrl.runtime.seeding import seed_everything

log = logging.getLogger(__name__)

Config = ClassicConfig


def _action_kind(env_id: str) -> tuple[bool, int, int]:
    """(discrete, obs_dim, action_dim) of an environment, from a throwaway instance."""
    env = make_vec_env(env_id, 1)
    obs_space, act_space = env.single_observation_space, env.single_action_space
    env.close()
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        raise ProxrlError(f"--env {env_id}: only flat Box observations are supported")
    if isinstance(act_space, gym.spaces.Discrete):
        return True, obs_space.shape[0], int(act_space.n)
    if isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1:
        return False, obs_space.shape[0], act_space.shape[0]
    raise ProxrlError(f"--env {env_id}: action space {act_space} is not supported")


@dataclass
class Learner:
    """What the loop trains and samples with."""

    envs: gym.vector.VectorEnv
    agent: Agent
    optimizer: torch.optim.Optimizer
    kl_ctrl: FixedKL  # AdaptiveKL for the adaptive-kl objective
    collector: Collector
    exact: bool  # whether every env can be snapshot (else episodes restart on resume)

    def checkpoint_entries(self) -> dict[str, Any]:
        """What a checkpoint holds of it, by the names checkpoints always used."""
        collector = self.collector
        collector_state = Accessors(
            collector.state_dict, lambda s: collector.load_state_dict(s, envs_too=self.exact)
        )
        return dict(
            agent=self.agent,
            optimizer=self.optimizer,
            kl_ctrl=self.kl_ctrl,
            collector=collector_state,
        )


@dataclass
class Progress:
    """The counters a checkpoint carries (``counters``) and the recent returns."""

    iteration: int = 0
    global_step: int = 0
    episodes: int = 0
    elapsed_before: float = 0.0  # wall time of the sessions before this one
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=100))

    def load(self, counters: dict[str, Any]) -> None:
        self.iteration, self.global_step = counters["iteration"], counters["global_step"]
        self.episodes, self.elapsed_before = counters["episodes"], counters["elapsed_s"]
        self.recent.extend(counters["recent_returns"])

    def counters(self, session_s: float) -> dict[str, Any]:
        return dict(
            iteration=self.iteration,
            global_step=self.global_step,
            episodes=self.episodes,
            elapsed_s=self.elapsed_before + session_s,
            recent_returns=list(self.recent),
        )


def build_learner(cfg: ClassicConfig, obs_dim: int, action_dim: int, discrete: bool) -> Learner:
    """Environments, networks, optimiser and KL-penalty controller."""
    envs = make_vec_env(cfg.env, cfg.num_envs)  # type: ignore[arg-type]
    agent = Agent(obs_dim, action_dim, discrete, cfg.hidden_size)
    by_gradient = ALGOS.trait(cfg.algo, "trains_policy_by_gradient")
    trainable = agent.parameters() if by_gradient else agent.critic.parameters()
    # fused: one kernel per step instead of ~10 per parameter tensor (the update's largest
    # overhead at these sizes); the same Adam, equal to the unfused one within float32 rounding.
    optimizer = torch.optim.Adam(trainable, lr=cfg.learning_rate, eps=1e-5, fused=True)
    kl_ctrl = (
        AdaptiveKL(cfg.penalty_beta, cfg.penalty_target)
        if OBJECTIVE_TABLE.trait(cfg.objective, "adaptive")
        else FixedKL(cfg.penalty_beta)
    )
    collector = Collector(
        envs,
        agent,
        ObsNormalizer((obs_dim,), cfg.normalize_obs, cfg.obs_clip),  # type: ignore[arg-type]
        RewardScaler(cfg.num_envs, cfg.gamma, cfg.normalize_reward, cfg.reward_clip),  # type: ignore[arg-type]
        cfg.gamma,
        cfg.seed,
    )
    exact = all(snapshot_supported(e) for e in envs.envs)
    return Learner(envs, agent, optimizer, kl_ctrl, collector, exact)


def train(cfg: ClassicConfig) -> dict[str, Any]:
    """Train, write metrics, checkpoints and summary.json; return the summary."""
    # 1. Fill the defaults of this kind of environment and check the result.
    discrete, obs_dim, action_dim = _action_kind(cfg.env)
    cfg = cfg.resolved(discrete)
    assert cfg.num_envs and cfg.num_steps and cfg.learning_rate and cfg.total_steps
    planned = cfg.num_iterations * cfg.batch_size

    # 2. Output directory (with the resolved config), one torch thread, seeds.
    run = Run(cfg)
    run.check_resume()  # compared with the resolved options the run wrote
    run.check_not_finished(planned, "step", "--total-steps")
    out = run.prepare()
    run.write_config(planned)
    torch.set_num_threads(cfg.torch_threads)
    torch.distributions.Distribution.set_default_validate_args(False)
    seed_everything(cfg.seed)

    # 3. Environments, networks, optimiser (its learning rate annealed per iteration),
    #    KL-penalty controller.
    learner = build_learner(cfg, obs_dim, action_dim, discrete)
    decay = "linear" if cfg.anneal_lr else "constant"
    run.schedule(learner.optimizer, warmup_then_decay(cfg.num_iterations, decay=decay))

    # 4. What a checkpoint holds (weights, optimiser, controller, normalisers and the running
    #    episodes; the run adds its guard, RNGs and schedule; the counters at save) and the
    #    resume from the newest one. Envs that cannot be snapshot restart their episodes.
    run.track(**learner.checkpoint_entries())
    progress = Progress()
    restored = run.start(planned)
    if restored is not None:
        if not learner.exact:
            warnings.warn(f"{cfg.env}: episodes in progress restart on resume", stacklevel=2)
        progress.load(restored.counters)
        log.info("resumed %s at step %d", restored.path, progress.global_step)

    # 5. The loop: collect → GAE → update → log → checkpoint (→ stop on SIGINT/SIGTERM).
    start = time.perf_counter()
    steps_at_start = progress.global_step

    def save() -> Path:
        counters = progress.counters(time.perf_counter() - start)
        return run.save(progress.global_step, **counters)

    stop_at = min(cfg.stop_at_step or cfg.total_steps, planned)
    finished = run.save_finished  # an exception saves the last finished iteration
    with run.running(planned, cfg.env, completed=progress.global_step, save_on_error=finished):
        while progress.iteration < cfg.num_iterations and progress.global_step < stop_at:
            progress.iteration += 1
            iteration = progress.iteration
            lr = run.learning_rate(iteration)

            # 5a-c. Collect N×T steps, advantages and returns, update.
            step = iterate(cfg, learner, run.guard, iteration)
            progress.global_step += cfg.batch_size
            progress.episodes += len(step.rollout.episodes)
            progress.recent.extend(r for r, _ in step.rollout.episodes)

            # 5d. Log one row per iteration.
            sps = (progress.global_step - steps_at_start) / (time.perf_counter() - start)
            row = iteration_row(progress, step, lr, sps) | run.guard.metrics()
            run.log(progress.global_step, {k: v for k, v in row.items() if math.isfinite(v)})
            shown = {"SPS": sps}
            if progress.recent:
                shown["return"] = float(np.mean(progress.recent))
            run.bar.update(cfg.batch_size, **shown)  # type: ignore[union-attr]

            # 5e. Checkpoint; on SIGINT/SIGTERM the iteration is complete: save it and stop
            #     (exit 130/143).
            saved = save() if cfg.save_every and iteration % cfg.save_every == 0 else None
            more = iteration < cfg.num_iterations and progress.global_step < stop_at
            if run.stop_requested and more:
                raise run.interrupted(saved or save())
            run.finished(progress.global_step, **progress.counters(time.perf_counter() - start))
    latest = run.checkpointer.manager.latest()
    step_of = run.checkpointer.manager.step_of
    final = latest if latest and step_of(latest) == progress.global_step else save()
    run.close()
    learner.envs.close()

    # 6. Summary: mean return of the last 100 training episodes.
    summary = summarize(cfg, progress, time.perf_counter() - start, steps_at_start, final)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


@dataclass
class Iteration:
    """One iteration's rollout, its flattened batch, the update's statistics and timings."""

    rollout: Rollout
    batch: Batch
    stats: dict[str, float]
    rollout_s: float
    update_s: float


def iterate(
    cfg: ClassicConfig, learner: Learner, guard: NonFiniteGuard, iteration: int
) -> Iteration:
    """Collect N×T steps with the current policy, GAE (``core.gae_env``; truncations bootstrapped
    in the rewards), then update the policy and the critic. A batch whose advantages or returns
    hold a NaN/Inf is skipped whole (counted by the guard); a finite one is only looked at, so
    that it does not reset the count of skipped steps in a row."""
    t0 = time.perf_counter()
    rollout = learner.collector.collect(cfg.num_steps)  # type: ignore[arg-type]
    rollout_s = time.perf_counter() - t0
    advantages, returns = gae_env(
        rollout.rewards,
        rollout.values,
        rollout.dones,
        rollout.next_value,
        cfg.gamma,
        cfg.lam,
    )
    batch = rollout.flatten(advantages, returns)

    t1 = time.perf_counter()
    stats: dict[str, float] = {}
    targets = {"advantages": advantages, "returns": returns}
    agent, optimizer = learner.agent, learner.optimizer
    if guard.problem(tensors=targets) is None or guard.check(iteration, tensors=targets):
        if ALGOS.trait(cfg.algo, "trains_policy_by_gradient"):
            stats = ppo_update(cfg, agent, optimizer, batch, learner.kl_ctrl, guard, iteration)
        else:
            stats = trpo_update(cfg, agent, optimizer, batch, guard, iteration)
    return Iteration(rollout, batch, stats, rollout_s, time.perf_counter() - t1)


def iteration_row(progress: Progress, step: Iteration, lr: float, sps: float) -> dict[str, float]:
    """The metrics row of an iteration (CleanRL's names)."""
    row: dict[str, float] = {"global_step": progress.global_step, "iteration": progress.iteration}
    episodes = step.rollout.episodes
    if episodes:
        row["charts/episodic_return"] = float(np.mean([r for r, _ in episodes]))
        row["charts/episodic_length"] = float(np.mean([n for _, n in episodes]))
    row["charts/learning_rate"] = lr
    row["charts/SPS"] = sps
    row.update(step.stats)
    mask = torch.ones_like(step.batch.values)
    row["losses/explained_variance"] = float(
        explained_variance(step.batch.values, step.batch.returns, mask)
    )
    row["time/rollout_s"], row["time/update_s"] = step.rollout_s, step.update_s
    return row


def summarize(
    cfg: ClassicConfig, progress: Progress, session_s: float, steps_at_start: int, final: Path
) -> dict[str, Any]:
    """summary.json: the run, its counters and the mean return of the last 100 episodes."""
    recent = progress.recent
    return {
        "env": cfg.env,
        "algo": cfg.algo,
        "objective": cfg.objective,
        "seed": cfg.seed,
        "global_step": progress.global_step,
        "iterations": progress.iteration,
        "episodes": progress.episodes,
        "complete": progress.iteration >= cfg.num_iterations,
        "mean_return_last_100": float(np.mean(recent)) if recent else math.nan,
        "std_return_last_100": float(np.std(recent)) if recent else math.nan,
        "wall_time_s": progress.elapsed_before + session_s,
        "sps_this_session": (progress.global_step - steps_at_start) / max(session_s, 1e-9),
        "checkpoint": str(final),
    }
