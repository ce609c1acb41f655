"""Configuration of classic (gymnasium) PPO and TRPO.

Fields left at ``None`` take the default of the environment's kind when the run starts:
continuous actions (MuJoCo) get the PPO paper's MuJoCo settings (CleanRL
``ppo_continuous_action.py``), discrete actions get CleanRL's classic-control settings
(``ppo.py``). The resolved values are written to ``OUTPUT_DIR/config.yaml``.

| field | continuous (paper / CleanRL) | discrete (CleanRL) |
|---|---|---|
| total_steps | 1,000,000 | 500,000 |
| num_envs × num_steps | 1 × 2048 | 4 × 128 |
| mini_batch_size, ppo_epochs | 64, 10 | 128, 4 |
| learning_rate | 3e-4 | 2.5e-4 |
| entropy_coef | 0.0 | 0.01 |
| normalize_obs / normalize_reward | on / on | off / off |

Field names are the language-model trainers' (the glossary in docs/architecture.md); CleanRL's
spellings are accepted as aliases in flags and YAML: ``lr``, ``gae_lambda``, ``ent_coef``,
``minibatch_size``, ``norm_adv``, ``target_kl`` (``runtime.foreign_names``, every command's),
``epochs``, ``kl_target`` (→ ``penalty_target``), ``kl_beta`` (→ ``penalty_beta``) and the
switch ``clip_vloss``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any

import tyro

from proxrl.registry import Registry
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.fields import SESSION_OPTION, Range, alias
from proxrl.runtime.run_config import RunConfig

OBJECTIVE_TABLE: Registry[None] = Registry("objective")
"""``objective`` → the PPO paper's surrogates (Table 1), built in ``classic.ppo`` from their
traits: ``clipped`` (the clipped surrogate), ``penalty`` (β·KL in the loss), ``adaptive`` (β
moves with the measured KL)."""
OBJECTIVE_TABLE.add("clip", None, "the clipped surrogate", clipped=True)
OBJECTIVE_TABLE.add(
    "adaptive-kl", None, "the KL penalty with an adaptive β", penalty=True, adaptive=True
)
OBJECTIVE_TABLE.add("fixed-kl", None, "the KL penalty with a fixed β", penalty=True)
OBJECTIVE_TABLE.add("none", None, "the plain surrogate")
OBJECTIVES: tuple[str, ...] = OBJECTIVE_TABLE.names()
Objective = OBJECTIVE_TABLE.choice()
ALGOS: Registry[None] = Registry("classic algorithm")
"""``algo`` → the policy update (``classic.train``); trait ``trains_policy_by_gradient``: the
optimizer steps the policy too (TRPO's line search moves it, the optimizer the critic only)."""
ALGOS.add("ppo", None, "PPO with the objective chosen", trains_policy_by_gradient=True)
ALGOS.add("trpo", None, "natural gradient + KL-constrained line search")
AlgoChoice = ALGOS.choice()

_CONTINUOUS: Mapping[str, Any] = MappingProxyType(
    dict(
        total_steps=1_000_000,
        num_envs=1,
        num_steps=2048,
        mini_batch_size=64,
        ppo_epochs=10,
        learning_rate=3e-4,
        entropy_coef=0.0,
        normalize_obs=True,
        normalize_reward=True,
    )
)
_DISCRETE: Mapping[str, Any] = MappingProxyType(
    dict(
        total_steps=500_000,
        num_envs=4,
        num_steps=128,
        mini_batch_size=128,
        ppo_epochs=4,
        learning_rate=2.5e-4,
        entropy_coef=0.01,
        normalize_obs=False,
        normalize_reward=False,
    )
)


@dataclasses.dataclass
class ClassicConfig(RunConfig):
    """PPO (or TRPO) on a gymnasium environment."""

    output_dir: str = "runs/classic"
    """Directory for metrics, TensorBoard events, checkpoints and summary.json."""
    save_every: Annotated[int, Range(ge=0)] = 50
    """Save a checkpoint every this many iterations (0: only at the end)."""
    env: str = "CartPole-v1"
    """Gymnasium environment id, e.g. CartPole-v1 or Hopper-v5."""
    algo: AlgoChoice = "ppo"
    """ppo, or trpo (natural gradient + KL-constrained line search) as the baseline."""
    objective: Objective = "clip"
    """PPO surrogate (paper Table 1): clip, adaptive-kl, fixed-kl, or none (plain surrogate)."""
    clip: Annotated[float, Range(gt=0)] = 0.2
    """ε of the clipped surrogate."""
    penalty_target: Annotated[float, Range(gt=0), alias("kl_target")] = 0.01
    """d_targ of adaptive-kl: β halves below d_targ/1.5 and doubles above 1.5·d_targ."""
    penalty_beta: Annotated[float, Range(ge=0), alias("kl_beta")] = 1.0
    """β of the KL penalty: constant for fixed-kl, the starting value for adaptive-kl."""
    early_stop_kl: Annotated[float | None, Range(gt=0)] = None
    """Stop an iteration's epochs early once a minibatch's approx KL exceeds this (None: off)."""
    total_steps: Annotated[int | None, Range(gt=0)] = None
    """Environment steps over all environments (None: 1M continuous, 500k discrete)."""
    # where this session stops, not what a step does
    stop_at_step: Annotated[int | None, Range(gt=0), SESSION_OPTION] = None
    """Checkpoint and stop once this many steps are done (continue later with --resume)."""
    num_envs: Annotated[int | None, Range(gt=0)] = None
    """N vectorised environments (None: 1 continuous, 4 discrete)."""
    num_steps: Annotated[int | None, Range(gt=0)] = None
    """T steps per environment per iteration (None: 2048 continuous, 128 discrete)."""
    mini_batch_size: Annotated[int | None, Range(gt=0)] = None
    """M samples per gradient step; must divide N×T (None: 64 continuous, 128 discrete)."""
    ppo_epochs: Annotated[int | None, Range(gt=0), alias("epochs")] = None
    """K passes over each batch (None: 10 continuous, 4 discrete)."""
    learning_rate: Annotated[float | None, Range(gt=0)] = None
    """Adam learning rate (None: 3e-4 continuous, 2.5e-4 discrete)."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over the run."""
    gamma: Annotated[float, Range(ge=0, le=1)] = 0.99
    """Discount γ."""
    lam: Annotated[float, Range(ge=0, le=1)] = 0.95
    """GAE λ."""
    whiten_advantages: bool = True
    """Whiten advantages within each minibatch (within the batch for TRPO)."""
    value_clip: Annotated[float | None, Range(gt=0)] = None
    """PPO: clip the value update to ±value_clip around the rollout's values, pessimistic max
    (None: off, as the PPO paper and SB3; CleanRL clips at 0.2, which scored lower on MuJoCo
    here)."""
    clip_vloss: Annotated[bool | None, tyro.conf.DisallowNone] = None
    """CleanRL's switch for value clipping, kept for its users: true sets value_clip to clip,
    false to None (None: value_clip decides)."""
    vf_coef: Annotated[float, Range(ge=0)] = 0.5
    """Weight of the value loss."""
    entropy_coef: Annotated[float | None, Range(ge=0)] = None
    """Weight of the entropy bonus (None: 0 continuous, 0.01 discrete)."""
    max_grad_norm: Annotated[float, Range(ge=0)] = 0.5
    """Clip the global gradient norm to this."""
    normalize_obs: bool | None = None
    """Running observation normalisation (None: on for continuous, off for discrete)."""
    normalize_reward: bool | None = None
    """Scale rewards by the std of the discounted return (None: on continuous, off discrete)."""
    obs_clip: Annotated[float, Range(gt=0)] = 10.0
    """Clip normalised observations to ±this."""
    reward_clip: Annotated[float, Range(gt=0)] = 10.0
    """Clip scaled rewards to ±this."""
    hidden_size: Annotated[int, Range(gt=0)] = 64
    """Width of the two hidden layers of the actor and of the critic."""
    trpo_max_kl: Annotated[float, Range(gt=0)] = 0.01
    """TRPO: the KL trust-region radius δ."""
    trpo_damping: Annotated[float, Range(ge=0)] = 0.1
    """TRPO: damping added to the Fisher-vector product."""
    trpo_cg_iters: Annotated[int, Range(gt=0)] = 10
    """TRPO: conjugate-gradient iterations."""
    trpo_backtrack_iters: Annotated[int, Range(gt=0)] = 10
    """TRPO: line-search steps before the update is rejected."""
    trpo_backtrack_coef: Annotated[float, Range(gt=0, lt=1)] = 0.8
    """TRPO: step shrink factor of the line search."""
    trpo_value_clip: Annotated[float | None, Range(gt=0)] = 0.2
    """TRPO: clip the critic's update as value_clip does for PPO (None: off, as sb3-contrib;
    off scored lower on Hopper here)."""
    torch_threads: Annotated[int, Range(gt=0)] = 1
    """torch intra-op threads (one is fastest for these small networks)."""

    def validate(self) -> None:
        super().validate()
        if OBJECTIVE_TABLE.trait(self.objective, "adaptive") and self.penalty_beta == 0:
            raise ProxrlError(
                "--penalty-beta must be > 0 with --objective adaptive-kl (it doubles or halves β)"
            )
        from proxrl.classic.envs import check_env_id

        check_env_id(self.env)

    def resolved(self, discrete: bool) -> ClassicConfig:
        """A copy with every ``None`` default filled in for the action-space kind, checked."""
        table = _DISCRETE if discrete else _CONTINUOUS
        filled = {k: v for k, v in table.items() if getattr(self, k) is None}
        if self.clip_vloss is not None:
            filled |= {"value_clip": self.clip if self.clip_vloss else None, "clip_vloss": None}
        cfg = dataclasses.replace(self, **filled)
        cfg.validate()
        batch = cfg.batch_size
        if batch % cfg.mini_batch_size:  # type: ignore[operator]
            raise ProxrlError(  # both spellings: CleanRL users know the second
                f"--mini-batch-size / --minibatch-size {cfg.mini_batch_size} does not divide "
                f"num_envs × num_steps = {cfg.num_envs} × {cfg.num_steps} = {batch}"
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
