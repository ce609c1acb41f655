"""``placement: ray``: the driver and the trainer actor.

The ``proxrl`` process (``launch.LAUNCHERS["ray"]``: ``train_on_ray``) starts a local Ray or
joins a cluster (``ray_address``, else ``$RAY_ADDRESS``), checks the cluster can give every
role its resources, and runs the driver (``loop.train_online``) in a trainer actor with a
``RayPlacement``, which holds the policy and its optimizer (and a value
head: ``critic: head``); ``ray_trainer_processes`` of them run it data parallel (``ray_group``).
From there ``RayPlacement`` starts the other roles as actors (rank 0's) that go when the trainer
does: the reward sources, the reference, the separate critic (``ray_critic``) and
``ray_engines`` generation engines. A trainer that dies ends the run with a one-line error; its
checkpoints are written atomically, so the last one is whole and ``--resume`` continues it.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from dataclasses import replace
from functools import partial
from types import MappingProxyType
from typing import Any

from torch import nn

from proxrl.algos.online.algorithm import Algorithm
from proxrl.algos.online.config import OnlineConfig
from proxrl.algos.online.placement import ray_group
from proxrl.algos.online.placement.base import Driver
from proxrl.algos.online.placement.ray_group import join_paths
from proxrl.algos.online.placement_fields import RAY_INSTALL
from proxrl.algos.online.prompts import per_response, prompt_order
from proxrl.algos.online.role_settings import LaunchAhead, RaySettings, RoleSettings
from proxrl.algos.online.roles import Models, load_models, role_settings
from proxrl.rollout.vllm_sampler import EngineCache
from proxrl.runtime import distributed as dist
from proxrl.runtime.errors import Interrupted, ProxrlError, RunFinished
from proxrl.runtime.signals import GracefulStop

log = logging.getLogger(__name__)


ACTORS = MappingProxyType(
    {
        "ray_trainer": "the trainer actor",
        "ray_engine": "each generation engine",
        "ray_reward": "the reward actor",
        "ray_reference": "the reference actor",
        "ray_teacher": "the teacher actor",
        "ray_critic": "the critic actor",
    }
)


COUNTS = MappingProxyType({"ray_trainer": "ray_trainer_processes", "ray_engine": "ray_engines"})


def role_actors(ray: RaySettings) -> list[tuple[str, int]]:
    """The run's roles (their fields' prefix) and how many actors each has."""
    roles = [
        ("ray_trainer", ray.ray_trainer_processes),
        ("ray_engine", ray.ray_engines),
        ("ray_reward", 1),
    ]
    roles += [("ray_reference", 1)] if ray.reference_actor else []
    roles += [("ray_teacher", 1)] if ray.teacher_actor else []
    return roles + [("ray_critic", 1)] if ray.critic_actor else roles


def requested(ray: RaySettings) -> dict[str, tuple[float, str]]:
    """CPUs and GPUs the run's actors ask for, each with the sum that makes it up."""
    roles = role_actors(ray)
    total = {}
    for unit in ("cpus", "gpus"):
        terms = [(n, getattr(ray, f"{role}_{unit}"), role) for role, n in roles]
        amount = sum(n * x for n, x, _ in terms)
        words = " + ".join(
            f"{COUNTS[role] + ' ' + str(n) + ' × ' if n > 1 else ''}{role}_{unit} {x:.12g}"
            for n, x, role in terms
        )
        total[unit] = (amount, words)
    return total


def check_address(address: str) -> None:
    """A host:port that does not answer fails here in seconds, not after Ray's minute of
    retries."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ProxrlError(f"ray_address: expected host:port or auto, got {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as error:
        raise ProxrlError(
            f"ray_address: no Ray cluster answers at {address} ({error.strerror or error}); "
            "start one with ray start --head, or leave ray_address empty for a local Ray"
        ) from error


def connect(ray_settings: RaySettings) -> bool:
    """Join the cluster ``ray_address`` or $RAY_ADDRESS names, else start a local Ray; True
    when this call started or joined it (and so should leave it at the end)."""
    try:
        import ray
    except ImportError as error:
        raise ProxrlError(f"placement: ray needs the ray package: {RAY_INSTALL}") from error
    if ray.is_initialized():
        return False
    address = ray_settings.ray_address or os.environ.get("RAY_ADDRESS", "")
    if address and address != "auto" and not address.startswith("ray://"):
        check_address(address)
        send_token_if_held()
    if not address:  # a local Ray gets this machine's CPUs and GPUs: check before starting it
        import torch

        machine = {"CPU": float(os.cpu_count() or 1), "GPU": float(torch.cuda.device_count())}
        where = "this machine (for a local Ray)"
        check_resources(ray_settings, [machine], where, where)
    try:
        ray.init(address=address or None, include_dashboard=False, logging_level=logging.WARNING)
    except ConnectionError as error:
        advice = f"; {TOKEN_ADVICE}" if address else ""
        raise ProxrlError(f"ray_address: {str(error).splitlines()[0]}{advice}") from error
    return True


TOKEN_ADVICE = (
    "if the cluster uses token authentication (ray start --head turns it on once a token "
    "exists), give this process its token: ~/.ray/auth_token, RAY_AUTH_TOKEN or "
    "RAY_AUTH_TOKEN_PATH, and RAY_AUTH_MODE=token"
)


def send_token_if_held() -> None:
    """Ask Ray to send this machine's authentication token when joining ``ray_address``.

    Ray (2.60 here) starts ``ray start --head`` with token authentication once a token exists
    (``~/.ray/auth_token``: any earlier local Ray wrote one) and, joining a cluster by its
    address, reads a token only when ``RAY_AUTH_MODE=token`` (``ray.init`` turns it on for
    ``auto`` alone): the join then fails after a minute as "Failed to connect" (the cluster's
    log: InvalidAuthToken). A token sent to a cluster without authentication is ignored, so a
    held token is sent whenever the mode is unset; an explicit ``RAY_AUTH_MODE`` is respected."""
    if "RAY_AUTH_MODE" in os.environ:
        return
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:  # a Ray without token authentication
        return
    if AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True):
        os.environ["RAY_AUTH_MODE"] = "token"
        Config.initialize("")  # Ray's config, read at import, sees the mode now


def check_resources(
    ray: RaySettings, nodes: list[dict[str, float]], where: str, on_one: str
) -> None:
    """Each actor's CPUs and GPUs fit in one of ``nodes`` (their resources, by Ray's names), as
    an actor runs on one node (Ray would leave one that fits none pending for ever), and every
    role's together fit in their sum. ``where``: the nodes, ``on_one``: any one of them."""
    units = (("cpus", "CPU"), ("gpus", "GPU"))
    for role, _ in role_actors(ray):
        for unit, key in units:
            field = f"{role}_{unit}"
            asked = getattr(ray, field)
            if asked > max((node.get(key, 0.0) for node in nodes), default=0.0) + 1e-9:
                raise ProxrlError(
                    f"placement: {ACTORS[role]} asks for {asked:.12g} {key}s ({field}), more "
                    f"than {on_one} has; lower {field}"
                )
    for unit, key in units:
        amount, words = requested(ray)[unit]
        if amount > sum(node.get(key, 0.0) for node in nodes) + 1e-9:
            raise ProxrlError(
                f"placement: the roles ask for {amount:.12g} {key}s ({words}), more than {where} "
                f"has; lower the ray_*_{unit} fields"
            )


class TrainerActor:
    """A process that runs the loop with the policy (``loop.train_online``): the one trainer,
    or one rank of ``ray_trainer_processes`` (``ray_group``).

    Started with three threads (``max_concurrency``), so that ``request_stop`` (the driver
    forwards the SIGINT / SIGTERM it caught, and the loop stops as in one process: a checkpoint
    at the end of the iteration, then ``Interrupted``) and ``hold_weights`` (rank 0 handing over
    the policy it published) reach it while ``train`` runs."""

    def __init__(self, paths: list[str], run: str) -> None:

        join_paths(paths)
        self.run = run
        self.stop = GracefulStop(signals=())  # the driver's signals; this process installs none
        self.published: list[Any] = [[], -1]  # rank 0's weights (a list of one ref), version

    def pid(self) -> int:
        return os.getpid()

    def free_address(self) -> tuple[str, int]:
        return ray_group.free_address()

    def join_group(self, rank: int, world: int, address: str, port: int) -> int:
        return ray_group.join_group(rank, world, address, port)

    def hold_weights(self, weights: list[Any], version: int) -> None:
        self.published[:] = [weights, version]

    def request_stop(self, signum: int) -> None:
        self.stop.request(signum)

    def stop_signal(self) -> int | None:
        """The signal forwarded so far (None: none)."""
        return self.stop.signum

    def train(self, cfg: OnlineConfig, algo: Algorithm, driver: Driver) -> tuple[str, Any]:
        """``driver`` (the online loop, as a local run calls it) with this actor's placement:
        ("ok", the last metrics row), or ("error", (class name, message, exit code)) for an
        error the user can act on, re-raised by ``train_on_ray`` as the same one line."""
        logging.basicConfig(level=logging.INFO)
        try:
            placement = RayPlacement(self.stop, self.run, self.published)
            return "ok", driver(cfg, algo, placement)
        except ProxrlError as error:
            return "error", (type(error).__name__, str(error), error.exit_code)


def reraised(name: str, message: str, exit_code: int) -> ProxrlError:
    if name == "RunFinished":
        return RunFinished(message)
    if name == "Interrupted":
        return Interrupted(message, exit_code - 128)
    return ProxrlError(message)


def train_on_ray(
    cfg: OnlineConfig, algo: Algorithm, driver: Driver, engines: EngineCache | None = None
) -> dict[str, float]:
    """``placement: ray``: run ``driver`` in ``ray_trainer_processes`` trainer actors (each with
    its ``RayPlacement``); this process waits, and leaves the Ray it started. ``engines`` is
    not read: Ray's engine actors start their own engines, in their own processes."""
    import ray

    if dist.world_size() > 1:
        raise ProxrlError("placement: ray starts the run's processes itself; launch it once")
    settings = role_settings(cfg).ray
    owns = connect(settings)
    trainers: list[Any] = []
    group = None
    try:
        nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
        check_resources(settings, nodes, "the Ray cluster", "any node of the Ray cluster")
        run = f"proxrl-{os.getpid()}-{time.time_ns()}"
        cpus, gpus = settings.ray_trainer_cpus, settings.ray_trainer_gpus
        every, group = ray_group.trainer_options(settings.ray_trainer_processes, cpus, gpus)
        for rank, options in enumerate(every):
            trainers.append(
                ray.remote(TrainerActor)
                .options(
                    num_cpus=cpus,
                    num_gpus=gpus,
                    max_restarts=0,
                    max_concurrency=3,  # train, and request_stop / hold_weights while it runs
                    name=ray_group.trainer_name(run, rank),
                    namespace="proxrl",
                    **options,
                )
                .remote(list(sys.path), run)
            )
        for rank, pid in enumerate(ray_group.connect_group(trainers)):
            log.info("placement: trainer rank %d of %d in process %d", rank, len(trainers), pid)
        status, value = ray_group.wait_forwarding_signals(
            trainers, [t.train.remote(cfg, algo, driver) for t in trainers], cfg.output_dir
        )
        if status == "error":
            raise reraised(*value)
        return value
    finally:
        for trainer in trainers:
            ray.kill(trainer)  # and with rank 0 every role actor it owns
        if group is not None:  # its reserved resources back to the cluster
            ray.util.remove_placement_group(group)
        if owns:
            ray.shutdown()
        # ray.kill (and shutdown) return before the trainer's process is gone: wait (bounded)
        # until it has let the output directory's lock go, so a --resume right after starts
        wait_for_release(cfg.output_dir, deadline_s=30.0)


class RayPlacement:
    """The trainer actor's roles: the reward sources, the reference, the separate critic and the
    engines in actors of their own, started here (so owned by the trainer); with several
    trainers, by rank 0 and shared (``ray_group``)."""

    def __init__(self, stop: GracefulStop, run: str, published: list[Any]) -> None:
        self.graceful = stop
        self.run = run
        self.published = published  # [weights, version] rank 0 handed this rank
        self.pool: Any = None

    @staticmethod
    def _actor(cls: type, role: str, settings: RaySettings, *args: Any, **options: Any) -> Any:
        """An actor of ``cls`` for ``role`` with the CPUs and GPUs ``settings`` gives it; its
        constructor gets this process's import paths, then ``args``."""
        import ray

        handle = (
            ray.remote(cls)
            .options(
                num_cpus=getattr(settings, f"ray_{role}_cpus"),
                num_gpus=getattr(settings, f"ray_{role}_gpus"),
                namespace="proxrl",
                **options,
            )
            .remote(list(sys.path), *args)
        )
        return handle

    @staticmethod
    def _ready(handles: list[Any], what: str) -> None:
        refs = [h.ready.remote() for h in handles]
        for error in ray_group.ready_within(refs, what):
            if error is not None:
                raise ProxrlError(error)

    def rewards(self, roles: RoleSettings) -> Any:
        from proxrl.algos.online.placement.ray_roles import RemoteRewards, RewardActor

        name = f"{self.run}-reward"

        def start() -> list[Any]:
            handle = self._actor(RewardActor, "reward", roles.ray, roles.rewards, name=name)
            self._ready([handle], "the reward actor")
            return [handle]

        return RemoteRewards(ray_group.shared(start, [name])[0], roles.ray.output_dir)

    def models(self, roles: RoleSettings, algo: Algorithm) -> Models:
        from proxrl.algos.online.placement.ray_critic import (
            CriticActor,
            remote_loader,
        )
        from proxrl.algos.online.placement.ray_roles import (
            EngineActor,
            EnginePool,
            FrozenActor,
            RemoteFrozen,
        )
        from proxrl.algos.online.placement.ray_weights import TRANSPORTS

        run, ray, model_settings = self.run, roles.ray, roles.models
        n = ray.ray_engines
        names = [f"{run}-engine-{i}" for i in range(n)]
        # each frozen role: its model (None: the policy's)
        frozen = [("reference", None)] if ray.reference_actor else []
        frozen += [("teacher", model_settings.teacher_model)] if ray.teacher_actor else []
        names += [f"{run}-{role}" for role, _ in frozen]
        started: list[Any] = []
        if dist.is_main():  # started now, to load while the policy does
            restarts = ray.ray_engine_restarts
            started = [
                self._actor(
                    EngineActor,
                    "engine",
                    ray,
                    model_settings,
                    roles.engine,
                    name=name,
                    max_restarts=restarts,
                    max_task_retries=restarts,
                )
                for name in names[:n]
            ]
            shared_prefix = roles.engine.shares_prefix
            started += [
                self._actor(FrozenActor, role, ray, model_settings, shared_prefix, model, name=name)
                for (role, model), name in zip(frozen, names[n:], strict=True)
            ]
        if ray.critic_actor:  # loaded in its actor, at the point the loop would load it
            start = partial(self._actor, CriticActor, "critic", ray, name=f"{run}-critic")
            algo = replace(algo, critic=remote_loader(start, algo.critic, ray.output_dir))
        # while the actors load (a teacher's tokenizer is checked here, before any waiting)
        models = load_models(
            model_settings, algo, with_reference=False, with_teacher=not ray.teacher_actor
        )

        def ready() -> list[Any]:
            roles = " or ".join(["the generation engines", *(f"the {r}" for r, _ in frozen)])
            self._ready(started, roles)
            return started

        handles = ray_group.shared(ready, names)
        engines, placed = handles[:n], handles[n:]
        by_role = {role: handle for (role, _), handle in zip(frozen, placed, strict=True)}
        transport = TRANSPORTS[ray.ray_weight_transport]
        self.pool = EnginePool(engines, models.tokenizer.pad_token_id, transport)
        reference, teacher = by_role.get("reference"), by_role.get("teacher")
        return replace(
            models,
            reference=(
                RemoteFrozen(reference, ray.output_dir, "reference")
                if reference is not None
                else models.reference
            ),
            teacher=(
                RemoteFrozen(teacher, ray.output_dir, "teacher")
                if teacher is not None
                else models.teacher
            ),
        )

    def engine(self, roles: RoleSettings, models: Models, prompt_ids: list[list[int]]) -> Any:
        return RayEngines(self, prompt_ids, roles.ray.ahead)

    def stop(self) -> GracefulStop:
        return self.graceful

    def publish(self, actor: nn.Module, version: int) -> float:
        """Rank 0 puts ``actor``'s weights in the object store for the engines and hands the
        reference to the other ranks, which wait for it (ranks hold the same weights after an
        update: one copy serves all); returns the seconds it took here."""
        import ray

        started = time.perf_counter()
        if dist.is_main():
            self.pool.publish(actor, version)
            if dist.world_size() > 1:  # the other ranks' requests may reach an engine first
                self.pool.settle()
            peers = [
                ray.get_actor(ray_group.trainer_name(self.run, rank), namespace="proxrl")
                for rank in range(1, dist.world_size())
            ]
            ray.get([peer.hold_weights.remote(self.pool.weights, version) for peer in peers])
        dist.barrier()
        if not dist.is_main():
            weights, held = self.published
            if held != version:
                raise RuntimeError(f"rank 0 published policy {held}, not {version}")
            self.pool.weights, self.pool.version = weights, version
        return time.perf_counter() - started


class RayEngines:
    """The engine actors' pool as the loop's engine: the policy's weights published at the
    start and after each update, batches launched ahead while the trainer updates (``ahead``:
    async_rollout's; None: none)."""

    def __init__(
        self, placement: RayPlacement, prompt_ids: list[list[int]], ahead: LaunchAhead | None
    ) -> None:
        self.placement = placement
        self.prompt_ids = prompt_ids
        self.ahead = ahead
        self.update_started = 0.0

    def sampler(self, policy: nn.Module) -> Any:
        return self.placement.pool

    def start(self, policy: nn.Module, iteration: int) -> None:
        self.placement.publish(policy, iteration)

    def before_update(self, iteration: int) -> None:
        """Launch the batches up to ``max_staleness`` iterations ahead (async_rollout) with the
        weights the engines hold now, then note when the update starts."""
        ahead, pool = self.ahead, self.placement.pool
        if ahead is not None:
            pool.pending = [p for p in pool.pending if p.iteration > iteration]
            last = min(iteration + ahead.max_staleness, ahead.iterations - 1)
            for later in range(iteration + 1, last + 1):
                if later in pool.launched():
                    continue
                n = len(self.prompt_ids)
                order = prompt_order(n, ahead.rollout_batch_size, later, ahead.seed)
                ids = [self.prompt_ids[i] for i in per_response(order, ahead.group_size)]
                pool.prefetch(later, ids, ahead.sampling, with_logprobs=True)
        self.update_started = time.time()

    def after_update(self, policy: nn.Module, iteration: int) -> dict[str, float]:
        ended = time.time()
        pool = self.placement.pool
        metrics = ray_group.group_metrics(dist.all_gather_objects(pool.metrics(iteration - 1)))
        metrics["time/update_start"], metrics["time/update_end"] = self.update_started, ended
        metrics["time/weight_sync_s"] = self.placement.publish(policy, iteration)
        return metrics

    def close(self) -> None:
        pass


def wait_for_release(output_dir: str, deadline_s: float) -> None:
    """Return once no process holds ``output_dir``'s run lock, or after ``deadline_s`` seconds
    (then the next run there says which process still holds it)."""
    from proxrl.runtime.run_dir import check_not_locked

    end = time.monotonic() + deadline_s
    while True:
        try:
            check_not_locked(output_dir)
            return
        except ProxrlError:
            if time.monotonic() > end:
                return
            time.sleep(0.2)
