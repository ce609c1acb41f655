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
and exit 130/143; a resumed run continues exactly as the uninterrupted one. A NaN/Inf in the
advantages or returns skips the iteration's update, one in a loss or gradient skips that
minibatch step (TRPO: the policy step); skips are counted in ``guard/skipped_updates`` and
``max_consecutive_skips`` of them in a row stop the run with the last good checkpoint intact.
"""

from __future__ import annotations

import json
import logging
import math
import time
import warnings
from collections import deque
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from proxrl.classic.agent import Agent
from proxrl.classic.config import ClassicConfig
from proxrl.classic.envs import (
    ObsNormalizer,
    RewardScaler,
    make_vec_env,
    snapshot_supported,
)
from proxrl.classic.ppo import ppo_update
from proxrl.classic.rollout import Collector
from proxrl.classic.trpo import trpo_update
from proxrl.core import AdaptiveKL, FixedKL, explained_variance, gae_env
from proxrl.runtime.checkpoint import prepare_output_dir, record_planned_steps
from proxrl.runtime.checkpointer import Accessors, Checkpointer, GlobalRNG
from proxrl.runtime.config import config_to_dict, save_config_file
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.guard import NonFiniteGuard
from proxrl.runtime.metrics import MetricsLogger, progress_bar
from proxrl.runtime.resume import check_not_finished, check_resume
from proxrl.runtime.seeding import seed_everything
from proxrl.runtime.signals import GracefulStop

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


def train(cfg: ClassicConfig) -> dict[str, Any]:
    """Train, write metrics, checkpoints and summary.json; return the summary."""
    # 1. Fill the defaults of this kind of environment and check the result.
    discrete, obs_dim, action_dim = _action_kind(cfg.env)
    cfg = cfg.resolved(discrete)
    assert cfg.num_envs and cfg.num_steps and cfg.learning_rate and cfg.total_steps

    # 2. Output directory (with the resolved config), one torch thread, seeds.
    check_resume(cfg)  # compared with the resolved options the run wrote
    check_not_finished(cfg, cfg.num_iterations * cfg.batch_size, "step", "--total-steps")
    out = prepare_output_dir(cfg.output_dir, cfg.resume, cfg.overwrite)
    save_config_file(cfg, out / "config.yaml")
    record_planned_steps(out, cfg.num_iterations * cfg.batch_size)
    torch.set_num_threads(cfg.torch_threads)
    torch.distributions.Distribution.set_default_validate_args(False)
    seed_everything(cfg.seed)

    # 3. Environments, networks, optimiser, KL-penalty controller, non-finite guard.
    envs = make_vec_env(cfg.env, cfg.num_envs)
    agent = Agent(obs_dim, action_dim, discrete, cfg.hidden_size)
    trainable = agent.parameters() if cfg.algo == "ppo" else agent.critic.parameters()
    # fused: one kernel per step instead of ~10 per parameter tensor (the update's largest
    # overhead at these sizes); the same Adam, equal to the unfused one within float32 rounding.
    optimizer = torch.optim.Adam(trainable, lr=cfg.learning_rate, eps=1e-5, fused=True)
    kl_ctrl = (
        AdaptiveKL(cfg.penalty_beta, cfg.penalty_target)
        if cfg.objective == "adaptive-kl"
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
    metrics = MetricsLogger(out, report_to=cfg.report_to, config=config_to_dict(cfg))
    checkpointer = Checkpointer(out, keep=cfg.keep_checkpoints)
    guard = NonFiniteGuard(cfg.max_consecutive_skips, checkpoint_dir=checkpointer.root)
    recent: deque[float] = deque(maxlen=100)
    iteration, global_step, episodes_done, elapsed_before = 0, 0, 0, 0.0

    # 4. What a checkpoint holds (weights, optimiser, controller, guard, normalisers and the
    #    running episodes, RNGs; the counters at save) and the resume from the newest one. Envs
    #    that cannot be snapshot restart their episodes.
    exact = all(snapshot_supported(e) for e in envs.envs)
    collector_state = Accessors(
        collector.state_dict, lambda s: collector.load_state_dict(s, envs_too=exact)
    )
    checkpointer.track(
        agent=agent,
        optimizer=optimizer,
        kl_ctrl=kl_ctrl,
        guard=guard,
        collector=collector_state,
        rng=GlobalRNG(),
    )
    if cfg.resume:
        restored = checkpointer.restore()
        if not exact:
            warnings.warn(f"{cfg.env}: episodes in progress restart on resume", stacklevel=2)
        counters = restored.counters
        iteration, global_step = counters["iteration"], counters["global_step"]
        episodes_done, elapsed_before = counters["episodes"], counters["elapsed_s"]
        recent.extend(counters["recent_returns"])
        metrics.truncate_after(global_step)
        log.info("resumed %s at step %d", restored.path, global_step)

    def save() -> Path:
        return checkpointer.save(
            global_step,
            iteration=iteration,
            global_step=global_step,
            episodes=episodes_done,
            elapsed_s=elapsed_before + time.perf_counter() - start,
            recent_returns=list(recent),
        )

    # 5. The loop: collect → GAE → update → log → checkpoint (→ stop on SIGINT/SIGTERM).
    start = time.perf_counter()
    steps_at_start = global_step
    stop_at = min(cfg.stop_at_step or cfg.total_steps, cfg.num_iterations * cfg.batch_size)
    bar = progress_bar(cfg.num_iterations * cfg.batch_size, cfg.env, global_step, cfg.progress)
    with bar, metrics, GracefulStop() as stop:
        while iteration < cfg.num_iterations and global_step < stop_at:
            iteration += 1
            lr = (
                cfg.learning_rate * (1.0 - (iteration - 1) / cfg.num_iterations)
                if cfg.anneal_lr
                else cfg.learning_rate
            )
            for group in optimizer.param_groups:
                group["lr"] = lr

            # 5a. Collect N×T steps with the current policy.
            t0 = time.perf_counter()
            rollout = collector.collect(cfg.num_steps)
            global_step += cfg.batch_size
            rollout_s = time.perf_counter() - t0

            # 5b. Advantages and returns (core GAE; truncations bootstrapped in the rewards).
            advantages, returns = gae_env(
                rollout.rewards,
                rollout.values,
                rollout.dones,
                rollout.next_value,
                cfg.gamma,
                cfg.lam,
            )
            batch = rollout.flatten(advantages, returns)

            # 5c. Update the policy and the critic. A batch whose advantages or returns hold a
            #     NaN/Inf is skipped whole (counted by the guard); a finite one is only looked
            #     at, so that it does not reset the count of skipped steps in a row.
            t1 = time.perf_counter()
            stats: dict[str, float] = {}
            targets = {"advantages": advantages, "returns": returns}
            if guard.problem(tensors=targets) is None or guard.check(iteration, tensors=targets):
                if cfg.algo == "ppo":
                    stats = ppo_update(cfg, agent, optimizer, batch, kl_ctrl, guard, iteration)
                else:
                    stats = trpo_update(cfg, agent, optimizer, batch, guard, iteration)
            update_s = time.perf_counter() - t1

            # 5d. Log one row per iteration.
            episodes_done += len(rollout.episodes)
            recent.extend(r for r, _ in rollout.episodes)
            row: dict[str, float] = {"global_step": global_step, "iteration": iteration}
            if rollout.episodes:
                row["charts/episodic_return"] = float(np.mean([r for r, _ in rollout.episodes]))
                row["charts/episodic_length"] = float(np.mean([n for _, n in rollout.episodes]))
            row["charts/learning_rate"] = lr
            row["charts/SPS"] = (global_step - steps_at_start) / (time.perf_counter() - start)
            row.update(stats)
            mask = torch.ones_like(batch.values)
            row["losses/explained_variance"] = float(
                explained_variance(batch.values, batch.returns, mask)
            )
            row["time/rollout_s"], row["time/update_s"] = rollout_s, update_s
            row.update(guard.metrics())
            metrics.log(global_step, {k: v for k, v in row.items() if math.isfinite(v)})
            shown = {"SPS": row["charts/SPS"]}
            if recent:
                shown["return"] = float(np.mean(recent))
            bar.update(cfg.batch_size, **shown)

            # 5e. Checkpoint.
            saved = save() if cfg.save_every and iteration % cfg.save_every == 0 else None

            # 5f. SIGINT/SIGTERM: the iteration is complete; save it and stop (exit 130/143).
            if stop.requested and iteration < cfg.num_iterations and global_step < stop_at:
                raise stop.interrupted(saved or save())
    latest = checkpointer.manager.latest()
    final = latest if latest and checkpointer.manager.step_of(latest) == global_step else save()
    envs.close()

    # 6. Summary: mean return of the last 100 training episodes.
    wall = elapsed_before + time.perf_counter() - start
    summary: dict[str, Any] = {
        "env": cfg.env,
        "algo": cfg.algo,
        "objective": cfg.objective,
        "seed": cfg.seed,
        "global_step": global_step,
        "iterations": iteration,
        "episodes": episodes_done,
        "complete": iteration >= cfg.num_iterations,
        "mean_return_last_100": float(np.mean(recent)) if recent else math.nan,
        "std_return_last_100": float(np.std(recent)) if recent else math.nan,
        "wall_time_s": wall,
        "sps_this_session": (global_step - steps_at_start) / max(time.perf_counter() - start, 1e-9),
        "checkpoint": str(final),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
