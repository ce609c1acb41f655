"""What the online algorithms share before any model is loaded: the config fields of
``proxrl ppo`` / ``proxrl grpo`` and the ``Algorithm`` record of an algorithm's choices.

Batch semantics, stated once: an iteration samples ``rollout_batch_size`` prompts ×
``group_size`` responses; the update takes ``ppo_epochs`` passes over them in shuffled
minibatches of ``mini_batch_size`` responses, one optimizer step each, computed in
``grad_accum`` micro-batches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Literal

from torch import Tensor

from proxrl.algos.online.critic import CriticLoader, NoCritic
from proxrl.core import AdaptiveKL
from proxrl.models.options import ModelRunConfig
from proxrl.rollout.experience import Experience
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.fields import Range


@dataclass
class OnlineConfig(ModelRunConfig):
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
    iterations: Annotated[int, Range(ge=1)] = 100
    """Rollout-and-update iterations."""
    rollout_batch_size: Annotated[int, Range(ge=1)] = 16
    """Prompts sampled per iteration."""
    group_size: Annotated[int, Range(ge=1)] = 1
    """Responses sampled per prompt."""
    max_prompt_length: Annotated[int, Range(ge=1)] = 256
    """Longest prompt in tokens; longer prompts are dropped (counted in the log)."""
    max_new_tokens: Annotated[int, Range(ge=1)] = 64
    """Longest response in tokens."""
    temperature: Annotated[float, Range(gt=0)] = 0.7
    """Sampling temperature; log-probs are computed from logits divided by it."""
    top_k: int = 0
    """Sample among the k likeliest tokens (0: off)."""
    top_p: Annotated[float, Range(gt=0, le=1)] = 1.0
    """Nucleus sampling threshold (1: off)."""
    stop_strings: tuple[str, ...] = ()
    """Strings that end a response besides EOS."""
    no_stop_penalty: float | None = None
    """Score for a response that hit max_new_tokens without stopping (None: no penalty)."""
    no_stop_mode: Literal["replace", "subtract"] = "replace"
    """replace: the score becomes no_stop_penalty; subtract: no_stop_penalty is subtracted from
    it."""
    reward_clip: float = 0.0
    """Clip scores to ±reward_clip (0: off)."""
    ppo_epochs: Annotated[int, Range(ge=1)] = 1
    """Passes over each rollout batch."""
    mini_batch_size: Annotated[int, Range(ge=1)] = 16
    """Responses per optimizer step."""
    grad_accum: Annotated[int, Range(ge=1)] = 1
    """Micro-batches per optimizer step (mini_batch_size / grad_accum responses per forward)."""
    learning_rate: Annotated[float, Range(gt=0)] = 1e-6
    """Policy learning rate (AdamW)."""
    clip: float = 0.2
    """PPO clip range ε (lower side)."""
    clip_high: float | None = None
    """Upper clip range (default: clip); DAPO uses 0.28."""
    dual_clip: float | None = None
    """Dual-clip bound c > 1 on negative-advantage losses (None: off)."""
    loss_agg: Literal[
        "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
    ] = "token-mean"
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
    early_stop_kl: Annotated[float | None, Range(ge=0)] = None
    """Stop an iteration's epochs once approx-KL(π_old‖π) exceeds this (None: never; 0, the
    older spelling of off, still means never)."""
    ref_reset_every: int = 0
    """Copy the policy into the reference every N iterations (0: never)."""
    sample_every: int = 10
    """Write sampled prompts, completions and scores to samples.jsonl every N iterations."""
    sampler: Literal["cached", "hf", "vllm"] = "cached"
    """cached: a lean decoding loop over the KV cache; hf: transformers' generate (always used
    with stop_strings); vllm: a vLLM engine in this process (pip install -e .[vllm])."""
    vllm_gpu_memory_utilization: Annotated[float, Range(gt=0, le=1)] = 0.3
    """sampler vllm: share of the GPU's memory the engine takes for weights and KV cache (on a
    CPU: share of the RAM for its KV cache)."""
    vllm_max_model_length: Annotated[int | None, Range(ge=1)] = None
    """sampler vllm: longest prompt + response the engine holds, in tokens (None: the model's)."""
    vllm_tensor_parallel_size: Annotated[int, Range(ge=1)] = 1
    """sampler vllm: GPUs the engine shards the model over (1 on a CPU)."""
    vllm_enforce_eager: bool = True
    """sampler vllm: skip CUDA graphs / torch.compile (a faster start, slower steps on a GPU)."""
    vllm_enable_prefix_caching: bool = True
    """sampler vllm: reuse the KV cache of a shared prompt (a GRPO group's) across requests."""
    compile_sampler: bool = False
    """cached sampler: run its decoding step through torch.compile over a static KV cache. A
    compile (seconds) per rollout batch size and 64-token length bucket, then cheaper steps: for
    long runs of small models."""
    track_kl: bool = True
    """Compute the KL to the reference even when kl_coef is fixed at 0 (one reference forward
    pass per iteration); false loads no reference model then and logs no objective/kl."""
    sampler_logprobs: bool = False
    """Take log π_old from the sampler's logits instead of a second forward pass: one pass
    fewer per iteration, but π_old then differs from the trainer's own numbers by float
    rounding (KV-cache vs full pass), so the first ratio is not exactly 1."""
    offload_frozen_roles: bool = False
    """Keep the reference and reward models on the CPU (their forward passes run there), freeing
    accelerator memory for the actor and critic."""

    @property
    def responses_per_iteration(self) -> int:
        return self.rollout_batch_size * self.group_size

    @property
    def micro_batch_size(self) -> int:
        return self.mini_batch_size // self.grad_accum

    def validate(self) -> None:
        super().validate()
        if not self.model:
            raise ProxrlError("model: expected a hub id or a local directory")
        if not self.prompts:
            raise ProxrlError("prompts: expected a prompt file, directory or datasets name")
        if self.reward_model is None and not self.reward_fn:
            raise ProxrlError(
                "reward_model / reward_fn: give a reward model, a reward function, or both"
            )
        sources = (self.reward_model is not None) + len(self.reward_fn)
        if self.reward_weights and len(self.reward_weights) != sources:
            raise ProxrlError(
                f"reward_weights: expected {sources} weights (one per reward source), "
                f"got {len(self.reward_weights)}"
            )
        if self.responses_per_iteration % self.mini_batch_size:
            raise ProxrlError(
                f"mini_batch_size: {self.mini_batch_size} does not divide the "
                f"{self.responses_per_iteration} responses of an iteration "
                f"(rollout_batch_size {self.rollout_batch_size} × group_size {self.group_size})"
            )
        if self.mini_batch_size % self.grad_accum:
            raise ProxrlError(
                f"grad_accum: {self.grad_accum} does not divide "
                f"mini_batch_size {self.mini_batch_size}"
            )
        if self.sampler == "vllm":
            from proxrl.rollout.vllm_sampler import INSTALL, vllm_available

            if not vllm_available():
                raise ProxrlError(f"sampler: vllm needs the vllm package: {INSTALL}")
            if self.stop_strings:
                raise ProxrlError("stop_strings: sampler vllm sees token ids only; use sampler hf")
        if self.compile_sampler and (self.sampler != "cached" or self.stop_strings):
            raise ProxrlError(
                "compile_sampler: needs sampler=cached without stop_strings (generate runs those)"
            )
        if self.lora_r and self.ref_reset_every:
            raise ProxrlError(
                "ref_reset_every: not available with lora_r > 0 (the reference is the base model)"
            )


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
    """Also decode each prompt greedily and score it (ReMax's baseline), in
    ``Experience.greedy_scores``."""
    critic: CriticLoader = NoCritic.load
    """Loads the critic (``critic.CRITICS[option]`` bound to its settings; none by default)."""
    penalty: AdaptiveKL | None = None
    """PPO-Penalty's adaptive β on KL(π_old‖π), updated after each iteration."""
