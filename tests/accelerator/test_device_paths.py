"""The code paths that differ on a GPU: models placed on the device (and frozen roles on the
CPU with ``offload_frozen_roles``), sampling and log-probs there, bf16 autocast on both
devices, the compiled sampler, and a run that learns. Skipped without a GPU (see conftest)."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from proxrl.algos.offline import sft
from proxrl.algos.online import grpo, ppo
from proxrl.algos.online import run as online
from proxrl.data.batching import pad_left
from proxrl.models.causal_lm import load_causal_lm
from proxrl.models.tokenizer import load_tokenizer
from proxrl.rollout.forward import policy_forward
from proxrl.rollout.generation import CachedSampler, HFSampler, SamplingSettings
from proxrl.runtime.metrics import read_metrics
from tests.algos.conftest import reward_model  # noqa: F401  (a fixture)
from tests.algos.lm_tasks import sft_rows, write_jsonl
from tests.algos.test_mixed_precision import linear_output_dtypes
from tests.algos.test_online import prompts, scores, small  # noqa: F401  (fixtures)


@pytest.mark.parametrize("sampler", ["hf", "cached", "compiled"])
def test_samplers_on_the_device_match_a_fresh_forward(sampler, device, tiny_lm):
    """Left-padded prompts on the device: each sampler's log-probs equal a full forward pass
    over its tokens (float32; TF32 is off by default for matrix products)."""
    tokenizer, model = load_tokenizer(tiny_lm), load_causal_lm(tiny_lm).to(device)
    ids = [tokenizer(f"say: {w} ->")["input_ids"] for w in ["abc", "de fg", "x", "hij kl mn"]] * 4
    prompt_ids = pad_left(ids, tokenizer.pad_token_id).to(device)
    prompt_mask = pad_left([[1] * len(r) for r in ids], 0).to(device)
    torch.manual_seed(0)
    chosen = (
        HFSampler(model, tokenizer)
        if sampler == "hf"
        else CachedSampler(model, tokenizer, compile_step=sampler == "compiled")
    )
    s = chosen.sample(
        prompt_ids, prompt_mask, SamplingSettings(16, temperature=0.7), with_logprobs=True
    )
    assert s.response_ids.device.type == device.type
    with torch.no_grad():
        full = policy_forward(
            model,
            torch.cat([prompt_ids, s.response_ids], 1),
            torch.cat([prompt_mask, s.response_mask], 1),
            prompt_ids.shape[1],
            0.7,
        )
    valid = s.response_mask.bool()
    torch.testing.assert_close(s.logprobs[valid], full.logprobs[valid], rtol=0, atol=1e-4)


def test_ppo_places_roles_and_trains_in_bf16(
    device,
    tiny_lm,
    prompts,  # noqa: F811  (a fixture)
    reward_model,  # noqa: F811  (a fixture)
    tmp_path,
    monkeypatch,
):
    """offload_frozen_roles: actor and critic on the device, reference and reward model on the
    CPU; bf16 autocast reaches the transformer layers on both; scores and values stay float32;
    every metric finite; the saved policy float32."""
    placed = {}
    place_roles = online.place_roles

    def record(models, rewards, offload_frozen):  # type: ignore[no-untyped-def]
        place_roles(models, rewards, offload_frozen)
        placed.update(
            actor=models.actor,
            critic=models.critic,
            reference=models.reference,
            reward=rewards.sources[0].model,
        )

    monkeypatch.setattr(online, "place_roles", record)
    cfg = small(
        ppo.Config,
        tiny_lm,
        prompts,
        tmp_path,
        iterations=2,
        group_size=2,
        mixed_precision="bf16",
        reward_fn=(),
        reward_model=reward_model,
        critic_learning_rate=1e-3,
        kl_coef=0.05,
        offload_frozen_roles=True,
    )
    with linear_output_dtypes() as seen:
        ppo.train(cfg)
    devices = {role: next(model.parameters()).device.type for role, model in placed.items()}
    assert devices == {
        "actor": device.type,
        "critic": device.type,
        "reference": "cpu",
        "reward": "cpu",
    }
    assert seen == {"body": {torch.bfloat16}, "head": {torch.float32}}
    for row in read_metrics(tmp_path):
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
    assert {t.dtype for t in load_file(str(tmp_path / "model.safetensors")).values()} == {
        torch.float32
    }


def test_grpo_learns_on_the_device(device, tiny_lm, prompts, tmp_path):  # noqa: F811
    cfg = small(
        grpo.Config,
        tiny_lm,
        prompts,
        tmp_path,
        estimator="grpo",
        iterations=30,
        group_size=4,
        ppo_epochs=2,
        mini_batch_size=16,
    )
    grpo.train(cfg)
    history = scores(tmp_path)
    assert sum(history[-5:]) / 5 > sum(history[:5]) / 5 + 0.15, history


def test_sft_trains_on_the_device_and_saves_float32(device, tiny_lm, tmp_path):
    data = write_jsonl(tmp_path / "sft.jsonl", sft_rows(64, seed=0))
    metrics = sft.train(
        sft.Config(
            model=tiny_lm,
            data=data,
            output_dir=str(tmp_path / "run"),
            batch_size=16,
            epochs=2,
            learning_rate=3e-3,
            progress=False,
            mixed_precision="bf16",
        )
    )
    rows = [r["train/loss"] for r in read_metrics(tmp_path / "run") if "train/loss" in r]
    assert rows[-1] < rows[0] and math.isfinite(metrics["train/loss"])
    assert {t.dtype for t in load_file(str(tmp_path / "run" / "model.safetensors")).values()} == {
        torch.float32
    }
