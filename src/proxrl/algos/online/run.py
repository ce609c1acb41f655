"""What one online run holds across its iterations (``OnlineRun``), and how it is opened: the
user's input checked before the output directory is touched, the roles loaded and placed, the
optimizers, controllers and checkpoint registered, a resumed run restored, the engine started.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import nn

from proxrl.algos.online.algorithm import Algorithm
from proxrl.algos.online.config import OnlineConfig
from proxrl.algos.online.heldout import HeldOut
from proxrl.algos.online.micro_batches import prefix_note
from proxrl.algos.online.placement.base import Placement
from proxrl.algos.online.roles import (
    Models,
    load_prompts,
    place_roles,
    role_settings,
    share_reward_model,
)
from proxrl.algos.online.rollouts_file import iteration_rows
from proxrl.algos.online.run_settings import RunSettings, run_settings
from proxrl.core import KL_CONTROLLERS, FixedKL
from proxrl.data.formats import PromptExample, load_prompt_examples
from proxrl.models.context import context_of
from proxrl.rollout.engines import RolloutEngine
from proxrl.rollout.ensemble import calibrated_ensemble
from proxrl.rollout.generation import CachedSampler, static_cache
from proxrl.rollout.rewards import RewardRole, check_reward_columns
from proxrl.runtime import distributed as dist
from proxrl.runtime.checkpointer import Restored, TrainableWeights
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.guard import NonFiniteGuard
from proxrl.runtime.health import HealthMonitor
from proxrl.runtime.lr_schedule import warmup_then_decay
from proxrl.runtime.metrics import read_metrics
from proxrl.runtime.run import Run
from proxrl.runtime.seeding import seed_everything

log = logging.getLogger(__name__)


def run_context(cfg: OnlineConfig) -> Run:
    """The run context of an online run: each rank's sampler stream checkpointed, and reseeded
    from the iteration when a resumed run has another world size."""
    return Run(
        cfg,
        rank_rng=True,
        reseed=lambda iteration: seed_everything(dist.sampler_seed(cfg.seed) + 7919 * iteration),
    )


def check_run(cfg: OnlineConfig) -> None:
    """Everything about the output directory the user asked for, before it is touched."""
    run_context(cfg).check(cfg.iterations, "iteration", "--iterations")


@dataclass
class OnlineRun:
    """The state of one online run; every stage of an iteration reads it."""

    settings: RunSettings  # each stage's record of the run's options, built when it opens
    algo: Algorithm
    models: Models  # as loaded: the rollout and the controllers read these
    train_models: Models  # the trained roles as the update runs them (FSDP-wrapped)
    rewards: RewardRole
    prompts: list[PromptExample]
    prompt_ids: list[list[int]]  # each prompt encoded (chat template, tools)
    held_out: HeldOut | None
    output_dir: Path
    context: Run  # output directory, checkpoint, guard, metrics, progress, signals, LR schedule
    optimizers: list[torch.optim.Optimizer]  # the policy's, then the critic's
    kl: FixedKL  # β of the KL to the reference (fixed or proportional)
    generator: torch.Generator  # the minibatch order
    engine: RolloutEngine = field(init=False)
    start: int = 0  # the first iteration this process runs (a resumed run's restored count)
    extra_rounds: int = 0  # dynamic sampling's rounds past the first so far: the data position
    last: dict[str, float] = field(default_factory=dict)  # the latest metrics row
    policy_iterations: int = 0  # iterations of this process that trained the policy
    empty_iterations: int = 0  # … of which no update step moved it (a zero gradient)
    warned_empty: bool = False  # loop.warn_if_mostly_empty has warned
    warned_masked: bool = False  # … that mask_truncated left a step nothing to train on

    @property
    def guard(self) -> NonFiniteGuard:
        return self.context.guard

    def save(self, done: int) -> Path:
        return self.context.save(done, iteration=done, extra_rounds=self.extra_rounds)


def open_run(cfg: OnlineConfig, algo: Algorithm, placement: Placement) -> OnlineRun:
    """1. seeds, roles, each stage's settings, prompts (a bad input fails before the output
    directory is touched); 2. the output directory; 3. optimizers and what a checkpoint holds;
    4. a resumed run restored; 5. the engine started with the policy's weights."""
    seed_everything(cfg.seed)
    # first, before any model loads: a reward function that does not import, or that needs a
    # column the prompt data lacks, is one line
    if cfg.rollouts_file is None:  # (a rollouts file brings no columns and no reward function)
        check_reward_columns(cfg.reward_fn, load_prompt_examples(cfg.prompts))
    roles = role_settings(cfg)  # what loading and placing the roles reads, built once
    rewards = placement.rewards(roles)
    models = placement.models(roles, algo)
    # the LoRA critic's base, when it is the same
    share_reward_model(models, rewards, cfg.offload_frozen_roles, cfg.async_rollout)
    if cfg.compile_sampler:  # a model without a static cache fails here, not mid-run
        static_cache(models.actor, CachedSampler.CACHE_BUCKET)
    # π_old's source and the passes' layout decided once, read by the rollout and the update
    settings = run_settings(cfg, algo, models.critic)
    # the run's prompts, encoded and checked against the policy's context; none with a
    # rollouts file (its rows bring their own: checked now, before the output directory)
    prompts: list[PromptExample] = []
    prompt_ids: list[list[int]] = []
    if settings.loop.recorded.rollouts_file is not None:
        iteration_rows(settings.loop.recorded, models.tokenizer)
    else:
        prompts, prompt_ids = load_prompts(roles.prompts, models.tokenizer)
        check_context(settings.collecting.scoring.max_new_tokens, models.actor, prompt_ids)
    held_out = HeldOut.create(settings.held_out, models.tokenizer, rewards, Path(cfg.output_dir))
    if dist.world_size() > 1:  # prompts (whole groups) are sharded: rollout_batch_size is global
        dist.split_global(cfg.rollout_batch_size, "rollout_batch_size")
    context = run_context(cfg)
    context.prepare()
    context.write_config(cfg.iterations)
    # shared_prefix unset (on where it applies): said once where it cannot apply
    note = prefix_note(settings.layout)
    if note is not None and dist.is_main():
        log.info("%s", note)
    place_roles(models, rewards, offload_frozen=cfg.offload_frozen_roles)
    run = _with_optimizers(settings, algo, models, rewards, prompts, prompt_ids, held_out, context)
    _register_state(run)
    restored = context.start()
    if restored is not None:
        _restored(run, restored)
    run.engine = placement.engine(roles, models, prompt_ids)
    run.engine.start(models.actor, run.start)  # a resumed run's weights differ from the model's
    return run


def check_context(max_new_tokens: int, actor: nn.Module, prompt_ids: list[list[int]]) -> None:
    """The longest prompt plus ``max_new_tokens`` must fit the policy's context: refused in
    one line before training (a longer sequence failed mid-run in a learned-position model,
    and ran past the trained positions of a rotary one)."""
    config = getattr(actor, "config", None)
    context = None if config is None else context_of(config)
    longest = max(len(ids) for ids in prompt_ids)
    if context is not None and longest + max_new_tokens > context:
        raise ProxrlError(
            f"max_new_tokens: the longest prompt ({longest} tokens) + max_new_tokens "
            f"({max_new_tokens}) = {longest + max_new_tokens} tokens is longer than the "
            f"model's context ({context} positions): lower max_new_tokens, or max_prompt_length "
            "(longer prompts are dropped)"
        )


def _with_optimizers(
    settings: RunSettings,
    algo: Algorithm,
    models: Models,
    rewards: RewardRole,
    prompts: list[PromptExample],
    prompt_ids: list[list[int]],
    held_out: HeldOut | None,
    context: Run,
) -> OnlineRun:
    """The optimizers (their rates on the run's schedule) and controllers, the roles placed.

    Several processes: data parallel (DDP) keeps the plain modules, the update summing
    gradients over ranks itself once per optimizer step (critic_forward calls the backbone and
    head directly, past any wrapper's forward); FSDP shards the trained roles in place (launch
    config), the rollout gathering full weights to generate. Each rank samples with seed +
    rank."""
    train_models = models
    if dist.world_size() > 1 and dist.is_sharded():
        train_models = replace(
            models,
            actor=dist.wrap_model(models.actor),
            critic=models.critic.wrapped(dist.wrap_model),
        )
    optimizing = settings.optimizing
    optimizers = make_optimizers(optimizing.learning_rate, models)
    # lr_schedule linear: each rate decays to 0 over the iterations (1 − iteration / iterations)
    schedule = warmup_then_decay(optimizing.iterations, 0, optimizing.lr_schedule)
    context.schedule(optimizers, schedule)
    kl = KL_CONTROLLERS[settings.controlling.kl_controller](settings.controlling)
    generator = torch.Generator().manual_seed(optimizing.seed)
    if dist.world_size() > 1:
        seed_everything(dist.sampler_seed(optimizing.seed))
    return OnlineRun(
        settings, algo, models, train_models, rewards, prompts, prompt_ids, held_out,
        context.output_dir, context, optimizers, kl, generator,
    )  # fmt: skip


def make_optimizers(learning_rate: float, models: Models) -> list[torch.optim.Optimizer]:
    """The policy's AdamW over its trainable weights at ``learning_rate``, then the critic's
    optimizers (the training client makes its own with it)."""
    actor_params = [p for p in models.actor.parameters() if p.requires_grad]
    return [
        torch.optim.AdamW(actor_params, lr=learning_rate, weight_decay=0.0),
        *models.critic.optimizers(),
    ]


def _register_state(run: OnlineRun) -> None:
    """What a checkpoint holds, registered once: the trained weights, optimizers, controllers,
    (with the run context's own: the guard, the RNGs, each rank's sampler stream too, and the
    LR schedule) and, as a counter, the iteration (which fixes the data position). Resume
    restores all of it."""
    context, models = run.context, run.models
    context.track(actor=TrainableWeights(models.actor))
    context.track(critic=models.critic.checkpoint_weights())  # None for the critic-free family
    if (
        run.settings.controlling.ref_reset_every
    ):  # a moving reference is state; a frozen one reloads
        context.track(reference=models.reference)
    context.track(optimizers=run.optimizers, kl=run.kl, penalty=run.algo.penalty)
    context.track(generator=run.generator)
    context.track(held_out=run.held_out)  # the early-stop history (None without eval_data)
    context.track(critic_warmup=models.critic.warmup_stop)  # None unless it may end early
    context.track(reward_calibration=calibrated_ensemble(run.rewards))  # None: nothing calibrated


def _restored(run: OnlineRun, restored: Restored) -> None:
    """Where a resumed run continues; the samples its checkpoint did not reach are dropped (the
    run context drops the metrics)."""
    run.start = int(restored.counters["iteration"])
    run.extra_rounds = int(restored.counters.get("extra_rounds", 0))  # older checkpoints: none
    if dist.is_main():
        truncate_samples(run.output_dir, run.start)
    log.info("resumed from %s at iteration %d", restored.path, run.start)


def health_monitor(run: OnlineRun) -> HealthMonitor:
    """The health rules, warning once each when they first fire, fed a resumed run's past."""
    resumed = run.start and dist.is_main()
    return HealthMonitor(read_metrics(run.output_dir) if resumed else ())


def truncate_samples(output_dir: Path, iteration: int) -> None:
    """Drop samples written after ``iteration`` (a resumed run writes them again)."""
    path = output_dir / "samples.jsonl"
    if path.exists():
        kept = [
            line
            for line in path.read_text(encoding="utf-8").splitlines()
            if json.loads(line)["iteration"] <= iteration
        ]
        path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
