"""The loop every online algorithm shares: rollout → score → advantages → update.

PPO, GRPO, RLOO, ReMax, REINFORCE++ and REINFORCE differ only in what an ``Algorithm`` says:
whether a critic is trained, whether the KL to the reference is paid in the reward or in the
loss, how advantages are estimated and which policy loss is minimised. Each algorithm file
builds one and calls ``train_online``; the loop below is written once.

Batch semantics, stated once: an iteration samples ``rollout_batch_size`` prompts ×
``group_size`` responses; the update takes ``ppo_epochs`` passes over them in shuffled
minibatches of ``mini_batch_size`` responses, one optimizer step each, computed in
``grad_accum`` micro-batches.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from proxrl.core import (
    AdaptiveKL,
    FixedKL,
    ProportionalKL,
    aggregate_loss,
    entropy_bonus,
    explained_variance,
    kl_k3,
    masked_mean,
    sequence_kl,
    value_loss,
)
from proxrl.data.batching import pad_left
from proxrl.data.encoding import encode_prompt_text
from proxrl.data.formats import PromptExample, load_prompt_examples
from proxrl.models.causal_lm import load_causal_lm
from proxrl.models.lora import adapter_disabled, apply_lora, trainable_state_dict
from proxrl.models.scalar_head import load_score_model
from proxrl.models.tokenizer import load_tokenizer, resize_for_tokenizer
from proxrl.rollout.experience import Experience
from proxrl.rollout.forward import critic_forward, policy_forward
from proxrl.rollout.generation import HFSampler, SamplingSettings, stopped
from proxrl.rollout.rewards import (
    FunctionReward,
    RewardModelReward,
    WeightedRewards,
    load_reward_function,
)
from proxrl.runtime.checkpoint import CheckpointManager, prepare_output_dir
from proxrl.runtime.config import RunConfig, save_config_file
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.metrics import MetricsLogger, progress_bar
from proxrl.runtime.seeding import capture_rng_state, restore_rng_state, seed_everything

log = logging.getLogger(__name__)


@dataclass
class OnlineConfig(RunConfig):
    """Fields shared by ``proxrl ppo`` and ``proxrl grpo``."""

    model: str = ""
    """Policy to start from (usually an SFT model): hub id or local directory."""
    prompts: str = ""
    """Prompt data ({"prompt"} or {"messages"} rows; other fields reach reward functions)."""
    reward_model: str | None = None
    """Reward model (num_labels=1 sequence classifier): hub id or local directory."""
    reward_fn: tuple[str, ...] = ()
    """Reward functions as module:function, called with (prompts, completions, **columns)."""
    reward_weights: tuple[float, ...] = ()
    """Weight of each reward source, reward model first (default: all 1)."""
    iterations: int = 100
    """Rollout-and-update iterations."""
    rollout_batch_size: int = 16
    """Prompts sampled per iteration."""
    group_size: int = 1
    """Responses sampled per prompt."""
    max_prompt_length: int = 256
    """Longest prompt in tokens; longer prompts are dropped (counted in the log)."""
    max_new_tokens: int = 64
    """Longest response in tokens."""
    temperature: float = 0.7
    """Sampling temperature; log-probs are computed from logits divided by it."""
    top_k: int = 0
    """Sample among the k likeliest tokens (0: off)."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1: off)."""
    stop_strings: tuple[str, ...] = ()
    """Strings that end a response besides EOS."""
    no_stop_penalty: float | None = None
    """Score for a response that hit max_new_tokens without stopping (None: no penalty)."""
    no_stop_mode: Literal["replace", "subtract"] = "replace"
    """replace: the score becomes no_stop_penalty; subtract: no_stop_penalty is subtracted from it."""
    reward_clip: float = 0.0
    """Clip scores to ±reward_clip (0: off)."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    mini_batch_size: int = 16
    """Responses per optimizer step."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (mini_batch_size / grad_accum responses per forward)."""
    learning_rate: float = 1e-6
    """Policy learning rate (AdamW)."""
    lr_schedule: Literal["linear", "constant"] = "linear"
    """Decay learning rates linearly to 0 at the last iteration, or keep them."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm (0: off)."""
    clip: float = 0.2
    """PPO clip range ε (lower side)."""
    clip_high: float | None = None
    """Upper clip range (default: clip); DAPO uses 0.28."""
    dual_clip: float | None = None
    """Dual-clip bound c > 1 on negative-advantage losses (None: off)."""
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] = "token-mean"
    """How per-token losses reduce to a scalar."""
    kl_coef: float = 0.05
    """Initial coefficient β of the KL to the reference policy."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k1"
    """Per-token KL estimator for the KL paid in the reward."""
    kl_controller: Literal["fixed", "proportional"] = "fixed"
    """fixed β, or the proportional controller of Ziegler et al. (InstructGPT)."""
    kl_target: float = 6.0
    """Target sequence KL of the proportional controller."""
    kl_horizon: int = 10000
    """Horizon (in samples) of the proportional controller."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (entropy is logged either way)."""
    early_stop_kl: float = 0.0
    """Stop an iteration's epochs once approx-KL(π_old‖π) exceeds this (0: never)."""
    ref_reset_every: int = 0
    """Copy the policy into the reference every N iterations (0: never)."""
    sample_every: int = 10
    """Write sampled prompts, completions and scores to samples.jsonl every N iterations."""
    lora_r: int = 0
    """LoRA rank (0: full fine-tuning); the reference is then the adapter-disabled policy."""
    lora_alpha: float = 0.0
    """LoRA scale numerator (0: 2 × lora_r)."""
    dtype: str = "float32"
    """Weights dtype: float32, bfloat16, float16, float64 or auto."""
    attn_implementation: str | None = None
    """Attention kernel: eager, sdpa, flash_attention_2 (default: transformers chooses)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    trust_remote_code: bool = False
    """Run model code shipped with a hub repository (off unless you trust it)."""
    sampler_logprobs: bool = False
    """Take log π_old from the sampler's logits instead of a second forward pass: one pass
    fewer per iteration, but π_old then differs from the trainer's own numbers by float
    rounding (KV-cache vs full pass), so the first ratio is not exactly 1."""
    max_consecutive_skips: int = 5
    """Stop after this many optimizer steps in a row skipped for a non-finite loss or gradient."""
    progress: bool = True
    """Show a progress bar."""

    @property
    def responses_per_iteration(self) -> int:
        return self.rollout_batch_size * self.group_size

    @property
    def micro_batch_size(self) -> int:
        return self.mini_batch_size // self.grad_accum

    def validate(self) -> None:
        super().validate()
        positive = ("iterations", "rollout_batch_size", "group_size", "max_new_tokens", "ppo_epochs",
                    "mini_batch_size", "grad_accum", "max_prompt_length")
        for name in positive:
            if getattr(self, name) < 1:
                raise ProxrlError(f"{name}: expected >= 1, got {getattr(self, name)}")
        if not self.model:
            raise ProxrlError("model: expected a hub id or a local directory")
        if not self.prompts:
            raise ProxrlError("prompts: expected a prompt file, directory or datasets name")
        if self.reward_model is None and not self.reward_fn:
            raise ProxrlError("reward_model / reward_fn: give a reward model, a reward function, or both")
        sources = (self.reward_model is not None) + len(self.reward_fn)
        if self.reward_weights and len(self.reward_weights) != sources:
            raise ProxrlError(f"reward_weights: expected {sources} weights (one per reward source), got {len(self.reward_weights)}")
        if self.responses_per_iteration % self.mini_batch_size:
            raise ProxrlError(
                f"mini_batch_size: {self.mini_batch_size} does not divide the {self.responses_per_iteration} "
                f"responses of an iteration (rollout_batch_size {self.rollout_batch_size} × group_size {self.group_size})"
            )
        if self.mini_batch_size % self.grad_accum:
            raise ProxrlError(f"grad_accum: {self.grad_accum} does not divide mini_batch_size {self.mini_batch_size}")
        if self.temperature <= 0:
            raise ProxrlError(f"temperature: expected > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ProxrlError(f"top_p: expected in (0, 1], got {self.top_p}")
        if self.learning_rate <= 0:
            raise ProxrlError(f"learning_rate: expected > 0, got {self.learning_rate}")
        if self.lora_r and self.ref_reset_every:
            raise ProxrlError("ref_reset_every: not available with lora_r > 0 (the reference is the base model)")


# ------------------------------------------------------------------------------------------
# What an algorithm chooses


@dataclass
class Algorithm:
    """The small, explicit choices that make one online algorithm differ from another."""

    name: str
    estimate: Callable[[Experience, float], tuple[Tensor, Tensor, Tensor]]
    """(rollout, β) → (rewards, advantages, returns), each (B, T)."""
    policy_loss: Callable[[Tensor, Experience], tuple[Tensor, dict[str, Tensor]]]
    """(new log-probs (B, T), minibatch) → (loss, stats)."""
    kl_in_loss: bool = False
    """Pay β·KL(π‖π_ref) (k3) as a loss term instead of in the reward."""
    needs_greedy: bool = False
    """Also decode each prompt greedily and score it (ReMax's baseline), stored in ``extras``."""
    critic: Literal["none", "separate", "head"] = "none"
    critic_model: str | None = None
    critic_learning_rate: float = 0.0
    vf_coef: float = 0.1
    value_clip: float | None = None
    critic_warmup_iterations: int = 0
    penalty: AdaptiveKL | None = None
    """PPO-Penalty's adaptive β on KL(π_old‖π), updated after each iteration."""
    extras: dict[str, Tensor] = field(default_factory=dict)


class ValueHead(nn.Module):
    """V(s) = w·h + b on the policy's last hidden state (the shared-backbone critic), zero-initialised."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.linear(hidden.float()).squeeze(-1)


# ------------------------------------------------------------------------------------------
# Setup


@dataclass
class Models:
    actor: nn.Module
    reference: nn.Module | None  # None with LoRA: the adapter-disabled actor is the reference
    critic: nn.Module | None
    tokenizer: Any


def load_models(cfg: OnlineConfig, algo: Algorithm) -> Models:
    kwargs = {"dtype": cfg.dtype, "attn_implementation": cfg.attn_implementation,
              "trust_remote_code": cfg.trust_remote_code}
    tokenizer = load_tokenizer(cfg.model, trust_remote_code=cfg.trust_remote_code)
    actor = load_causal_lm(cfg.model, gradient_checkpointing=cfg.gradient_checkpointing, **kwargs)
    resize_for_tokenizer(actor, tokenizer)
    reference = None
    if cfg.lora_r:
        actor = apply_lora(actor, cfg.lora_r, cfg.lora_alpha or None)
    else:
        reference = load_causal_lm(cfg.model, **kwargs)
        resize_for_tokenizer(reference, tokenizer)
        reference.requires_grad_(False).eval()
    critic: nn.Module | None = None
    if algo.critic == "separate":
        source = algo.critic_model or cfg.reward_model or cfg.model
        critic = load_score_model(source, new_head="zero", gradient_checkpointing=cfg.gradient_checkpointing, **kwargs)
        resize_for_tokenizer(critic, tokenizer)
    elif algo.critic == "head":
        critic = ValueHead(actor.config.hidden_size)
    return Models(actor, reference, critic, tokenizer)


def load_rewards(cfg: OnlineConfig) -> WeightedRewards:
    sources: list[Any] = []
    if cfg.reward_model is not None:
        model = load_score_model(cfg.reward_model, dtype=cfg.dtype, trust_remote_code=cfg.trust_remote_code)
        model.requires_grad_(False).eval()
        rm_tokenizer = load_tokenizer(cfg.reward_model, trust_remote_code=cfg.trust_remote_code)
        sources.append(RewardModelReward(model, rm_tokenizer))
    sources += [FunctionReward(spec, load_reward_function(spec)) for spec in cfg.reward_fn]
    return WeightedRewards(sources, list(cfg.reward_weights) or [1.0] * len(sources))


def kl_controller(cfg: OnlineConfig) -> FixedKL:
    if cfg.kl_controller == "proportional":
        return ProportionalKL(cfg.kl_coef, cfg.kl_target, cfg.kl_horizon)
    return FixedKL(cfg.kl_coef)


# ------------------------------------------------------------------------------------------
# Rollout


@torch.no_grad()
def collect_rollout(
    cfg: OnlineConfig, algo: Algorithm, models: Models, rewards: WeightedRewards,
    prompts: list[PromptExample], prompt_ids: list[list[int]], kl_coef: float, timings: dict[str, float],
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
    settings = SamplingSettings(cfg.max_new_tokens, cfg.temperature, cfg.top_k, cfg.top_p, cfg.stop_strings)
    sampler = HFSampler(actor, tokenizer)
    use_sampler_logprobs = cfg.sampler_logprobs and algo.critic != "head"  # a value head needs the forward pass
    samples = sampler.sample(prompt_tensor, prompt_mask, settings, with_logprobs=use_sampler_logprobs)
    response_ids, response_mask = samples.response_ids, samples.response_mask
    if not response_mask.any(-1).all():  # an empty response cannot carry a score
        response_mask[:, 0] = 1
    completions = tokenizer.batch_decode(response_ids * response_mask + tokenizer.pad_token_id * (1 - response_mask), skip_special_tokens=True)
    timings["time/rollout_s"] = time.perf_counter() - started

    # Score.
    started = time.perf_counter()
    columns: dict[str, list[Any]] = defaultdict(list)
    for p in batch_prompts:
        for key, value in getattr(p, "columns", {}).items():
            columns[key].append(value)
    scores, parts = rewards(batch_prompts, completions, dict(columns))
    raw_scores = scores.clone()
    ended = stopped(response_mask, response_ids, tokenizer.eos_token_id, cfg.max_new_tokens).cpu()
    if cfg.no_stop_penalty is not None:
        penalised = scores - cfg.no_stop_penalty if cfg.no_stop_mode == "subtract" else torch.full_like(scores, cfg.no_stop_penalty)
        scores = torch.where(ended, scores, penalised)
    if cfg.reward_clip:
        scores = scores.clamp(-cfg.reward_clip, cfg.reward_clip)
    if algo.needs_greedy:
        greedy = sampler.sample(
            pad_left(prompt_ids, tokenizer.pad_token_id).to(device),
            pad_left([[1] * len(r) for r in prompt_ids], 0).to(device),
            SamplingSettings(cfg.max_new_tokens, greedy=True, stop_strings=cfg.stop_strings),
        )
        greedy_text = tokenizer.batch_decode(greedy.response_ids, skip_special_tokens=True)
        prompt_columns = {k: v[::group] for k, v in columns.items()}
        algo.extras["greedy_scores"] = rewards(prompts, greedy_text, prompt_columns)[0]
    timings["time/score_s"] = time.perf_counter() - started

    # Forward passes of the policy, the reference and the critic over the sampled tokens.
    started = time.perf_counter()
    P = prompt_tensor.shape[1]
    input_ids = torch.cat([prompt_tensor, response_ids], 1)
    attention_mask = torch.cat([prompt_mask, response_mask], 1)
    logprobs, ref_logprobs, values, entropy = [], [], [], []
    for rows in torch.arange(len(ids)).split(cfg.micro_batch_size):
        if use_sampler_logprobs:
            logprobs.append(samples.logprobs[rows])  # type: ignore[index]
            entropy.append(samples.entropy[rows])  # type: ignore[index]
        else:
            out = policy_forward(actor, input_ids[rows], attention_mask[rows], P, cfg.temperature,
                                 with_entropy=True, with_hidden=algo.critic == "head")
            logprobs.append(out.logprobs.float())
            entropy.append(out.entropy.float())  # type: ignore[union-attr]
        with adapter_disabled(actor) if models.reference is None else contextlib.nullcontext(models.reference) as ref:
            ref_logprobs.append(policy_forward(ref, input_ids[rows], attention_mask[rows], P, cfg.temperature).logprobs.float())
        if algo.critic == "separate":
            values.append(critic_forward(models.critic, input_ids[rows], attention_mask[rows], P))  # type: ignore[arg-type]
        elif algo.critic == "head":
            values.append(models.critic(out.hidden))  # type: ignore[misc]
        else:
            values.append(torch.zeros_like(logprobs[-1]))
    mask = response_mask.float()
    experience = Experience(
        prompt_ids=prompt_tensor, prompt_mask=prompt_mask, response_ids=response_ids, response_mask=response_mask,
        logprobs=torch.cat(logprobs), ref_logprobs=torch.cat(ref_logprobs), values=torch.cat(values) * mask,
        scores=scores.to(device), rewards=torch.zeros_like(mask), advantages=torch.zeros_like(mask), returns=torch.zeros_like(mask),
    )
    timings["time/forward_s"] = time.perf_counter() - started

    # Advantages.
    experience.rewards, experience.advantages, experience.returns = algo.estimate(experience, kl_coef)
    for name, tensor in (("scores", experience.scores), ("advantages", experience.advantages), ("rewards", experience.rewards)):
        if not torch.isfinite(tensor).all():
            raise ProxrlError(f"non-finite {name} in the rollout of this iteration; the update is not taken")
    seq_kl = sequence_kl(experience.logprobs, experience.ref_logprobs, mask)
    lengths = mask.sum(-1)
    metrics = {
        "objective/kl": seq_kl.mean().item(),
        "objective/scores": raw_scores.mean().item(),
        "objective/scores_after_penalty": scores.mean().item(),
        "objective/rlhf_reward": (scores.to(device) - kl_coef * seq_kl).mean().item(),
        "objective/entropy": masked_mean(torch.cat(entropy), mask).item(),
        "response/length_mean": lengths.mean().item(),
        "response/eos_rate": ended.float().mean().item(),
        "policy/kl_coef": kl_coef,
        **parts,
    }
    return experience, completions, metrics


# ------------------------------------------------------------------------------------------
# Update


def _finite_gradients(parameters: list[nn.Parameter]) -> bool:
    return all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in parameters)


def update(
    cfg: OnlineConfig, algo: Algorithm, models: Models, experience: Experience, optimizers: list[torch.optim.Optimizer],
    kl_coef: float, train_policy: bool, generator: torch.Generator,
) -> tuple[dict[str, float], int]:
    """``ppo_epochs`` passes of shuffled minibatches, one optimizer step each.
    Returns the mean of each stat over the steps taken and the number of skipped steps."""
    actor, critic = models.actor, models.critic
    parameters = [p for opt in optimizers for group in opt.param_groups for p in group["params"]]
    totals: dict[str, float] = defaultdict(float)
    steps = skipped = 0
    P = experience.prompt_ids.shape[1]
    for _ in range(cfg.ppo_epochs):
        epoch_kl = []
        for minibatch in torch.randperm(len(experience), generator=generator).split(cfg.mini_batch_size):
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            step_stats: dict[str, float] = defaultdict(float)
            for rows in minibatch.split(cfg.micro_batch_size):
                mb = experience.select(rows)
                mask = mb.response_mask.float()
                out = policy_forward(actor, mb.input_ids, mb.attention_mask, P, cfg.temperature,
                                     with_entropy=True, with_hidden=algo.critic == "head")
                loss = torch.zeros((), device=mask.device)
                stats: dict[str, Tensor] = {}
                if train_policy:
                    loss, stats = algo.policy_loss(out.logprobs, mb)
                    if algo.kl_in_loss and kl_coef:
                        kl_loss = aggregate_loss(kl_k3(out.logprobs, mb.ref_logprobs), mask, cfg.loss_agg)
                        loss = loss + kl_coef * kl_loss
                        stats["kl_loss"] = kl_loss.detach()
                    bonus, entropy_stats = entropy_bonus(out.entropy, mask, cfg.loss_agg)  # type: ignore[arg-type]
                    stats.update(entropy_stats)
                    if cfg.entropy_coef:
                        loss = loss + cfg.entropy_coef * bonus
                if algo.critic != "none":
                    if algo.critic == "head":
                        new_values = critic(out.hidden)  # type: ignore[misc]
                    else:
                        new_values = critic_forward(critic, mb.input_ids, mb.attention_mask, P)  # type: ignore[arg-type]
                    v_loss, v_stats = value_loss(new_values, mb.values, mb.returns, mask, algo.value_clip, cfg.loss_agg)
                    loss = loss + algo.vf_coef * v_loss
                    stats.update(v_stats)
                share = len(rows) / len(minibatch)
                (loss * share).backward()
                for key, value in stats.items():
                    step_stats[key] += float(value) * share
            if not (all(math.isfinite(v) for v in step_stats.values()) and _finite_gradients(parameters)):
                skipped += 1
                log.warning("skipped an optimizer step: non-finite loss or gradient (%s)",
                            {k: v for k, v in step_stats.items() if not math.isfinite(v)} or "gradient")
                for opt in optimizers:
                    opt.zero_grad(set_to_none=True)
                continue
            if cfg.max_grad_norm:
                step_stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(parameters, cfg.max_grad_norm))
            for opt in optimizers:
                opt.step()
            steps += 1
            for key, value in step_stats.items():
                totals[key] += value
            epoch_kl.append(step_stats.get("approx_kl", 0.0))
        if cfg.early_stop_kl and epoch_kl and sum(epoch_kl) / len(epoch_kl) > cfg.early_stop_kl:
            totals["early_stopped"] = 1.0
            break
    stats_out = {k: v / max(steps, 1) for k, v in totals.items() if k != "early_stopped"}
    stats_out["early_stopped"] = totals.get("early_stopped", 0.0)
    stats_out["steps"] = float(steps)
    return stats_out, skipped


NAMESPACES = {
    "value_loss": "value/loss", "value_clipfrac": "value/clipfrac", "value_mean": "value/mean",
    "entropy": "policy/entropy", "grad_norm": "policy/grad_norm", "early_stopped": "policy/early_stopped",
    "steps": "policy/optimizer_steps",
}


# ------------------------------------------------------------------------------------------
# The loop


def load_prompts(cfg: OnlineConfig, tokenizer: Any) -> tuple[list[PromptExample], list[list[int]]]:
    examples = load_prompt_examples(cfg.prompts)
    kept, ids = [], []
    for example in examples:
        encoded = encode_prompt_text(tokenizer, example.prompt, example.messages)
        if len(encoded) <= cfg.max_prompt_length:
            kept.append(example)
            ids.append(encoded)
    if len(kept) < len(examples):
        log.warning("%d of %d prompts are longer than max_prompt_length=%d and were dropped",
                    len(examples) - len(kept), len(examples), cfg.max_prompt_length)
    if not kept:
        raise ProxrlError(f"prompts: every prompt in {cfg.prompts} is longer than max_prompt_length={cfg.max_prompt_length}")
    return kept, ids


def prompt_order(n_prompts: int, batch: int, iteration: int, seed: int) -> list[int]:
    """The prompt indices of ``iteration`` (0-based): a fresh seeded permutation per pass over
    the data, so the data position is a pure function of the iteration (exact resume)."""
    start = iteration * batch
    order: list[int] = []
    while len(order) < batch:
        epoch, offset = divmod(start + len(order), n_prompts)
        permutation = torch.randperm(n_prompts, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)).tolist()
        order.extend(permutation[offset : offset + batch - len(order)])
    return order


def train_online(cfg: OnlineConfig, algo: Algorithm) -> dict[str, float]:
    """Run ``cfg.iterations`` of rollout → score → advantages → update for ``algo``."""
    # 1. Output directory, seeds, models, reward sources, prompts.
    output_dir = prepare_output_dir(cfg.output_dir, cfg.resume, cfg.overwrite)
    seed_everything(cfg.seed)
    rewards = load_rewards(cfg)  # first: a reward function that does not import fails fast
    models = load_models(cfg, algo)
    prompts, prompt_ids = load_prompts(cfg, models.tokenizer)
    save_config_file(cfg, output_dir / "config.yaml")

    # 2. Optimizers: the policy at learning_rate, the critic at its own rate.
    actor_params = [p for p in models.actor.parameters() if p.requires_grad]
    optimizers = [torch.optim.AdamW(actor_params, lr=cfg.learning_rate, weight_decay=0.0)]
    base_rates = [cfg.learning_rate]
    if models.critic is not None:
        critic_params = [p for p in models.critic.parameters() if p.requires_grad]
        optimizers.append(torch.optim.AdamW(critic_params, lr=algo.critic_learning_rate, weight_decay=0.0))
        base_rates.append(algo.critic_learning_rate)
    kl = kl_controller(cfg)
    generator = torch.Generator().manual_seed(cfg.seed)
    checkpoints = CheckpointManager(output_dir, keep=cfg.keep_checkpoints)
    logger = MetricsLogger(output_dir)

    def save(done: int) -> None:
        tensors = {"actor": trainable_state_dict(models.actor)}
        if models.critic is not None:
            tensors["critic"] = trainable_state_dict(models.critic)
        if cfg.ref_reset_every and models.reference is not None:
            tensors["reference"] = {k: v.detach().clone() for k, v in models.reference.state_dict().items()}
        state = {
            "iteration": done, "optimizers": [opt.state_dict() for opt in optimizers], "kl": kl.state_dict(),
            "penalty": algo.penalty.state_dict() if algo.penalty else {}, "rng": capture_rng_state(),
            "generator": generator.get_state(),
        }
        checkpoints.save(done, tensors, state)

    # 3. Resume: weights, optimizers, controllers, RNGs, iteration (which fixes the data position).
    start = 0
    if cfg.resume:
        latest = checkpoints.latest()
        if latest is None:
            raise ProxrlError(f"--resume: no complete checkpoint in {output_dir}")
        tensors, state = checkpoints.load(latest)
        models.actor.load_state_dict(tensors["actor"], strict=False)
        if models.critic is not None:
            models.critic.load_state_dict(tensors["critic"], strict=False)
        if "reference" in tensors and models.reference is not None:
            models.reference.load_state_dict(tensors["reference"])
        for opt, opt_state in zip(optimizers, state["optimizers"], strict=True):
            opt.load_state_dict(opt_state)
        kl.load_state_dict(state["kl"])
        if algo.penalty is not None:
            algo.penalty.load_state_dict(state["penalty"])
        restore_rng_state(state["rng"])
        generator.set_state(state["generator"])
        start = int(state["iteration"])
        logger.truncate_after(start)
        truncate_samples(output_dir, start)
        log.info("resumed from %s at iteration %d", latest, start)

    # 4. Iterate.
    last: dict[str, float] = {}
    consecutive_skips = 0
    with progress_bar(cfg.iterations, f"{algo.name}", completed=start, enabled=cfg.progress) as bar:
        for iteration in range(start, cfg.iterations):
            started = time.perf_counter()
            fraction_left = 1 - iteration / cfg.iterations if cfg.lr_schedule == "linear" else 1.0
            for opt, rate in zip(optimizers, base_rates, strict=True):
                for group in opt.param_groups:
                    group["lr"] = rate * fraction_left

            # 4a. Rollout: sample, score, forward passes, advantages.
            timings: dict[str, float] = {}
            order = prompt_order(len(prompts), cfg.rollout_batch_size, iteration, cfg.seed)
            models.actor.eval()
            experience, completions, row = collect_rollout(
                cfg, algo, models, rewards, [prompts[i] for i in order], [prompt_ids[i] for i in order], kl.value, timings
            )

            # 4b. Update: the critic alone during warm-up, then both.
            models.actor.train()
            started_update = time.perf_counter()
            train_policy = iteration >= algo.critic_warmup_iterations
            stats, skipped = update(cfg, algo, models, experience, optimizers, kl.value, train_policy, generator)
            timings["time/update_s"] = time.perf_counter() - started_update
            consecutive_skips = consecutive_skips + skipped if skipped and not stats["steps"] else 0
            if consecutive_skips >= cfg.max_consecutive_skips:
                raise ProxrlError(
                    f"stopped: {consecutive_skips} optimizer steps in a row had a non-finite loss or gradient; "
                    f"the last good checkpoint in {output_dir} is intact"
                )

            # 4c. Controllers: KL-in-reward β, PPO-Penalty β, reference reset.
            kl.update(row["objective/kl"], cfg.responses_per_iteration)
            if algo.penalty is not None and train_policy:
                algo.penalty.update(stats.get("approx_kl", 0.0))
                row["policy/penalty_beta"] = algo.penalty.value
            if cfg.ref_reset_every and (iteration + 1) % cfg.ref_reset_every == 0 and models.reference is not None:
                models.reference.load_state_dict(models.actor.state_dict())

            # 4d. Metrics, samples, checkpoint.
            mask = experience.response_mask.float()
            if algo.critic != "none":
                row["value/explained_var"] = explained_variance(experience.values, experience.returns, mask).item()
            for key, value in stats.items():
                row[NAMESPACES.get(key, key if "/" in key else f"policy/{key}")] = value
            row["guard/skipped_updates"] = float(skipped)
            elapsed = time.perf_counter() - started
            row["perf/tokens_per_s"] = mask.sum().item() / elapsed
            row["time/iteration_s"] = elapsed
            row.update(timings)
            last = logger.log(iteration + 1, row)
            if cfg.sample_every and (iteration % cfg.sample_every == 0 or iteration + 1 == cfg.iterations):
                write_samples(output_dir, iteration + 1, [prompts[i] for i in order for _ in range(cfg.group_size)], completions, experience.scores)
            bar.update(1, score=row["objective/scores"], kl=row["objective/kl"])
            if cfg.save_every and (iteration + 1) % cfg.save_every == 0 and iteration + 1 < cfg.iterations:
                save(iteration + 1)

    # 5. Final checkpoint and the policy (and critic) for transformers.
    if cfg.iterations > start:
        save(cfg.iterations)
    save_policy(models, output_dir)
    logger.close()
    return last


def truncate_samples(output_dir: Path, iteration: int) -> None:
    """Drop samples written after ``iteration`` (a resumed run writes them again)."""
    path = output_dir / "samples.jsonl"
    if path.exists():
        kept = [line for line in path.read_text(encoding="utf-8").splitlines() if json.loads(line)["iteration"] <= iteration]
        path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")


def write_samples(output_dir: Path, iteration: int, prompts: list[PromptExample], completions: list[str], scores: Tensor) -> None:
    with open(output_dir / "samples.jsonl", "a", encoding="utf-8") as f:
        for prompt, completion, score in zip(prompts, completions, scores.tolist(), strict=True):
            f.write(json.dumps({"iteration": iteration, "prompt": prompt.prompt, "completion": completion, "score": score}) + "\n")


def save_policy(models: Models, output_dir: Path) -> None:
    """The policy via ``save_pretrained`` (safetensors; a peft adapter under LoRA) plus the
    tokenizer; a separate critic under ``critic/``."""
    models.actor.save_pretrained(output_dir)
    models.tokenizer.save_pretrained(output_dir)
    if isinstance(models.critic, ValueHead):
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in models.critic.state_dict().items()}, str(output_dir / "value_head.safetensors"))
    elif models.critic is not None:
        models.critic.save_pretrained(output_dir / "critic")
