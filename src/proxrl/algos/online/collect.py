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
from proxrl.algos.online.config import OnlineConfig
from proxrl.algos.online.critic import Critic
from proxrl.algos.online.episodes import responses_stopped, sample_responses, score_responses
from proxrl.algos.online.gather import gather_rollout, gathered_correction_stats
from proxrl.algos.online.micro_batches import packs, token_budget
from proxrl.algos.online.roles import Models
from proxrl.algos.online.samplers import ENGINES, make_engine, sampling_settings
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
from proxrl.rollout.generation import Samples, SamplingSettings
from proxrl.rollout.packing import micro_batch_plan
from proxrl.rollout.rewards import RewardRole
from proxrl.runtime import distributed as dist


@contextlib.contextmanager
def timed(timings: dict[str, float], key: str) -> Iterator[None]:
    """Add the seconds the block takes to ``timings[key]``."""
    started = time.perf_counter()
    yield
    timings[key] = time.perf_counter() - started


@dataclass(frozen=True)
class OldPolicySource:
    """Where the rollout's log π_old comes from."""

    from_sampler: bool  # the sampler's log-probs stand in for π_old (no pass for them)
    correct: bool  # a rollout correction: the pass gives π_old, the sampler's give the weights
    forward_pass: bool  # the rollout runs its own pass (else, without from_sampler, the update)
    measured: bool = False  # π_old is the trainer's, and the sampler's log-probs are asked for
    # only to measure them against it (``Experience.sampler_logprobs``)

    @classmethod
    def of(cls, cfg: OnlineConfig, algo: Algorithm, critic: Critic) -> OldPolicySource:
        """A value head reads the pass's hidden state, so the pass runs anyway, and with
        sampler_logprobs alone its log-probs are π_old: the same weights sampled. Not under
        async_rollout: the batch was sampled by the policy one or more versions back, and the
        pass would give the current policy's, leaving the lag uncorrected. π_old is then the
        engine's (the behaviour policy's), as without a value head; the pass gives V_old.

        Without sampler_logprobs an engine with kernels of its own (vLLM: ``ENGINES``' trait
        ``own_kernels``) is still asked for its log-probs, which it computes as it samples, so
        the mismatch the trainer's π_old leaves unmeasured is logged; the built-in samplers run
        the trainer's own module, whose numbers the pass repeats to round-off."""
        correct = cfg.sampler_logprobs and cfg.rollout_correction != "none"
        behind = cfg.async_rollout  # the samples may lag the policy they train
        own_kernels = ENGINES.trait(cfg.sampler, "own_kernels")
        return cls(
            from_sampler=cfg.sampler_logprobs
            and (behind or not critic.needs_hidden)
            and not correct,
            correct=correct,
            forward_pass=old_logprobs_pass(cfg, algo, critic),
            measured=own_kernels and not cfg.sampler_logprobs and cfg.rollouts_file is None,
        )

    @property
    def sampler_logprobs(self) -> bool:
        return self.from_sampler or self.correct or self.measured


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
    cfg: OnlineConfig,
    algo: Algorithm,
    models: Models,
    rewards: RewardRole,
    prompts: list[PromptExample],
    prompt_ids: list[list[int]],
    kl_coef: float,
    timings: dict[str, float],
    engine: RolloutEngine | None = None,
) -> tuple[Experience, list[str], dict[str, float]]:
    """Sample, score and evaluate one batch of prompts with ``engine`` (default: the run's
    sampler on the policy itself); returns the rollout without advantages, the completions and
    the rollout-side metrics."""
    engine = engine or make_engine(cfg, models.tokenizer)
    source = OldPolicySource.of(cfg, algo, models.critic)
    with timed(timings, "time/rollout_s"):
        sampled = sample(cfg, models, engine, prompts, prompt_ids, source.sampler_logprobs)
    with timed(timings, "time/score_s"):
        scored = score(cfg, algo, models, engine, rewards, sampled, prompt_ids)
    return evaluate(cfg, models, sampled, scored, source, kl_coef, timings)


@torch.no_grad()
def evaluate(
    cfg: OnlineConfig,
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
        passes = forward_passes(cfg, models, sampled, scored, source)
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
    cfg: OnlineConfig,
    models: Models,
    engine: RolloutEngine,
    prompts: list[PromptExample],
    prompt_ids: list[list[int]],
    with_logprobs: bool,
) -> Sampled:
    """Stage 1: G responses per prompt, consecutive, decoded."""
    tokenizer, actor = models.tokenizer, models.actor
    device = next(actor.parameters()).device
    ids = [row for row in prompt_ids for _ in range(cfg.group_size)]
    batch_prompts = [p for p in prompts for _ in range(cfg.group_size)]
    prompt_tensor = pad_left(ids, tokenizer.pad_token_id).to(device)
    prompt_mask = pad_left([[1] * len(r) for r in ids], 0).to(device)
    with dist.gathered_for_generation(actor) as whole:  # FSDP / ZeRO-3: full weights to sample
        samples = sample_responses(  # (or whole episodes, with an environment)
            cfg,
            engine.sampler(whole),
            tokenizer,
            batch_prompts,
            prompt_tensor,
            prompt_mask,
            sampling_settings(cfg),
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


def shaped_scores(cfg: OnlineConfig, scores: Tensor, ended: Tensor, lengths: Tensor) -> Tensor:
    """The score-shaping rules in order: the no-stop penalty for a response that did not stop,
    DAPO's soft overlong punishment by its ``lengths`` (B,), then clipping to ±reward_clip."""
    if cfg.no_stop_penalty is not None:
        penalised = NO_STOP_RULES[cfg.no_stop_mode](scores, cfg.no_stop_penalty)
        scores = torch.where(ended, scores, penalised)
    if cfg.overlong_buffer:
        scores = scores + overlong_penalty(
            lengths.to(scores.dtype), cfg.max_new_tokens, cfg.overlong_buffer, cfg.overlong_penalty
        )
    if cfg.reward_clip:
        scores = scores.clamp(-cfg.reward_clip, cfg.reward_clip)
    return scores


def score(
    cfg: OnlineConfig,
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
    ended = responses_stopped(samples, models.tokenizer.eos_token_id, cfg.max_new_tokens).cpu()
    lengths = samples.response_mask.sum(-1).cpu()
    scores = shaped_scores(cfg, raw.clone(), ended, lengths)
    greedy_scores = None
    if algo.needs_greedy:
        prompts = sampled.prompts[:: cfg.group_size]
        once = {k: v[:: cfg.group_size] for k, v in columns.items()}
        greedy_scores = greedy_baseline(cfg, models, engine, rewards, prompts, prompt_ids, once)
        device = next(models.actor.parameters()).device
        greedy_scores = greedy_scores.repeat_interleave(cfg.group_size).to(device)
    return Scored(raw, scores, ended, parts, greedy_scores, combined)


def greedy_baseline(
    cfg: OnlineConfig,
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
    settings = SamplingSettings(cfg.max_new_tokens, greedy=True, stop_strings=cfg.stop_strings)
    with dist.gathered_for_generation(actor) as whole:
        greedy = sample_responses(
            cfg,
            engine.sampler(whole),
            tokenizer,
            prompts,
            pad_left(prompt_ids, tokenizer.pad_token_id).to(device),
            pad_left([[1] * len(r) for r in prompt_ids], 0).to(device),
            settings,
            with_logprobs=False,
        )
    text = tokenizer.batch_decode(greedy.response_ids, skip_special_tokens=True)
    return score_responses(greedy, rewards, prompts, text, columns).total


def forward_passes(
    cfg: OnlineConfig,
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
    plan = micro_batch_plan(attention_mask, cfg.micro_batch_size, token_budget(cfg))
    columns: dict[str, list[Tensor]] = defaultdict(list)
    for rows in plan:
        for name, value in micro_batch_passes(
            cfg, models, samples, input_ids[rows], attention_mask[rows], rows, P, source
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
    correct = ROLLOUT_CORRECTIONS[cfg.rollout_correction]
    low, cap = cfg.rollout_correction_low, cfg.rollout_correction_cap
    experience.rollout_weights = correct(old - behaviour, mask, low, cap)
    stats = correction_stats(
        old, behaviour, experience.rollout_weights, mask, cfg.rollout_correction_cap
    )
    correction = {k: float(v) for k, v in stats.items()}
    return Passes(experience, joined.get("entropy"), correction, float(mask.sum()))


def micro_batch_passes(
    cfg: OnlineConfig,
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
    settings = sampling_settings(cfg)
    packed = packs(cfg)
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
            cfg.temperature,
            with_entropy=not source.from_sampler,
            with_hidden=critic.needs_hidden,
            **settings.truncation,
            packed=packed,
            shared_prefix=cfg.shared_prefix,
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
                ref, input_ids, attention_mask, P, cfg.temperature, settings.truncation, packed,
                shared_prefix=cfg.shared_prefix,
            )  # fmt: skip
    if models.teacher is not None:  # on-policy distillation: the teacher scores the samples
        teacher, truncation = models.teacher, settings.truncation
        out["teacher_logprobs"], argmax = frozen_pass(
            teacher, input_ids, attention_mask, P, cfg.temperature, truncation, packed, True,
            shared_prefix=cfg.shared_prefix,
        )  # fmt: skip
        assert argmax is not None
        out["teacher_argmax"] = argmax
    out["values"] = critic.values(input_ids, attention_mask, P, hidden)
    return out


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
      KL-shaped), no teacher's term joins the advantages (on-policy distillation), and no value
      head reads the pass's hidden state for V_old;
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
        and cfg.teacher_model is None
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
