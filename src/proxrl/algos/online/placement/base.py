"""The placement interface the loop calls (``Roles``), its local implementation and the
choice between them; ``ray_run`` holds the Ray one."""

from __future__ import annotations

from typing import Any, Protocol

from torch import nn

from proxrl.algos.online.config import Algorithm, OnlineConfig
from proxrl.algos.online.roles import Models, load_models, load_rewards
from proxrl.rollout.rewards import WeightedRewards
from proxrl.runtime.signals import GracefulStop


class Roles(Protocol):
    def rewards(self, cfg: OnlineConfig) -> WeightedRewards: ...

    def models(self, cfg: OnlineConfig, algo: Algorithm) -> Models: ...

    def stop(self) -> GracefulStop:
        """What the loop asks, after each iteration, whether SIGINT / SIGTERM came: this
        process's signals, or those the driver caught and forwarded (placement ray)."""

    def start(self, actor: nn.Module, iteration: int) -> None:
        """The run (or its resumed part) begins at ``iteration`` with ``actor``'s weights."""

    def before_update(self, iteration: int, prompt_ids: list[list[int]]) -> None:
        """The update of ``iteration`` (0-based) is about to start."""

    def after_update(self, actor: nn.Module, iteration: int) -> dict[str, float]:
        """``actor`` holds the weights after ``iteration`` updates; returns the metrics of the
        placement for that iteration's row."""


class LocalRoles:
    """Every role in this process, loaded as ``roles`` loads them."""

    def rewards(self, cfg: OnlineConfig) -> WeightedRewards:
        return load_rewards(cfg)

    def models(self, cfg: OnlineConfig, algo: Algorithm) -> Models:
        return load_models(cfg, algo)

    def stop(self) -> GracefulStop:
        return GracefulStop()

    def start(self, actor: nn.Module, iteration: int) -> None:
        pass

    def before_update(self, iteration: int, prompt_ids: list[list[int]]) -> None:
        pass

    def after_update(self, actor: nn.Module, iteration: int) -> dict[str, float]:
        return {}


def roles_for(cfg: OnlineConfig) -> Roles:
    """The roles of this process: the Ray trainer actor's when it runs the loop, else local."""
    from proxrl.algos.online.placement import ray_run

    current = ray_run.trainer_roles()
    return current if current is not None else LocalRoles()


def elsewhere(cfg: OnlineConfig) -> bool:
    """Whether the loop runs in another process: placement ray, called outside its trainer."""
    if cfg.placement != "ray":
        return False
    from proxrl.algos.online.placement import ray_run

    return ray_run.trainer_roles() is None


def train_elsewhere(cfg: OnlineConfig, algo: Algorithm) -> Any:
    """Run ``train_online`` in a Ray trainer actor (``ray_run.train_on_ray``)."""
    from proxrl.algos.online.placement.ray_run import train_on_ray

    return train_on_ray(cfg, algo)
