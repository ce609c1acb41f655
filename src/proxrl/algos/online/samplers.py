"""Which sampler an online run draws its responses from (``sampler:``), and the inference
engine of one that keeps its own copy of the weights (vLLM)."""

from __future__ import annotations

import os
from typing import Any

from proxrl.algos.online.config import OnlineConfig
from proxrl.models.lora import adapter_base
from proxrl.rollout.generation import CachedSampler, HFSampler, Sampler
from proxrl.runtime import distributed as dist
from proxrl.runtime.errors import ProxrlError


def engine_options(cfg: OnlineConfig) -> Any:
    from proxrl.rollout.vllm_sampler import EngineOptions

    return EngineOptions(
        # an adapter directory: the engine starts from its base; the first sync brings the rest
        model=adapter_base(os.path.expanduser(cfg.model)) or cfg.model,
        dtype=cfg.dtype,
        gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        max_model_length=cfg.vllm_max_model_length,
        tensor_parallel_size=cfg.vllm_tensor_parallel_size,
        enforce_eager=cfg.vllm_enforce_eager,
        enable_prefix_caching=cfg.vllm_enable_prefix_caching,
    )


def rollout_engine(cfg: OnlineConfig) -> Any:
    """The run's inference engine when the sampler keeps its own copy of the weights (vllm),
    started here once; None for the samplers that read the policy itself."""
    if cfg.sampler != "vllm":
        return None
    from proxrl.rollout.vllm_sampler import start_engine

    if dist.world_size() > 1:
        raise ProxrlError("sampler: vllm runs in one process for now; launch it without accelerate")
    return start_engine(engine_options(cfg))


def _vllm(cfg: OnlineConfig, model: Any, tokenizer: Any) -> Sampler:
    from proxrl.rollout.vllm_sampler import VLLMSampler

    return VLLMSampler(rollout_engine(cfg), tokenizer)


SAMPLERS: dict[str, Any] = {
    "cached": lambda cfg, model, tok: CachedSampler(model, tok, compile_step=cfg.compile_sampler),
    "hf": lambda cfg, model, tok: HFSampler(model, tok),
    "vllm": _vllm,
}


def make_sampler(cfg: OnlineConfig, model: Any, tokenizer: Any) -> Sampler:
    """The sampler ``cfg.sampler`` names; ``generate`` whenever stop strings need its text
    matching."""
    return SAMPLERS["hf" if cfg.stop_strings else cfg.sampler](cfg, model, tokenizer)
