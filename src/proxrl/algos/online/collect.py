"""The rollout stages of the online loop: sample → score → forward passes → gather.

Each stage hands the next a typed record; the result is an ``Experience`` without advantages
(the loop estimates them once, after any dynamic-sampling filter: ``advantages.estimate``).
- ``sample``: G responses per prompt (whole episodes, with an environment), decoded;
- ``score``: the reward sources' scores, then the shaping rules (no-stop penalty, DAPO's
  overlong punishment, clipping), and ReMax's greedy baseline;
- ``forward_passes``: log π_old (or the sampler's), log π_ref, V_old and entropy over the
  sampled tokens, and a rollout correction's weights;
- ``gather_rollout``: several processes join their rows, so every later average is global.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from proxrl.algos.online.algorithm import Algorithm
from proxrl.algos.online.episodes import responses_stopped, sample_responses, score_responses
from proxrl.algos.online.gather import gather_rollout, gathered_correction_stats
from proxrl.algos.online.old_policy import OldPolicySource
from proxrl.algos.online.roles import Models
from proxrl.algos.online.rollout_settings import (
    PassSettings,
    RolloutSettings,
    SampleSettings,
    ScoreSettings,
    ScoreShaping,
)
from proxrl.core import (
    NO_STOP_RULES,
    ROLLOUT_CORRECTIONS,
    correction_stats,
    masked_mean,
    mismatch_stats,
    overlong_penalty,
    sequence_kl,
)
from proxrl.data.batching import pad_left
from proxrl.data.formats import PromptExample
from proxrl.models.lora import adapter_disabled
from proxrl.rollout.engines import RolloutEngine
from proxrl.rollout.experience import Experience
from proxrl.rollout.forward import at_least_float32, frozen_pass, policy_forward
from proxrl.rollout.generation import Samples
from proxrl.rollout.packing import micro_batch_plan
from proxrl.rollout.rewards import RewardRole
from proxrl.runtime import distributed as dist


@contextlib.contextmanager
def timed(timings: dict[str, float], key: str) -> Iterator[None]:
    """Set ``timings[key]`` to the seconds the block takes (each stage times itself once per
    dict; dynamic sampling sums its rounds' dicts: ``dapo``)."""
    started = time.perf_counter()
    yield
    timings[key] = time.perf_counter() - started


@dataclass
class Sampled:
    """Stage sample → score: one batch's responses, a prompt's G consecutive."""

    prompts: list[PromptExample]  # (B,) each row's prompt
    prompt_ids: Tensor  # (B, P) left-padded
    prompt_mask: Tensor  # (B, P)
    samples: Samples  # (B, T) responses, or whole episodes with an environment
    completions: list[str]  # (B,) the responses decoded


@dataclass
class Scored:
    """Stage score → forward passes."""

    raw: Tensor  # (B,) the reward sources' scores (+ an episode's environment reward)
    scores: Tensor  # (B,) after the shaping rules
    ended: Tensor  # (B,) bool, the response stopped by itself (CPU)
    parts: dict[str, float]  # each source's mean score
    greedy_scores: Tensor | None  # (B,) ReMax's baseline: the score of the prompt's greedy decode
    combined: Tensor | None = None  # (B,) the sources combined by the algorithm (GDPO), or None
    token_rewards: Tensor | None = None  # (B, T) task rewards at their tokens, summing to
    # ``scores`` (``Experience.token_rewards``); None: scores only


@dataclass
class Passes:
    """Stage forward passes → gather: the rollout's per-token model outputs."""

    experience: Experience  # without advantages
    entropy: Tensor | None  # (B, T) entropy of π_old's processed distribution (None: no pass)
    correction: dict[str, float]  # the rollout correction's statistics ({} without one)
    correction_tokens: float  # the valid tokens those statistics average over


@dataclass
class RolloutBatch:
    """What the rollout of one iteration hands the loop."""

    experience: Experience  # (B = rollout_batch_size · G rows), without advantages
    completions: list[str]  # (B,) the responses decoded
    rows: list[int]  # (B,) each row's prompt index
    metrics: dict[str, float]  # the rollout side of the iteration's metrics row
    extra_rounds: int = 0  # sampling rounds past the first (dynamic sampling)
    prompts: list[PromptExample] | None = None  # (B,) the rows' prompts where they are not
    # the run's (a rollouts file's: ``rows`` then counts the file's rows)


@torch.no_grad()
def collect_rollout(
    settings: RolloutSettings,
    algo: Algorithm,
    models: Models,
    rewards: RewardRole,
    prompts: list[PromptExample],
    prompt_ids: list[list[int]],
    kl_coef: float,
    timings: dict[str, float],
    engine: RolloutEngine,
) -> tuple[Experience, list[str], dict[str, float]]:
    """Sample, score and evaluate one batch of prompts with ``engine``; returns the rollout
    without advantages, the completions and the rollout-side metrics."""
    source = settings.old_policy
    with timed(timings, "time/rollout_s"):
        sampled = sample(
            settings.sampling, models, engine, prompts, prompt_ids, source.sampler_logprobs
        )
    with timed(timings, "time/score_s"):
        scored = score(settings.scoring, algo, models, engine, rewards, sampled, prompt_ids)
    return evaluate(settings.passes, models, sampled, scored, source, kl_coef, timings)


@torch.no_grad()
def evaluate(
    settings: PassSettings,
    models: Models,
    sampled: Sampled,
    scored: Scored,
    source: OldPolicySource,
    kl_coef: float,
    timings: dict[str, float],
) -> tuple[Experience, list[str], dict[str, float]]:
    """The forward passes over a sampled, scored batch, several processes' rows gathered, and
    the rollout-side metrics (also for a rollouts file's batch: ``rollouts_file``)."""
    with timed(timings, "time/forward_s"):
        passes = forward_passes(settings, models, sampled, scored, source)
    experience, entropy, completions = passes.experience, passes.entropy, sampled.completions
    raw, ended, parts, correction = scored.raw, scored.ended, scored.parts, passes.correction
    if dist.world_size() > 1:  # advantages, baselines and metrics are over every rank's rows
        experience, raw, ended, entropy, completions = gather_rollout(
            experience,
            raw,
            ended,
            torch.zeros_like(experience.loss_mask.float()) if entropy is None else entropy,
            completions,
            models.tokenizer.pad_token_id,
        )
        parts = dist.all_reduce_mean(dict(parts))
        if correction:
            correction = gathered_correction_stats(correction, passes.correction_tokens)
    metrics = {
        **rollout_metrics(experience, raw, ended, kl_coef, source),
        **parts,
        **{f"rollout/{k}": v for k, v in correction.items()},
    }
    if experience.teacher_logprobs is not None:
        metrics |= distill_metrics(experience)
    if experience.sampler_logprobs is not None and experience.logprobs is not None:
        # (without the pass, the update's forward is π_old: it measures, ``OnPolicyRecord``)
        metrics |= mismatch_metrics(experience.logprobs, experience.sampler_logprobs, experience)
    if experience.logprobs is not None:  # else the update logs them (update.OnPolicyRecord)
        assert entropy is not None
        mask = experience.loss_mask.float()
        metrics |= old_policy_metrics(
            experience.logprobs,
            experience.ref_logprobs,
            entropy,
            experience.scores,
            mask,
            kl_coef,
            models.tracks_kl,
        )
    return experience, completions, metrics


def mismatch_metrics(
    trainer: Tensor, sampler: Tensor, experience: Experience, rows: Tensor | None = None
) -> dict[str, float]:
    """``core.mismatch_stats`` of the trainer's log π_old (B, T) against the sampler's over the
    model's tokens (of ``rows`` alone: a bool (B,)), named ``rollout/mismatch_kl``, …, in float64
    (a float32 engine's numbers are exact in it; the trainer's are kept as computed)."""
    mask = experience.loss_mask
    if rows is not None:
        trainer, sampler, mask = trainer[rows], sampler[rows], mask[rows]
    stats = mismatch_stats(trainer.double(), sampler.double(), mask)
    return {f"rollout/{key}": float(value) for key, value in stats.items()}


def distill_metrics(experience: Experience) -> dict[str, float]:
    """What the teacher says of the rollout, per sampled token: the reverse KL's k1 estimate
    log π_old − log π_teacher (π_old: the policy that sampled), the teacher's log-prob, and the
    share of sampled tokens that are the teacher's likeliest."""
    teacher, argmax = experience.teacher_logprobs, experience.teacher_argmax
    assert teacher is not None and argmax is not None and experience.logprobs is not None
    mask = experience.loss_mask.float()
    agrees = (experience.response_ids == argmax).to(mask.dtype)
    return {
        "distill/reverse_kl": masked_mean(experience.logprobs - teacher, mask).item(),
        "distill/teacher_logprob": masked_mean(teacher, mask).item(),
        "distill/teacher_argmax_agreement": masked_mean(agrees, mask).item(),
    }


def rollout_metrics(
    experience: Experience, raw: Tensor, ended: Tensor, kl_coef: float, source: OldPolicySource
) -> dict[str, float]:
    """What the rollout's scores and lengths say, before any model output is read."""
    return {
        "objective/scores": raw.mean().item(),
        "objective/scores_after_penalty": experience.scores.mean().item(),
        "response/length_mean": experience.loss_mask.float().sum(-1).mean().item(),
        "response/eos_rate": ended.float().mean().item(),
        "policy/kl_coef": kl_coef,
        # 1: the trainer ran a forward pass for π_old (0: the sampler's or the update's)
        "perf/old_logprobs_pass": float(source.forward_pass and not source.from_sampler),
    }


def sample(
    settings: SampleSettings,
    models: Models,
    engine: RolloutEngine,
    prompts: list[PromptExample],
    prompt_ids: list[list[int]],
    with_logprobs: bool,
) -> Sampled:
    """Stage 1: G responses per prompt, consecutive, decoded."""
    tokenizer, actor = models.tokenizer, models.actor
    device = next(actor.parameters()).device
    ids = [row for row in prompt_ids for _ in range(settings.group_size)]
    batch_prompts = [p for p in prompts for _ in range(settings.group_size)]
    prompt_tensor = pad_left(ids, tokenizer.pad_token_id).to(device)
    prompt_mask = pad_left([[1] * len(r) for r in ids], 0).to(device)
    with dist.gathered_for_generation(actor) as whole:  # FSDP / ZeRO-3: full weights to sample
        samples = sample_responses(  # (or whole episodes, with an environment)
            settings.episodes,
            engine.sampler(whole),
            tokenizer,
            batch_prompts,
            prompt_tensor,
            prompt_mask,
            settings.distribution,
            with_logprobs=with_logprobs,
        )
    response_ids, response_mask = samples.response_ids, samples.response_mask
    if not response_mask.any(-1).all():  # an empty response cannot carry a score
        response_mask[:, 0] = 1
    completions = tokenizer.batch_decode(
        response_ids * response_mask + tokenizer.pad_token_id * (1 - response_mask),
        skip_special_tokens=True,
    )
    return Sampled(batch_prompts, prompt_tensor, prompt_mask, samples, completions)


def prompt_columns(prompts: list[PromptExample]) -> dict[str, list[Any]]:
    """The data set's other fields, one list per column (what reward functions receive)."""
    columns: dict[str, list[Any]] = defaultdict(list)
    for p in prompts:
        for key, value in getattr(p, "columns", {}).items():
            columns[key].append(value)
    return dict(columns)


def shaped_scores(shaping: ScoreShaping, scores: Tensor, ended: Tensor, lengths: Tensor) -> Tensor:
    """The score-shaping rules in order: the no-stop penalty for a response that did not stop,
    DAPO's soft overlong punishment by its ``lengths`` (B,), then clipping to ±reward_clip."""
    if shaping.no_stop_penalty is not None:
        penalised = NO_STOP_RULES[shaping.no_stop_mode](scores, shaping.no_stop_penalty)
        scores = torch.where(ended, scores, penalised)
    if shaping.overlong_buffer:
        scores = scores + overlong_penalty(
            lengths.to(scores.dtype),
            shaping.max_new_tokens,
            shaping.overlong_buffer,
            shaping.overlong_penalty,
        )
    if shaping.reward_clip:
        scores = scores.clamp(-shaping.reward_clip, shaping.reward_clip)
    return scores


def score(
    settings: ScoreSettings,
    algo: Algorithm,
    models: Models,
    engine: RolloutEngine,
    rewards: RewardRole,
    sampled: Sampled,
    prompt_ids: list[list[int]],
) -> Scored:
    """Stage 2: the reward sources' scores, shaped; ReMax's greedy baseline."""
    columns = prompt_columns(sampled.prompts)
    samples = sampled.samples
    scored = score_responses(samples, rewards, sampled.prompts, sampled.completions, columns)
    raw, parts = scored.total, scored.parts
    combined = None
    if algo.combine_sources is not None:
        combined = algo.combine_sources(scored.per_source, list(scored.weights))
    eos = models.tokenizer.eos_token_id
    ended = responses_stopped(samples, eos, settings.max_new_tokens).cpu()
    lengths = samples.response_mask.sum(-1).cpu()
    scores = shaped_scores(settings.shaping, raw.clone(), ended, lengths)
    greedy_scores, greedy = None, settings.greedy
    if greedy is not None:
        prompts = sampled.prompts[:: greedy.group_size]
        once = {k: v[:: greedy.group_size] for k, v in columns.items()}
        greedy_scores = greedy_baseline(greedy, models, engine, rewards, prompts, prompt_ids, once)
        device = next(models.actor.parameters()).device
        greedy_scores = greedy_scores.repeat_interleave(greedy.group_size).to(device)
    return Scored(raw, scores, ended, parts, greedy_scores, combined)


def greedy_baseline(
    greedy: SampleSettings,
    models: Models,
    engine: RolloutEngine,
    rewards: RewardRole,
    prompts: list[PromptExample],
    prompt_ids: list[list[int]],
    columns: dict[str, list[Any]],
) -> Tensor:
    """(N,) the score of each prompt's greedy decode (ReMax's baseline)."""
    tokenizer, actor = models.tokenizer, models.actor
    device = next(actor.parameters()).device
    with dist.gathered_for_generation(actor) as whole:
        decoded = sample_responses(
            greedy.episodes,
            engine.sampler(whole),
            tokenizer,
            prompts,
            pad_left(prompt_ids, tokenizer.pad_token_id).to(device),
            pad_left([[1] * len(r) for r in prompt_ids], 0).to(device),
            greedy.distribution,
            with_logprobs=False,
        )
    text = tokenizer.batch_decode(decoded.response_ids, skip_special_tokens=True)
    return score_responses(decoded, rewards, prompts, text, columns).total


def forward_passes(
    settings: PassSettings,
    models: Models,
    sampled: Sampled,
    scored: Scored,
    source: OldPolicySource,
) -> Passes:
    """Stage 3: the policy's, the reference's and the critic's passes over the sampled tokens,
    in the micro-batches of the update (packed or padded); the rollout correction's weights."""
    samples, P = sampled.samples, sampled.prompt_ids.shape[1]
    response_ids, response_mask = samples.response_ids, samples.response_mask
    device = next(models.actor.parameters()).device
    input_ids = torch.cat([sampled.prompt_ids, response_ids], 1)
    attention_mask = torch.cat([sampled.prompt_mask, response_mask], 1)
    plan = micro_batch_plan(attention_mask, settings.micro_batch_size, settings.token_budget)
    columns: dict[str, list[Tensor]] = defaultdict(list)
    for rows in plan:
        for name, value in micro_batch_passes(
            settings, models, samples, input_ids[rows], attention_mask[rows], rows, P, source
        ).items():
            columns[name].append(value)
    order = torch.cat(plan).argsort()  # packed micro-batches take rows out of order
    joined = {name: torch.cat(parts)[order] for name, parts in columns.items()}
    mask = (response_mask if samples.action_mask is None else samples.action_mask).float()
    experience = Experience(
        prompt_ids=sampled.prompt_ids,
        prompt_mask=sampled.prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        logprobs=joined.get("logprobs"),
        ref_logprobs=joined.get("ref_logprobs"),
        values=joined["values"] * mask,
        scores=scored.scores.to(device),
        greedy_scores=scored.greedy_scores,
        combined_scores=None if scored.combined is None else scored.combined.to(device),
        truncated=~scored.ended.to(device),
        action_mask=samples.action_mask,
        token_rewards=None if scored.token_rewards is None else scored.token_rewards.to(device),
        teacher_logprobs=joined.get("teacher_logprobs"),
        teacher_argmax=joined.get("teacher_argmax"),
        sampler_logprobs=samples.logprobs if source.measured else None,
    )
    if not source.correct:
        return Passes(experience, joined.get("entropy"), {}, 0.0)
    behaviour = samples.logprobs.float()  # type: ignore[union-attr]
    old = experience.logprobs
    assert old is not None
    correct = ROLLOUT_CORRECTIONS[settings.rollout_correction]
    low, cap = settings.rollout_correction_low, settings.rollout_correction_cap
    experience.rollout_weights = correct(old - behaviour, mask, low, cap)
    stats = correction_stats(old, behaviour, experience.rollout_weights, mask, cap)
    correction = {k: float(v) for k, v in stats.items()}
    return Passes(experience, joined.get("entropy"), correction, float(mask.sum()))


def micro_batch_passes(
    settings: PassSettings,
    models: Models,
    samples: Samples,
    input_ids: Tensor,
    attention_mask: Tensor,
    rows: Tensor,
    P: int,
    source: OldPolicySource,
) -> dict[str, Tensor]:
    """One micro-batch's log π_old and entropy (the sampler's or a pass's; none where the
    update's forward gives them), log π_ref and V_old."""
    actor, critic = models.actor, models.critic
    distribution, packed = settings.distribution, settings.packed
    temperature, truncation = distribution.temperature, distribution.truncation
    out: dict[str, Tensor] = {}
    hidden = None
    if source.from_sampler:
        out["logprobs"] = samples.logprobs[rows]  # type: ignore[index]
        out["entropy"] = (  # NaN for a sampler that gives none: logged, never used
            samples.entropy[rows]
            if samples.entropy is not None
            else torch.full_like(out["logprobs"], float("nan"))
        )
    # (with the sampler's π_old a value head still needs the pass's hidden state)
    if source.forward_pass and (not source.from_sampler or critic.needs_hidden):
        policy = policy_forward(
            actor,
            input_ids,
            attention_mask,
            P,
            temperature,
            with_entropy=not source.from_sampler,
            with_hidden=critic.needs_hidden,
            **truncation,
            packed=packed,
            shared_prefix=settings.shares_prefix,
        )
        if not source.from_sampler:
            out["logprobs"] = at_least_float32(policy.logprobs)
            out["entropy"] = at_least_float32(policy.entropy)  # type: ignore[arg-type]
        hidden = policy.hidden
    if not models.tracks_kl:  # β ≡ 0: π_ref would only be logged; KL reads 0 everywhere
        if "logprobs" in out:  # (without the pass π_ref stays empty too: nothing reads it)
            out["ref_logprobs"] = out["logprobs"]
    else:
        with (
            adapter_disabled(actor)
            if models.reference is None
            else contextlib.nullcontext(models.reference) as ref
        ):
            out["ref_logprobs"], _ = frozen_pass(
                ref, input_ids, attention_mask, P, temperature, truncation, packed,
                shared_prefix=settings.shares_prefix,
            )  # fmt: skip
    if models.teacher is not None:  # on-policy distillation: the teacher scores the samples
        out["teacher_logprobs"], argmax = frozen_pass(
            models.teacher, input_ids, attention_mask, P, temperature, truncation, packed, True,
            shared_prefix=settings.shares_prefix,
        )  # fmt: skip
        assert argmax is not None
        out["teacher_argmax"] = argmax
    out["values"] = critic.values(input_ids, attention_mask, P, hidden)
    return out


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
