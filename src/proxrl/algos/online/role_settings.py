"""What loading and placing the online run's roles reads of its options: small frozen records,
built once from the config when the run opens (``roles.role_settings``) and handed to the
loaders (``roles.load_*``, a critic's ``load``), the placement and its Ray actors, so that none
of them takes the whole config. Each field is the config's option of the same name
(``runtime.config.narrowed``) unless its comment says what it is derived from.

This module is below the config (``samplers`` reads ``EngineSettings``, and the config takes
its sampler choices from ``samplers``): it imports nothing of it."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from proxrl.models.options import autocast
from proxrl.rollout.generation import SamplingSettings


@dataclass(frozen=True)
class Loading:
    """How every ``from_pretrained`` of the run loads a model (``ModelRunConfig``'s options)."""

    dtype: str
    attn_implementation: str | None
    trust_remote_code: bool

    def loader_kwargs(self) -> dict[str, Any]:
        """The keywords every ``from_pretrained`` call of the run shares."""
        return {
            "dtype": self.dtype,
            "attn_implementation": self.attn_implementation,
            "trust_remote_code": self.trust_remote_code,
        }


@dataclass(frozen=True)
class ModelSettings:
    """What loading the policy, the reference, the teacher and the critic reads
    (``roles.load_models``, a critic's ``load``, the Ray role actors)."""

    model: str  # the policy (its tokenizer is every role's)
    loading: Loading
    gradient_checkpointing: bool  # (the trained roles)
    mixed_precision: str  # the forward passes' autocast (``autocast``)
    lora_r: int  # the policy trains as LoRA adapters (its reference: the adapters off)
    lora_alpha: float
    tracks_kl: bool  # derived: the run measures the KL to a reference (False: β fixed at 0)
    teacher_model: str | None
    distill_loss: str
    reward_model: tuple[str, ...]  # where a separate critic starts by default (critic_start)

    def autocast(self) -> AbstractContextManager[None]:
        """The context every forward pass runs in (``models.options.autocast``)."""
        return autocast(self.mixed_precision)


@dataclass(frozen=True)
class RewardSettings:
    """What loading the reward sources reads (``roles.load_rewards``)."""

    reward_model: tuple[str, ...]
    reward_fn: tuple[str, ...]
    reward_weights: tuple[float, ...]
    reward_ensemble: str
    reward_ensemble_std_coef: float
    max_tokens_per_micro_batch: int | None  # a reward model's batches (None: packed from their
    # own lengths; 0: padded)
    shares_prefix: bool  # derived (``OnlineConfig.shares_prefix``): a group's prompt once
    model: str  # the policy, whose tokenizer each reward model's is judged against
    loading: Loading


@dataclass(frozen=True)
class EngineSettings:
    """What building the run's sampling engine reads (``samplers.make_engine``)."""

    sampler: str
    stop_strings: tuple[str, ...]
    compile_sampler: bool
    shares_prefix: bool  # derived (``OnlineConfig.shares_prefix``): a group's prompt once
    model: str  # where a vLLM engine starts
    dtype: str
    lora_r: int
    lora_sync: str  # derived (``OnlineConfig.lora_sync``): how the policy reaches vLLM
    vllm_gpu_memory_utilization: float
    vllm_max_model_length: int | None
    vllm_tensor_parallel_size: int
    vllm_enforce_eager: bool
    vllm_enable_prefix_caching: bool


@dataclass(frozen=True)
class PromptSettings:
    """What loading the run's prompts reads (``roles.load_prompts``)."""

    prompts: str
    max_prompt_length: int
    environment: str | None  # (the tools an episode's environment offers the prompts)
    tool_call_format: str


@dataclass(frozen=True)
class LaunchAhead:
    """What launching batches ahead of their iteration reads (async_rollout under placement
    ray: ``ray_run.RayEngines``)."""

    max_staleness: int
    iterations: int
    rollout_batch_size: int
    group_size: int
    seed: int
    sampling: SamplingSettings  # the run's distribution (``narrowed`` from the config)


@dataclass(frozen=True)
class RaySettings:
    """What ``placement: ray`` reads: the cluster, each role actor's CPUs and GPUs (by the
    ``ray_<role>_<unit>`` names), and which roles have an actor."""

    ray_address: str
    ray_trainer_processes: int
    ray_engines: int
    ray_engine_restarts: int
    ray_weight_transport: str
    ray_trainer_cpus: float
    ray_trainer_gpus: float
    ray_engine_cpus: float
    ray_engine_gpus: float
    ray_reward_cpus: float
    ray_reward_gpus: float
    ray_reference_cpus: float
    ray_reference_gpus: float
    ray_teacher_cpus: float
    ray_teacher_gpus: float
    ray_critic_cpus: float
    ray_critic_gpus: float
    output_dir: str  # named when an actor dies
    reference_actor: bool  # derived: a reference model of its own (not under LoRA)
    teacher_actor: bool  # derived: a teacher scoring the sampled tokens (not gjsd's)
    critic_actor: bool  # derived: a separate value model (``critic: separate``)
    ahead: LaunchAhead | None  # derived: None without async_rollout


@dataclass(frozen=True)
class RoleSettings:
    """Everything loading and placing the roles reads, built once (``roles.role_settings``)."""

    models: ModelSettings
    rewards: RewardSettings
    engine: EngineSettings
    prompts: PromptSettings
    ray: RaySettings
