"""Which operations create large tensors: a dispatch mode that records every operation whose
output is a new tensor of at least ``numel`` elements (not a view of an input), in the forward
and in the backward alike (autograd's engine runs the backward's operations through it)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LargeAllocations(TorchDispatchMode):
    """``with LargeAllocations(n) as seen: ...``, then ``seen.ops``: the operations, in order,
    that made a new tensor of ``n`` or more elements."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel = numel
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {
            a.untyped_storage().data_ptr()
            for a in tree_flatten((args, kwargs))[0]
            if isinstance(a, torch.Tensor)
        }
        for tensor in tree_flatten(out)[0]:
            if (
                isinstance(tensor, torch.Tensor)
                and tensor.numel() >= self.numel
                and tensor.untyped_storage().data_ptr() not in inputs
            ):
                self.ops.append(str(func))
        return out
