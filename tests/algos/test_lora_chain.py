"""LoRA stages feed the next one: LoRA SFT → LoRA DPO → LoRA GRPO, each starting from the last
one's output (its merged model, or an adapter directory), trains on top of it, takes it as its
reference, and saves what plain transformers / peft load as exactly the policy it trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from proxrl.algos.offline import dpo, sft
from proxrl.algos.online import grpo, loop
from proxrl.models.lora import adapter_disabled
from proxrl.models.tokenizer import load_tokenizer
from tests.algos.lm_tasks import preference_rows, sft_rows, write_jsonl

TEXTS = ["copy: abc = abc", "say: def -> abcd.", "copy: ghij = ghij"]
ATOL = 2e-5  # float32: merging W + BA and running x·W + (x·A)·B round differently at ~1e-6


def _ids(tiny_lm: str) -> torch.Tensor:
    tokenizer = load_tokenizer(tiny_lm)
    rows = [tokenizer(t)["input_ids"][:5] for t in TEXTS]
    return torch.tensor(rows)


def _logps(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """(B, T) ids → (B, T-1) log-probs of each next token."""
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float()
    return logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def _plain(path: Path | str) -> torch.nn.Module:
    """The saved model as a user loads it: plain transformers, no proxrl."""
    return AutoModelForCausalLM.from_pretrained(path).eval()


def _through_adapter(adapter: Path) -> torch.nn.Module:
    """The adapter on the model it names as its base, as the README says to load one: a base
    that is itself an adapter directory is merged into its own base first."""
    config = json.loads((adapter / "adapter_config.json").read_text())
    start = Path(config["base_model_name_or_path"])
    base = (
        _through_adapter(start).merge_and_unload()
        if (start / "adapter_config.json").exists()
        else _plain(start)
    )
    return PeftModel.from_pretrained(base, str(adapter)).eval()


@pytest.mark.parametrize("start", ["merged", "adapter"])
def test_lora_sft_then_lora_dpo_then_lora_grpo_save_the_policies_they_trained(
    start, tiny_lm, tmp_path, monkeypatch
):
    ids = _ids(tiny_lm)
    seen: dict[str, torch.Tensor] = {}

    # 1. LoRA SFT. A start from "adapter" hands the next stage the adapter directory alone (as
    #    an older proxrl or another tool saves it): it must load as base + adapter.
    sft_out = tmp_path / "sft"
    sft.train(
        sft.Config(
            model=tiny_lm,
            data=write_jsonl(tmp_path / "sft.jsonl", sft_rows(64, seed=0)),
            output_dir=str(sft_out),
            lora_r=4,
            batch_size=16,
            max_steps=6,
            learning_rate=1e-2,
            progress=False,
        )
    )
    sft_start = str(sft_out / "adapter") if start == "adapter" else str(sft_out)
    sft_logps = _logps(_plain(sft_out), ids)
    assert (sft_logps - _logps(_plain(tiny_lm), ids)).abs().max() > 0.05  # SFT moved the model

    # 2. LoRA DPO from the SFT model: its reference log-probs are the SFT model's, and what it
    #    saves is the policy it trained.
    real_reference_logps, real_save_final = dpo.reference_logps, dpo.save_final

    def record_reference(model, *args, **kwargs):
        seen.setdefault("dpo_reference", _logps(model, ids))
        return real_reference_logps(model, *args, **kwargs)

    def record_final(model, *args, **kwargs):
        seen["dpo_final"] = _logps(model, ids)
        return real_save_final(model, *args, **kwargs)

    monkeypatch.setattr(dpo, "reference_logps", record_reference)
    monkeypatch.setattr(dpo, "save_final", record_final)
    dpo_out = tmp_path / "dpo"
    dpo.train(
        dpo.Config(
            model=sft_start,
            data=write_jsonl(tmp_path / "pairs.jsonl", preference_rows(32, seed=0)),
            output_dir=str(dpo_out),
            lora_r=4,
            batch_size=16,
            max_steps=4,
            learning_rate=1e-2,
            progress=False,
        )
    )
    torch.testing.assert_close(seen["dpo_reference"], sft_logps, rtol=0, atol=ATOL)
    dpo_logps = _logps(_plain(dpo_out), ids)
    assert (dpo_logps - sft_logps).abs().max() > 0.01  # DPO moved the model
    torch.testing.assert_close(dpo_logps, seen["dpo_final"], rtol=0, atol=ATOL)
    torch.testing.assert_close(
        _logps(_through_adapter(dpo_out / "adapter"), ids), dpo_logps, rtol=0, atol=ATOL
    )

    # 3. LoRA GRPO from the DPO model: the reference is the DPO model (with the SFT and DPO
    #    adapters merged), the saved model the trained policy.
    real_save_policy = loop.save_policy

    def record_policy(models, output_dir):
        seen["grpo_final"] = _logps(models.actor, ids)
        with adapter_disabled(models.actor) as reference:
            seen["grpo_reference"] = _logps(reference, ids)
        return real_save_policy(models, output_dir)

    monkeypatch.setattr(loop, "save_policy", record_policy)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in "abcd"))
    grpo_out = tmp_path / "grpo"
    grpo.train(
        grpo.Config(
            # from "adapter": DPO's adapter alone, whose base is the SFT adapter directory
            model=str(dpo_out / "adapter") if start == "adapter" else str(dpo_out),
            prompts=str(prompts),
            reward_fn=("tests.algos.online_rewards:target_fraction",),
            output_dir=str(grpo_out),
            lora_r=4,
            iterations=2,
            rollout_batch_size=4,
            group_size=2,
            mini_batch_size=8,
            max_new_tokens=6,
            learning_rate=3e-2,
            track_kl=True,
            progress=False,
            seed=3,
        )
    )
    torch.testing.assert_close(seen["grpo_reference"], dpo_logps, rtol=0, atol=ATOL)
    grpo_logps = _logps(_plain(grpo_out), ids)
    assert (grpo_logps - dpo_logps).abs().max() > 1e-3  # GRPO moved the model
    torch.testing.assert_close(grpo_logps, seen["grpo_final"], rtol=0, atol=ATOL)
    torch.testing.assert_close(
        _logps(_through_adapter(grpo_out / "adapter"), ids), grpo_logps, rtol=0, atol=ATOL
    )
