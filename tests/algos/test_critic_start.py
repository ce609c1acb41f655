"""Where PPO's separate critic starts: the reward model (default), the policy, or the critic/
an earlier run saved (warm start); and the one-line errors for a directory with no critic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from proxrl.algos.online import grpo, ppo
from proxrl.algos.online.roles import load_models, role_settings
from proxrl.models.scalar_head import load_score_model, score_head
from proxrl.runtime.errors import ProxrlError

REWARD = ("tests.algos.online_rewards:target_fraction",)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in "abcdefgh"))
    return str(path)


def config(module, tiny_lm, prompts, out: Path, **overrides):
    fields = dict(
        model=tiny_lm,
        prompts=prompts,
        reward_fn=REWARD,
        output_dir=str(out),
        iterations=2,
        rollout_batch_size=4,
        group_size=2,
        max_new_tokens=4,
        mini_batch_size=8,
        learning_rate=3e-3,
        critic_learning_rate=1e-2,
        progress=False,
        seed=3,
    )
    if module is grpo:
        fields.pop("critic_learning_rate")
    return module.Config(**(fields | overrides))


def critic_weights(cfg) -> dict[str, torch.Tensor]:
    models = load_models(role_settings(cfg).models, ppo.build(cfg))
    return {k: v.detach().clone() for k, v in models.critic.module.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_default_start_is_the_reward_model_head_included(tiny_lm, prompts, reward_model, tmp_path):
    critic = critic_weights(
        config(ppo, tiny_lm, prompts, tmp_path / "r", reward_model=reward_model)
    )
    assert same(critic, load_score_model(reward_model).state_dict())
    assert critic["score.weight"].abs().sum() > 0


def test_policy_start_takes_the_policy_and_a_zero_head_beside_a_reward_model(
    tiny_lm, prompts, reward_model, tmp_path
):
    cfg = config(
        ppo, tiny_lm, prompts, tmp_path / "r", reward_model=reward_model, critic_model="policy"
    )
    critic = critic_weights(cfg)
    policy = load_score_model(tiny_lm, new_head="zero").state_dict()
    assert same(critic, policy)
    assert not same(critic, load_score_model(reward_model).state_dict())
    assert torch.equal(critic["score.weight"], torch.zeros_like(critic["score.weight"]))


def test_warm_start_from_an_earlier_runs_critic(tiny_lm, prompts, reward_model, tmp_path):
    earlier = tmp_path / "earlier"
    ppo.train(config(ppo, tiny_lm, prompts, earlier, reward_model=reward_model))
    saved = load_score_model(str(earlier / "critic")).state_dict()
    assert not same(saved, load_score_model(reward_model).state_dict())  # it trained
    critic = critic_weights(
        config(
            ppo, tiny_lm, prompts, tmp_path / "r", reward_model=reward_model, critic_model=earlier
        )
    )
    assert same(critic, saved)


def test_a_run_without_a_critic_is_a_one_line_error(tiny_lm, prompts, tmp_path):
    critic_free = tmp_path / "grpo"
    grpo.train(config(grpo, tiny_lm, prompts, critic_free, group_size=2))
    with pytest.raises(ProxrlError, match=r"is a ppo/grpo run without a critic/ to start from"):
        critic_weights(config(ppo, tiny_lm, prompts, tmp_path / "r", critic_model=critic_free))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ProxrlError, match=r"holds no critic \(no critic/, no config.json\)"):
        critic_weights(config(ppo, tiny_lm, prompts, tmp_path / "r", critic_model=str(empty)))
    with pytest.raises(ProxrlError, match="critic_model: applies to critic separate"):
        config(
            ppo, tiny_lm, prompts, tmp_path / "r", critic="head", critic_model="policy"
        ).validate()


def test_score_head_of_a_saved_critic_is_loaded_not_reset(tiny_lm, tmp_path):
    """The warm start keeps a trained head: load_score_model initialises one only if missing."""
    model = load_score_model(tiny_lm, new_head="zero")
    torch.nn.init.constant_(score_head(model).weight, 0.25)
    model.save_pretrained(tmp_path / "c")
    assert torch.equal(
        score_head(load_score_model(str(tmp_path / "c"), new_head="zero")).weight,
        torch.full_like(score_head(model).weight, 0.25),
    )


def test_an_adapter_directory_as_critic_start_is_its_base_with_the_adapter_merged(
    tiny_lm, prompts, tmp_path
):
    from proxrl.models.causal_lm import load_causal_lm
    from proxrl.models.lora import apply_lora

    adapted = apply_lora(load_causal_lm(tiny_lm), r=4)
    with torch.no_grad():
        for param in adapted.parameters():
            if param.requires_grad:
                param.add_(0.1)
    adapted.save_pretrained(tmp_path / "adapter")
    cfg = config(ppo, tiny_lm, prompts, tmp_path / "r", critic_model=str(tmp_path / "adapter"))
    critic = load_models(role_settings(cfg).models, ppo.build(cfg)).critic.module
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        expected = adapted.get_base_model().model(input_ids=ids).last_hidden_state
        hidden = critic.model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(hidden, expected, rtol=0, atol=2e-5)
    assert (
        expected - load_causal_lm(tiny_lm).model(input_ids=ids).last_hidden_state
    ).abs().max() > 0.01
    assert torch.equal(critic.score.weight, torch.zeros_like(critic.score.weight))
