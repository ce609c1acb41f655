"""The loop every online algorithm shares: rollout → score → advantages → update.

PPO, GRPO, RLOO, ReMax, REINFORCE++ and REINFORCE differ only in what an ``Algorithm`` says
(``config``): whether a critic is trained, whether the KL to the reference is paid in
the reward or in the loss, how advantages are estimated and which policy loss is minimised.
Each algorithm file builds one and calls ``train_online``; the loop below is written once, its
two halves in ``rollout`` and ``update``; the roles it trains and queries are loaded in ``roles``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor

from proxrl.algos.online.config import Algorithm, OnlineConfig
from proxrl.algos.online.dapo import dynamic_rollout, without_truncated
from proxrl.algos.online.heldout import HeldOut
from proxrl.algos.online.placement.base import elsewhere, roles_for, train_elsewhere
from proxrl.algos.online.roles import Models, load_prompts, place_roles
from proxrl.algos.online.rollout import collect_rollout, prompt_order
from proxrl.algos.online.samplers import rollout_engine
from proxrl.algos.online.update import NAMESPACES, update
from proxrl.core import FixedKL, ProportionalKL, informative_groups
from proxrl.data.formats import PromptExample
from proxrl.models.lora import save_model
from proxrl.models.tokenizer import save_tokenizer
from proxrl.rollout.generation import CachedSampler, static_cache
from proxrl.rollout.vllm_sampler import release_memory, sync_weights
from proxrl.runtime import distributed as dist
from proxrl.runtime.checkpoint import (
    check_output_dir,
    prepare_output_dir,
    record_planned_steps,
)
from proxrl.runtime.checkpointer import Checkpointer, GlobalRNG, TrainableWeights
from proxrl.runtime.config import config_to_dict, save_config_file
from proxrl.runtime.guard import NonFiniteGuard
from proxrl.runtime.health import HealthMonitor
from proxrl.runtime.logs import rendered
from proxrl.runtime.metrics import MetricsLogger, progress_bar, read_metrics
from proxrl.runtime.resume import check_not_finished, check_resume
from proxrl.runtime.seeding import seed_everything

log = logging.getLogger(__name__)

__all__ = ["Algorithm", "OnlineConfig", "train_online"]


def kl_controller(cfg: OnlineConfig) -> FixedKL:
    if cfg.kl_controller == "proportional":
        return ProportionalKL(cfg.kl_coef, cfg.kl_target, cfg.kl_horizon)
    return FixedKL(cfg.kl_coef)


def train_online(cfg: OnlineConfig, algo: Algorithm) -> dict[str, float]:
    """Run ``cfg.iterations`` of rollout → score → advantages → update for ``algo``."""
    # 1. Output directory, seeds, models, reward sources, prompts.
    # Everything the user handed us is checked before the output directory is touched.
    check_output_dir(cfg.output_dir, cfg.resume, cfg.overwrite)
    check_resume(cfg)
    check_not_finished(cfg, cfg.iterations, "iteration", "--iterations")
    if elsewhere(cfg):  # placement ray: this function runs again in a trainer actor
        return train_elsewhere(cfg, algo)
    roles = roles_for(cfg)  # where the roles live (algos.online.placement)
    seed_everything(cfg.seed)
    rewards = roles.rewards(cfg)  # first: a reward function that does not import fails fast
    models = roles.models(cfg, algo)
    if cfg.compile_sampler:
        static_cache(
            models.actor, CachedSampler.CACHE_BUCKET
        )  # a model without one fails here, not mid-run
    prompts, prompt_ids = load_prompts(cfg, models.tokenizer)
    held_out = HeldOut.create(cfg, models.tokenizer, rewards, Path(cfg.output_dir))
    world = dist.world_size()
    if world > 1:  # prompts (whole groups) are sharded: rollout_batch_size is global
        dist.split_global(cfg.rollout_batch_size, "rollout_batch_size")
    output_dir = prepare_output_dir(cfg.output_dir, cfg.resume, cfg.overwrite)
    if dist.is_main():
        save_config_file(cfg, output_dir / "config.yaml")
        record_planned_steps(output_dir, cfg.iterations)

    # 2. Optimizers: the policy at learning_rate, the critic at its own rate. Several
    #    processes: data parallel (DDP) keeps the plain modules, the update summing gradients
    #    over ranks itself once per optimizer step (critic_forward calls the backbone and head
    #    directly, past any wrapper's forward); FSDP shards the trained roles in place (launch
    #    config), the rollout gathering full weights to generate. Each rank samples with
    #    seed + rank.
    place_roles(models, rewards, offload_frozen=cfg.offload_frozen_roles)
    train_models = models
    if world > 1 and dist.is_sharded():
        train_models = replace(
            models,
            actor=dist.wrap_model(models.actor),
            critic=models.critic.wrapped(dist.wrap_model),
        )
    actor_params = [p for p in models.actor.parameters() if p.requires_grad]
    optimizers = [
        torch.optim.AdamW(actor_params, lr=cfg.learning_rate, weight_decay=0.0),
        *models.critic.optimizers(),
    ]
    base_rates = [opt.param_groups[0]["lr"] for opt in optimizers]
    kl = kl_controller(cfg)
    generator = torch.Generator().manual_seed(cfg.seed)
    checkpointer = Checkpointer(
        output_dir,
        keep=cfg.keep_checkpoints,
        rank_rng=True,
        # another world size: a fresh stream per rank, still a function of the iteration
        reseed=lambda iteration: seed_everything(dist.sampler_seed(cfg.seed) + 7919 * iteration),
    )
    guard = NonFiniteGuard(cfg.max_consecutive_skips, checkpointer.root)
    logger = MetricsLogger(
        output_dir, dist.is_main(), report_to=cfg.report_to, config=config_to_dict(cfg)
    )
    if world > 1:
        seed_everything(dist.sampler_seed(cfg.seed))

    # 3. What a checkpoint holds, registered once: the trained weights, optimizers, controllers,
    #    RNGs (each rank's sampler stream too) and, as a counter, the iteration (which fixes the
    #    data position). Resume restores all of it.
    checkpointer.track(actor=TrainableWeights(models.actor))
    checkpointer.track(critic=models.critic.checkpoint_weights())  # None for the critic-free family
    if cfg.ref_reset_every:  # a reference that moves is state; a frozen one is reloaded from disk
        checkpointer.track(reference=models.reference)
    checkpointer.track(
        optimizers=optimizers,
        kl=kl,
        penalty=algo.penalty,
        rng=GlobalRNG(),
        generator=generator,
        guard=guard,
    )
    checkpointer.track(held_out=held_out)  # the early-stop history (None without eval_data)

    # Dynamic sampling draws extra batches of prompts: the data position is the iteration plus
    # the extra rounds so far, a counter of the checkpoint.
    extra_rounds = 0
    group_size = cfg.group_size

    def save(done: int) -> Path:
        return checkpointer.save(done, iteration=done, extra_rounds=extra_rounds)

    start = 0
    if cfg.resume:
        restored = checkpointer.restore()
        start = int(restored.counters["iteration"])
        extra_rounds = int(restored.counters.get("extra_rounds", 0))  # older checkpoints: none
        logger.truncate_after(start)
        if dist.is_main():
            truncate_samples(output_dir, start)
        log.info("resumed from %s at iteration %d", restored.path, start)

    # An engine with its own copy of the weights (sampler: vllm) starts once, outside the
    # iterations, and gets the policy's weights now (a resumed run's differ from the model's).
    engine = rollout_engine(cfg) if models.engines is None else None  # (ray: in engine actors)
    if engine is not None:
        sync_weights(engine, models.actor)
    roles.start(models.actor, start)

    # 4. Iterate. The health rules warn once each when they first fire (runtime.health).
    health = HealthMonitor(read_metrics(output_dir) if start and dist.is_main() else ())
    last: dict[str, float] = {}
    done, end = start, start if held_out is not None and held_out.stopped else cfg.iterations
    bar_on = cfg.progress and dist.is_main()
    with (
        progress_bar(cfg.iterations, f"{algo.name}", completed=start, enabled=bar_on) as bar,
        roles.stop() as stop,
    ):
        for iteration in range(start, end):
            started = time.perf_counter()
            fraction_left = 1 - iteration / cfg.iterations if cfg.lr_schedule == "linear" else 1.0
            for opt, rate in zip(optimizers, base_rates, strict=True):
                for group in opt.param_groups:
                    group["lr"] = rate * fraction_left

            # 4a. Rollout: sample, score, forward passes, advantages.
            timings: dict[str, float] = {}
            models.actor.eval()
            if cfg.dynamic_sampling:
                experience, completions, order, row = dynamic_rollout(
                    cfg,
                    algo,
                    models,
                    rewards,
                    prompts,
                    prompt_ids,
                    kl.value,
                    timings,
                    draw=iteration + extra_rounds,
                )
                extra_rounds += int(row["sampling/rounds"]) - 1
            else:
                order = prompt_order(len(prompts), cfg.rollout_batch_size, iteration, cfg.seed)
                local = dist.shard(order)  # rank r: prompts r, r + world, ...; gathered in order
                order = [
                    i for r in range(world) for i in order[r::world] for _ in range(group_size)
                ]
                with cfg.autocast():
                    experience, completions, row = collect_rollout(
                        cfg,
                        algo,
                        models,
                        rewards,
                        [prompts[i] for i in local],
                        [prompt_ids[i] for i in local],
                        kl.value,
                        timings,
                    )
            if group_size > 1:
                row["sampling/constant_groups"] = float(
                    (~informative_groups(experience.scores, group_size)).sum()
                )
            # What the update trains on; metrics keep describing the whole rollout.
            trained = without_truncated(experience) if cfg.mask_truncated else experience
            # A finite rollout is only inspected: counting it as a success would reset the
            # in-a-row count, and a run with fewer steps per iteration than max_consecutive_skips
            # whose gradients are always NaN would then never stop.
            rollout = {
                "scores": experience.scores,
                "rewards": experience.rewards,
                "advantages": experience.advantages,
            }
            rollout_ok = guard.problem(tensors=rollout) is None or guard.check(
                iteration + 1, tensors=rollout
            )

            # 4b. Update: the critic alone during warm-up, then both. A rollout with a non-finite
            # score, reward or advantage is skipped whole.
            models.actor.train()
            if engine is not None:
                release_memory(engine)  # on a GPU the engine sleeps through the update
            roles.before_update(iteration, prompt_ids)
            started_update = time.perf_counter()
            train_policy = iteration >= models.critic.warmup_iterations
            stats: dict[str, float] = {}
            if rollout_ok:
                stats = update(
                    cfg,
                    algo,
                    train_models,
                    trained,
                    optimizers,
                    kl.value,
                    train_policy,
                    generator,
                    guard,
                    iteration + 1,
                )
            timings["time/update_s"] = time.perf_counter() - started_update
            # (before the controllers: without a π_old pass objective/kl comes from the update)
            for key, value in stats.items():
                row[NAMESPACES.get(key, key if "/" in key else f"policy/{key}")] = value
            if engine is not None:
                timings["time/weight_sync_s"] = sync_weights(engine, models.actor)
            timings |= roles.after_update(models.actor, iteration + 1)

            # 4c. Controllers: KL-in-reward β, PPO-Penalty β, reference reset.
            if rollout_ok:
                kl.update(row.get("objective/kl", 0.0), cfg.responses_per_iteration)
            if algo.penalty is not None and train_policy and stats.get("steps"):
                algo.penalty.update(stats.get("approx_kl", 0.0))
                row["policy/penalty_beta"] = algo.penalty.value
            if (
                cfg.ref_reset_every
                and (iteration + 1) % cfg.ref_reset_every == 0
                and models.reference is not None
            ):
                models.reference.load_state_dict(dist.full_state(models.actor.state_dict()))

            # 4d. Metrics, samples, checkpoint.
            mask = experience.response_mask.float()
            if rollout_ok:
                row.update(models.critic.rollout_metrics(experience))
            row.update(guard.metrics())
            elapsed = time.perf_counter() - started
            row["perf/tokens_per_s"] = mask.sum().item() / elapsed
            row["time/iteration_s"] = elapsed
            row.update(timings)
            stop_early = held_out is not None and held_out.step(iteration + 1, row, models)
            last = logger.log(iteration + 1, row)
            if dist.is_main():
                health.observe(iteration + 1, last)
            sample_now = cfg.sample_every and (
                iteration % cfg.sample_every == 0 or iteration + 1 == cfg.iterations
            )
            if sample_now and dist.is_main():
                write_samples(
                    output_dir,
                    iteration + 1,
                    [prompts[i] for i in order],
                    completions,
                    experience.scores,
                    show=cfg.progress,
                )
            bar.update(1, score=row["objective/scores"], kl=row.get("objective/kl", 0.0))
            if dist.any_rank(stop.requested) and iteration + 1 < cfg.iterations:
                raise stop.interrupted(save(iteration + 1))
            if (
                cfg.save_every
                and (iteration + 1) % cfg.save_every == 0
                and iteration + 1 < cfg.iterations
                and not stop_early
            ):
                save(iteration + 1)
            done = iteration + 1
            if stop_early:
                break

    # 5. Final checkpoint and the policy (and critic) for transformers.
    if done > start:
        save(done)
    save_policy(models, output_dir)  # every rank: FSDP gathers the weights first
    if dist.is_main() and held_out is not None:
        held_out.finish(output_dir)
    dist.barrier()
    logger.close()
    return last


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


def write_samples(
    output_dir: Path,
    iteration: int,
    prompts: list[PromptExample],
    completions: list[str],
    scores: Tensor,
    show: bool = False,
    shown: int = 3,
) -> None:
    """Append every sample to samples.jsonl; with ``show``, log the first few as a table."""
    rows = list(zip(prompts, completions, scores.tolist(), strict=True))
    with open(output_dir / "samples.jsonl", "a", encoding="utf-8") as f:
        for prompt, completion, score in rows:
            f.write(
                json.dumps(
                    {
                        "iteration": iteration,
                        # as the data set had it: a string, or a conversation's messages
                        "prompt": prompt.prompt if prompt.messages is None else prompt.messages,
                        "completion": completion,
                        "score": score,
                    }
                )
                + "\n"
            )
    if show:
        from rich.table import Table

        table = Table(title=f"samples at iteration {iteration}", show_lines=True)
        for column in ("prompt", "completion", "score"):
            table.add_column(column, overflow="fold")
        for prompt, completion, score in rows[:shown]:
            table.add_row(prompt.prompt or str(prompt.messages), completion, f"{score:.3f}")
        log.info("%s", rendered(table))


def save_policy(models: Models, output_dir: Path) -> None:
    """The policy via ``save_pretrained`` (safetensors; under LoRA the merged model, the adapter
    in ``adapter/``: ``models.lora.save_model``) plus the tokenizer, and the critic as it saves
    itself (a separate one under ``critic/``, a value head in ``value_head.safetensors``).
    Every rank calls it (under FSDP each joins the gathers); rank 0 writes."""
    sharded = dist.is_sharded()
    actor = dist.full_state(models.actor.state_dict()) if sharded else None
    critic = [dist.full_state(m.state_dict()) for m in models.critic.modules()] if sharded else []
    if not dist.is_main():
        return
    save_model(models.actor, output_dir, actor)
    save_tokenizer(models.tokenizer, output_dir, "left")  # for a user's batched generate
    models.critic.save_pretrained(output_dir, critic[0] if critic else None)
