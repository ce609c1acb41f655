"""``vllm_lora_sync: adapter``: after each update the engine gets the LoRA adapter alone (a new
vLLM ``LoRARequest`` per version, the previous one removed), the base weights once per run; it
then samples and scores as the trainer's LoRA policy.

Tolerance 1e-5 on log-probs: the engine computes x·Wᵀ + s·(x·Aᵀ)·Bᵀ in float32 as peft does,
in another order, so the two differ by float32 rounding (≈1e-6 on this 2-layer model), while a
stale adapter or the bare base moves them by more than 1e-2."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import torch

from proxrl.algos.online import grpo
from proxrl.algos.online.roles import role_settings
from proxrl.algos.online.samplers import engine_options, lora_sync
from proxrl.models.lora import apply_lora
from proxrl.models.tokenizer import load_tokenizer
from proxrl.rollout.engines import VLLMEngine
from proxrl.rollout.forward import policy_forward
from proxrl.rollout.generation import SamplingSettings
from proxrl.rollout.vllm_sampler import LORA_SYNCS
from proxrl.runtime.errors import ProxrlError
from tests.vllm.test_vllm_training import _rows, small

HERE = Path(__file__).parent
PROMPTS = ["say: abc ->", "copy: de =", "say: x ->", "abc"]
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def setup(tiny_lm, prompts, engines):
    from transformers import AutoModelForCausalLM

    cfg = small(grpo.Config, tiny_lm, prompts, "unused", lora_r=4, vllm_lora_sync="adapter")
    tokenizer = load_tokenizer(tiny_lm)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm, dtype=torch.float32)
    return cfg, tokenizer, model, engines


def _prompts(tokenizer):
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    width = max(map(len, ids))
    prompt_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in ids])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids])
    return prompt_ids, mask


def _gap(engine: VLLMEngine, policy) -> float:
    """Largest |engine − trainer| log-prob of the tokens the engine sampled (T 0.7)."""
    prompt_ids, mask = _prompts(engine.tokenizer)
    torch.manual_seed(1)
    samples = engine.sampler(policy).sample(
        prompt_ids, mask, SamplingSettings(max_new_tokens=10, temperature=0.7), True
    )
    assert samples.response_mask.sum() >= 20
    with torch.no_grad():
        trainer = policy_forward(
            policy,
            torch.cat([prompt_ids, samples.response_ids], 1),
            torch.cat([mask, samples.response_mask], 1),
            prompt_ids.shape[1],
            0.7,
        ).logprobs
    return ((samples.logprobs - trainer) * samples.response_mask).abs().max().item()


def _update(policy, seed: int) -> None:
    """A LoRA update: only the adapter's tensors move (B starts at 0: moved so it matters)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn(p.shape, generator=generator) * 0.2)


def test_adapter_syncs_score_as_the_trainer_and_keep_only_the_newest(setup):
    cfg, tokenizer, model, engines = setup
    settings = role_settings(cfg).engine
    engine = VLLMEngine(engine_options(settings), tokenizer, lora_sync(settings.lora_sync), engines)
    policy = apply_lora(copy.deepcopy(model), r=4)
    _update(policy, seed=2)
    engine.start(policy, 0)
    assert _gap(engine, policy) < TOLERANCE
    first = engine.adapters.request
    _update(policy, seed=3)  # the update
    assert _gap(engine, policy) > 1e-2  # the engine still samples the old adapter: detectable
    seconds = engine.after_update(policy, 0)["time/weight_sync_s"]
    assert seconds > 0
    assert _gap(engine, policy) < TOLERANCE
    second = engine.adapters.request
    _update(policy, seed=4)  # a second update: the newest adapter, not the first or second
    engine.after_update(policy, 1)
    assert _gap(engine, policy) < TOLERANCE
    llm = engine.engine.llm
    assert engine.adapters.request.lora_int_id not in (first.lora_int_id, second.lora_int_id)
    assert llm.llm_engine.list_loras() == {engine.adapters.request.lora_int_id}
    assert [p.name for p in engine.adapters.root.iterdir()] == ["v3"]  # v1, v2 deleted
    with policy.disable_adapter():
        assert _gap(engine, policy) > 1e-2  # the adapter is applied: the bare base differs
    root = engine.adapters.root
    engine.close()
    assert llm.llm_engine.list_loras() == set() and not root.exists()


def test_the_base_weights_are_sent_once_per_run(setup, monkeypatch):
    """A run's first sync sends the base (the engine may hold another run's weights), later
    syncs the adapter alone."""
    from proxrl.rollout import vllm_sampler

    cfg, tokenizer, model, engines = setup
    sent: list[bool] = []
    reload = vllm_sampler.sync_weights
    monkeypatch.setattr(
        vllm_sampler,
        "sync_weights",
        lambda e, m, deltas=True: sent.append(deltas) or reload(e, m, deltas),
    )
    settings = role_settings(cfg).engine
    engine = VLLMEngine(engine_options(settings), tokenizer, LORA_SYNCS["adapter"], engines)
    policy = apply_lora(copy.deepcopy(model), r=4)
    _update(policy, seed=5)
    engine.start(policy, 0)
    engine.after_update(policy, 0)
    engine.after_update(policy, 1)
    assert sent == [False]
    engine.close()


def test_a_resumed_run_samples_its_restored_adapter(tiny_lm, prompts, tmp_path, monkeypatch, train):
    """2 + 1 iterations resumed from the iteration-2 checkpoint log what 3 straight do: the
    third rollout samples the restored adapter (a stale or missing one samples otherwise)."""
    monkeypatch.syspath_prepend(str(HERE))
    options = dict(lora_r=4, vllm_lora_sync="adapter", save_every=1, keep_checkpoints=5)
    straight = tmp_path / "straight"
    train(grpo, small(grpo.Config, tiny_lm, prompts, straight, **options))
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    steps = sorted((resumed / "checkpoints").glob("step_*"), key=lambda p: int(p.name[5:]))
    assert len(steps) == 3
    shutil.rmtree(steps[-1])
    for path in resumed.glob("*.safetensors"):
        path.unlink()
    train(grpo, small(grpo.Config, tiny_lm, prompts, resumed, resume=True, **options))
    assert len(_rows(straight)) == 3
    assert _rows(straight) == _rows(resumed)


def test_merged_is_the_default_and_the_only_sync_without_lora(tiny_lm, prompts):
    def resolved(**fields):
        return small(grpo.Config, tiny_lm, prompts, "unused", **fields).lora_sync

    assert resolved(lora_r=4) == "merged"
    assert resolved(lora_r=4, vllm_lora_sync="adapter") == "adapter"
    assert resolved(lora_r=0) == "merged"
    assert resolved(lora_r=0, vllm_lora_sync="adapter") == "merged"  # no adapter to send
    assert resolved(lora_r=4, vllm_lora_sync="merged") == "merged"


def test_adapter_sync_is_refused_with_placement_ray_and_beyond_vllms_ranks(tiny_lm, prompts):
    fields = dict(lora_r=4, vllm_lora_sync="adapter", placement="ray")
    with pytest.raises(ProxrlError) as error:
        small(grpo.Config, tiny_lm, prompts, "unused", **fields).validate()
    assert str(error.value) == (
        "vllm_lora_sync: adapter is not available with placement ray; use merged"
    )
    small(grpo.Config, tiny_lm, prompts, "unused", **(fields | {"lora_r": 0})).validate()
    wide = small(grpo.Config, tiny_lm, prompts, "unused", lora_r=1024, vllm_lora_sync="adapter")
    with pytest.raises(ProxrlError, match="^vllm_lora_sync: adapter: vLLM serves LoRA ranks up"):
        engine_options(role_settings(wide).engine)
    narrow = small(grpo.Config, tiny_lm, prompts, "unused", lora_r=9, vllm_lora_sync="adapter")
    assert engine_options(role_settings(narrow).engine).max_lora_rank == 16


def test_a_run_that_fails_before_its_close_leaves_no_adapter_files(tmp_path):
    import os
    import subprocess
    import sys

    script = (
        "from proxrl.rollout.vllm_sampler import AdapterVersions\n"
        "versions = AdapterVersions()\n"
        "versions.next_directory().mkdir(parents=True)\n"
        "raise SystemExit(3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=os.environ | {"TMPDIR": str(tmp_path)}, check=False
    )
    assert done.returncode == 3
    assert not list(tmp_path.glob("proxrl-lora-*"))
