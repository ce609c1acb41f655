"""``sampler: vllm`` on a run that starts from a directory holding a LoRA adapter: the engine
starts from the adapter's base (vLLM cannot read an adapter directory as a model), the first
weight sync brings the adapted policy, and the engine ends the run scoring as the saved model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from proxrl.algos.online import grpo
from proxrl.algos.online.roles import role_settings
from proxrl.algos.online.samplers import engine_options
from proxrl.models.causal_lm import load_causal_lm
from proxrl.models.lora import apply_lora
from proxrl.rollout.engines import VLLMEngine
from tests.vllm.test_vllm_training import _engine_matches_saved_policy, small

HERE = Path(__file__).parent


@pytest.mark.parametrize("sync", ["merged", "adapter"])
def test_a_lora_run_from_an_adapter_directory_samples_the_adapted_policy(
    tiny_lm, prompts, tmp_path, monkeypatch, sync, train, engines
):
    """With adapter syncs the engine's base is the adapted model (the run's first sync sends the
    policy's base weights) and the new adapter is applied on it."""
    monkeypatch.syspath_prepend(str(HERE))  # the reward functions of tests/vllm/rewards.py
    kept: list = []  # the run's adapters, left loaded at its close to be checked
    monkeypatch.setattr(VLLMEngine, "close", lambda engine: kept.append(engine.adapters))
    adapted = apply_lora(load_causal_lm(tiny_lm), r=4)
    with torch.no_grad():
        for param in adapted.parameters():
            if param.requires_grad:
                param.add_(0.05)
    adapted.save_pretrained(tmp_path / "adapter")  # no config.json, no tokenizer: peft's layout
    cfg = small(
        grpo.Config,
        str(tmp_path / "adapter"),
        prompts,
        tmp_path / "run",
        lora_r=4,
        iterations=2,
        vllm_lora_sync=sync,
    )

    train(grpo, cfg)

    assert _engine_matches_saved_policy(cfg, tmp_path / "run", engines, kept[0]) < 1e-4
    kept[0].close(engines.get(engine_options(role_settings(cfg).engine)).llm)
