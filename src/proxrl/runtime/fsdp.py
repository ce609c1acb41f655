"""FSDP2 (``torch.distributed.fsdp.fully_shard``), applied by proxrl itself, on GPUs and CPUs.

How a run asks for it: the way accelerate and TRL users already do, ``accelerate launch
--config_file configs/accelerate/fsdp.yaml -m proxrl ...`` (``distributed_type: FSDP``,
``fsdp_version: 2``). accelerate's launcher exports the choice as ``ACCELERATE_USE_FSDP`` and
``FSDP_*`` variables; proxrl reads them and shards the trained models here. accelerate's own
``prepare`` is not used because on a machine without a GPU accelerate turns FSDP off (its
state becomes ``MULTI_CPU``) while ``fully_shard`` itself runs over gloo: applying it here
keeps one code path, and the CPU tests prove the path a GPU run takes. ``torchrun`` users
set the same variables (``ACCELERATE_USE_FSDP=true FSDP_VERSION=2 torchrun ...``).

What is sharded: every transformer block (the classes in ``FSDP_TRANSFORMER_CLS_TO_WRAP``,
else the model's ``_no_split_modules``), then the modules proxrl calls directly: the whole
model for a causal LM (its tied embedding and head stay in one group); the backbone and the
score head for a sequence classifier (reward model, critic), whose losses call the two past
the model's ``forward``. Gradients are averaged over ranks by FSDP (its reduce-scatter), so
the trainers weigh each loss by ``world / global units``.

Weights leave a sharded module only gathered (``full_state``: every rank calls it, each gets
the full tensors), so a checkpoint or a saved model written by a sharded run loads in one
process; a full checkpoint loaded into a sharded run is cut to each rank's shard
(``shard_like``). For generation every group is gathered once and kept whole until the
sampler is done (``unsharded``): no collective runs per decoded token, so ranks may stop
sampling at different steps.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any, cast

import torch
from torch import Tensor, nn

from proxrl.runtime.errors import ProxrlError

log = logging.getLogger(__name__)

DEEPSPEED_REFUSED = (
    "DeepSpeed is not supported by proxrl (its engine owns backward, step and checkpoints, "
    "and it cannot be tested here); launch with configs/accelerate/fsdp.yaml: FSDP2 full "
    "shard partitions weights, gradients and Adam states as ZeRO-3 does"
)


def _flag(name: str) -> bool:
    return os.environ.get(name, "false").strip().lower() in ("1", "true", "yes")


def requested() -> bool:
    """Whether the launch asked for FSDP (``ACCELERATE_USE_FSDP``, set by ``accelerate launch``
    from a ``distributed_type: FSDP`` config)."""
    return _flag("ACCELERATE_USE_FSDP")


def check_request() -> None:
    """Refuse, in one line, what the launch asked for and proxrl does not run: DeepSpeed,
    FSDP version 1, FSDP parameter offload."""
    if _flag("ACCELERATE_USE_DEEPSPEED"):
        raise ProxrlError(DEEPSPEED_REFUSED)
    if not requested():
        return
    version = os.environ.get("FSDP_VERSION", "1")
    if version != "2":
        raise ProxrlError(
            f"fsdp_version: the accelerate config asks for FSDP {version}; proxrl shards with "
            "FSDP2 (fully_shard) only: set fsdp_version: 2"
        )
    if _flag("FSDP_CPU_RAM_EFFICIENT_LOADING"):
        # transformers would leave the weights of ranks > 0 on the meta device, waiting for a
        # broadcast from rank 0 that proxrl does not run: every rank loads the checkpoint.
        os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "false"
        log.warning("fsdp_cpu_ram_efficient_loading is off: every rank loads the full weights")
    if _flag("FSDP_OFFLOAD_PARAMS"):
        raise ProxrlError(
            "fsdp_offload_params: proxrl's FSDP2 path does not offload parameters to the CPU; "
            "set it to false (offload_frozen_roles moves the reference and reward model)"
        )


def _layer_classes(model: nn.Module) -> set[str]:
    named = os.environ.get("FSDP_TRANSFORMER_CLS_TO_WRAP", "")
    if named.strip():
        return {name.strip() for name in named.split(",") if name.strip()}
    return {
        name
        for module in model.modules()
        for name in (getattr(module, "_no_split_modules", None) or ())
    }


def _entry_modules(model: nn.Module) -> list[nn.Module]:
    """The modules proxrl's code calls: the score head and the backbone of a sequence
    classifier (called one after the other, past its ``forward``), else the model."""
    get_base = getattr(model, "get_base_model", None)  # a peft wrapper
    inner = get_base() if callable(get_base) else model
    head = next(
        (
            getattr(inner, name)
            for name in ("score", "classifier")
            if isinstance(getattr(inner, name, None), nn.Module)
        ),
        None,
    )
    prefix = getattr(inner, "base_model_prefix", "")
    body = getattr(inner, prefix, None) if prefix else None
    if head is not None and isinstance(body, nn.Module):
        return [body, head]
    return [model]


def shard_model(model: nn.Module, device: torch.device, world: int) -> nn.Module:
    """``fully_shard`` the blocks and the entry modules of ``model`` in place, over every rank
    (a 1-D mesh on ``device``'s type), and return it. Every rank must call it with the same
    weights (proxrl loads them seeded and from the same files)."""
    if hasattr(model, "peft_config"):
        raise ProxrlError(
            "lora_r: LoRA is not sharded by proxrl's FSDP2 path (its adapters are small); "
            "train LoRA data parallel (configs/accelerate/multi_gpu_ddp.yaml)"
        )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world,))
    reshard = os.environ.get("FSDP_RESHARD_AFTER_FORWARD", "true").strip().lower() != "false"
    layers = _layer_classes(model)
    blocks = [m for m in model.modules() if type(m).__name__ in layers]
    entries = _entry_modules(model)
    for module in [*blocks, *entries]:  # blocks first: a group takes what no inner one holds
        fully_shard(module, mesh=mesh, reshard_after_forward=reshard)
    log.info(
        "FSDP2: %d %s blocks and %d entry modules sharded over %d ranks",
        len(blocks),
        "/".join(sorted(layers)) or "no",
        len(entries),
        world,
    )
    unsharded = [name for name, p in model.named_parameters() if not is_dtensor(p)]
    if unsharded:  # a parameter outside every group would be trained apart on each rank
        raise RuntimeError(f"FSDP left {len(unsharded)} parameters unsharded: {unsharded[:3]}")
    return model


def is_dtensor(x: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(x, DTensor)


def full_state(obj: Any) -> Any:
    """``obj`` (a tensor, or dicts / lists / tuples of them) with every sharded tensor gathered
    whole (a collective: every rank calls it in the same order). Plain values pass as they are."""
    if is_dtensor(obj):
        return obj.full_tensor()
    if isinstance(obj, dict):
        return {key: full_state(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(full_state(value) for value in obj)
    return obj


def shard_like(full: Tensor, like: Tensor) -> Tensor:
    """``full`` cut to this rank's shard of ``like``'s layout when ``like`` is sharded (no
    communication: every rank holds ``full``), else ``full`` itself."""
    if not is_dtensor(like) or is_dtensor(full):
        return full
    from torch.distributed.tensor import DTensor, distribute_tensor

    layout = cast(DTensor, like)
    return distribute_tensor(
        full.to(device=like.device, dtype=like.dtype),
        layout.device_mesh,
        layout.placements,
        src_data_rank=None,
    )


def shard_optimizer_state(
    optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> dict[str, Any]:
    """An optimizer ``state_dict`` of full tensors (as a sharded run saves it, or one process
    wrote it) with each tensor of a sharded parameter's shape cut to this rank's shard."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    per_param = {
        index: {
            key: shard_like(value, params[index])
            if isinstance(value, Tensor) and value.shape == params[index].shape
            else value
            for key, value in entry.items()
        }
        for index, entry in state.get("state", {}).items()
    }
    return {**state, "state": per_param}


def _fsdp_modules(model: nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def unsharded(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` with every FSDP2 group gathered and kept whole (no reshard after a forward)
    until the block ends: the sampler's forwards then run no collective, so ranks may decode
    different numbers of steps. Every rank must enter (the gather is a collective)."""
    modules = _fsdp_modules(model)
    reshard = os.environ.get("FSDP_RESHARD_AFTER_FORWARD", "true").strip().lower() != "false"
    for module in modules:
        module.unshard()
        module.set_reshard_after_forward(False, recurse=False)
    try:
        yield model
    finally:
        for module in modules:
            module.set_reshard_after_forward(reshard, recurse=False)
            module.reshard()
