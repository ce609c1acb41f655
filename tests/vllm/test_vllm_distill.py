"""On-policy distillation with ``sampler: vllm``: vLLM samples the student, the teacher (another
shape, the same tokenizer) scores in the trainer, as with the built-in sampler."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from proxrl.algos.online import grpo
from proxrl.models.tiny import build_tiny_lm
from proxrl.runtime.metrics import read_metrics
from tests.vllm.conftest import CORPUS


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(
        build_tiny_lm(
            tmp_path_factory.mktemp("teacher") / "lm", CORPUS, hidden_size=48, num_layers=1, seed=7
        )
    )


def test_a_teacher_scores_what_vllm_samples(tiny_lm, teacher, prompts, tmp_path: Path, train):
    cfg = grpo.Config(
        model=tiny_lm,
        teacher_model=teacher,
        prompts=prompts,
        output_dir=str(tmp_path),
        iterations=2,
        rollout_batch_size=4,
        group_size=2,
        max_new_tokens=8,
        temperature=1.0,
        mini_batch_size=8,
        learning_rate=3e-3,
        progress=False,
        seed=3,
        sampler="vllm",
        vllm_gpu_memory_utilization=0.02,
    )
    train(grpo, cfg)
    rows = read_metrics(tmp_path)
    assert len(rows) == 2
    for row in rows:
        assert row["time/weight_sync_s"] > 0  # the engine followed the student
        assert math.isfinite(row["distill/reverse_kl"])
        assert row["distill/teacher_logprob"] < 0
        assert 0 <= row["distill/teacher_argmax_agreement"] <= 1
