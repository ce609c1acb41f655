"""A separate critic under LoRA (``critic_lora_r``, by default ``lora_r``): only its adapters and
score head train, it saves a merged sequence classifier plus its adapter, and a run resumes
from its checkpoint to the uninterrupted run's bits."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from proxrl.algos.online import ppo
from proxrl.algos.online.critic import CriticSettings, SeparateCritic
from proxrl.algos.online.roles import role_settings
from proxrl.models.scalar_head import load_score_model
from proxrl.models.tokenizer import load_tokenizer
from proxrl.rollout.forward import critic_forward
from proxrl.runtime.errors import ProxrlError

WORDS = ["abc", "def", "ghi", "jkl"]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in WORDS))
    return str(path)


def config(tiny_lm: str, prompts: str, out: Path, **overrides: object) -> ppo.Config:
    fields = dict(
        model=tiny_lm,
        prompts=prompts,
        reward_fn=("tests.algos.online_rewards:target_fraction",),
        output_dir=str(out),
        iterations=2,
        rollout_batch_size=4,
        group_size=2,
        max_new_tokens=6,
        mini_batch_size=8,
        learning_rate=3e-3,
        critic_learning_rate=3e-3,
        progress=False,
        seed=5,
    )
    return ppo.Config(**(fields | overrides))  # type: ignore[arg-type]


def load_critic(tiny_lm: str, lora_r: int) -> SeparateCritic:
    settings = CriticSettings(learning_rate=1e-2, vf_coef=1.0, value_clip=None, lora_r=lora_r)
    cfg = ppo.Config(model=tiny_lm, prompts="unused.jsonl", reward_fn=("m:f",))
    models = role_settings(cfg).models
    return SeparateCritic.load(settings, models, torch.nn.Identity(), load_tokenizer(tiny_lm))


def test_a_lora_critic_trains_only_its_adapters_and_head(tiny_lm):
    """Three AdamW steps on a value loss move every adapter matrix and the head (the head starts
    at 0, so the body's adapters get a gradient from the second step on) and leave every body
    weight bitwise as loaded; the optimizer holds only the trainable tensors."""
    critic = load_critic(tiny_lm, lora_r=4)
    trainable = {name for name, p in critic.module.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n or ".modules_to_save." in n for n in trainable)
    (optimizer,) = critic.optimizers()
    held = [p for group in optimizer.param_groups for p in group["params"]]
    assert sum(p.numel() for p in held) == sum(
        p.numel() for p in critic.module.parameters() if p.requires_grad
    )
    before = {n: p.detach().clone() for n, p in critic.module.named_parameters()}
    ids = torch.randint(3, 60, (2, 7))
    mask = torch.ones_like(ids)
    for _ in range(3):
        (critic.values(ids, mask, 3, None) - 1.0).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    moved = {n for n, p in critic.module.named_parameters() if not torch.equal(p, before[n])}
    assert moved == trainable


def test_critic_lora_r_0_trains_every_critic_weight(tiny_lm):
    critic = load_critic(tiny_lm, lora_r=0)
    assert all(p.requires_grad for p in critic.module.parameters())


def test_a_value_head_refuses_critic_lora_r(tiny_lm, prompts, tmp_path):
    with pytest.raises(ProxrlError, match="critic_lora_r: applies to critic separate"):
        config(tiny_lm, prompts, tmp_path, critic="head", critic_lora_r=4).validate()


def test_lora_ppo_saves_a_merged_critic_that_equals_base_plus_adapter(tiny_lm, prompts, tmp_path):
    """lora_r 4: the critic follows it. critic/ is a plain sequence classifier whose values
    equal the start critic with critic/adapter applied (the merge is exact to float32 rounding),
    its body moved from the start, and the checkpoint holds no body weight."""
    from peft import PeftModel

    ppo.train(config(tiny_lm, prompts, tmp_path, lora_r=4, save_every=2))
    saved = tmp_path / "critic"
    assert json.loads((saved / "adapter" / "adapter_config.json").read_text())["r"] == 4
    merged = load_score_model(str(saved)).eval()
    start = load_score_model(tiny_lm, new_head="zero")
    body = "model.layers.0.mlp.down_proj.weight"
    start_body = start.state_dict()[body].clone()
    adapted = PeftModel.from_pretrained(start, str(saved / "adapter")).eval()
    ids = torch.randint(3, 60, (2, 9))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        torch.testing.assert_close(
            critic_forward(merged, ids, mask, 4),
            critic_forward(adapted, ids, mask, 4),
            rtol=0,
            atol=1e-5,
        )
    assert not torch.equal(load_file(saved / "model.safetensors")[body], start_body)
    checkpoint = next((tmp_path / "checkpoints").iterdir())
    kept = load_file(checkpoint / "critic.safetensors")
    assert kept and all(".lora_" in n or ".modules_to_save." in n for n in kept)


def test_lora_ppo_resumes_its_critic_exactly(tiny_lm, prompts, tmp_path):
    """3 iterations checkpointing every 1; resumed from iteration 2's checkpoint: the same
    merged critic and policy bits as the uninterrupted run."""
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    ppo.train(config(tiny_lm, prompts, whole, lora_r=4, iterations=3, save_every=1))
    shutil.copytree(whole, resumed)
    last = sorted((resumed / "checkpoints").iterdir())[-1]
    shutil.rmtree(last)
    ppo.train(config(tiny_lm, prompts, resumed, lora_r=4, iterations=3, save_every=1, resume=True))
    for name in ("model.safetensors", "critic/model.safetensors"):
        a, b = load_file(whole / name), load_file(resumed / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
