"""Collecting N environments × T steps with the current policy, and the batch record it fills.

Terminated vs truncated (gymnasium 1.x): both end the episode, so ``dones[t] = 1`` and GAE does
not look past step t. A truncated episode (time limit) did not really end, though: its value is
bootstrapped by adding ``γ·V(final observation)`` to that step's reward, computed with the
critic of the rollout on the normalised final observation (from ``info["final_obs"]``, which the
same-step auto-reset provides). The reward added is in the critic's (scaled) units.

Per step only the policy's draw is computed, in NumPy (``RolloutPolicy``); log π_old, V_old and
the bootstrap values come from batched torch forwards once the T steps are done (the networks do
not change within a rollout).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from proxrl.classic.agent import Agent, RolloutPolicy
from proxrl.classic.envs import EpisodeTracker, ObsNormalizer, RewardScaler


@dataclasses.dataclass
class Rollout:
    """One iteration's experience from N environments over T steps."""

    obs: Tensor  # (T, N, obs_dim) normalised observation s_t the policy acted on
    actions: Tensor  # (T, N) discrete index, or (T, N, act_dim) unclipped Gaussian sample
    logprobs: Tensor  # (T, N) log π_old(a_t|s_t)
    values: Tensor  # (T, N) V_old(s_t) from the rollout's critic
    rewards: Tensor  # (T, N) scaled reward, plus γ·V(final obs) where the episode was truncated
    dones: Tensor  # (T, N) 1 where the episode ended (terminated or truncated) at step t
    next_value: Tensor  # (N,) V_old(s_T), the state after the last step
    episodes: list[tuple[float, int]]  # (raw return, length) of every episode that ended

    def flatten(self, advantages: Tensor, returns: Tensor) -> Batch:
        """The (T·N,) sample batch the update shuffles, with GAE's (T, N) outputs."""
        n = self.logprobs.numel()
        return Batch(
            obs=self.obs.reshape(n, -1),
            actions=self.actions.reshape(n, *self.actions.shape[2:]),
            logprobs=self.logprobs.reshape(n),
            values=self.values.reshape(n),
            advantages=advantages.reshape(n),
            returns=returns.reshape(n),
        )


@dataclasses.dataclass
class Batch:
    """Flattened samples, B = T·N."""

    obs: Tensor  # (B, obs_dim)
    actions: Tensor  # (B,) or (B, act_dim)
    logprobs: Tensor  # (B,) log π_old(a|s)
    values: Tensor  # (B,) V_old(s)
    advantages: Tensor  # (B,) GAE advantages (not yet whitened)
    returns: Tensor  # (B,) advantages + values, the critic's target

    def minibatches(self, size: int) -> Iterator[Batch]:
        """One epoch: the samples in a fresh random order (``torch.randperm``), cut into
        consecutive minibatches of ``size`` (the last may be smaller). Each field is gathered
        once per epoch, so that a minibatch is a set of views rather than six gathers."""
        order = torch.randperm(self.logprobs.shape[0])
        shuffled = self._map(lambda field: field[order])
        for start in range(0, len(order), size):
            yield shuffled._map(lambda field: field[start : start + size])  # noqa: B023 - used at once

    def _map(self, fn: Callable[[Tensor], Tensor]) -> Batch:
        return Batch(**{f.name: fn(getattr(self, f.name)) for f in dataclasses.fields(self)})


class Collector:
    """Steps the vector environment with the policy, keeping the current observation, the
    normalisers and the running episodes between iterations."""

    def __init__(
        self,
        envs: gym.vector.SyncVectorEnv,
        agent: Agent,
        obs_norm: ObsNormalizer,
        reward_scaler: RewardScaler,
        gamma: float,
        seed: int,
    ):
        self.envs, self.agent, self.gamma = envs, agent, gamma
        self.obs_norm, self.reward_scaler = obs_norm, reward_scaler
        self.tracker = EpisodeTracker(envs.num_envs)
        space = envs.single_action_space
        self.discrete = isinstance(space, gym.spaces.Discrete)
        self.low = None if self.discrete else space.low  # type: ignore[attr-defined]
        self.high = None if self.discrete else space.high  # type: ignore[attr-defined]
        raw, _ = envs.reset(seed=seed)
        self.obs = self.obs_norm(raw, update=True)  # (N, obs_dim) normalised
        self.env_seconds = 0.0

    def collect(self, num_steps: int) -> Rollout:
        n = self.envs.num_envs
        obs_buf = np.zeros((num_steps, *self.obs.shape), dtype=np.float32)
        rewards = np.zeros((num_steps, n), dtype=np.float32)
        dones = np.zeros((num_steps, n), dtype=np.float32)
        actions: list[np.ndarray] = []
        episodes: list[tuple[float, int]] = []
        # Truncated episodes: (step, env) and the final observation, normalised as at that step.
        truncations: list[tuple[int, int]] = []
        final_obs: list[np.ndarray] = []
        policy = RolloutPolicy(self.agent, seed=int(torch.randint(2**62, ())))
        for t in range(num_steps):
            obs_buf[t] = self.obs
            action = policy(self.obs)
            actions.append(action)
            env_action = action if self.discrete else np.clip(action, self.low, self.high)
            start = time.perf_counter()
            raw_obs, reward, terminated, truncated, info = self.envs.step(env_action)
            self.env_seconds += time.perf_counter() - start
            done = terminated | truncated
            episodes += self.tracker.step(reward, done)
            self.obs = self.obs_norm(raw_obs, update=True)
            rewards[t] = self.reward_scaler(reward, done)
            dones[t] = done
            for i in np.flatnonzero(truncated & ~terminated):
                truncations.append((t, int(i)))
                final_obs.append(self.obs_norm(info["final_obs"][i][None], update=False))

        # The networks did not change during the rollout, so log π_old and V_old of every step
        # come from one batched forward each rather than 2·T single-row ones.
        obs = torch.from_numpy(obs_buf)
        flat_obs = obs.reshape(num_steps * n, -1)
        taken = torch.from_numpy(np.stack(actions))
        with torch.no_grad():
            dist = self.agent.dist(flat_obs)
            logprobs = self.agent.log_prob(dist, taken.reshape(num_steps * n, *taken.shape[2:]))
            values = self.agent.value(flat_obs)
            next_value = self.agent.value(torch.from_numpy(self.obs))
            if truncations:
                final_values = self.agent.value(torch.from_numpy(np.concatenate(final_obs)))
                steps, envs = zip(*truncations, strict=True)
                rewards[list(steps), list(envs)] += self.gamma * final_values.numpy()
        return Rollout(
            obs=obs,
            actions=taken,
            logprobs=logprobs.reshape(num_steps, n),
            values=values.reshape(num_steps, n),
            rewards=torch.from_numpy(rewards),
            dones=torch.from_numpy(dones),
            next_value=next_value,
            episodes=episodes,
        )

    def state_dict(self) -> dict[str, Any]:
        from proxrl.classic.envs import snapshot_env

        return {
            "obs": torch.from_numpy(self.obs.copy()),
            "obs_rms": self.obs_norm.rms.state_dict(),
            "reward_scaler": self.reward_scaler.state_dict(),
            "tracker": self.tracker.state_dict(),
            "envs": [snapshot_env(e) for e in self.envs.envs],
        }

    def load_state_dict(self, state: dict[str, Any], envs_too: bool = True) -> None:
        """Restore the normalisers and, with ``envs_too``, the running episodes exactly (else
        the episodes restart from the reset done in ``__init__``)."""
        from proxrl.classic.envs import restore_env

        self.obs_norm.rms.load_state_dict(state["obs_rms"])
        self.reward_scaler.load_state_dict(state["reward_scaler"])
        if not envs_too:
            return
        self.obs = state["obs"].numpy().copy()
        self.tracker.load_state_dict(state["tracker"])
        for env, snap in zip(self.envs.envs, state["envs"], strict=True):
            restore_env(env, snap)
