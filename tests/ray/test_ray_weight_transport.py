"""``ray_weight_transport``: the weights broadcast over a process group of the trainer and the
engines give the run the object store gives, and really travel through the group."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from proxrl.algos.online import ppo
from proxrl.models.causal_lm import load_causal_lm
from proxrl.runtime.metrics import read_metrics
from tests.ray.test_placement import assert_same_run, config

TWO_ENGINES = {
    "placement": "ray",
    "ray_engines": 2,
    "ray_engine_cpus": 0.125,
    "ray_engine_restarts": 0,
}


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    import json

    words = ["abc", "def", "ghi", "jkl", "mno", "pqr", "stu", "vwx"]
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in words))
    return str(path)


def test_process_group_weights_give_the_object_store_run_and_go_by_broadcast(
    local_ray, tiny_lm, prompts, tmp_path
):
    """Synchronous PPO with 2 engines, float64: the same metrics to round-off and the same final
    weights with either transport. By object store each engine reads one copy per policy version
    and receives nothing by broadcast; by process group each receives every weight's bytes once
    per version (the first publish and each update) and reads no object-store copy."""
    model_bytes = sum(
        t.numel() * t.element_size()
        for t in load_causal_lm(tiny_lm, dtype="float64").state_dict().values()
    )
    runs: dict[str, Path] = {}
    for transport in ("object_store", "process_group"):
        runs[transport] = out = tmp_path / transport
        ppo.train(config(tiny_lm, prompts, out, ray_weight_transport=transport, **TWO_ENGINES))
    store, group = read_metrics(runs["object_store"]), read_metrics(runs["process_group"])
    versions = [2.0 * (i + 1) for i in range(3)]  # 2 engines × (i + 1) versions at iteration i
    assert [r["rollout/weight_store_loads"] for r in store] == versions
    assert [r["rollout/weight_broadcast_bytes"] for r in store] == [0.0] * 3
    assert [r["rollout/weight_store_loads"] for r in group] == [0.0] * 3
    assert [r["rollout/weight_broadcast_bytes"] for r in group] == [
        v * model_bytes for v in versions
    ]
    first = load_causal_lm(tiny_lm, dtype="float64").state_dict()
    final = load_causal_lm(str(runs["process_group"]), dtype="float64").state_dict()
    assert any(not torch.equal(first[k], final[k]) for k in first), "nothing trained"
    assert_same_run(runs["process_group"], runs["object_store"])


def test_process_group_weights_reach_engines_generating_ahead(
    local_ray, tiny_lm, prompts, tmp_path
):
    """GRPO with the next batch sampled while this one trains (async_rollout, max_staleness 1):
    the broadcast of each update queues behind the engine's batch in flight, and the run is the
    object-store one to round-off. The batch of iteration i + 1 is sampled by an engine holding
    versions 0..i, received by broadcast: 1, 1, 2, 3 copies of the model."""
    from proxrl.algos.online import grpo

    model_bytes = sum(
        t.numel() * t.element_size()
        for t in load_causal_lm(tiny_lm, dtype="float64").state_dict().values()
    )
    fields = dict(
        model=tiny_lm,
        prompts=prompts,
        reward_fn=("tests.algos.online_rewards:target_fraction",),
        iterations=4,
        rollout_batch_size=4,
        group_size=2,
        max_new_tokens=6,
        mini_batch_size=8,
        learning_rate=3e-3,
        dtype="float64",
        progress=False,
        seed=3,
        placement="ray",
        ray_engine_restarts=0,
        async_rollout=True,
        sampler_logprobs=True,
        rollout_correction="tis",
    )
    for transport in ("object_store", "process_group"):
        out = str(tmp_path / transport)
        grpo.train(grpo.Config(**fields, output_dir=out, ray_weight_transport=transport))
    rows = read_metrics(tmp_path / "process_group")
    assert [r["rollout/staleness"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert [r["rollout/weight_store_loads"] for r in rows] == [0.0] * 4
    copies = [r["rollout/weight_broadcast_bytes"] / model_bytes for r in rows]
    assert copies == [1.0, 1.0, 2.0, 3.0]
    assert_same_run(tmp_path / "process_group", tmp_path / "object_store")
