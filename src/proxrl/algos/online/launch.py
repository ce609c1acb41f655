"""The way into ``ppo`` and ``grpo``: the command line, a YAML file, the Python API and a
module's ``train(cfg)`` all arrive here. The config and the output directory are checked once,
before anything starts; then the placement the config names runs the driver
(``loop.train_online``) with a placement it builds: ``LocalPlacement`` in this process, or
``RayPlacement`` in each of Ray's trainer actors. The driver never checks the config again and
never asks where it runs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TypeVar

from proxrl.algos.online.algorithm import Algorithm
from proxrl.algos.online.config import OnlineConfig
from proxrl.algos.online.loop import train_online
from proxrl.algos.online.placement.base import Driver, run_here
from proxrl.algos.online.placement.ray_run import train_on_ray
from proxrl.algos.online.run import check_run
from proxrl.rollout.vllm_sampler import EngineCache

Launcher = Callable[[OnlineConfig, Algorithm, Driver, EngineCache | None], dict[str, float]]
"""(cfg, algo, the driver, an ``EngineCache`` or None) → the last metrics row: builds a
placement and runs the driver with it."""

LAUNCHERS: Mapping[str, Launcher] = MappingProxyType({"local": run_here, "ray": train_on_ray})
"""``placement`` → how the driver is run (the names are ``placement_fields.PLACEMENTS``')."""


C = TypeVar("C", bound=OnlineConfig)


def launch(
    cfg: C, build: Callable[[C], Algorithm], engines: EngineCache | None = None
) -> dict[str, float]:
    """Check ``cfg`` (as the command line and ``proxrl.config`` do: a module-level
    ``grpo.train`` / ``ppo.train`` is a way in too) and the run it asks for, build the
    algorithm, and run the driver where ``cfg.placement`` says. ``engines``: a
    ``vllm_sampler.EngineCache`` held by a caller that runs several stages in this process
    (the demo), so that their vLLM engine starts once."""
    cfg.validate()
    check_run(cfg)
    return LAUNCHERS[cfg.placement](cfg, build(cfg), train_online, engines)
