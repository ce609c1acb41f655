"""``proxrl classic-eval``: run a saved classic policy deterministically for N episodes.

Reads ``RUN_DIR/config.yaml`` (environment, network size, normalisation) and the run's newest
verified checkpoint (or ``--checkpoint``), acts with the mode of the policy (argmax for discrete
actions, the Gaussian mean clipped to the action bounds for continuous ones) on observations
normalised with the frozen training statistics, and reports the mean undiscounted return.
Writes ``RUN_DIR/eval.json``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any

import gymnasium as gym
import numpy as np
import torch

from proxrl.classic.agent import Agent
from proxrl.classic.config import ClassicConfig
from proxrl.classic.envs import ObsNormalizer, check_env_id
from proxrl.runtime.checkpoint import CheckpointManager
from proxrl.runtime.config import load_config_file, parse_config
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.fields import Range, check_ranges


@dataclasses.dataclass
class EvalConfig:
    """proxrl classic-eval: run a policy trained by proxrl classic, deterministically."""

    run_dir: str = "runs/classic"
    """The output_dir of the training run."""
    checkpoint: str | None = None
    """A checkpoint directory to load instead of the run's newest one."""
    episodes: Annotated[int, Range(gt=0)] = 10
    """Number of episodes to run."""
    seed: Annotated[int, Range(ge=0, le=2**32 - 1)] = 0
    """Seed of the first episode's reset (episode i uses seed + i)."""

    def validate(self) -> None:
        check_ranges(self)


def evaluate(cfg: EvalConfig) -> dict[str, Any]:
    """Run the episodes; return (and write to RUN_DIR/eval.json) their returns and statistics."""
    run = Path(cfg.run_dir)
    if not (run / "config.yaml").is_file():
        raise ProxrlError(f"--run-dir {run} holds no config.yaml of a classic run")
    train_cfg = load_config_file(ClassicConfig, run / "config.yaml", validate=False)
    check_env_id(train_cfg.env)
    manager = CheckpointManager(run)
    path = Path(cfg.checkpoint) if cfg.checkpoint else manager.latest()
    if path is None:
        raise ProxrlError(f"--run-dir {run} holds no complete checkpoint")
    tensors, state = manager.load(path)

    torch.set_num_threads(1)
    env = gym.make(train_cfg.env)
    discrete = isinstance(env.action_space, gym.spaces.Discrete)
    obs_dim = env.observation_space.shape[0]  # type: ignore[index]
    action_dim = int(env.action_space.n) if discrete else env.action_space.shape[0]  # type: ignore[attr-defined,index]
    agent = Agent(obs_dim, action_dim, discrete, train_cfg.hidden_size)
    agent.load_state_dict(tensors["agent"])
    agent.eval()
    norm = ObsNormalizer((obs_dim,), bool(train_cfg.normalize_obs), train_cfg.obs_clip)
    norm.rms.load_state_dict(state["collector"]["obs_rms"])

    returns, lengths = [], []
    for i in range(cfg.episodes):
        obs, _ = env.reset(seed=cfg.seed + i)
        total, steps, done = 0.0, 0, False
        while not done:
            with torch.no_grad():
                x = torch.from_numpy(norm(obs[None], update=False))
                action = agent.act(agent.dist(x), deterministic=True)[0].numpy()
            if not discrete:
                action = np.clip(action, env.action_space.low, env.action_space.high)  # type: ignore[attr-defined]
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            steps += 1
            done = terminated or truncated
        returns.append(total)
        lengths.append(steps)
    env.close()
    result = {
        "env": train_cfg.env,
        "checkpoint": str(path),
        "episodes": cfg.episodes,
        "mean_return": float(np.mean(returns)),
        "std_return": float(np.std(returns)),
        "mean_length": float(np.mean(lengths)),
        "returns": returns,
    }
    (run / "eval.json").write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(EvalConfig, argv, prog="proxrl classic-eval")
    r = evaluate(cfg)
    print(
        f"{r['env']}: mean return {r['mean_return']:.1f} ± {r['std_return']:.1f} over "
        f"{r['episodes']} episodes (mean length {r['mean_length']:.0f}); {r['checkpoint']}"
    )
    return 0
