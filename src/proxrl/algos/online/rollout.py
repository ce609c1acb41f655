"""The rollout half of the online loop: sample prompts, generate, score, run the reference /
critic forward passes and estimate advantages."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from proxrl.algos.online.config import Algorithm, OnlineConfig
from proxrl.algos.online.critic import Critic
from proxrl.algos.online.episodes import responses_stopped, sample_responses, score_responses
from proxrl.algos.online.roles import Models
from proxrl.algos.online.samplers import make_sampler
from proxrl.core import (
    combine_correction_stats,
    correction_stats,
    icepop_weights,
    masked_mean,
    mis_weights,
    overlong_penalty,
    seq_mis_weights,
    seq_tis_weights,
    sequence_kl,
    tis_weights,
)
from proxrl.data.batching import pad_left
from proxrl.data.formats import PromptExample
from proxrl.models.lora import adapter_disabled
from proxrl.rollout.experience import Experience
from proxrl.rollout.forward import at_least_float32, policy_forward, reference_pass
from proxrl.rollout.generation import SamplingSettings
from proxrl.rollout.packing import micro_batch_plan
from proxrl.rollout.rewards import WeightedRewards
from proxrl.runtime import distributed as dist


def prompt_order(n_prompts: int, batch: int, iteration: int, seed: int) -> list[int]:
    """The prompt indices of ``iteration`` (0-based): a fresh seeded permutation per pass over
    the data, so the data position is a pure function of the iteration (exact resume)."""
    start = iteration * batch
    order: list[int] = []
    while len(order) < batch:
        epoch, offset = divmod(start + len(order), n_prompts)
        permutation = torch.randperm(
            n_prompts, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)
        ).tolist()
        order.extend(permutation[offset : offset + batch - len(order)])
    return order


CORRECTIONS: dict[str, Callable[[torch.Tensor, torch.Tensor, OnlineConfig], torch.Tensor]] = {
    "tis": lambda log_ratio, mask, cfg: tis_weights(log_ratio, mask, cfg.rollout_correction_cap),
    "seq_tis": lambda log_ratio, mask, cfg: seq_tis_weights(
        log_ratio, mask, cfg.rollout_correction_cap
    ),
    "mis": lambda log_ratio, mask, cfg: mis_weights(log_ratio, mask, cfg.rollout_correction_cap),
    "seq_mis": lambda log_ratio, mask, cfg: seq_mis_weights(
        log_ratio, mask, cfg.rollout_correction_cap
    ),
    "icepop": lambda log_ratio, mask, cfg: icepop_weights(
        log_ratio, mask, cfg.rollout_correction_low, cfg.rollout_correction_cap
    ),
}
"""``rollout_correction`` → (log π_old − log π_sampler, mask, config) → (B, T) weights."""


def old_logprobs_pass(cfg: OnlineConfig, algo: Algorithm, critic: Critic) -> bool:
    """Whether the rollout runs a forward pass of its own for log π_old. Without it the update
    takes π_old = π from its forward (detached: the ratio is exactly 1, approx-KL and clip
    fractions 0), which is the same update and the same logged numbers to round-off only where:

    - the rollout batch gets one optimizer step (ppo_epochs 1, one mini-batch), so π has not
      moved since the rollout when that step's forward runs;
    - π_old is the trainer's own (sampler_logprobs false, hence no rollout_correction): the
      sampler's log-probs differ from the trainer's by the engine's rounding;
    - nothing before the update reads π_old: the KL is paid in the loss (``Algorithm.kl_loss``,
      grpo), not in the reward (ppo, rloo, remax, reinforce, reinforce_pp*, whose advantages are
      KL-shaped), and no value head reads the pass's hidden state for V_old;
    - every rollout row reaches the update's forward, where the rollout metrics that read π_old
      (objective/kl, objective/entropy, objective/rlhf_reward) are then computed: not
      dynamic_sampling (those metrics cover the dropped groups too) nor mask_truncated (a
      micro-batch of truncated rows runs no forward).

    The two forwards compute the same function of the weights: dropout is off in every model
    the loop loads (``models.causal_lm.disable_dropout``, LoRA dropout 0), so train() and eval()
    agree, and both run under the same ``cfg.autocast()`` (under bf16 they agree to its
    rounding, as the pass itself would)."""
    one_step = cfg.ppo_epochs == 1 and cfg.mini_batch_size == cfg.responses_per_iteration
    return not (
        cfg.skip_old_logprobs_pass
        and one_step
        and not cfg.sampler_logprobs
        and algo.kl_loss is not None
        and not critic.needs_hidden
        and not cfg.dynamic_sampling
        and not cfg.mask_truncated
    )


def old_policy_metrics(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    entropy: torch.Tensor,
    scores: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
    tracks_kl: bool,
) -> dict[str, float]:
    """The rollout metrics that read π_old ((B, T) log-probs and entropy, (B,) scores): the
    rollout computes them after its pass, the update from its forward when there was none."""
    seq_kl = sequence_kl(logprobs, ref_logprobs, mask)
    metrics = {
        "objective/rlhf_reward": (scores.to(seq_kl.device) - kl_coef * seq_kl).mean().item(),
        "objective/entropy": masked_mean(entropy, mask).item(),
    }
    if tracks_kl:
        metrics["objective/kl"] = seq_kl.mean().item()
    return metrics


@torch.no_grad()
def collect_rollout(
    cfg: OnlineConfig,
    algo: Algorithm,
    models: Models,
    rewards: WeightedRewards,
    prompts: list[PromptExample],
    prompt_ids: list[list[int]],
    kl_coef: float,
    timings: dict[str, float],
) -> tuple[Experience, list[str], dict[str, float]]:
    """Sample, score and evaluate one batch of prompts; returns the rollout, the completions
    and the rollout-side metrics."""
    tokenizer, actor = models.tokenizer, models.actor
    device = next(actor.parameters()).device
    group = cfg.group_size
    started = time.perf_counter()
    # Generate: G samples per prompt, consecutive.
    ids = [row for row in prompt_ids for _ in range(group)]
    batch_prompts = [p for p in prompts for _ in range(group)]
    prompt_tensor = pad_left(ids, tokenizer.pad_token_id).to(device)
    prompt_mask = pad_left([[1] * len(r) for r in ids], 0).to(device)
    settings = SamplingSettings(
        cfg.max_new_tokens,
        cfg.temperature,
        cfg.top_k,
        cfg.top_p,
        cfg.stop_strings,
        min_p=cfg.min_p,
    )
    critic = models.critic
    # A rollout correction weighs π_old (the trainer's, from the forward pass below) against the
    # sampler's log-probs; without one the sampler's stand in for π_old and save that pass.
    correct = cfg.sampler_logprobs and cfg.rollout_correction != "none"
    use_sampler_logprobs = (
        cfg.sampler_logprobs and not critic.needs_hidden and not correct
    )  # a value head needs the forward pass
    old_pass = old_logprobs_pass(cfg, algo, critic)  # False: the update's forward gives π_old
    with dist.gathered_for_generation(actor) as whole:  # FSDP / ZeRO-3: full weights to sample
        samples = sample_responses(  # (or whole episodes, with an environment)
            cfg,
            models.engines or make_sampler(cfg, whole, tokenizer),
            tokenizer,
            batch_prompts,
            prompt_tensor,
            prompt_mask,
            settings,
            with_logprobs=use_sampler_logprobs or correct,
        )
    response_ids, response_mask = samples.response_ids, samples.response_mask
    if not response_mask.any(-1).all():  # an empty response cannot carry a score
        response_mask[:, 0] = 1
    completions = tokenizer.batch_decode(
        response_ids * response_mask + tokenizer.pad_token_id * (1 - response_mask),
        skip_special_tokens=True,
    )
    timings["time/rollout_s"] = time.perf_counter() - started

    # Score.
    started = time.perf_counter()
    columns: dict[str, list[Any]] = defaultdict(list)
    for p in batch_prompts:
        for key, value in getattr(p, "columns", {}).items():
            columns[key].append(value)
    scores, parts = score_responses(samples, rewards, batch_prompts, completions, dict(columns))
    raw_scores = scores.clone()
    ended = responses_stopped(samples, tokenizer.eos_token_id, cfg.max_new_tokens).cpu()
    if cfg.no_stop_penalty is not None:
        penalised = (
            scores - cfg.no_stop_penalty
            if cfg.no_stop_mode == "subtract"
            else torch.full_like(scores, cfg.no_stop_penalty)
        )
        scores = torch.where(ended, scores, penalised)
    if cfg.overlong_buffer:  # DAPO's soft overlong punishment
        lengths = response_mask.sum(-1).cpu().to(scores.dtype)
        scores = scores + overlong_penalty(
            lengths, cfg.max_new_tokens, cfg.overlong_buffer, cfg.overlong_penalty
        )
    if cfg.reward_clip:
        scores = scores.clamp(-cfg.reward_clip, cfg.reward_clip)
    greedy_scores = None
    if algo.needs_greedy:
        with dist.gathered_for_generation(actor) as whole:
            greedy = sample_responses(
                cfg,
                models.engines or make_sampler(cfg, whole, tokenizer),
                tokenizer,
                prompts,
                pad_left(prompt_ids, tokenizer.pad_token_id).to(device),
                pad_left([[1] * len(r) for r in prompt_ids], 0).to(device),
                SamplingSettings(cfg.max_new_tokens, greedy=True, stop_strings=cfg.stop_strings),
                with_logprobs=False,
            )
        greedy_text = tokenizer.batch_decode(greedy.response_ids, skip_special_tokens=True)
        prompt_columns = {k: v[::group] for k, v in columns.items()}
        greedy_scores = score_responses(greedy, rewards, prompts, greedy_text, prompt_columns)
        greedy_scores = greedy_scores[0].repeat_interleave(group).to(device)
    timings["time/score_s"] = time.perf_counter() - started

    # Forward passes of the policy, the reference and the critic over the sampled tokens.
    started = time.perf_counter()
    P = prompt_tensor.shape[1]
    input_ids = torch.cat([prompt_tensor, response_ids], 1)
    attention_mask = torch.cat([prompt_mask, response_mask], 1)
    logprobs, ref_logprobs, values, entropy = [], [], [], []
    packed = bool(cfg.max_tokens_per_micro_batch)
    plan = micro_batch_plan(attention_mask, cfg.micro_batch_size, cfg.max_tokens_per_micro_batch)
    for rows in plan:
        hidden = None
        if use_sampler_logprobs:
            logprobs.append(samples.logprobs[rows])  # type: ignore[index]
            entropy.append(  # NaN for a sampler that gives none: logged, never used
                samples.entropy[rows]
                if samples.entropy is not None
                else torch.full_like(logprobs[-1], float("nan"))
            )
        elif old_pass:
            out = policy_forward(
                actor,
                input_ids[rows],
                attention_mask[rows],
                P,
                cfg.temperature,
                with_entropy=True,
                with_hidden=critic.needs_hidden,
                **settings.truncation,
                packed=packed,
            )
            logprobs.append(at_least_float32(out.logprobs))
            entropy.append(at_least_float32(out.entropy))  # type: ignore[arg-type]
            hidden = out.hidden
        if not models.tracks_kl:  # β ≡ 0: π_ref would only be logged; KL reads 0 everywhere
            if logprobs:  # (without the pass π_ref stays empty too: nothing reads it)
                ref_logprobs.append(logprobs[-1])
        else:
            with (
                adapter_disabled(actor)
                if models.reference is None
                else contextlib.nullcontext(models.reference) as ref
            ):
                ref_logprobs.append(
                    reference_pass(
                        ref,
                        input_ids[rows],
                        attention_mask[rows],
                        P,
                        cfg.temperature,
                        settings.truncation,
                        packed,
                    ).to(device)
                )
        values.append(critic.values(input_ids[rows], attention_mask[rows], P, hidden))
    order = torch.cat(plan).argsort()  # packed micro-batches take rows out of order
    logprobs, ref_logprobs, values, entropy = (
        [torch.cat(x)[order]] if x else [] for x in (logprobs, ref_logprobs, values, entropy)
    )
    mask = (response_mask if samples.action_mask is None else samples.action_mask).float()
    experience = Experience(
        prompt_ids=prompt_tensor,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        logprobs=torch.cat(logprobs) if logprobs else None,
        ref_logprobs=torch.cat(ref_logprobs) if ref_logprobs else None,
        values=torch.cat(values) * mask,
        scores=scores.to(device),
        rewards=torch.zeros_like(mask),
        advantages=torch.zeros_like(mask),
        returns=torch.zeros_like(mask),
        greedy_scores=greedy_scores,
        truncated=~ended.to(device),
        action_mask=samples.action_mask,
    )
    correction_metrics: dict[str, float] = {}
    correction_tokens = 0.0
    if correct:
        log_ratio = experience.logprobs - samples.logprobs.float()  # type: ignore[union-attr]
        experience.rollout_weights = CORRECTIONS[cfg.rollout_correction](log_ratio, mask, cfg)
        stats = correction_stats(
            experience.logprobs,
            samples.logprobs.float(),  # type: ignore[union-attr]
            experience.rollout_weights,
            mask,
            cfg.rollout_correction_cap,
        )
        correction_metrics = {k: float(v) for k, v in stats.items()}
        correction_tokens = float(mask.sum())
    timings["time/forward_s"] = time.perf_counter() - started

    # Several processes: each sampled its own prompts (whole groups); gather the rollout so that
    # advantages, whitening, group baselines, the KL measurement and metrics are global.
    if dist.world_size() > 1:
        entropy = [torch.cat(entropy) if entropy else torch.zeros_like(mask)]
        experience, raw_scores, ended, entropy[0], completions = gather_rollout(
            experience, raw_scores, ended, entropy[0], completions, tokenizer.pad_token_id
        )
        scores, mask = experience.scores, experience.loss_mask.float()
        parts = dist.all_reduce_mean(dict(parts))
        if correction_metrics:
            correction_metrics = gathered_correction_stats(correction_metrics, correction_tokens)

    # Advantages.
    experience.rewards, experience.advantages, experience.returns = algo.estimate(
        experience, kl_coef
    )
    lengths = mask.sum(-1)
    metrics = {
        "objective/scores": raw_scores.mean().item(),
        "objective/scores_after_penalty": scores.mean().item(),
        "response/length_mean": lengths.mean().item(),
        "response/eos_rate": ended.float().mean().item(),
        "policy/kl_coef": kl_coef,
        # 1: the trainer ran a forward pass for π_old (0: the sampler's or the update's)
        "perf/old_logprobs_pass": float(old_pass and not use_sampler_logprobs),
        **parts,
        **{f"rollout/{k}": v for k, v in correction_metrics.items()},
    }
    if experience.logprobs is not None:  # else the update logs them (update.OnPolicyRecord)
        metrics |= old_policy_metrics(
            experience.logprobs,
            experience.ref_logprobs,
            torch.cat(entropy),
            scores,
            mask,
            kl_coef,
            models.tracks_kl,
        )
    return experience, completions, metrics


def gathered_correction_stats(stats: dict[str, float], tokens: float) -> dict[str, float]:
    """This rank's ``correction_stats`` over its ``tokens`` valid tokens → the whole rollout's,
    on every rank: token means weighted by each rank's tokens, the ratio's min and max as the
    least and greatest over ranks (``core.combine_correction_stats``)."""
    shards = dist.all_gather_objects((stats, tokens))
    return combine_correction_stats([part for part, _ in shards], [n for _, n in shards])


def pad_to(x: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
    extra = width - x.shape[1]
    if extra == 0:
        return x
    pad = torch.full((x.shape[0], extra), value, dtype=x.dtype, device=x.device)
    return torch.cat([pad, x] if left else [x, pad], dim=1)


def gather_rollout(
    experience: Experience,
    raw_scores: torch.Tensor,
    ended: torch.Tensor,
    entropy: torch.Tensor,
    completions: list[str],
    pad_id: int,
) -> tuple[Experience, torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
    """Every rank's rollout concatenated in rank order (rows of rank 0 first), prompts re-padded
    on the left and responses on the right to the widest rank's (B, P) and (B, T)."""
    device = experience.prompt_ids.device
    local = {name: None if x is None else x.cpu() for name, x in experience.tensors().items()}
    parts = dist.all_gather_objects(
        {
            "experience": local,
            "raw_scores": raw_scores.cpu(),
            "ended": ended.cpu(),
            "entropy": entropy.cpu(),
            "completions": completions,
        }
    )
    P = max(p["experience"]["prompt_ids"].shape[1] for p in parts)
    T = max(p["experience"]["response_ids"].shape[1] for p in parts)
    columns: dict[str, Any] = {}
    for name in local:
        if local[name] is None:  # an optional field this algorithm leaves empty, on every rank
            columns[name] = None
            continue
        rows = []
        for p in parts:
            x = p["experience"][name]
            if name in ("prompt_ids", "prompt_mask"):
                x = pad_to(x, P, pad_id if name == "prompt_ids" else 0, left=True)
            elif x.dim() == 2:
                x = pad_to(x, T, pad_id if name == "response_ids" else 0, left=False)
            rows.append(x)
        columns[name] = torch.cat(rows).to(device)
    entropy_all = torch.cat([pad_to(p["entropy"], T, 0.0, left=False) for p in parts]).to(device)
    return (
        replace(experience, **columns),
        torch.cat([p["raw_scores"] for p in parts]),
        torch.cat([p["ended"] for p in parts]),
        entropy_all,
        [c for p in parts for c in p["completions"]],
    )
