"""What each stage of an online run reads of its options, built once when the run opens: the
one function that reads the whole config (``run_settings``) hands every stage a small frozen
record of its own, and no stage reads the config.

A record's field is the config's field of the same name (``runtime.config.narrowed``), so a
name means one thing in the config and in every record; what a record derives (π_old's source,
the micro-batch plan's budget, the sampled distribution) is derived here, once, and given."""

from __future__ import annotations

from dataclasses import dataclass, replace

from proxrl.algos.online.algorithm import Algorithm
from proxrl.algos.online.config import OnlineConfig
from proxrl.algos.online.critic import Critic
from proxrl.algos.online.dapo import DrawSettings
from proxrl.algos.online.distill_fields import DistillFields
from proxrl.algos.online.episodes import EpisodeSettings
from proxrl.algos.online.heldout import HeldOutSettings
from proxrl.algos.online.micro_batches import PassLayout, token_budget
from proxrl.algos.online.old_policy import OldPolicyOptions, OldPolicySource
from proxrl.algos.online.rollout_settings import (
    PassSettings,
    RolloutSettings,
    SampleSettings,
    ScoreSettings,
    ScoreShaping,
)
from proxrl.algos.online.rollouts_file import RolloutsFile
from proxrl.algos.online.update import UpdateSettings
from proxrl.core import PolicyLossSettings
from proxrl.rollout.generation import SamplingSettings
from proxrl.rollout.multiturn import EpisodeLimits
from proxrl.runtime.config import narrowed


@dataclass(frozen=True)
class LoopSettings:
    """What the driver and the loop's own stages read (``loop``)."""

    iterations: int
    save_every: int  # a periodic checkpoint every N iterations (0: only at the end)
    sample_every: int  # samples.jsonl every N iterations (0: never)
    progress: bool  # a progress bar, and the first samples shown as a table
    task_reward: bool  # a reward model or function scores (else no score is shown)
    mask_truncated: bool  # responses cut at max_new_tokens leave the update's loss
    mixed_precision: str  # the rollout's autocast (models.options.autocast)
    drawing: DrawSettings  # which prompts an iteration samples, dynamic sampling's rounds
    recorded: RolloutsFile  # the rollouts file read each iteration (its ``rollouts_file``
    # None: the run samples its own)
    distill: DistillFields | None  # a teacher's options for the advantages (None: no teacher)


@dataclass(frozen=True)
class OptimizerSettings:
    """What the optimizers and the update's generator are made with (``run.open_run``)."""

    learning_rate: float  # the policy's AdamW (a critic's optimizers are its own)
    lr_schedule: str  # how each rate moves over the iterations (runtime.lr_schedule)
    iterations: int  # the schedule's length
    seed: int  # the minibatch order's generator, and each rank's sampler stream


@dataclass(frozen=True)
class ControllerSettings:
    """What the controllers between iterations read of the run's options (``loop.
    update_controllers``); β's controller itself is built from the first four once
    (``core.KL_CONTROLLERS``, in ``run.open_run``)."""

    kl_controller: str  # core.KL_CONTROLLERS' name
    kl_coef: float  # β at the start (fixed: throughout)
    kl_target: float  # the proportional controller's target KL
    kl_horizon: int  # … and its horizon
    samples_per_measure: int  # the responses behind each KL measurement (an iteration's)
    ref_reset_every: int  # copy the policy into the reference every N iterations (0: never)


@dataclass(frozen=True)
class RunSettings:
    """Every stage's record of one run, built together (``run_settings``)."""

    loop: LoopSettings
    optimizing: OptimizerSettings
    collecting: RolloutSettings  # what the rollout stages read, π_old's source
    updating: UpdateSettings  # what the update stage reads (the same source and pass layout)
    controlling: ControllerSettings
    layout: PassLayout  # what the passes' layout is decided from (the start-up note reads it)
    policy_loss: PolicyLossSettings  # the policy losses' knobs (a training client binds them)
    held_out: HeldOutSettings | None  # the held-out evaluation's (None: no eval_data)


def run_settings(cfg: OnlineConfig, algo: Algorithm, critic: Critic) -> RunSettings:
    """The run's records from its config ``cfg``, ``algo`` and the
    loaded ``critic`` (whether it reads the pass's hidden state decides π_old's source)."""
    layout = narrowed(PassLayout, cfg, prefix_off=cfg.prefix_off())
    distribution = narrowed(SamplingSettings, cfg)
    episodes = None
    if cfg.environment is not None:
        limits = EpisodeLimits(cfg.max_turns, cfg.max_episode_tokens)
        episodes = narrowed(EpisodeSettings, cfg, limits=limits)
    sampling = narrowed(SampleSettings, cfg, distribution=distribution, episodes=episodes)
    greedy = None
    if algo.needs_greedy:  # ReMax's baseline: the same sample stage, decoding greedily
        decode = SamplingSettings(cfg.max_new_tokens, greedy=True, stop_strings=cfg.stop_strings)
        greedy = replace(sampling, distribution=decode)
    shaping = narrowed(ScoreShaping, cfg)
    passes = narrowed(
        PassSettings, cfg, token_budget=token_budget(layout), distribution=distribution
    )
    source = OldPolicySource.decided(narrowed(OldPolicyOptions, cfg), algo, critic)
    collecting = RolloutSettings(
        sampling, narrowed(ScoreSettings, cfg, shaping=shaping, greedy=greedy), passes, source
    )
    distill = narrowed(DistillFields, cfg) if cfg.distills else None
    updating = narrowed(
        UpdateSettings,
        cfg,
        passes=passes,
        distill=distill,
        old_is_trainers_pass=source.reused_by_update,
        measures_mismatch=source.measures_mismatch,
    )
    loop = narrowed(
        LoopSettings,
        cfg,
        drawing=narrowed(DrawSettings, cfg),
        recorded=narrowed(RolloutsFile, cfg),
        distill=distill,
    )
    controlling = narrowed(ControllerSettings, cfg, samples_per_measure=cfg.responses_per_iteration)
    held_out = None
    if cfg.eval_data is not None:  # the training's distribution, greedy as eval_greedy says
        evaluated = replace(distribution, greedy=cfg.eval_greedy)
        held_out = narrowed(HeldOutSettings, cfg, distribution=evaluated, episodes=episodes)
    return RunSettings(
        loop,
        narrowed(OptimizerSettings, cfg),
        collecting,
        updating,
        controlling,
        layout,
        narrowed(PolicyLossSettings, cfg),
        held_out,
    )
