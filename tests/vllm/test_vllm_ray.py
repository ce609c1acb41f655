"""``placement: ray`` with ``sampler: vllm``: a vLLM engine inside each engine actor, given the
trainer's weights after every update (through the object store)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from proxrl.algos.online import grpo
from proxrl.runtime.metrics import read_metrics

pytest.importorskip("ray")


def test_vllm_engine_actors_sample_with_the_latest_weights(tiny_lm, prompts, tmp_path):
    """Each batch's engine log-probs agree with the trainer's π_old pass to vLLM's float32
    rounding at every iteration, while the policy moves: the engines were synced after every
    update (a stale engine's log-probs lag the trainer's by a whole update)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        cfg = grpo.Config(
            model=tiny_lm,
            prompts=prompts,
            reward_fn=("tests.vllm.rewards:target_fraction",),
            output_dir=str(tmp_path),
            iterations=3,
            rollout_batch_size=4,
            group_size=2,
            max_new_tokens=8,
            temperature=1.0,
            mini_batch_size=8,
            ppo_epochs=2,
            learning_rate=1e-2,
            progress=False,
            seed=3,
            sampler="vllm",
            vllm_gpu_memory_utilization=0.02,
            sampler_logprobs=True,
            rollout_correction="tis",
            placement="ray",
        )
        grpo.train(cfg)
    finally:
        ray.shutdown()
    rows = read_metrics(tmp_path)
    assert len(rows) == 3
    for row in rows:  # measured: KL ≤ 6e-14, ratios within 1e-6 of 1
        assert row["rollout/mismatch_kl"] < 1e-10, row
        assert 1 - 1e-5 < row["rollout/is_ratio_min"] <= row["rollout/is_ratio_max"] < 1 + 1e-5, row
    first = load_file(Path(tiny_lm) / "model.safetensors")
    final = load_file(tmp_path / "model.safetensors")
    assert any(not torch.allclose(first[k], final[k]) for k in first), "nothing trained"
