"""Configuration of classic (gymnasium) PPO and TRPO.

Fields left at ``None`` take the default of the environment's kind when the run starts:
continuous actions (MuJoCo) get the PPO paper's MuJoCo settings (CleanRL
``ppo_continuous_action.py``), discrete actions get CleanRL's classic-control settings
(``ppo.py``). The resolved values are written to ``OUTPUT_DIR/config.yaml``.

| field | continuous (paper / CleanRL) | discrete (CleanRL) |
|---|---|---|
| total_steps | 1,000,000 | 500,000 |
| num_envs × num_steps | 1 × 2048 | 4 × 128 |
| minibatch_size, epochs | 64, 10 | 128, 4 |
| lr | 3e-4 | 2.5e-4 |
| ent_coef | 0.0 | 0.01 |
| normalize_obs / normalize_reward | on / on | off / off |
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from proxrl.runtime.config import RunConfig
from proxrl.runtime.errors import ProxrlError

Objective = Literal["clip", "adaptive-kl", "fixed-kl", "none"]
OBJECTIVES: tuple[str, ...] = ("clip", "adaptive-kl", "fixed-kl", "none")

_CONTINUOUS: dict[str, Any] = dict(
    total_steps=1_000_000, num_envs=1, num_steps=2048, minibatch_size=64, epochs=10, lr=3e-4,
    ent_coef=0.0, normalize_obs=True, normalize_reward=True,
)
_DISCRETE: dict[str, Any] = dict(
    total_steps=500_000, num_envs=4, num_steps=128, minibatch_size=128, epochs=4, lr=2.5e-4,
    ent_coef=0.01, normalize_obs=False, normalize_reward=False,
)


@dataclasses.dataclass
class ClassicConfig(RunConfig):
    """PPO (or TRPO) on a gymnasium environment."""

    output_dir: str = "runs/classic"
    """Directory for metrics, TensorBoard events, checkpoints and summary.json."""
    save_every: int = 50
    """Save a checkpoint every this many iterations (0: only at the end)."""
    env: str = "CartPole-v1"
    """Gymnasium environment id, e.g. CartPole-v1 or Hopper-v5."""
    algo: Literal["ppo", "trpo"] = "ppo"
    """ppo, or trpo (natural gradient + KL-constrained line search) as the baseline."""
    objective: Objective = "clip"
    """PPO surrogate (paper Table 1): clip, adaptive-kl, fixed-kl, or none (plain surrogate)."""
    clip: float = 0.2
    """ε of the clipped surrogate; also the value-clipping range when clip_vloss is on."""
    kl_target: float = 0.01
    """d_targ of adaptive-kl: β halves below d_targ/1.5 and doubles above 1.5·d_targ."""
    kl_beta: float = 1.0
    """β of the KL penalty: constant for fixed-kl, the starting value for adaptive-kl."""
    target_kl: float | None = None
    """Stop an iteration's epochs early once a minibatch's approx KL exceeds this (off: None)."""
    total_steps: int | None = None
    """Environment steps over all environments (None: 1M continuous, 500k discrete)."""
    stop_at_step: int | None = None
    """Checkpoint and stop once this many steps are done (continue later with --resume)."""
    num_envs: int | None = None
    """N vectorised environments (None: 1 continuous, 4 discrete)."""
    num_steps: int | None = None
    """T steps per environment per iteration (None: 2048 continuous, 128 discrete)."""
    minibatch_size: int | None = None
    """M samples per gradient step; must divide N×T (None: 64 continuous, 128 discrete)."""
    epochs: int | None = None
    """K passes over each batch (None: 10 continuous, 4 discrete)."""
    lr: float | None = None
    """Adam learning rate (None: 3e-4 continuous, 2.5e-4 discrete)."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over the run."""
    gamma: float = 0.99
    """Discount γ."""
    gae_lambda: float = 0.95
    """GAE λ."""
    norm_adv: bool = True
    """Whiten advantages within each minibatch (within the batch for TRPO)."""
    clip_vloss: bool = True
    """Clip the value update to ±clip around the rollout's values (pessimistic max)."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float | None = None
    """Weight of the entropy bonus (None: 0 continuous, 0.01 discrete)."""
    max_grad_norm: float = 0.5
    """Clip the global gradient norm to this."""
    normalize_obs: bool | None = None
    """Running observation normalisation (None: on for continuous, off for discrete)."""
    normalize_reward: bool | None = None
    """Scale rewards by the std of the discounted return (None: on continuous, off discrete)."""
    obs_clip: float = 10.0
    """Clip normalised observations to ±this."""
    reward_clip: float = 10.0
    """Clip scaled rewards to ±this."""
    hidden_size: int = 64
    """Width of the two hidden layers of the actor and of the critic."""
    trpo_max_kl: float = 0.01
    """TRPO: the KL trust-region radius δ."""
    trpo_damping: float = 0.1
    """TRPO: damping added to the Fisher-vector product."""
    trpo_cg_iters: int = 10
    """TRPO: conjugate-gradient iterations."""
    trpo_backtrack_iters: int = 10
    """TRPO: line-search steps before the update is rejected."""
    trpo_backtrack_coef: float = 0.8
    """TRPO: step shrink factor of the line search."""
    max_consecutive_skips: int = 5
    """Stop after this many updates in a row skipped for a NaN/Inf (loss, gradient, advantages)."""
    torch_threads: int = 1
    """torch intra-op threads (one is fastest for these small networks)."""
    progress: bool = True
    """Show a progress bar on a terminal."""

    def validate(self) -> None:
        super().validate()
        from proxrl.classic.envs import check_env_id

        check_env_id(self.env)
        positive = ["total_steps", "num_envs", "num_steps", "minibatch_size", "epochs",
                    "hidden_size", "torch_threads", "trpo_cg_iters", "trpo_backtrack_iters",
                    "stop_at_step", "max_consecutive_skips"]
        for name in positive:
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ProxrlError(f"--{name.replace('_', '-')} must be > 0, got {value}")
        for name in ["lr", "clip", "kl_target", "trpo_max_kl", "obs_clip", "reward_clip"]:
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ProxrlError(f"--{name.replace('_', '-')} must be > 0, got {value}")
        for name in ["kl_beta", "vf_coef", "ent_coef", "max_grad_norm", "trpo_damping"]:
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ProxrlError(f"--{name.replace('_', '-')} must be >= 0, got {value}")
        if self.target_kl is not None and self.target_kl <= 0:
            raise ProxrlError(f"--target-kl must be > 0, got {self.target_kl}")
        for name in ["gamma", "gae_lambda"]:
            if not 0 <= getattr(self, name) <= 1:
                raise ProxrlError(f"--{name.replace('_', '-')} must lie in [0, 1]")
        if not 0 < self.trpo_backtrack_coef < 1:
            raise ProxrlError("--trpo-backtrack-coef must lie in (0, 1)")

    def resolved(self, discrete: bool) -> ClassicConfig:
        """A copy with every ``None`` default filled in for the action-space kind, checked."""
        table = _DISCRETE if discrete else _CONTINUOUS
        filled = {k: v for k, v in table.items() if getattr(self, k) is None}
        cfg = dataclasses.replace(self, **filled)
        cfg.validate()
        batch = cfg.batch_size
        if batch % cfg.minibatch_size:  # type: ignore[operator]
            raise ProxrlError(
                f"--minibatch-size {cfg.minibatch_size} does not divide num_envs × num_steps = "
                f"{cfg.num_envs} × {cfg.num_steps} = {batch}"
            )
        if cfg.total_steps < batch:  # type: ignore[operator]
            raise ProxrlError(
                f"--total-steps {cfg.total_steps} is less than one iteration "
                f"(num_envs × num_steps = {batch})"
            )
        return cfg

    @property
    def batch_size(self) -> int:
        """N×T samples per iteration."""
        assert self.num_envs is not None and self.num_steps is not None, "call resolved() first"
        return self.num_envs * self.num_steps

    @property
    def num_iterations(self) -> int:
        """Iterations in the run: total_steps // (N×T)."""
        assert self.total_steps is not None, "call resolved() first"
        return self.total_steps // self.batch_size
