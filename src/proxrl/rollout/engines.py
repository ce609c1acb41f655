"""Where an online run's responses come from, behind one lifecycle the loop drives without
asking which engine it has.

An engine ``start``s with the policy's weights, hands the rollout a ``Sampler``, is told when
the update begins (``before_update``: a GPU engine frees its memory, an asynchronous one
launches later batches) and ends (``after_update``: it takes the new weights and returns the
seconds that took), and ``close``s. ``PolicySampling`` samples the policy module itself (the
built-in samplers); ``VLLMEngine`` keeps vLLM's copy of the weights; the Ray engine pool lives
with its placement (``algos.online.placement.ray_run``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from torch import nn

from proxrl.rollout.generation import CachedSampler, HFSampler, Sampler

if TYPE_CHECKING:
    from proxrl.rollout.vllm_sampler import EngineCache, EngineOptions, LocalLLM, LoraSync


class RolloutEngine(Protocol):
    def start(self, policy: nn.Module, iteration: int) -> None:
        """The run (or its resumed part) begins at ``iteration`` with ``policy``'s weights."""

    def sampler(self, policy: nn.Module) -> Sampler:
        """The sampler of one rollout; ``policy`` is the module to sample from where the
        engine samples the policy itself (gathered whole under FSDP)."""
        ...

    def before_update(self, iteration: int) -> None:
        """The update of ``iteration`` (0-based) is about to start."""

    def after_update(self, policy: nn.Module, iteration: int) -> dict[str, float]:
        """``policy`` holds the weights after ``iteration`` updates; returns the engine's
        metrics for that iteration's row (its weight sync's seconds)."""
        ...

    def close(self) -> None:
        """The run is over."""


@dataclass
class PolicySampling:
    """The built-in samplers: they read the policy module itself, so nothing is synced."""

    tokenizer: Any
    generate: bool = False  # transformers' generate (sampler hf; any run with stop strings)
    compile_step: bool = False  # the cached sampler's decoding step through torch.compile
    shared_prefill: bool = True  # the cached sampler prefills a group's prompt once

    def start(self, policy: nn.Module, iteration: int) -> None:
        pass

    def sampler(self, policy: nn.Module) -> Sampler:
        if self.generate:
            return HFSampler(policy, self.tokenizer)
        return CachedSampler(
            policy,
            self.tokenizer,
            compile_step=self.compile_step,
            shared_prefill=self.shared_prefill,
        )

    def before_update(self, iteration: int) -> None:
        pass

    def after_update(self, policy: nn.Module, iteration: int) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


class VLLMEngine:
    """A vLLM engine in this process with its own copy of the weights, synced after each
    update (``lora_sync``: a LoRA merged in, or the adapter alone); on a GPU it sleeps through
    the update. It owns its engine (``LocalLLM``: the ``vllm.LLM`` and its sleep state),
    started at the run's start, or taken from ``engines`` where the caller keeps one between
    runs (``EngineCache``); a run's own is dropped at its close."""

    def __init__(
        self,
        options: EngineOptions,
        tokenizer: Any,
        lora_sync: LoraSync | None = None,
        engines: EngineCache | None = None,
    ) -> None:
        from proxrl.rollout.vllm_sampler import LORA_SYNCS, AdapterVersions

        self.options = options
        self.tokenizer = tokenizer
        self.lora_sync = lora_sync or LORA_SYNCS["merged"]
        self.adapters = AdapterVersions()
        self.engines = engines
        self.engine: LocalLLM | None = None

    def _started(self) -> LocalLLM:
        from proxrl.rollout.vllm_sampler import LocalLLM, start_engine

        if self.engine is None:
            if self.engines is not None:
                self.engine = self.engines.get(self.options)
            else:
                self.engine = LocalLLM(start_engine(self.options))
        return self.engine

    def start(self, policy: nn.Module, iteration: int) -> None:
        # a resumed run's weights differ from the model's, a kept engine holds another run's
        self.lora_sync.sync(self._started().awake(), policy, self.adapters)

    def sampler(self, policy: nn.Module) -> Sampler:
        from proxrl.rollout.vllm_sampler import VLLMSampler

        return VLLMSampler(self._started().awake(), self.tokenizer, self.adapters)

    def before_update(self, iteration: int) -> None:
        self._started().sleep()

    def after_update(self, policy: nn.Module, iteration: int) -> dict[str, float]:
        seconds = self.lora_sync.sync(self._started().awake(), policy, self.adapters)
        return {"time/weight_sync_s": seconds}

    def close(self) -> None:
        if self.engine is not None:
            self.adapters.close(self.engine.awake())
            self.engine = None  # (a kept one stays with its cache)
