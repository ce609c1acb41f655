"""runtime.distributed on one process is a no-op, and its pure parts (shard, split_global)
split as documented for any world size (world size and rank patched in)."""

from __future__ import annotations

import pytest
import torch

from proxrl.runtime import distributed as dist
from proxrl.runtime.errors import ProxrlError


def test_one_process_is_a_no_op():
    assert (dist.world_size(), dist.rank(), dist.is_main()) == (1, 0, True)
    x = torch.tensor([1.5, -2.0])
    assert dist.all_reduce_sum(x) is x and dist.all_reduce_mean(x) is x
    assert dist.all_reduce_sum({"loss": 0.25}) == {"loss": 0.25}
    assert dist.all_reduce_sum(3.0) == 3.0
    assert dist.any_rank(False) is False and dist.any_rank(True) is True
    assert dist.shard([5, 6, 7]) == [5, 6, 7]
    assert dist.split_global(7, "batch_size") == 7
    assert dist.sampler_seed(11) == 11
    model = torch.nn.Linear(2, 1)
    assert dist.wrap_model(model) is model and dist.unwrap_parallel(model) is model
    with dist.gathered_for_generation(model) as whole:
        assert whole is model
    assert dist.distributed_type() == "NO" and not dist.is_sharded()


@pytest.mark.parametrize("world", [2, 3])
def test_shard_takes_every_world_th_item_and_the_shards_partition_the_list(monkeypatch, world):
    items = list(range(10))
    monkeypatch.setattr(dist, "world_size", lambda: world)
    shards = []
    for r in range(world):
        monkeypatch.setattr(dist, "rank", lambda r=r: r)
        shards.append(dist.shard(items))
    assert shards[0] == items[0::world] and shards[1] == items[1::world]
    assert sorted(i for s in shards for i in s) == items
    monkeypatch.setattr(dist, "rank", lambda: 1)
    assert dist.sampler_seed(11) == 12


def test_split_global_divides_or_names_the_field(monkeypatch):
    monkeypatch.setattr(dist, "world_size", lambda: 4)
    assert dist.split_global(16, "rollout_batch_size") == 4
    with pytest.raises(
        ProxrlError,
        match=(
            r"^rollout_batch_size: the global batch of 6 does not divide across 4 processes; "
            r"use a multiple of 4$"
        ),
    ):
        dist.split_global(6, "rollout_batch_size")
