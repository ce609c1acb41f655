"""What the online algorithms share before any model is loaded: the config fields of
``proxrl ppo`` / ``proxrl grpo``. An option chosen by name takes its choices from its core
registry; other spellings of a name (TRL's, older ones) are accepted here only, in the alias
maps, and mapped to the registry's name before any lookup.

Batch semantics, stated once: an iteration samples ``rollout_batch_size`` prompts ×
``group_size`` responses; the update takes ``ppo_epochs`` passes over them in shuffled
minibatches of ``mini_batch_size`` responses, one optimizer step each, computed in
``grad_accum`` micro-batches.
"""

from __future__ import annotations

import functools
import logging
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, ClassVar

import tyro

from proxrl.algos.online.distill_fields import DistillFields
from proxrl.algos.online.heldout_fields import HeldOutFields
from proxrl.algos.online.placement_fields import PlacementFields
from proxrl.algos.online.samplers import ENGINES, SamplerChoice
from proxrl.core import (
    AGGREGATIONS,
    ENSEMBLE_COMBINATIONS,
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    NO_STOP_RULES,
    POLICY_LOSSES,
    ROLLOUT_CORRECTIONS,
    Aggregation,
    PolicyLossSettings,
    aggregation,
)
from proxrl.models.options import ModelRunConfig
from proxrl.registry import AppliesWith
from proxrl.rollout.prefix import unshared_reason
from proxrl.rollout.vllm_sampler import LORA_SYNCS
from proxrl.runtime import distributed as dist
from proxrl.runtime.config import check_knobs
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.fields import FREE_ON_RESUME, Range, alias

log = logging.getLogger(__name__)

DEFAULT_MINI_BATCH = 16  # responses per optimizer step when the batch allows it

LOSS_AGGREGATION_ALIASES = MappingProxyType(
    {
        "dapo": "token-mean",
        "bnpo": "token-mean",
        "grpo": "seq-mean-token-mean",
        "dr_grpo": "seq-mean-token-sum-norm",
    }
)
"""TRL's loss_type spellings of the aggregations → their names in ``core.AGGREGATIONS``."""


def canonical(name: str, aliases: Mapping[str, str]) -> str:
    """The registry's name for ``name``, a registry name or one of ``aliases``."""
    return aliases.get(name, name)


def _config_annotations(settings: type) -> dict[str, Any]:
    """The annotations of a core settings dataclass, its ``Bound`` the config's ``Range`` (TRL's
    spellings, ``epsilon`` and ``epsilon_high``, are in ``runtime.foreign_names``)."""
    hints = typing.get_type_hints(settings, include_extras=True)
    return {name: hints[name] for name in settings.__annotations__}


@dataclass
class PolicyLossFields(PolicyLossSettings):
    """The policy losses' knobs (``core.PolicyLossSettings``: clip, clip_high, dual_clip,
    sapo_tau_*) as config fields, each core ``Bound`` their range: a knob declared there
    reaches --help (its docstring), YAML and the range checks with no line here."""

    __annotations__ = _config_annotations(PolicyLossSettings)


PolicyLossChoice = POLICY_LOSSES.choice()
LossAggregationChoice = AGGREGATIONS.choice(aliases=LOSS_AGGREGATION_ALIASES)
RewardKLChoice = KL_ESTIMATORS.choice(exclude=("k3+",))  # k3+ differs from k3 in its gradient
RolloutCorrectionChoice = ROLLOUT_CORRECTIONS.choice(off=("none",))
RewardEnsembleChoice = ENSEMBLE_COMBINATIONS.choice()
NoStopChoice = NO_STOP_RULES.choice()
KLControllerChoice = KL_CONTROLLERS.choice()
LoraSyncChoice = LORA_SYNCS.choice()

HARMLESS_WHEN_UNUSED = MappingProxyType(
    {
        "clip": "TRL's epsilon: accepted whatever the loss, so a config moves between losses as is",
        "clip_high": "TRL's epsilon_high: accepted whatever the loss, as clip",
    }
)
"""The knobs accepted while no selected entry reads them (``runtime.config.check_knobs``),
each with the reason: every other knob of an entry the run has not chosen is refused."""


@dataclass
class OnlineRunFields(DistillFields, PlacementFields, HeldOutFields, ModelRunConfig):
    """The fields of ``OnlineConfig`` that come before the policy loss's knobs (a base of their
    own so that the knobs keep their place in --help and config.yaml)."""

    model: str = ""
    """Policy to start from (usually an SFT model): hub id or local directory."""
    prompts: str = ""
    """Prompt data: any row with a prompt, standard or conversational (docs/datasets.md); other
    fields reach reward functions."""
    rollouts_file: str | None = None
    """Train on trajectories produced elsewhere (JSONL, one per line, or .parquet, one per row:
    README "Rollouts from elsewhere"), read afresh each iteration, π_old their recorded
    log-probs; instead of prompts, sampling and rewards."""
    reward_model: tuple[str, ...] = ()
    """Reward model (num_labels=1 sequence classifier): hub id or local directory; several form
    an ensemble (one reward source: each standardised by its training scores, then combined)."""
    reward_fn: tuple[str, ...] = ()
    """Reward functions as module:function (one, or a list), called as TRL does: prompts=,
    completions= and the data's columns by keyword (by position without a completions
    parameter)."""
    reward_weights: Annotated[tuple[float, ...], Range()] = ()
    """Weight of each reward source, reward model (or ensemble) first (default: all 1)."""
    reward_ensemble: RewardEnsembleChoice = "mean"
    """How several reward models' standardised scores combine per response: mean, min, or
    mean − reward_ensemble_std_coef × their std."""
    reward_ensemble_std_coef: Annotated[float, Range(ge=0)] = 1.0
    """k of reward_ensemble mean_minus_std: how much the members' disagreement costs."""
    iterations: Annotated[int, Range(ge=1)] = 100
    """Rollout-and-update iterations."""
    save_every: int = 10
    """Save a checkpoint every this many iterations (0: only at the end; an exception saves the
    last finished one either way). Each holds the trained weights and AdamW's moments."""
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
    top_k: Annotated[int, Range(ge=0)] = 0
    """Sample among the k likeliest tokens (0: off)."""
    top_p: Annotated[float, Range(gt=0, le=1)] = 1.0
    """Nucleus sampling threshold (1: off)."""
    min_p: Annotated[float, Range(ge=0, lt=1)] = 0.0
    """Min-p sampling: keep tokens at least min_p times as likely as the likeliest (0: off).
    temperature, top_k, top_p, min_p apply in that order, to the sampler's draws and the
    trainer's log-probs alike (sampler vllm: not with top_p < 1, as it applies min-p first)."""
    stop_strings: tuple[str, ...] = ()
    """Strings that end a response besides EOS."""
    no_stop_penalty: Annotated[float | None, Range()] = None
    """Score for a response that hit max_new_tokens without stopping (None: no penalty)."""
    no_stop_mode: Annotated[NoStopChoice, AppliesWith("no_stop_penalty")] = "replace"
    """replace: the score becomes no_stop_penalty; subtract: no_stop_penalty is subtracted from
    it."""
    reward_clip: Annotated[float, Range(ge=0)] = 0.0
    """Clip scores to ±reward_clip (0: off)."""
    # DAPO's sampling-side options (Yu et al. 2025).
    overlong_buffer: Annotated[int, Range(ge=0)] = 0
    """DAPO overlong shaping: over the last N tokens before max_new_tokens the score loses
    overlong_penalty × (length − (max_new_tokens − N)) / N (0: off)."""
    overlong_penalty: Annotated[float, Range(ge=0), AppliesWith("overlong_buffer")] = 1.0
    """Score lost by a response that reaches max_new_tokens under overlong_buffer."""
    mask_truncated: bool = False
    """Leave responses that hit max_new_tokens without stopping out of the loss (their tokens
    get no gradient and do not count in any average)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose scores (after penalties and shaping) are all
    equal, sampling more prompts until rollout_batch_size groups are kept (group_size >= 2)."""
    max_sampling_rounds: Annotated[int, Range(ge=1), AppliesWith("dynamic_sampling")] = 4
    """dynamic_sampling: most sampling rounds per iteration, the first included; a batch still
    short after them is filled with dropped groups (counted in sampling/filled_groups)."""
    ppo_epochs: Annotated[int, Range(ge=1)] = 1
    """Passes over each rollout batch."""
    mini_batch_size: Annotated[int | None, Range(ge=1)] = None
    """Responses per optimizer step (None: the largest divisor of an iteration's responses up to
    16 that grad_accum divides)."""
    grad_accum: Annotated[int, Range(ge=1)] = 1
    """Micro-batches per optimizer step (mini_batch_size / grad_accum responses per forward)."""
    max_tokens_per_micro_batch: Annotated[int | None, Range(ge=0)] = None
    """Padding-free micro-batches: rows packed into forwards of at most this many real tokens
    (a longer row alone), results equal to the padded path's (0: grad_accum padded forwards).
    None: packed at micro_batch_size × the batch's longest row (no more real tokens than a
    padded micro-batch has positions), except where shared_prefix forwards a group's prompt once
    (the larger saving), under FSDP, and for a distill_loss that reads logits: padded there.
    A reward model's scoring packs alike (None: 64 rows × the longest; padded under FSDP)."""
    learning_rate: Annotated[float, Range(gt=0)] = 1e-6
    """Policy learning rate (AdamW)."""


@dataclass
class OnlineConfig(PolicyLossFields, OnlineRunFields):
    """Fields shared by ``proxrl ppo`` and ``proxrl grpo``."""

    loss_aggregation: Annotated[LossAggregationChoice, alias("loss_agg")] = "token-mean"
    """How per-token losses reduce to a step's loss, normalised over the whole mini-batch:
    token-mean (DAPO; = TRL dapo, bnpo), seq-mean-token-mean (GRPO; = grpo), seq-mean-token-sum,
    seq-mean-token-sum-norm (Dr. GRPO: ÷ max_new_tokens; = dr_grpo)."""
    policy_loss: Annotated[PolicyLossChoice, alias("policy_loss_type")] = "ppo"
    """Surrogate: ppo (token ratio, clipped), gspo / gspo_token (sequence ratio, Zheng et al.
    2025), cispo (clipped stop-gradient IS weight × log π, MiniMax-M1), sapo (token ratio
    through a soft sigmoid gate, Gao et al. 2025; sapo_tau_pos / sapo_tau_neg)."""
    kl_coef: Annotated[float, Range(ge=0)] = 0.05
    """Initial coefficient β of the KL to the reference policy."""
    kl_estimator: RewardKLChoice = "k1"
    """Per-token KL estimator for the KL paid in the reward."""
    kl_controller: KLControllerChoice = "fixed"
    """fixed β, or the proportional controller of Ziegler et al. (InstructGPT)."""
    kl_target: Annotated[float, Range(gt=0)] = 6.0
    """Target sequence KL of the proportional controller."""
    kl_horizon: Annotated[int, Range(ge=1)] = 10000
    """Horizon (in samples) of the proportional controller."""
    entropy_coef: Annotated[float, Range(ge=0)] = 0.0
    """Entropy bonus coefficient (entropy is logged either way)."""
    early_stop_kl: Annotated[float | None, Range(ge=0)] = None
    """Stop an iteration's epochs once approx-KL(π_old‖π) exceeds this (None: never; 0, the
    older spelling of off, still means never)."""
    ref_reset_every: Annotated[int, Range(ge=0)] = 0
    """Copy the policy into the reference every N iterations (0: never)."""
    sample_every: Annotated[int, Range(ge=0)] = 10
    """Write sampled prompts, completions and scores to samples.jsonl every N iterations (0:
    never)."""
    sampler: SamplerChoice = "cached"
    """cached: a lean decoding loop over the KV cache; hf: transformers' generate (always used
    with stop_strings); vllm: a vLLM engine in this process (in the environment make setup-vllm
    builds)."""
    # The engine's memory budget, the first thing to lower after it ran out of memory: it bounds
    # how many sequences decode at once, not what any of them decodes.
    vllm_gpu_memory_utilization: Annotated[float, Range(gt=0, le=1), FREE_ON_RESUME] = 0.3
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
    vllm_lora_sync: LoraSyncChoice = "merged"
    """sampler vllm with lora_r > 0: after each update send the engine every weight with the LoRA
    merged in (merged), or the adapter alone, applied by vLLM's LoRA layers (adapter; not with
    placement ray): a sync of ~0 s, but on a CPU each sampled token ~2× dearer, so it pays only
    below ~130–300 sampled tokens per update at Qwen2-0.5B's shape."""
    shared_prefix: Annotated[bool | None, tyro.conf.DisallowNone] = None  # a switch
    """Run a group's prompt once: the cached sampler prefills it once and expands its KV cache to
    the group's rows, and the padded training passes (policy, π_old, reference, teacher,
    separate critic) forward it once, each response attending to its keys and values (its
    gradient the sum over the group). The same results as repeating it, up to float rounding.
    It cannot apply with several processes, under gradient_checkpointing, in packed
    micro-batches (max_tokens_per_micro_batch > 0) or with group_size 1 (None: on wherever it
    applies, and the run says in one line at start-up where it does not; true: refused where it
    cannot apply; false: every row repeats its prompt). compile_sampler's loop repeats it."""
    compile_sampler: bool = False
    """cached sampler: run its decoding step through torch.compile over a static KV cache. A
    compile (seconds) per rollout batch size and 64-token length bucket, then cheaper steps: for
    long runs of small models."""
    track_kl: bool = True
    """Compute the KL to the reference even when kl_coef is fixed at 0 (one reference forward
    pass per iteration); false loads no reference model then and logs no objective/kl."""
    sampler_logprobs: Annotated[bool | None, tyro.conf.DisallowNone] = None  # a switch
    """Take log π_old from the sampler's logits instead of a second forward pass: one pass
    fewer per iteration, but π_old then differs from the trainer's own numbers by float
    rounding (KV-cache vs full pass), so the first ratio is not exactly 1. With a
    rollout_correction, π_old is the trainer's and the sampler's log-probs give the weights
    (None: true with async_rollout, whose engine alone knows the behaviour policy, else false)."""
    skip_old_logprobs_pass: bool = True
    """Skip the rollout's forward pass for log π_old where π_old is π at the update's only
    optimizer step (old_policy.old_logprobs_pass lists when): the update's own forward gives it and
    the ratio is exactly 1. False: always run the pass."""
    rollout_correction: RolloutCorrectionChoice = "none"
    """With sampler_logprobs: weigh each token's policy loss by ρ = π_old/π_sampler (one extra
    forward pass for the trainer's π_old). tis / seq_tis: min(ρ, cap) per token / per response;
    mis / seq_mis: ρ, or 0 above cap; icepop: ρ, or 0 outside [rollout_correction_low, cap]."""
    rollout_correction_cap: Annotated[float, Range(gt=1)] = 2.0
    """Upper bound C on the correction's ratio (TIS's C; IcePop's β)."""
    rollout_correction_low: Annotated[float, Range(gt=0, lt=1)] = 0.5
    """icepop: lower bound α on the token ratio."""
    offload_frozen_roles: bool = False
    """Keep the reference, teacher and reward models on the CPU (their forward passes run
    there), freeing accelerator memory for the actor and critic."""
    environment: str | None = None
    """Multi-turn episodes: a module:factory whose factory() makes each episode's Environment
    (rollout/environment.py; None: single-turn responses)."""
    max_turns: Annotated[int, Range(ge=1), AppliesWith("environment")] = 4
    """environment: most model turns per episode."""
    max_episode_tokens: Annotated[int, Range(ge=1), AppliesWith("environment")] = 512
    """environment: most model + observation tokens per episode after its prompt (a model turn
    also stops at max_new_tokens)."""
    tool_call_format: str = "hermes"
    """environment: how tool calls are parsed from a model turn: hermes (Hermes / Qwen 2.5:
    <tool_call>{"name": ..., "arguments": {...}}</tool_call>)."""

    def __post_init__(self) -> None:
        if self.sampler_logprobs is None:
            self.sampler_logprobs = self.async_rollout
            if self.async_rollout:
                log.info(
                    "async_rollout: sampler_logprobs true (the engine that sampled gives "
                    "the behaviour policy's log-probs)"
                )
        if self.reward_model is None or isinstance(self.reward_model, str):  # Python callers
            self.reward_model = () if self.reward_model is None else (self.reward_model,)
        # One reward function alone, as TRL's reward_funcs takes it: "m:f" means ("m:f",).
        if isinstance(self.reward_fn, str):
            self.reward_fn = (self.reward_fn,)
        if isinstance(self.reward_weights, (int, float)):
            self.reward_weights = (float(self.reward_weights),)

    @property
    def task_reward(self) -> bool:
        """Whether responses are scored by a task reward (else a teacher alone trains them)."""
        sources = self.reward_model or self.reward_fn or self.environment is not None
        return bool(sources or self.rollouts_file is not None)

    @property
    def responses_per_iteration(self) -> int:
        return self.rollout_batch_size * self.group_size

    @property
    def responses_per_step(self) -> int:
        """mini_batch_size, or by default one that follows the batch the user chose: the largest
        divisor of responses_per_iteration up to 16 (16 itself for the default batch) that
        grad_accum divides."""
        if self.mini_batch_size is not None:
            return self.mini_batch_size
        n, cap = self.responses_per_iteration, max(DEFAULT_MINI_BATCH, self.grad_accum)
        fits = [d for d in range(self.grad_accum, cap + 1, self.grad_accum) if n % d == 0]
        return max(fits, default=n)

    @property
    def micro_batch_size(self) -> int:
        return self.responses_per_step // self.grad_accum

    @property
    def aggregation(self) -> Aggregation:
        """``loss_aggregation`` bound to Dr. GRPO's constant horizon, the generation budget."""
        mode = canonical(self.loss_aggregation, LOSS_AGGREGATION_ALIASES)
        return aggregation(mode, self.response_horizon)

    @property
    def lora_sync(self) -> str:
        """How the policy reaches a vLLM engine (``vllm_sampler.LORA_SYNCS``): the whole weights
        without LoRA (no adapter to send), else ``vllm_lora_sync``."""
        return self.vllm_lora_sync if self.lora_r else "merged"

    @property
    def response_horizon(self) -> int:
        """The most tokens a response holds: max_new_tokens, or a whole episode's budget."""
        return self.max_new_tokens if self.environment is None else self.max_episode_tokens

    harmless_when_unused: ClassVar[Mapping[str, str]] = HARMLESS_WHEN_UNUSED
    # shared_prefix was a bool, true by default, before true meant "refused where it cannot
    # apply": a run saved then holds true, read back on --resume as unset (what it meant).
    former_defaults: ClassVar[Mapping[str, Any]] = MappingProxyType({"shared_prefix": True})

    @property
    def shares_prefix(self) -> bool:
        """Whether the passes forward a group's prompt once wherever they can (shared_prefix
        unset or true; ``prefix_off`` says where they cannot)."""
        return self.shared_prefix is not False

    def prefix_off(self) -> str | None:
        """Why this run's passes repeat each prompt although ``shared_prefix`` is on, or None
        where they forward a group's prompt once (``rollout.prefix.unshared_reason``)."""
        return unshared_reason(
            dist.world_size(),
            self.gradient_checkpointing,
            self.max_tokens_per_micro_batch or 0,
            alone=self.group_size == 1 and self.rollouts_file is None,
        )

    def validate(self) -> None:
        super().validate()
        self.validate_options()
        self.validate_held_out()
        self.validate_placement(
            bool(self.sampler_logprobs),
            self.dynamic_sampling,
            separate_critic=getattr(self, "critic", None) == "separate",
        )
        self._check_inputs()
        self.validate_distill(bool(self.max_tokens_per_micro_batch))
        self._check_rewards()
        self._check_batches()
        self._check_correction()
        self._check_dynamic_sampling()

    def validate_options(self, open_choices: tuple[str, ...] = ()) -> None:
        """The rules between the options themselves, not the run's inputs (its prompts, reward
        sources, environment): what a ``TrainingClient``, whose user brings those to each call,
        checks too. ``open_choices``: choice fields picked per call (the client's loss)."""
        check_knobs(self, open_choices)
        self._check_dual_clip()
        self._check_kl()
        self._check_sampler()
        self._check_shaping()
        self._check_shared_prefix()

    def _check_shared_prefix(self) -> None:
        """An explicit shared_prefix true where it cannot apply (unset: said at start-up)."""
        if self.shared_prefix is not True:
            return
        reason = self.prefix_off()
        if reason is not None:
            raise ProxrlError(
                f"shared_prefix: true cannot apply to this run ({reason}); leave it unset (on "
                "wherever it applies) or set it false"
            )

    def _check_inputs(self) -> None:
        """A model, prompts, something that scores, and an environment that loads (or a
        rollouts file, which brings its prompts and scores)."""
        if not self.model:
            raise ProxrlError("model: expected a hub id or a local directory")
        if self.rollouts_file is not None:
            return self._check_rollouts_file(self.rollouts_file)
        if not self.prompts:
            raise ProxrlError("prompts: expected a prompt file, directory or datasets name")
        task_reward = self.task_reward
        if not task_reward and not self.distills:
            raise ProxrlError(
                "reward_model / reward_fn: give a reward model, a reward function, or both (or "
                "a teacher_model alone)"
            )
        if not task_reward and self.dynamic_sampling:
            raise ProxrlError(
                "dynamic_sampling: with a teacher_model alone every response scores 0, so every "
                "group would be dropped; give a reward source or set it false"
            )
        from proxrl.rollout.environment import (
            load_environment_factory,
            new_environment,
            tool_call_parser,
        )

        tool_call_parser(self.tool_call_format)  # checked whether or not an environment is set
        if self.environment is not None:  # one environment made now: a bad factory fails here
            new_environment(load_environment_factory(self.environment), self.tool_call_format)
            if self.overlong_buffer:
                raise ProxrlError(
                    "overlong_buffer: measures one response against max_new_tokens, not an "
                    "episode; set it 0 with environment"
                )

    def _check_rollouts_file(self, path: str) -> None:
        """A rollouts file brings the prompts, the responses and their scores: nothing else
        may claim to."""
        given = {
            "prompts": bool(self.prompts),
            "reward_model": bool(self.reward_model),
            "reward_fn": bool(self.reward_fn),
            "environment": self.environment is not None,
            "dynamic_sampling": self.dynamic_sampling,
            # the file replaces the engines Ray would place (several processes: torchrun)
            "placement": self.ray_actors,
        }
        clash = next((name for name, on in given.items() if on), None)
        if clash is not None:
            raise ProxrlError(
                f"{clash}: not with rollouts_file (the file brings the prompts, the responses "
                "and their scores)"
            )
        if not Path(path).is_file():
            raise ProxrlError(f"rollouts_file: {path} is not a file")

    def _check_rewards(self) -> None:
        """One weight per reward source, not all 0."""
        sources = bool(self.reward_model) + len(self.reward_fn)
        if self.reward_weights and len(self.reward_weights) != sources:
            raise ProxrlError(
                f"reward_weights: expected {sources} weights (one per reward source), "
                f"got {len(self.reward_weights)}"
            )
        if self.reward_weights and not any(self.reward_weights):
            raise ProxrlError("reward_weights: every weight is 0, so no reward reaches the policy")

    def _check_dual_clip(self) -> None:
        """The dual clip bounds the loss only past the clip range."""
        high = "clip" if self.clip_high is None else "clip_high"
        upper = 1 + self.upper_clip
        if self.dual_clip is not None and self.dual_clip <= upper:
            # Below 1 + ε it would cut the loss inside the clip range, not only past it.
            raise ProxrlError(
                f"dual_clip: expected > 1 + {high} = {upper:g} (it bounds the loss only past the "
                f"clip range), got {self.dual_clip}"
            )

    def _check_kl(self) -> None:
        if KL_CONTROLLERS.trait(self.kl_controller, "adapts") and self.kl_coef == 0:
            raise ProxrlError(
                f"kl_coef: the {self.kl_controller} controller scales β, so it cannot start from 0"
            )

    def _check_batches(self) -> None:
        """The optimizer step divides the iteration, the micro-batches divide the step."""
        step = self.responses_per_step
        if self.responses_per_iteration % step:
            raise ProxrlError(
                f"mini_batch_size: {step} does not divide the "
                f"{self.responses_per_iteration} responses of an iteration "
                f"(rollout_batch_size {self.rollout_batch_size} × group_size {self.group_size})"
            )
        if step % self.grad_accum:
            raise ProxrlError(
                f"grad_accum: {self.grad_accum} does not divide mini_batch_size {step}"
                + ("" if self.mini_batch_size else " (the default: give mini_batch_size)")
            )

    def _check_sampler(self) -> None:
        """What each sampler can do (its traits)."""
        trait = functools.partial(ENGINES.trait, self.sampler)
        if trait("min_p_first") and self.min_p > 0 and self.top_p < 1:
            raise ProxrlError(  # the trainer replays generate's order (core.truncate_logits)
                f"min_p: sampler {self.sampler} applies min-p before top-p, the trainer after it "
                f"(as generate), so with top_p {self.top_p} they would score different "
                "distributions; set min_p 0 or top_p 1, or use sampler cached"
            )
        if trait("needs_vllm"):
            from proxrl.rollout.vllm_sampler import INSTALL, vllm_available

            if not vllm_available():
                raise ProxrlError(f"sampler: {self.sampler} needs the vllm package: {INSTALL}")
        if trait("token_ids_only") and self.stop_strings:
            raise ProxrlError(
                f"stop_strings: sampler {self.sampler} sees token ids only; use sampler hf"
            )
        ray_sync = LORA_SYNCS.trait(self.vllm_lora_sync, "ray")
        if trait("needs_vllm") and self.lora_r and self.ray_actors and not ray_sync:
            raise ProxrlError(  # its engine actors are sent merged weights (ray_weights)
                f"vllm_lora_sync: {self.vllm_lora_sync} is not available with placement ray; "
                "use merged"
            )
        if self.compile_sampler and self.stop_strings:
            raise ProxrlError(
                "compile_sampler: not with stop_strings (generate runs those, not the cached loop)"
            )

    def _check_correction(self) -> None:
        """A rollout correction weighs recorded log-probs: the sampler's or a file's (a
        client's recorded rollouts bring theirs per call)."""
        recorded = self.sampler_logprobs or self.rollouts_file is not None
        if self.rollout_correction != "none" and not recorded:
            raise ProxrlError(
                f"rollout_correction: {self.rollout_correction} corrects the sampler's log-probs; "
                "set sampler_logprobs true (or rollout_correction none)"
            )

    def _check_dynamic_sampling(self) -> None:
        if self.dynamic_sampling and self.group_size < 2:
            raise ProxrlError(
                f"dynamic_sampling: needs groups of at least 2 responses, got group_size "
                f"{self.group_size}"
            )

    def _check_shaping(self) -> None:
        """DAPO's overlong buffer; the reference a LoRA run keeps."""
        if self.overlong_buffer > self.max_new_tokens:
            raise ProxrlError(
                f"overlong_buffer: {self.overlong_buffer} exceeds max_new_tokens "
                f"{self.max_new_tokens}"
            )
        if self.lora_r and self.ref_reset_every:
            raise ProxrlError(
                "ref_reset_every: not available with lora_r > 0 (the reference is the base model)"
            )
