"""A thin layer over ``accelerate`` for data-parallel and sharded runs.

Under ``accelerate launch`` or ``torchrun`` (``WORLD_SIZE`` > 1 in the environment) the first
call builds ``accelerate.PartialState`` (which starts the process group: NCCL on GPUs, gloo on
CPUs). An accelerate config with ``distributed_type: FSDP`` makes the run sharded: proxrl
applies FSDP2 (``fully_shard``) itself, on GPUs and CPUs alike (``runtime.fsdp`` says why).
Otherwise every function here is a no-op on a world of one process, and accelerate is never
imported: the single-process path is unchanged.

What each function guarantees:
- ``shard(items)``: rank r takes ``items[r::world]``, a deterministic split that needs no
  communication; with ``len(items)`` divisible by the world size every rank gets the same count.
- ``all_reduce_sum`` / ``all_reduce_mean``: on a tensor, a float, or a dict of floats (keys
  are unioned across ranks; a missing key counts as 0). Dicts and floats travel in float64.
- ``split_global(value, field)``: a global batch size divided by the world size, or a
  ``ProxrlError`` naming the config field.
- ``wrap_model``: ``fully_shard`` for FSDP (chosen by the launch config); the model itself on
  one process and for plain data parallelism (see its docstring).
- ``all_reduce_gradients``: sum of every gradient over ranks (the DDP path accumulates locally
  under ``no_sync`` and reduces once per optimizer step, so ranks may hold different numbers of
  micro-batches, even none).
- ``gathered_for_generation(model)``: full weights during generation under FSDP, gathered
  once, so ranks may sample different numbers of steps.
- ``full_state(obj)``: sharded tensors gathered whole, on every rank (checkpoints, saves).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any, TypeVar, overload

import torch
import torch.distributed as torch_dist
from torch import Tensor, nn

from proxrl.runtime import fsdp
from proxrl.runtime.errors import ProxrlError

T = TypeVar("T")


def _env_world_size() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
SINGLE_PROCESS_LAUNCH = (
    "accelerate launch asked for several processes but started only this one (its --cpu / "
    "MULTI_CPU mode needs MPI); on one machine run: accelerate launch --multi_gpu "
    "--num_processes N -m proxrl ... (without GPUs proxrl runs the processes on the CPU over "
    "gloo), or torchrun --nproc_per_node N -m proxrl ..."
)


def check_launch() -> None:
    """Refuse a launch that asked for several processes and got one. ``accelerate launch --cpu
    --num_processes N`` (or a MULTI_CPU config) without an MPI hostfile runs the script once, as
    a plain process, with no error: the run would silently be single-process. Its launcher sets
    MASTER_ADDR/MASTER_PORT only when more than one process is asked for, while every launcher
    that does start several (torchrun, accelerate's multi-GPU path, mpirun) sets a world size."""
    fsdp.check_request()
    launched_by_accelerate = "ACCELERATE_USE_CPU" in os.environ
    asked_for_several = "MASTER_PORT" in os.environ
    got_several = any(os.environ.get(name) for name in WORLD_SIZE_VARIABLES)
    if launched_by_accelerate and asked_for_several and not got_several:
        raise ProxrlError(SINGLE_PROCESS_LAUNCH)


@lru_cache(maxsize=1)
def _state() -> Any:
    """``accelerate.PartialState`` when launched on several processes, else ``None``."""
    if _env_world_size() <= 1:
        return None
    # torch._dynamo imported after a process group exists (torch.compile, transformers'
    # generate) keeps the group alive past destroy_process_group, and its gloo threads then
    # run into interpreter shutdown, where they can abort a finished run. Imported before the
    # group, it holds none.
    import torch._dynamo  # noqa: F401
    from accelerate import PartialState

    # Without a GPU, accelerate only goes multi-process on the CPU when told (cpu=True); it then
    # reads WORLD_SIZE/RANK from the launcher (torchrun, accelerate launch) and picks gloo.
    state = PartialState(cpu=not torch.cuda.is_available())
    atexit.register(_shutdown)
    return state


def _shutdown() -> None:
    """Destroy the process group before the interpreter exits: a gloo group left to C++
    destructors can abort the process ("terminate called without an active exception")."""
    if torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def end_launched_process(exit_code: int) -> None:
    """End this rank of a launched run now, with ``exit_code``; return at once in a process
    that no launcher started (a one-process run ends as usual, even where a library made a
    group of one, as vLLM does, and ``cli.main`` called in-process returns).

    destroy_process_group cannot stop gloo's threads once FSDP2 has run: torch keeps each device
    mesh, and with it the group, in module-level caches (DTensor's sharding and redistribution
    plans, ``MeshTopoInfo``). Left to interpreter shutdown, those threads race C++ teardown and
    now and then abort a rank whose run has finished and saved (exit -6, "terminate called
    without an active exception"). So Python's exit handlers run here (``_shutdown`` among
    them: the ranks still leave the group together), the streams are flushed, and the process
    ends without C++ static teardown."""
    if _env_world_size() <= 1 or not (torch_dist.is_available() and torch_dist.is_initialized()):
        return
    atexit._run_exitfuncs()  # logging's, the trackers', proxrl's own: nothing is skipped
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(exit_code)


@lru_cache(maxsize=1)
def accelerator() -> Any:
    """The process's ``accelerate.Accelerator`` (launched runs only)."""
    if _state() is None:
        raise RuntimeError("accelerator() is only available in a launched multi-process run")
    from accelerate import Accelerator

    return Accelerator(cpu=not torch.cuda.is_available())


def world_size() -> int:
    state = _state()
    return 1 if state is None else int(state.num_processes)


def rank() -> int:
    state = _state()
    return 0 if state is None else int(state.process_index)


def is_main() -> bool:
    """Whether this process writes (metrics, samples, checkpoints, final models)."""
    return rank() == 0


def device() -> torch.device:
    """This process's device: accelerate's choice when launched, else the first GPU or the CPU."""
    state = _state()
    if state is not None:
        return torch.device(state.device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def barrier() -> None:
    if world_size() > 1:
        _state().wait_for_everyone()


def split_global(value: int, field: str) -> int:
    """``value`` (a global batch size) per rank; ``ProxrlError`` naming ``field`` when the
    world size does not divide it."""
    n = world_size()
    if value % n:
        raise ProxrlError(
            f"{field}: the global batch of {value} does not divide across {n} processes; "
            f"use a multiple of {n}"
        )
    return value // n


def shard(items: Sequence[T]) -> list[T]:
    """This rank's share of ``items``: every ``world_size``-th one from ``rank``."""
    return list(items[rank() :: world_size()])


def _reduce_tensor(x: Tensor, op: Any) -> Tensor:
    if world_size() == 1:
        return x
    out = x.detach().clone()
    moved = out.to(device()) if device().type != "cpu" and out.device.type == "cpu" else out
    torch_dist.all_reduce(moved, op=op)
    return moved.to(x.device)


def _dict_keys(values: dict[str, float]) -> list[str]:
    gathered: list[Any] = [None] * world_size()
    torch_dist.all_gather_object(gathered, sorted(values))
    return sorted({key for keys in gathered for key in keys})


def _reduce_dict(values: dict[str, float], op: Any) -> dict[str, float]:
    keys = _dict_keys(values)
    packed = torch.tensor([float(values.get(k, 0.0)) for k in keys], dtype=torch.float64)
    reduced = _reduce_tensor(packed, op)
    return {k: float(v) for k, v in zip(keys, reduced.tolist(), strict=True)}


@overload
def all_reduce_sum(x: Tensor) -> Tensor: ...
@overload
def all_reduce_sum(x: dict[str, float]) -> dict[str, float]: ...
@overload
def all_reduce_sum(x: float) -> float: ...
def all_reduce_sum(x: Any) -> Any:
    """Sum over ranks (a new object; the input is left as it is)."""
    if world_size() == 1:
        return x
    if isinstance(x, Tensor):
        return _reduce_tensor(x, torch_dist.ReduceOp.SUM)
    if isinstance(x, dict):
        return _reduce_dict(x, torch_dist.ReduceOp.SUM)
    return float(
        _reduce_tensor(torch.tensor(float(x), dtype=torch.float64), torch_dist.ReduceOp.SUM)
    )


@overload
def all_reduce_mean(x: Tensor) -> Tensor: ...
@overload
def all_reduce_mean(x: dict[str, float]) -> dict[str, float]: ...
@overload
def all_reduce_mean(x: float) -> float: ...
def all_reduce_mean(x: Any) -> Any:
    """Mean over ranks (each rank weighs the same)."""
    n = world_size()
    if n == 1:
        return x
    total = all_reduce_sum(x)
    if isinstance(total, dict):
        return {k: v / n for k, v in total.items()}
    return total / n


def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on any (e.g. a stop signal seen by one rank)."""
    if world_size() == 1:
        return flag
    return all_reduce_sum(1.0 if flag else 0.0) > 0


def all_gather_objects(obj: T) -> list[T]:
    """``obj`` of every rank, in rank order (picklable objects; small ones)."""
    if world_size() == 1:
        return [obj]
    gathered: list[Any] = [None] * world_size()
    torch_dist.all_gather_object(gathered, obj)
    return gathered


def broadcast_object(obj: T) -> T:
    """Rank 0's ``obj`` on every rank."""
    if world_size() == 1:
        return obj
    box = [obj]
    torch_dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[return-value]


def sampler_seed(seed: int) -> int:
    """The seed of this rank's sampler: ``seed + rank``, so ranks draw different samples."""
    return seed + rank()


# ------------------------------------------------------------------------------------------
# Models


def distributed_type() -> str:
    """``"NO"`` on one process, ``"FSDP"`` when the launch asked for it (on a CPU too, where
    accelerate itself reports ``MULTI_CPU``), else accelerate's ``DistributedType`` name
    (``MULTI_CPU``, ``MULTI_GPU``, ...)."""
    state = _state()
    if state is None:
        return "NO"
    return "FSDP" if fsdp.requested() else str(state.distributed_type.value)


def is_sharded() -> bool:
    """FSDP2: the engine owns gradient reduction (an average over ranks) and the weights."""
    return distributed_type() == "FSDP"


def wrap_model(model: nn.Module) -> nn.Module:
    """Shard ``model`` with FSDP2 in place (``runtime.fsdp.shard_model``) when the launch asked
    for FSDP, and return it; call it before building the model's optimizer.

    On one process, and for plain data parallelism (DDP, ``MULTI_GPU`` / ``MULTI_CPU``), the
    model comes back unchanged: the trainers accumulate a step locally and sum the gradients
    once with ``all_reduce_gradients`` — what DDP's ``no_sync`` + final sync computes —
    without a wrapper that hides the model's attributes from code that calls its submodules
    (the reward model's and critic's backbone + head). DDP's start-up broadcast is not needed:
    every rank loads the same weights with the same seed."""
    if world_size() == 1 or not is_sharded():
        return model
    return fsdp.shard_model(model, device(), world_size())


def unwrap_parallel(model: nn.Module) -> nn.Module:
    """The plain module inside a data-parallel wrapper (DDP); an FSDP2 module is its own (its
    class is swapped in place); a peft wrapper stays (``models.scalar_head.unwrap_peft``)."""
    if world_size() == 1 or is_sharded():
        return model
    return accelerator().unwrap_model(model)  # type: ignore[no-any-return]


def full_state(obj: T) -> T:
    """``obj`` with every FSDP-sharded tensor gathered whole (``runtime.fsdp.full_state``): on
    every rank, which must all call it. Without sharding, ``obj`` itself."""
    if not is_sharded():
        return obj
    return fsdp.full_state(obj)  # type: ignore[no-any-return]


@contextlib.contextmanager
def no_sync(model: nn.Module) -> Iterator[None]:
    """Skip DDP's per-backward all-reduce (``all_reduce_gradients`` reduces once per step)."""
    sync_off = getattr(model, "no_sync", None)
    if world_size() == 1 or sync_off is None or is_sharded():
        yield
        return
    with sync_off():
        yield


def all_reduce_gradients(params: Sequence[nn.Parameter]) -> None:
    """Sum every parameter's gradient over ranks, in place (a rank without a gradient adds
    zeros). Flattened into one buffer per dtype so it is one collective per dtype."""
    if world_size() == 1:
        return
    by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
    for p in params:
        by_dtype.setdefault(p.dtype, []).append(p)
    for dtype, group in by_dtype.items():
        flat = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in group]
        ).to(dtype)
        torch_dist.all_reduce(flat, op=torch_dist.ReduceOp.SUM)
        offset = 0
        for p in group:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n


@contextlib.contextmanager
def gathered_for_generation(model: nn.Module) -> Iterator[nn.Module]:
    """Yield a module whose full weights are present on this rank, for ``generate``.

    - one process / DDP: the plain module (weights are already whole);
    - FSDP2: every group gathered once and kept whole until the block ends
      (``runtime.fsdp.unsharded``), so sampling runs no collective and ranks may stop at
      different steps. Every rank must enter it (the gather is a collective).
    """
    if world_size() == 1 or not is_sharded():
        yield unwrap_parallel(model)
        return
    with fsdp.unsharded(model) as whole:
        yield whole
