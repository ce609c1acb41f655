"""The config fields of ``placement: ray`` (and its one-step-ahead rollouts), shared by ``ppo``
and ``grpo``; docs/scaling.md ("Ray placement") shows them filled in for a 7B run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from proxrl.registry import AppliesWith, Registry
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.fields import FREE_ON_RESUME, Range

RAY_INSTALL = "pip install 'proxrl[ray]' (or pip install ray)"

PLACEMENTS: Registry[None] = Registry("placement")
"""``placement`` → where the roles live (``algos.online.placement`` builds each); an entry's
knobs are the fields that only it reads."""
PLACEMENTS.add("local", None, "every role in this process (data parallel under accelerate)")
PLACEMENTS.add(
    "ray",
    None,
    "the trainer, the frozen roles, the critic and the engines each a Ray actor",
    ray=True,
    knobs=(
        "ray_address",
        "ray_engines",
        "ray_engine_gpus",
        "ray_engine_cpus",
        "ray_trainer_gpus",
        "ray_trainer_cpus",
        "ray_trainer_processes",
        "ray_reference_gpus",
        "ray_reference_cpus",
        "ray_teacher_gpus",
        "ray_teacher_cpus",
        "ray_critic_gpus",
        "ray_critic_cpus",
        "ray_reward_gpus",
        "ray_reward_cpus",
        "ray_engine_restarts",
        "ray_weight_transport",
        "async_rollout",
    ),
)
WEIGHT_TRANSPORTS: Registry[None] = Registry("weight transport")
"""``ray_weight_transport`` → how weights reach the Ray engines (``placement.ray_weights``)."""
WEIGHT_TRANSPORTS.add(
    "object_store", None, "one ray.put read by every engine", reaches_restarted=True
)
WEIGHT_TRANSPORTS.add("process_group", None, "a broadcast; gloo on CPUs, NCCL on GPUs")
PlacementChoice = PLACEMENTS.choice()
WeightTransportChoice = WEIGHT_TRANSPORTS.choice()


@dataclass
class PlacementFields:
    """Where the roles of an online run live, and how far generation may run ahead."""

    placement: PlacementChoice = "local"
    """local: every role in this process (data parallel under accelerate); ray: the trainer, the
    reference, a teacher, the reward sources, a separate critic and the generation engines each
    a Ray actor."""
    # which cluster this invocation joins (a resumed run may run on another)
    ray_address: Annotated[str, FREE_ON_RESUME] = ""
    """placement ray: the cluster to join (host:port or auto; empty: $RAY_ADDRESS, else a local
    Ray started for the run)."""
    ray_engines: Annotated[int, Range(ge=1)] = 1
    """placement ray: generation engines (actors), each sampling a share of every batch."""
    ray_engine_gpus: Annotated[float, Range(ge=0)] = 0.0
    """placement ray: GPUs per generation engine (fractions share one)."""
    ray_engine_cpus: Annotated[float, Range(ge=0)] = 0.25
    """placement ray: CPUs per generation engine (fractions share one)."""
    ray_trainer_gpus: Annotated[float, Range(ge=0)] = 0.0
    """placement ray: GPUs of the trainer actor (the policy, its optimizer, a value head)."""
    ray_trainer_cpus: Annotated[float, Range(ge=0)] = 1.0
    """placement ray: CPUs of the trainer actor."""
    ray_trainer_processes: Annotated[int, Range(ge=1)] = 1
    """placement ray: trainer actors running the update data parallel (each ray_trainer_gpus /
    ray_trainer_cpus, one placement group); the other roles are shared."""
    ray_reference_gpus: Annotated[float, Range(ge=0)] = 0.0
    """placement ray: GPUs of the reference actor."""
    ray_reference_cpus: Annotated[float, Range(ge=0)] = 0.25
    """placement ray: CPUs of the reference actor."""
    ray_teacher_gpus: Annotated[float, Range(ge=0)] = 0.0
    """placement ray: GPUs of the teacher actor (teacher_model with distill_loss
    reverse_kl_reward; gjsd reads the teacher's whole distribution, so it stays in the trainer)."""
    ray_teacher_cpus: Annotated[float, Range(ge=0)] = 0.25
    """placement ray: CPUs of the teacher actor."""
    ray_critic_gpus: Annotated[float, Range(ge=0)] = 0.0
    """placement ray: GPUs of the critic actor (critic separate: the value model and its
    optimizer; a value head, critic head, stays with the policy in the trainer)."""
    ray_critic_cpus: Annotated[float, Range(ge=0)] = 0.25
    """placement ray: CPUs of the critic actor (critic separate)."""
    ray_reward_gpus: Annotated[float, Range(ge=0)] = 0.0
    """placement ray: GPUs of the reward actor (every reward model and function)."""
    ray_reward_cpus: Annotated[float, Range(ge=0)] = 0.25
    """placement ray: CPUs of the reward actor."""
    ray_engine_restarts: Annotated[int, Range(ge=0)] = 3
    """placement ray: times Ray restarts a generation engine that died (its batch is retried)."""
    ray_weight_transport: WeightTransportChoice = "object_store"
    """placement ray: how weights reach the engines after an update: object_store (one ray.put
    read by every engine) or process_group (a broadcast; gloo on CPUs, NCCL on GPUs)."""
    async_rollout: bool = False
    """placement ray: generate the next batches while this one trains (sets sampler_logprobs:
    the engine's log-probs are the behaviour policy's; pair with a rollout_correction)."""
    max_staleness: Annotated[int, Range(ge=1), AppliesWith("async_rollout")] = 1
    """async_rollout: batches generated ahead, so the most policy versions a sample may lag the
    policy it trains (1: one-step-off)."""

    @property
    def ray_actors(self) -> bool:
        """The roles are Ray actors (the placement's trait ``ray``)."""
        return PLACEMENTS.trait(self.placement, "ray")

    def validate_placement(
        self, sampler_logprobs: bool, dynamic_sampling: bool, separate_critic: bool = False
    ) -> None:
        if not self.ray_actors:
            return
        if self.ray_trainer_processes > 1 and separate_critic:
            raise ProxrlError(
                "ray_trainer_processes: several trainers share no separate critic yet; "
                "use critic head, or ray_trainer_processes 1"
            )
        if self.ray_trainer_processes > 1 and self.async_rollout:
            raise ProxrlError(
                "ray_trainer_processes: several trainers do not generate ahead yet; "
                "set async_rollout false, or ray_trainer_processes 1"
            )
        rejoins = WEIGHT_TRANSPORTS.trait(self.ray_weight_transport, "reaches_restarted")
        if self.ray_engine_restarts and not rejoins:
            raise ProxrlError(
                f"ray_weight_transport: {self.ray_weight_transport} cannot reach an engine Ray "
                "restarted (it left the group): set ray_engine_restarts 0, or use object_store"
            )
        try:
            import ray  # noqa: F401
        except ImportError as error:
            raise ProxrlError(f"placement: ray needs the ray package: {RAY_INSTALL}") from error
        if self.async_rollout and not sampler_logprobs:
            raise ProxrlError(
                "async_rollout: the behaviour log-probs must come from the engine that sampled: "
                "leave sampler_logprobs unset (true with async_rollout) or set it true"
            )
        if self.async_rollout and dynamic_sampling:
            raise ProxrlError("async_rollout: not with dynamic_sampling (it samples on demand)")
