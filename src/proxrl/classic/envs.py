"""Vectorised gymnasium environments, observation normalisation, reward scaling, episode
bookkeeping and environment snapshots for exact resume.

The normalisers are written here (NumPy, batched over the N environments) rather than taken from
gymnasium's wrappers so that their state is a few arrays we can checkpoint and restore. They do
what CleanRL's ``NormalizeObservation`` / ``NormalizeReward`` wrappers do:

- observations: running mean/variance over every observation the policy sees (including the
  first observation of each episode), ``clip((o − μ)/√(σ² + 1e-8), ±clip)``;
- rewards: divided by the running std of the discounted return ``R ← γR + r`` (reset to 0 when
  an episode ends), then clipped to ``±clip``. The mean is not subtracted.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from proxrl.runtime.errors import ProxrlError


def check_env_id(env_id: str) -> None:
    """Raise ``ProxrlError`` naming ``--env`` if gymnasium does not know ``env_id``."""
    if env_id in gym.envs.registry:
        return
    close = difflib.get_close_matches(env_id, list(gym.envs.registry), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise ProxrlError(f"--env: unknown gymnasium environment {env_id!r}{hint}")


def make_vec_env(env_id: str, num_envs: int) -> gym.vector.SyncVectorEnv:
    """N copies of ``env_id`` in one process, auto-reset in the same step.

    With ``AutoresetMode.SAME_STEP`` the observation returned for an environment whose episode
    just ended is already the first observation of its next episode; the last observation of the
    finished episode is in ``info["final_obs"]`` (needed to bootstrap a truncated episode).
    """
    check_env_id(env_id)

    def thunk() -> gym.Env[Any, Any]:
        return gym.make(env_id)

    fns: list[Callable[[], gym.Env[Any, Any]]] = [thunk] * num_envs
    try:
        return gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    except gym.error.DependencyNotInstalled as exc:  # Box2D, MuJoCo...: gymnasium names the extra
        raise ProxrlError(f"--env {env_id}: {str(exc).strip().splitlines()[0]}") from None


def batch_moments(batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(B, *shape) → the mean and population variance over B, each (*shape,): the arithmetic of
    ``np.mean``/``np.var`` (equal to the bit) without their per-call overhead, which the rollout
    pays twice a step."""
    mean = batch.sum(axis=0, keepdims=True) / batch.shape[0]
    centred = batch - mean
    return mean[0], (centred * centred).sum(axis=0) / batch.shape[0]


class RunningMeanStd:
    """Running mean and (population) variance of batches, merged with Chan's parallel formula.
    Starts as CleanRL's: mean 0, var 1, count 1e-4."""

    def __init__(self, shape: tuple[int, ...] = ()):
        self.mean = np.zeros(shape, dtype=np.float64)
        self.var = np.ones(shape, dtype=np.float64)
        self.count = 1e-4

    def update(self, batch: np.ndarray) -> None:
        """Fold in a batch of shape (B, *shape)."""
        b_mean, b_var = batch_moments(batch)
        b_count = batch.shape[0]
        delta = b_mean - self.mean
        total = self.count + b_count
        self.mean = self.mean + delta * b_count / total
        m2 = self.var * self.count + b_var * b_count + delta**2 * self.count * b_count / total
        self.var = m2 / total
        self.count = total

    def state_dict(self) -> dict[str, Any]:
        return {"mean": self.mean.tolist(), "var": self.var.tolist(), "count": float(self.count)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mean = np.asarray(state["mean"], dtype=np.float64)
        self.var = np.asarray(state["var"], dtype=np.float64)
        self.count = float(state["count"])


class ObsNormalizer:
    """``clip((o − μ)/√(σ² + eps), ±clip)`` with running μ, σ²; identity when disabled."""

    def __init__(self, shape: tuple[int, ...], enabled: bool, clip: float, eps: float = 1e-8):
        self.rms = RunningMeanStd(shape)
        self.enabled, self.clip, self.eps = enabled, clip, eps

    def __call__(self, obs: np.ndarray, update: bool) -> np.ndarray:
        """Normalise a (B, *shape) batch, first folding it into the statistics if ``update``."""
        if not self.enabled:
            return obs.astype(np.float32)
        if update:
            self.rms.update(obs)
        out = (obs - self.rms.mean) / np.sqrt(self.rms.var + self.eps)
        return np.clip(out, -self.clip, self.clip).astype(np.float32)


class RewardScaler:
    """``clip(r / √(Var[R] + eps), ±clip)`` where ``R ← γ·R + r`` per environment (reset at the
    end of an episode); identity when disabled."""

    def __init__(self, num_envs: int, gamma: float, enabled: bool, clip: float, eps: float = 1e-8):
        self.rms = RunningMeanStd(())
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.enabled, self.gamma, self.clip, self.eps = enabled, gamma, clip, eps

    def __call__(self, rewards: np.ndarray, dones: np.ndarray) -> np.ndarray:
        """Scale an (N,) reward vector; ``dones`` (N,) marks episodes that ended at this step."""
        if not self.enabled:
            return rewards.astype(np.float32)
        self.returns = self.returns * self.gamma + rewards
        self.rms.update(self.returns)
        scaled = np.clip(rewards / np.sqrt(self.rms.var + self.eps), -self.clip, self.clip)
        self.returns[dones] = 0.0
        return scaled.astype(np.float32)

    def state_dict(self) -> dict[str, Any]:
        return {"rms": self.rms.state_dict(), "returns": self.returns.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rms.load_state_dict(state["rms"])
        self.returns = np.asarray(state["returns"], dtype=np.float64)


class EpisodeTracker:
    """Undiscounted return and length of the running episode in each environment, from the raw
    (unscaled) rewards; ``step`` returns the (return, length) of every episode that ended."""

    def __init__(self, num_envs: int):
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)

    def step(self, rewards: np.ndarray, dones: np.ndarray) -> list[tuple[float, int]]:
        self.returns += rewards
        self.lengths += 1
        ended = [(float(self.returns[i]), int(self.lengths[i])) for i in np.flatnonzero(dones)]
        self.returns[dones] = 0.0
        self.lengths[dones] = 0
        return ended

    def state_dict(self) -> dict[str, Any]:
        return {"returns": self.returns.tolist(), "lengths": self.lengths.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.returns = np.asarray(state["returns"], dtype=np.float64)
        self.lengths = np.asarray(state["lengths"], dtype=np.int64)


# --------------------------------------------------------------------------------------------
# Snapshots of running environments, so that a resumed run continues the same episodes.
#
# What is saved per sub-environment: the wrappers' counters (TimeLimit's elapsed steps), the
# environment's NumPy generator, its plain array/number attributes (classic-control physics
# state such as CartPole's ``state``) and, for MuJoCo environments, the full integration state
# (qpos, qvel, act, warm-start, ...) from ``mj_getState``. Everything is encoded as a JSON string
# so the checkpoint stays loadable with ``weights_only=True``. Environments with other hidden
# state (e.g. Box2D bodies) are not covered: ``snapshot_supported`` reports that.

_WRAPPER_FIELDS = ("_elapsed_steps", "_has_reset")


def _encode(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": str(value.dtype), "shape": value.shape}
    if isinstance(value, np.generic):
        return value.item()
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and "__ndarray__" in value:
        arr = np.asarray(value["__ndarray__"], dtype=value["dtype"])
        return arr.reshape(value["shape"])
    return value


def _plain(value: Any) -> bool:
    return isinstance(value, (np.ndarray, np.generic, bool, int, float, type(None))) and not (
        isinstance(value, np.ndarray) and value.dtype == object
    )


def _mujoco_parts(env: Any) -> tuple[Any, Any, Any] | None:
    model, data = getattr(env, "model", None), getattr(env, "data", None)
    if model is None or type(model).__name__ != "MjModel":
        return None
    import mujoco

    return mujoco, model, data


def snapshot_supported(env: gym.Env[Any, Any]) -> bool:
    """Whether ``snapshot_env`` captures all of this environment's state (classic control and
    MuJoCo); for others a resumed run restarts the episodes in progress."""
    base = env.unwrapped
    if _mujoco_parts(base) is not None:
        return True
    return type(base).__module__.startswith("gymnasium.envs.classic_control")


def snapshot_env(env: gym.Env[Any, Any]) -> str:
    """The state of one (wrapped) environment, as a JSON string."""
    wrappers = []
    layer: Any = env
    while hasattr(layer, "env"):
        wrappers.append({k: getattr(layer, k) for k in _WRAPPER_FIELDS if hasattr(layer, k)})
        layer = layer.env
    base = env.unwrapped
    attrs = {
        k: _encode(v) for k, v in vars(base).items() if not k.startswith("_np_random") and _plain(v)
    }
    snap: dict[str, Any] = {
        "wrappers": wrappers,
        "attrs": attrs,
        "np_random": base.np_random.bit_generator.state,
    }
    parts = _mujoco_parts(base)
    if parts is not None:
        mujoco, model, data = parts
        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        state = np.empty(mujoco.mj_stateSize(model, spec), dtype=np.float64)
        mujoco.mj_getState(model, data, state, spec)
        snap["mujoco"] = state.tolist()
    return json.dumps(snap)


def restore_env(env: gym.Env[Any, Any], text: str) -> None:
    """Put back a state from ``snapshot_env`` into an environment of the same id."""
    snap = json.loads(text)
    layer: Any = env
    for fields in snap["wrappers"]:
        for k, v in fields.items():
            setattr(layer, k, v)
        layer = layer.env
    base = env.unwrapped
    for k, v in snap["attrs"].items():
        setattr(base, k, _decode(v))
    base.np_random.bit_generator.state = snap["np_random"]
    if "mujoco" in snap:
        parts = _mujoco_parts(base)
        assert parts is not None, "a MuJoCo snapshot can only be restored into a MuJoCo env"
        mujoco, model, data = parts
        state = np.asarray(snap["mujoco"], dtype=np.float64)
        mujoco.mj_setState(model, data, state, mujoco.mjtState.mjSTATE_INTEGRATION)
