"""Which engine an online run samples its responses from (``sampler:``): one table, each entry
building a ``rollout.engines.RolloutEngine`` from what the run's engine reads of its options
(``role_settings.EngineSettings``; the config takes its ``sampler`` choices and their knobs from
this table, so this module is below it)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from proxrl.algos.online.role_settings import EngineSettings
from proxrl.models.lora import adapter_base
from proxrl.registry import Registry
from proxrl.rollout.engines import PolicySampling, RolloutEngine, VLLMEngine
from proxrl.rollout.generation import Sampler
from proxrl.runtime import distributed as dist
from proxrl.runtime.errors import ProxrlError


def lora_sync(name: str) -> Any:
    """How the engine gets the policy after an update (``vllm_sampler.LORA_SYNCS[name]``;
    ``EngineSettings.lora_sync``)."""
    from proxrl.rollout.vllm_sampler import LORA_SYNCS

    return LORA_SYNCS[name]


def engine_options(settings: EngineSettings) -> Any:
    from proxrl.rollout.vllm_sampler import EngineOptions, lora_slot_rank

    slots = lora_sync(settings.lora_sync).lora_slots
    return EngineOptions(
        # an adapter directory: the engine starts from its base; the first sync brings the rest
        model=adapter_base(os.path.expanduser(settings.model)) or settings.model,
        dtype=settings.dtype,
        gpu_memory_utilization=settings.vllm_gpu_memory_utilization,
        max_model_length=settings.vllm_max_model_length,
        tensor_parallel_size=settings.vllm_tensor_parallel_size,
        enforce_eager=settings.vllm_enforce_eager,
        enable_prefix_caching=settings.vllm_enable_prefix_caching,
        max_lora_rank=lora_slot_rank(settings.lora_r) if slots else None,
    )


def _vllm(settings: EngineSettings, tokenizer: Any, engines: Any) -> RolloutEngine:
    if dist.world_size() > 1:
        raise ProxrlError("sampler: vllm runs in one process for now; launch it without accelerate")
    sync = lora_sync(settings.lora_sync)
    return VLLMEngine(engine_options(settings), tokenizer, sync, engines)


ENGINES: Registry[Callable[[EngineSettings, Any, Any], RolloutEngine]] = Registry("sampler")
"""``sampler`` → (the run's ``EngineSettings``, tokenizer, the caller's
``vllm_sampler.EngineCache`` or None) → the
engine (the built-in samplers start nothing, so keep nothing); ``hf`` whenever stop strings need
generate's text matching. Traits: ``token_ids_only`` (no stop strings), ``min_p_first`` (min-p
before top-p, unlike generate), ``needs_vllm`` (the vllm package), ``own_kernels`` (the engine
computes with kernels of its own, not the trainer's module: where the trainer runs the π_old
pass, the engine's log-probs of the sampled tokens are asked for too and measured against it,
``rollout/mismatch_kl``)."""
ENGINES.add(
    "cached",
    lambda settings, tok, engines: PolicySampling(
        tok, compile_step=settings.compile_sampler, shared_prefill=settings.shares_prefix
    ),
    "a lean decoding loop over the KV cache",
    knobs=("compile_sampler",),
)
ENGINES.add(
    "hf",
    lambda settings, tok, engines: PolicySampling(tok, generate=True),
    "transformers' generate",
)
ENGINES.add(
    "vllm",
    _vllm,
    "a vLLM engine in this process",
    knobs=(
        "vllm_gpu_memory_utilization",
        "vllm_max_model_length",
        "vllm_tensor_parallel_size",
        "vllm_enforce_eager",
        "vllm_enable_prefix_caching",
        "vllm_lora_sync",
    ),
    token_ids_only=True,
    min_p_first=True,
    needs_vllm=True,
    own_kernels=True,
)
SamplerChoice = ENGINES.choice()


def make_engine(settings: EngineSettings, tokenizer: Any, engines: Any = None) -> RolloutEngine:
    """The engine ``settings.sampler`` names (``hf`` for ``cached`` with stop strings: the same
    transformers policy in this process, generate matching the text, as the option says).
    vLLM with stop strings is refused, never replaced: no path runs another engine than the
    one asked for (the config's validation refuses it first; this holds where it was skipped).
    ``engines``: a ``vllm_sampler.EngineCache`` the caller keeps between runs (None: the run
    starts its own)."""
    if ENGINES.trait(settings.sampler, "token_ids_only") and settings.stop_strings:
        raise ProxrlError(
            "stop_strings: sampler vllm sees token ids only; use sampler hf, or drop stop_strings"
        )
    name = "hf" if settings.stop_strings else settings.sampler
    return ENGINES[name](settings, tokenizer, engines)


def make_sampler(settings: EngineSettings, model: Any, tokenizer: Any) -> Sampler:
    """One sampler of ``model`` as ``make_engine``'s engine gives it (started: vLLM's engine
    starts from ``settings.model``; a caller syncs the weights it wants)."""
    return make_engine(settings, tokenizer).sampler(model)
