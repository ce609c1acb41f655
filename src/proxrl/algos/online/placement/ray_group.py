"""``ray_trainer_processes``: the trainer role as a group of Ray actors running the data-parallel
code unchanged.

The driver reserves one bundle per trainer (``ray_trainer_cpus`` / ``ray_trainer_gpus``) in a
Ray placement group (PACK: on as few nodes as fit), starts one trainer actor in each, and hands
every one the environment ``torchrun`` would give it (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``
and ``MASTER_PORT`` of a port free on rank 0's node), set in the actor's own process before
``runtime.distributed`` builds its process group there: gloo on CPUs, NCCL on GPUs, as under a
launcher. From then on the ranks run ``loop.train_online`` as launched processes do (each its
share of the prompts, the gathered rollout, gradients summed over ranks, rank 0 writing).

The other roles are shared by the group: rank 0 starts the reward, reference and engine actors
(named), the other ranks find them by name, and after each update rank 0 alone puts the weights
in the object store and hands the reference to the other ranks' actors, so that every rank's
next batch is sampled from the same policy version.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any

from proxrl.runtime import distributed as dist
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.signals import GracefulStop

PLACEMENT_TIMEOUT_S = 120.0
READY_TIMEOUT_ENV = "PROXRL_RAY_READY_TIMEOUT_S"
RUN_TIMEOUT_ENV = "PROXRL_RAY_RUN_TIMEOUT_S"  # the driver's wait for the trainers; unset: none


def ready_timeout_s() -> float:
    """How long a started actor may take to be ready (placed, and its model loaded):
    ``$PROXRL_RAY_READY_TIMEOUT_S``, else 15 minutes. An actor Ray cannot place (the cluster's
    free resources are short) would otherwise leave the run waiting for ever."""
    return float(os.environ.get(READY_TIMEOUT_ENV, 900.0))


def ready_within(refs: Any, what: str, timeout_s: float | None = None) -> Any:
    """``answer(refs)`` of actors just started, within ``timeout_s`` (``ready_timeout_s``); a
    one-line error naming ``what`` ("the reward actor") otherwise."""
    import ray

    limit = ready_timeout_s() if timeout_s is None else timeout_s
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=limit)
    if len(ready) < len(refs):
        raise ProxrlError(
            f"placement: {what} did not start within {limit:.0f} s: Ray could not place it (the "
            f"cluster's free CPUs/GPUs are short: see ray status) or its start hung; "
            f"{READY_TIMEOUT_ENV} sets the wait"
        )
    return answer(refs)


def answer(refs: Any) -> Any:
    """``ray.get``, with a role's ``ProxrlError`` raised here as the same one line (Ray wraps
    it in a traceback of the actor's)."""
    import ray
    from ray.exceptions import RayTaskError

    try:
        return ray.get(refs)
    except RayTaskError as error:
        if isinstance(error.cause, ProxrlError):
            raise ProxrlError(str(error.cause)) from None
        raise


def role_died(role: str, error: Exception, output_dir: str) -> ProxrlError:
    """The one line for a role actor (``role``: "the reward actor", ...) that died under a call:
    its name, not the trainer's, and that the last checkpoint is whole."""
    return ProxrlError(
        f"placement: {role} died ({type(error).__name__}); the last checkpoint in {output_dir} "
        "is whole: --resume continues the run"
    )


def answer_of(role: str, output_dir: str, refs: Any) -> Any:
    """``answer`` from ``role``'s actor; its death is reported as that role's (``role_died``)."""
    from ray.exceptions import RayActorError

    try:
        return answer(refs)
    except RayActorError as error:
        raise role_died(role, error, output_dir) from error


def join_paths(paths: list[str]) -> None:
    """The driver's import path (reward functions' modules) in this worker too."""
    sys.path.extend(p for p in paths if p not in sys.path)


def free_address() -> tuple[str, int]:
    """This node's address and a TCP port free on it now (rank 0's: the group's rendezvous)."""
    import ray

    with socket.socket() as s:
        s.bind(("", 0))
        port = int(s.getsockname()[1])
    return ray.util.get_node_ip_address(), port


def rank_environment(rank: int, world: int, address: str, port: int) -> dict[str, str]:
    """What a launcher exports to rank ``rank``. Ray gives each actor its own GPUs
    (``CUDA_VISIBLE_DEVICES``), so an actor's device is its first one: local rank 0 of 1."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": address,
        "MASTER_PORT": str(port),
    }


def join_group(rank: int, world: int, address: str, port: int) -> int:
    """Export the rank's environment in this process (an actor; nothing distributed has been
    asked yet, so ``runtime.distributed`` reads it on first use); returns this process's id."""
    os.environ.update(rank_environment(rank, world, address, port))
    return os.getpid()


def trainer_bundle(cpus: float, gpus: float) -> dict[str, float]:
    bundle = {"CPU": cpus, "GPU": gpus}
    return {key: amount for key, amount in bundle.items() if amount > 0}


def trainer_options(n: int, cpus: float, gpus: float) -> tuple[list[dict[str, Any]], Any]:
    """Ray options of each of ``n`` trainer actors (``ray_trainer_processes``, each of ``cpus``
    and ``gpus``), their bundles of the group's placement group, and the group (to remove at
    the end; None for one trainer, or when a trainer asks for nothing to reserve)."""
    import ray
    from ray.exceptions import GetTimeoutError
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundle = trainer_bundle(cpus, gpus)
    if n == 1 or not bundle:
        return [{}] * n, None
    group = placement_group([bundle] * n, strategy="PACK")
    try:
        ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_S)
    except GetTimeoutError as error:
        remove_placement_group(group)
        raise ProxrlError(
            f"ray_trainer_processes: Ray could not place {n} trainers of {bundle} within "
            f"{PLACEMENT_TIMEOUT_S:.0f} s (the cluster's free resources are short); lower "
            "ray_trainer_processes or the ray_trainer_* fields"
        ) from error
    options = [
        {"scheduling_strategy": PlacementGroupSchedulingStrategy(group, rank)} for rank in range(n)
    ]
    return options, group


def trainer_name(run: str, rank: int) -> str:
    """Rank 0 keeps the one trainer's name; the roles are named after it (``run``-engine-0...)."""
    return f"{run}-trainer" if rank == 0 else f"{run}-trainer-{rank}"


def connect_group(trainers: list[Any]) -> list[int]:
    """Give each trainer actor its rank's environment (rank 0's node and a port free there);
    returns their process ids. One trainer: nothing to join, it runs as one process."""
    import ray

    what = "the trainer actor" if len(trainers) == 1 else "a trainer actor"
    if len(trainers) == 1:
        return [int(ready_within([trainers[0].pid.remote()], what)[0])]
    (address, port), *_ = ready_within([t.free_address.remote() for t in trainers], what)
    world = len(trainers)
    return [
        int(pid)
        for pid in ray.get(
            [t.join_group.remote(rank, world, address, port) for rank, t in enumerate(trainers)]
        )
    ]


def shared(create: Any, names: list[str]) -> list[Any]:
    """Role actors the group shares: ``create()`` starts them on rank 0 (and waits until they
    are ready); every other rank then finds them by ``names``."""
    import ray

    handles = create() if dist.is_main() else []
    dist.barrier()
    if dist.is_main():
        return list(handles)
    return [ray.get_actor(name, namespace="proxrl") for name in names]


def group_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    """Every rank's engine metrics (``EnginePool.metrics``) as one row: the stalest batch, the
    engine restarts (each rank sees the same ones), the interval from the first sampling start
    to the last end."""
    if not rows[0]:
        return {}
    pick = {
        "rollout/staleness": max,
        "rollout/engine_restarts": max,
        "rollout/weight_broadcast_bytes": max,  # every rank samples from every engine
        "rollout/weight_store_loads": max,
        "time/generate_start": min,
        "time/generate_end": max,
    }
    return {key: float(pick[key](row[key] for row in rows)) for key in rows[0]}


def wait_forwarding_signals(trainers: list[Any], results: list[Any], output_dir: str) -> Any:
    """Rank 0's result once every trainer has answered, or at once the first error or dead
    trainer (the other ranks would wait for it in a collective for ever). The first SIGINT /
    SIGTERM caught here meanwhile is sent on to every trainer (which then stop after the same
    iteration, with a checkpoint: the loop's stop flag is summed over ranks). A second one acts
    at once, as in one process: SIGINT raises ``KeyboardInterrupt`` (the trainers are then
    killed), SIGTERM ends this process (and Ray its actors); the last checkpoint stays whole."""
    import ray
    from ray.exceptions import RayActorError

    forwarded = False
    pending = list(results)
    limit = float(os.environ.get(RUN_TIMEOUT_ENV, "inf"))
    deadline = time.monotonic() + limit
    with GracefulStop() as stop:
        while pending:
            if time.monotonic() > deadline:
                raise ProxrlError(
                    f"placement: the trainer actors did not finish within {limit:.0f} s "
                    f"({RUN_TIMEOUT_ENV}); the last checkpoint in {output_dir} is whole"
                )
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=0.1)
            for ref in done:
                try:
                    status, value = ray.get(ref)
                except RayActorError as error:
                    raise role_died(
                        dead_actor(error, results.index(ref)), error, output_dir
                    ) from error
                if status == "error":
                    return status, value
            if stop.signum is not None and not forwarded:
                for trainer in trainers:
                    trainer.request_stop.remote(stop.signum)
                forwarded = True
    return ray.get(results[0])


def dead_actor(error: Exception, rank: int) -> str:
    """Who died when trainer ``rank``'s ``train`` ended in ``error`` (a ``RayActorError``): the
    trainer itself, or (a ``RayTaskError``: the trainer answered) an actor it called that no
    role stand-in named (``answer_of``)."""
    from ray.exceptions import RayTaskError

    if isinstance(error, RayTaskError):
        return f"an actor trainer rank {rank} called"
    return "the trainer actor" if rank == 0 else f"the trainer actor of rank {rank}"
