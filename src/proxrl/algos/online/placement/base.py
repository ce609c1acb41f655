"""The placement interface the loop is handed (``Placement``: where the roles live, which
engine samples, where stop signals come from) and its local implementation; ``ray_run``
holds the Ray one. The command chooses the placement and passes it in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from proxrl.algos.online.algorithm import Algorithm
from proxrl.algos.online.config import OnlineConfig
from proxrl.algos.online.role_settings import RoleSettings
from proxrl.algos.online.roles import (
    Models,
    load_models,
    load_rewards,
    reward_policy_tokenizer,
)
from proxrl.algos.online.samplers import make_engine
from proxrl.rollout.engines import RolloutEngine
from proxrl.rollout.rewards import WeightedRewards
from proxrl.rollout.vllm_sampler import EngineCache
from proxrl.runtime.signals import GracefulStop


class Placement(Protocol):
    """Each method reads the part of the run's ``RoleSettings`` (built once when the run opens,
    ``roles.role_settings``) that the roles it places need."""

    def rewards(self, roles: RoleSettings) -> WeightedRewards: ...

    def models(self, roles: RoleSettings, algo: Algorithm) -> Models: ...

    def engine(
        self, roles: RoleSettings, models: Models, prompt_ids: list[list[int]]
    ) -> RolloutEngine:
        """The engine the rollouts sample from (``prompt_ids``: the run's prompts, for an
        engine that launches batches ahead)."""
        ...

    def stop(self) -> GracefulStop:
        """What the loop asks, after each iteration, whether SIGINT / SIGTERM came: this
        process's signals, or those the driver caught and forwarded (placement ray)."""
        ...


Driver = Callable[[OnlineConfig, Algorithm, "Placement"], dict[str, float]]
"""The online driver (``loop.train_online``): opens the run with a placement, iterates,
returns the last metrics row."""


class LocalPlacement:
    """Every role in this process, loaded as ``roles`` loads them; the run's own sampler.
    ``engines``: a ``vllm_sampler.EngineCache`` kept by a caller that opens several runs, whose
    vLLM engine the run takes (None: the run starts its own)."""

    def __init__(self, engines: EngineCache | None = None) -> None:
        self.engines = engines

    def rewards(self, roles: RoleSettings) -> WeightedRewards:
        return load_rewards(roles.rewards, reward_policy_tokenizer(roles.rewards))

    def models(self, roles: RoleSettings, algo: Algorithm) -> Models:
        return load_models(roles.models, algo)

    def engine(self, roles: RoleSettings, models: Models, prompt_ids: list[list[int]]) -> Any:
        return make_engine(roles.engine, models.tokenizer, self.engines)

    def stop(self) -> GracefulStop:
        return GracefulStop()


def run_here(
    cfg: OnlineConfig, algo: Algorithm, driver: Driver, engines: EngineCache | None = None
) -> dict[str, float]:
    """``placement: local``: the driver in this process (each process of a launcher's);
    ``engines``: the caller's ``EngineCache``, kept across its runs (None: the run's own)."""
    return driver(cfg, algo, LocalPlacement(engines))
