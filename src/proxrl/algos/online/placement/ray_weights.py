"""``ray_weight_transport``: how the policy's weights reach the generation engines after each
update.

``object_store``: one ``ray.put`` of the merged weights per update, every engine reading the same
object (on one node a shared-memory read; a restarted engine reads it again). ``process_group``:
the trainer (rank 0; the data-parallel trainers' own group is not involved) and every engine
(ranks 1..N) join a ``torch.distributed`` process group of their own, rendezvousing at a
``TCPStore`` the trainer hosts, and each update is one broadcast per dtype of a flat buffer of
every weight, received into buffers the engine allocated when it joined: gloo where the weights
are on the CPU, NCCL where they are on a GPU (GPU to GPU, no host copy, as OpenRLHF and veRL
sync their vLLM engines). The engine then loads what it received as it loads the object store's
copy (``load_state_dict``, then ``sync_weights`` into vLLM).
"""

from __future__ import annotations

import datetime
from types import MappingProxyType
from typing import Any

import ray
import torch
import torch.distributed as tdist
from torch import Tensor, nn

from proxrl.models.lora import merged_weights

GROUP_TIMEOUT = datetime.timedelta(minutes=10)

Layout = list[tuple[str, str, tuple[int, ...]]]  # (name, dtype's name, shape) of each weight


def layout_of(named: list[tuple[str, Tensor]]) -> Layout:
    return [(name, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for name, t in named]


def dtypes_of(layout: Layout) -> list[str]:
    """The dtypes in the order of their first weight: one buffer, one broadcast each."""
    return list(dict.fromkeys(dtype for _, dtype, _ in layout))


def flatten(named: list[tuple[str, Tensor]]) -> list[Tensor]:
    """One flat copy per dtype (``dtypes_of``) of every weight of that dtype, in order."""
    layout = layout_of(named)
    return [
        torch.cat(
            [t.reshape(-1) for (_, d, _), (_, t) in zip(layout, named, strict=True) if d == dtype]
        )
        for dtype in dtypes_of(layout)
    ]


def unflatten(layout: Layout, buffers: list[Tensor]) -> dict[str, Tensor]:
    """The weights of ``layout`` as views into the flat ``buffers`` (``flatten``'s inverse)."""
    offsets = dict.fromkeys(dtypes_of(layout), 0)
    index = {dtype: i for i, dtype in enumerate(offsets)}
    state = {}
    for name, dtype, shape in layout:
        size = int(torch.Size(shape).numel())
        start = offsets[dtype]
        state[name] = buffers[index[dtype]][start : start + size].view(shape)
        offsets[dtype] = start + size
    return state


def gloo_group(store: Any, rank: int, world: int) -> Any:
    return tdist.ProcessGroupGloo(store, rank, world, GROUP_TIMEOUT)


def nccl_group(store: Any, rank: int, world: int) -> Any:
    options = tdist.ProcessGroupNCCL.Options()
    options._timeout = GROUP_TIMEOUT
    return tdist.ProcessGroupNCCL(store, rank, world, options)


BACKENDS = MappingProxyType(
    {"cpu": gloo_group, "cuda": nccl_group}
)  # by the device the weights are on


def join_group(address: str, port: int, rank: int, world: int, device: str) -> Any:
    """This process as ``rank`` of the weight group whose store listens at address:port."""
    store = tdist.TCPStore(address, port, world, is_master=False, timeout=GROUP_TIMEOUT)
    return BACKENDS[device](tdist.PrefixStore("proxrl-weights", store), rank, world)


def broadcast(group: Any, buffer: Tensor) -> Any:
    """From the trainer (rank 0) to every engine; the work to wait on."""
    options = tdist.BroadcastOptions()
    options.rootRank = 0
    return group.broadcast([buffer], options)


class WeightReceiver:
    """An engine's end of the group: buffers for ``layout``, filled by each broadcast."""

    def __init__(
        self, address: str, port: int, rank: int, world: int, device: str, layout: Layout
    ) -> None:
        self.layout = layout
        sizes = dict.fromkeys(dtypes_of(layout), 0)
        for _, dtype, shape in layout:
            sizes[dtype] += int(torch.Size(shape).numel())
        self.buffers = [
            torch.empty(size, dtype=getattr(torch, dtype), device=device)
            for dtype, size in sizes.items()
        ]
        self.nbytes = sum(b.numel() * b.element_size() for b in self.buffers)
        self.group = join_group(address, port, rank, world, device)

    def receive(self) -> dict[str, Tensor]:
        for buffer in self.buffers:
            broadcast(self.group, buffer).wait()
        return unflatten(self.layout, self.buffers)


class ObjectStoreWeights:
    """The trainer's side of ``object_store``: the sampling requests carry the reference."""

    def __init__(self, handles: list[Any]) -> None:
        self.handles = handles

    def publish(self, actor: nn.Module, version: int) -> list[Any]:
        """Send policy ``version`` (loaded in the background); returns what a request carries
        for an engine to load it (a reference in a list, so that Ray hands it over unread)."""
        state = {name: tensor.cpu().clone() for name, tensor in merged_weights(actor)}
        weights = [ray.put(state)]
        for handle in self.handles:
            handle.load.remote(weights, version)
        return weights

    def settle(self) -> None:
        """Nothing to wait for: every request carries the reference, and an engine loads it
        before it samples."""


class ProcessGroupWeights:
    """The trainer's side of ``process_group``: the group is built at the first publish, and
    each broadcast runs in the background until the next publish (or ``settle``) waits for it."""

    def __init__(self, handles: list[Any]) -> None:
        self.handles = handles
        self.group: Any = None
        self.layout: Layout = []
        self.pending: list[Any] = []  # the last broadcast's works and the engines' receives
        self.sent: list[Tensor] = []  # its buffers, alive until it is done

    def connect(self, layout: Layout, device: str) -> None:
        from proxrl.algos.online.placement.ray_group import answer, free_address

        world = 1 + len(self.handles)
        address, _ = free_address()
        store = tdist.TCPStore(
            "0.0.0.0", 0, world, is_master=True, wait_for_workers=False, timeout=GROUP_TIMEOUT
        )
        joined = [
            handle.join_weights.remote(address, store.port, rank, world, device, layout)
            for rank, handle in enumerate(self.handles, start=1)
        ]
        self.group = BACKENDS[device](tdist.PrefixStore("proxrl-weights", store), 0, world)
        self.store, self.layout = store, layout
        answer(joined)

    def publish(self, actor: nn.Module, version: int) -> list[Any]:
        named = [(name, tensor.detach()) for name, tensor in merged_weights(actor)]
        layout = layout_of(named)
        self.settle()
        if self.group is None:
            self.connect(layout, named[0][1].device.type)
        elif layout != self.layout:
            raise RuntimeError("the policy's weights changed names, dtypes or shapes mid-run")
        receives = [handle.receive.remote(version) for handle in self.handles]
        self.sent = flatten(named)
        self.pending = [broadcast(self.group, buffer) for buffer in self.sent] + receives
        return []  # the engines hold the weights when a request reaches them: nothing to carry

    def settle(self) -> None:
        from proxrl.algos.online.placement.ray_group import answer

        works, receives = self.pending[: len(self.sent)], self.pending[len(self.sent) :]
        for work in works:
            work.wait()
        answer(receives)
        self.pending, self.sent = [], []


TRANSPORTS = MappingProxyType(
    {"object_store": ObjectStoreWeights, "process_group": ProcessGroupWeights}
)
