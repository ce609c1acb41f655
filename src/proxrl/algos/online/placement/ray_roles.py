"""The role actors of ``placement: ray`` and the stand-ins through which the trainer's loop calls
them, each behind the interface the loop already uses: a reward source (``RemoteRewards``), a
reference model and a teacher (``RemoteFrozen``, each with its ``FrozenActor``) and a sampler
(``EnginePool``).

Weights travel from the trainer to the engines through Ray's object store (one ``ray.put`` per
update, every engine reading the same object) or a process group of the trainer and the engines
(``ray_weight_transport``, ``ray_weights``: gloo on CPUs, NCCL on GPUs). An engine that was
restarted (``ray_engine_restarts``; object_store only) finds it holds other weights than the
request names and reloads the latest before sampling, so Ray's retry of the task draws the same
batch.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import ray
import torch
from torch import Tensor, nn

from proxrl.algos.online.placement.ray_group import answer, answer_of, join_paths
from proxrl.algos.online.placement.ray_weights import (
    Layout,
    ObjectStoreWeights,
    ProcessGroupWeights,
    WeightReceiver,
)
from proxrl.algos.online.role_settings import EngineSettings, ModelSettings, RewardSettings
from proxrl.algos.online.roles import load_rewards, place_rewards, reward_policy_tokenizer
from proxrl.algos.online.samplers import ENGINES, make_engine
from proxrl.data.batching import pad_left, pad_to
from proxrl.models.causal_lm import load_causal_lm
from proxrl.models.tokenizer import load_tokenizer, resize_for_tokenizer
from proxrl.rollout.forward import frozen_pass
from proxrl.rollout.generation import Samples, SamplingSettings
from proxrl.rollout.rewards import RewardScores, TrainerState
from proxrl.runtime import distributed as dist
from proxrl.runtime.errors import ProxrlError


class RoleActor:
    """A role's process: what its constructor failed with is kept for ``ready`` to report as
    one line (an actor whose ``__init__`` raised only reports a traceback)."""

    error: str | None = None

    def ready(self) -> str | None:
        return self.error


def frozen_model(
    settings: ModelSettings, on_cpu: bool = False, path: str | None = None
) -> tuple[nn.Module, Any]:
    """The policy's starting model (or ``path``: the teacher) loaded as the trainer loads its
    reference, on this actor's device, resized for the policy's tokenizer."""
    loading = settings.loading
    tokenizer = load_tokenizer(settings.model, trust_remote_code=loading.trust_remote_code)
    role = "model" if path is None else "teacher_model"  # named as the trainer names it
    model = load_causal_lm(path or settings.model, **loading.loader_kwargs(), role=role)
    resize_for_tokenizer(model, tokenizer)
    device = "cpu" if on_cpu else dist.device()
    return model.requires_grad_(False).eval().to(device), tokenizer


class RewardActor(RoleActor):
    """Every reward source of the run (reward models and functions), scoring where it lives."""

    def __init__(self, paths: list[str], settings: RewardSettings) -> None:
        join_paths(paths)
        try:
            self.rewards = load_rewards(settings, reward_policy_tokenizer(settings))
            place_rewards(self.rewards, dist.device())
        except ProxrlError as error:
            self.error = str(error)

    def score(
        self, prompts: list[Any], completions: list[str], columns: dict[str, list[Any]]
    ) -> RewardScores:
        return self.rewards(prompts, completions, columns).cpu()


class RemoteRewards:
    """The reward actor as the loop's ``WeightedRewards``: (prompts, completions, columns) →
    ``RewardScores``, the record the local role returns."""

    sources: tuple[()] = ()  # placed in their actor, not by the trainer

    def __init__(self, handle: Any, output_dir: str) -> None:
        self.handle = handle
        self.output_dir = output_dir  # named when the actor dies
        self.trainer_state = TrainerState()  # set each iteration; travels in the columns

    def __call__(
        self, prompts: list[Any], completions: list[str], columns: dict[str, list[Any]]
    ) -> RewardScores:
        ref = self.handle.score.remote(prompts, completions, columns)
        return answer_of("the reward actor", self.output_dir, ref)


class FrozenActor(RoleActor):
    """A frozen role's model, scoring the trainer's sampled tokens where it lives: the reference
    (``model`` None: the policy's starting model) or on-policy distillation's teacher
    (``model``: ``teacher_model``). ``shared_prefix``: its passes forward a group's prompt once
    (``EngineSettings.shares_prefix``)."""

    def __init__(
        self,
        paths: list[str],
        settings: ModelSettings,
        shared_prefix: bool,
        model: str | None = None,
    ) -> None:
        join_paths(paths)
        self.shared_prefix = shared_prefix
        try:
            self.model, _ = frozen_model(settings, path=model)
        except ProxrlError as error:
            self.error = str(error)

    @torch.no_grad()
    def logprobs(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        prompt_length: int,
        temperature: float,
        truncation: dict[str, Any],
        packed: bool,
        with_argmax: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """``rollout.forward.frozen_pass`` on this actor's model: (B, T) log π and (with_argmax)
        the (B, T) likeliest tokens, on the CPU as the ids it is sent."""
        return frozen_pass(
            self.model, input_ids, attention_mask, prompt_length, temperature, truncation, packed,
            with_argmax, self.shared_prefix,
        )  # fmt: skip

    def state_dict(self) -> dict[str, Tensor]:
        return {k: v.cpu() for k, v in self.model.state_dict().items()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.model.load_state_dict(state)


class RemoteFrozen:
    """A frozen role's actor as the loop's reference or teacher: ``rollout.forward.frozen_pass``
    hands it the micro-batch's (B, P + T) ids and mask and gets back the (B, T) log-probs (and
    with_argmax the (B, T) argmax) computed in the actor, so per micro-batch B × (P + T) ids go
    there and B × T floats (and ids) come back. ``role``: "reference" or "teacher", named when
    the actor dies."""

    def __init__(self, handle: Any, output_dir: str, role: str) -> None:
        self.handle = handle
        self.output_dir = output_dir  # named when the actor dies
        self.role = role

    def _answer(self, ref: Any) -> Any:
        return answer_of(f"the {self.role} actor", self.output_dir, ref)

    def logprobs(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        prompt_length: int,
        temperature: float,
        truncation: dict[str, Any],
        packed: bool,
        with_argmax: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        return self._answer(
            self.handle.logprobs.remote(
                input_ids.cpu(),
                attention_mask.cpu(),
                prompt_length,
                temperature,
                truncation,
                packed,
                with_argmax,
            )
        )

    def state_dict(self) -> dict[str, Tensor]:  # checkpointed when ref_reset_every moves it
        return self._answer(self.handle.state_dict.remote())

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self._answer(self.handle.load_state_dict.remote({k: v.cpu() for k, v in state.items()}))


@dataclass
class EngineBatch:
    samples: Samples  # on the CPU
    rng_state: Tensor  # the engine's torch RNG after sampling
    version: int  # the policy version (updates applied) of the weights that sampled
    started: float  # time.time() when sampling began
    ended: float
    pid: int  # the engine's process (another one after Ray restarted it)
    weights_in: tuple[int, int]  # bytes it received by broadcast, object-store copies it read


class EngineActor(RoleActor):
    """A generation engine: a copy of the policy sampled by the run's sampler (the built-in
    ones; vLLM's engine inside this actor with sampler vllm)."""

    def __init__(
        self, paths: list[str], model_settings: ModelSettings, engine: EngineSettings
    ) -> None:
        join_paths(paths)
        self.version = -1
        self.broadcast_bytes = self.store_loads = 0
        self.receiver: WeightReceiver | None = None
        try:
            # under vLLM the module only stages the weights vLLM reloads from: on the CPU
            on_cpu = ENGINES.trait(engine.sampler, "needs_vllm")
            self.model, tokenizer = frozen_model(model_settings, on_cpu=on_cpu)
            self.engine = make_engine(engine, tokenizer)
            self.sampler = self.engine.sampler(self.model)
        except ProxrlError as error:
            self.error = str(error)

    def load(self, weights: list[Any], version: int) -> None:
        """The weights in the object store (``weights[0]``: a reference, passed inside a list so
        that Ray hands it over unread) of policy ``version``; a no-op when already held."""
        if version == self.version:
            return
        if not weights:  # process_group: the broadcast of this version should have come first
            raise RuntimeError(f"engine holds policy {self.version}, asked for {version}")
        self.apply(ray.get(weights[0]), version)
        self.store_loads += 1

    def apply(self, state: dict[str, Tensor], version: int) -> None:
        self.model.load_state_dict(state)
        self.engine.after_update(self.model, version)  # vLLM's copy of the weights: synced
        self.version = version

    def join_weights(
        self, address: str, port: int, rank: int, world: int, device: str, layout: Layout
    ) -> None:
        """Join the trainer's weight group (``ray_weights``) as ``rank``."""
        self.receiver = WeightReceiver(address, port, rank, world, device, layout)

    def receive(self, version: int) -> None:
        """Policy ``version`` by the trainer's broadcast, loaded as the object store's copy."""
        assert self.receiver is not None, "receive before join_weights"
        self.apply(self.receiver.receive(), version)
        self.broadcast_bytes += self.receiver.nbytes

    @torch.no_grad()
    def sample(
        self,
        weights: list[Any],
        version: int,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        settings: SamplingSettings,
        with_logprobs: bool,
        rng: Tensor | int,
    ) -> EngineBatch:
        """Sample with policy ``version``'s weights from the RNG state ``rng`` (a seed for
        engines past the first)."""
        self.load(weights, version)
        started = time.time()
        if isinstance(rng, int):
            torch.manual_seed(rng)
        else:
            torch.set_rng_state(rng)
        device = dist.device()
        samples = self.sampler.sample(
            prompt_ids.to(device), prompt_mask.to(device), settings, with_logprobs
        )
        cpu = Samples(*(None if x is None else x.cpu() for x in vars(samples).values()))
        received = (self.broadcast_bytes, self.store_loads)
        return EngineBatch(
            cpu, torch.get_rng_state(), version, started, time.time(), os.getpid(), received
        )


@dataclass
class Pending:
    """A batch launched ahead of its iteration (async_rollout)."""

    iteration: int
    prompt_ids: Tensor  # (B, P) as the rollout will pad them
    futures: list[Any]


class EnginePool:
    """N engine actors as one ``Sampler``: each samples a contiguous share of the batch.

    Synchronous: the first engine draws from the trainer's own RNG state and hands it back, so
    one engine samples exactly what the trainer's own sampler would (engines past the first get
    seeds drawn from it). Ahead of time (``prefetch``): seeds drawn from the trainer's RNG when
    the batch is launched, the batch used when the rollout asks for the same prompts."""

    def __init__(
        self, handles: list[Any], pad_id: int, transport: type = ObjectStoreWeights
    ) -> None:
        self.handles = handles
        self.transport = transport(handles)
        self.pad_id = pad_id
        self.weights: list[Any] = []
        self.version = -1
        self.pending: list[Pending] = []
        self.last: list[EngineBatch] = []
        self.pids: list[int | None] = [None] * len(handles)
        self.restarts = 0

    def publish(self, actor: nn.Module, version: int) -> float:
        """Send ``actor``'s weights to every engine as policy ``version`` (their loads run in
        the background); returns the seconds it took here."""
        started = time.perf_counter()
        self.weights, self.version = self.transport.publish(actor, version), version
        return time.perf_counter() - started

    def settle(self) -> None:
        """Wait until the engines can sample the published weights for any caller."""
        self.transport.settle()

    def _launch(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        settings: SamplingSettings,
        logprobs: bool,
        hand_over: bool,
    ) -> list[Any]:
        """One sampling task per engine; with ``hand_over`` the first engine draws from the
        trainer's RNG state itself, the others (all of them without) from seeds drawn from it."""
        shares = torch.arange(len(prompt_ids)).tensor_split(len(self.handles))
        seeds: list[Tensor | int] = [
            int(torch.randint(0, 2**62, ())) for _ in range(len(self.handles) - hand_over)
        ]
        rngs = [torch.get_rng_state(), *seeds] if hand_over else seeds
        return [
            handle.sample.remote(
                self.weights,
                self.version,
                prompt_ids[rows].cpu(),
                prompt_mask[rows].cpu(),
                settings,
                logprobs,
                rng,
            )
            for handle, rows, rng in zip(self.handles, shares, rngs, strict=True)
        ]

    def prefetch(
        self,
        iteration: int,
        prompt_ids: list[list[int]],
        settings: SamplingSettings,
        with_logprobs: bool,
    ) -> None:
        """Launch the batch of ``iteration`` (its prompts' ids, repeated per group) now."""
        tensor = pad_left(prompt_ids, self.pad_id)
        mask = pad_left([[1] * len(row) for row in prompt_ids], 0)
        futures = self._launch(tensor, mask, settings, with_logprobs, hand_over=False)
        self.pending.append(Pending(iteration, tensor, futures))

    def launched(self) -> list[int]:
        return [p.iteration for p in self.pending]

    def sample(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        settings: SamplingSettings,
        with_logprobs: bool = False,
    ) -> Samples:
        head = self.pending[0] if self.pending else None
        if head is not None and torch.equal(head.prompt_ids, prompt_ids.cpu()):
            self.pending.pop(0)
            batches = self._wait(head.futures)
        else:
            futures = self._launch(prompt_ids, prompt_mask, settings, with_logprobs, True)
            batches = self._wait(futures)
            torch.set_rng_state(batches[0].rng_state)
        self.last = batches
        for i, batch in enumerate(batches):
            self.restarts += self.pids[i] not in (None, batch.pid)
            self.pids[i] = batch.pid
        device = prompt_ids.device
        width = max(b.samples.response_ids.shape[1] for b in batches)
        fields = {}
        for name in ("response_ids", "response_mask", "logprobs", "entropy"):
            parts = [getattr(b.samples, name) for b in batches]
            if any(x is None for x in parts):
                fields[name] = None
                continue
            value = self.pad_id if name == "response_ids" else 0
            fields[name] = torch.cat([pad_to(x, width, value, left=False) for x in parts]).to(
                device
            )
        return Samples(**fields)

    def _wait(self, futures: list[Any]) -> list[EngineBatch]:
        from ray.exceptions import RayActorError

        try:
            return answer(futures)
        except RayActorError as error:  # Ray restarted it ray_engine_restarts times already
            # process_group takes no restarts (a restarted engine has left the weight group)
            advice = (
                "use ray_weight_transport object_store with ray_engine_restarts > 0"
                if isinstance(self.transport, ProcessGroupWeights)
                else "raise ray_engine_restarts"
            )
            raise ProxrlError(
                f"placement: a generation engine died and could not be restarted "
                f"({type(error).__name__}); {advice}, or check its node"
            ) from error

    def metrics(self, iteration: int) -> dict[str, float]:
        """The staleness and generation interval of the batch the rollout of ``iteration``
        used, and the engines' restarts so far."""
        if not self.last:
            return {}
        return {
            "rollout/staleness": float(max(iteration - b.version for b in self.last)),
            "rollout/engine_restarts": float(self.restarts),
            "rollout/weight_broadcast_bytes": float(sum(b.weights_in[0] for b in self.last)),
            "rollout/weight_store_loads": float(sum(b.weights_in[1] for b in self.last)),
            "time/generate_start": min(b.started for b in self.last),
            "time/generate_end": max(b.ended for b in self.last),
        }
