"""Which engine an online run samples its responses from (``sampler:``): one table, each entry
building a ``rollout.engines.RolloutEngine`` from the run's config (an ``OnlineConfig``, typed
``Any`` here: the config takes its ``sampler`` choices and their knobs from this table, so this
module is below it)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from proxrl.models.lora import adapter_base
from proxrl.registry import Registry
from proxrl.rollout.engines import PolicySampling, RolloutEngine, VLLMEngine
from proxrl.rollout.generation import Sampler, SamplingSettings
from proxrl.runtime import distributed as dist
from proxrl.runtime.errors import ProxrlError


def sampling_settings(cfg: Any) -> SamplingSettings:
    """The distribution a run samples from, as the trainer's log-probs replay it."""
    return SamplingSettings(
        cfg.max_new_tokens,
        cfg.temperature,
        cfg.top_k,
        cfg.top_p,
        cfg.stop_strings,
        min_p=cfg.min_p,
    )


def lora_sync(cfg: Any) -> Any:
    """How the engine gets the policy after an update (``OnlineConfig.lora_sync``)."""
    from proxrl.rollout.vllm_sampler import LORA_SYNCS

    return LORA_SYNCS[cfg.lora_sync]


def engine_options(cfg: Any) -> Any:
    from proxrl.rollout.vllm_sampler import EngineOptions, lora_slot_rank

    return EngineOptions(
        # an adapter directory: the engine starts from its base; the first sync brings the rest
        model=adapter_base(os.path.expanduser(cfg.model)) or cfg.model,
        dtype=cfg.dtype,
        gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        max_model_length=cfg.vllm_max_model_length,
        tensor_parallel_size=cfg.vllm_tensor_parallel_size,
        enforce_eager=cfg.vllm_enforce_eager,
        enable_prefix_caching=cfg.vllm_enable_prefix_caching,
        max_lora_rank=lora_slot_rank(cfg.lora_r) if lora_sync(cfg).lora_slots else None,
    )


def _vllm(cfg: Any, tokenizer: Any, engines: Any) -> RolloutEngine:
    if dist.world_size() > 1:
        raise ProxrlError("sampler: vllm runs in one process for now; launch it without accelerate")
    return VLLMEngine(engine_options(cfg), tokenizer, lora_sync(cfg), engines)


ENGINES: Registry[Callable[[Any, Any, Any], RolloutEngine]] = Registry("sampler")
"""``sampler`` → (config, tokenizer, the caller's ``vllm_sampler.EngineCache`` or None) → the
engine (the built-in samplers start nothing, so keep nothing); ``hf`` whenever stop strings need
generate's text matching. Traits: ``token_ids_only`` (no stop strings), ``min_p_first`` (min-p
before top-p, unlike generate), ``needs_vllm`` (the vllm package), ``own_kernels`` (the engine
computes with kernels of its own, not the trainer's module: where the trainer runs the π_old
pass, the engine's log-probs of the sampled tokens are asked for too and measured against it,
``rollout/mismatch_kl``)."""
ENGINES.add(
    "cached",
    lambda cfg, tok, engines: PolicySampling(
        tok, compile_step=cfg.compile_sampler, shared_prefill=cfg.shares_prefix
    ),
    "a lean decoding loop over the KV cache",
    knobs=("compile_sampler",),
)
ENGINES.add(
    "hf", lambda cfg, tok, engines: PolicySampling(tok, generate=True), "transformers' generate"
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


def make_engine(cfg: Any, tokenizer: Any, engines: Any = None) -> RolloutEngine:
    """The engine ``cfg.sampler`` names (``hf`` for ``cached`` with stop strings: the same
    transformers policy in this process, generate matching the text, as the option says).
    vLLM with stop strings is refused, never replaced: no path runs another engine than the
    one asked for (the config's validation refuses it first; this holds where it was skipped).
    ``engines``: a ``vllm_sampler.EngineCache`` the caller keeps between runs (None: the run
    starts its own)."""
    if ENGINES.trait(cfg.sampler, "token_ids_only") and cfg.stop_strings:
        raise ProxrlError(
            "stop_strings: sampler vllm sees token ids only; use sampler hf, or drop stop_strings"
        )
    return ENGINES["hf" if cfg.stop_strings else cfg.sampler](cfg, tokenizer, engines)


def make_sampler(cfg: Any, model: Any, tokenizer: Any) -> Sampler:
    """One sampler of ``model`` as ``make_engine``'s engine gives it (started: vLLM's engine
    starts from ``cfg.model``; a caller syncs the weights it wants)."""
    return make_engine(cfg, tokenizer).sampler(model)
