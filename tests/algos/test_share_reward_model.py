"""The reward model scored through the LoRA critic's frozen base when that base is the reward
model (``roles.share_reward_model``): one model's weights less in memory, every number of the
run the same bit for bit as with the reward model's own copy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from proxrl.algos.online import ppo, roles, run
from proxrl.algos.online.roles import role_settings
from proxrl.models.lora import apply_lora
from proxrl.models.scalar_head import load_score_model
from proxrl.rollout.rewards import RewardModelReward
from proxrl.runtime.metrics import read_metrics


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in "abcd"))
    return str(path)


def config(tiny_lm: str, prompts: str, reward_model: str, out: Path, **overrides: object):
    fields = dict(
        model=tiny_lm,
        prompts=prompts,
        reward_model=(reward_model,),
        output_dir=str(out),
        iterations=3,
        rollout_batch_size=4,
        group_size=1,
        max_new_tokens=5,
        mini_batch_size=2,
        ppo_epochs=2,
        lora_r=4,
        learning_rate=1e-2,
        critic_learning_rate=5e-2,
        progress=False,
        seed=7,
    )
    return ppo.Config(**(fields | overrides))  # type: ignore[arg-type]


def test_is_base_of_the_reward_model_and_not_of_another(reward_model, tiny_lm):
    """A LoRA critic loaded from the reward model has it as its base (adapters and the trained
    head's copy set aside, even after they moved); one weight changed by one ulp, or a critic
    from the policy, does not."""
    rm = load_score_model(reward_model, new_head=None)
    critic = apply_lora(load_score_model(reward_model, new_head="zero"), 4, task="seq_cls")
    with torch.no_grad():
        for p in critic.parameters():
            if p.requires_grad:  # the adapters and the head's trained copy move
                p.add_(0.5)
    assert roles.is_base_of(rm, critic)
    weight = dict(rm.named_parameters())["model.layers.0.mlp.up_proj.weight"]
    with torch.no_grad():
        weight[0, 0] = torch.nextafter(weight[0, 0], torch.tensor(float("inf")))
    assert not roles.is_base_of(rm, critic)
    other = apply_lora(load_score_model(tiny_lm, new_head="zero"), 4, task="seq_cls")
    assert not roles.is_base_of(load_score_model(reward_model, new_head=None), other)


def test_a_shared_reward_model_gives_the_run_of_its_own_copy(
    tiny_lm, prompts, reward_model, tmp_path, monkeypatch
):
    """3 iterations × 2 epochs × 2 minibatches, the critic's adapters and head moving at every
    step: the shared run's metrics (scores, KL, values, losses, gradient norms), its saved
    policy and critic are those of the run with the reward model's own copy, exactly; and in
    the shared run the reward source holds the critic's module, no third model."""
    seen: list[object] = []
    share = roles.share_reward_model

    def recording(models, rewards, *run_options):  # type: ignore[no-untyped-def]
        shared = share(models, rewards, *run_options)
        seen.append((shared, rewards.sources[0], models.critic.module))
        return shared

    monkeypatch.setattr(run, "share_reward_model", recording)
    ppo.train(config(tiny_lm, prompts, reward_model, tmp_path / "shared"))
    (shared, source, critic_module) = seen[0]
    assert shared and isinstance(source, RewardModelReward)
    assert source.model is critic_module and source.adapter_disabled

    monkeypatch.setattr(run, "share_reward_model", lambda models, rewards, *run_options: False)
    ppo.train(config(tiny_lm, prompts, reward_model, tmp_path / "own"))
    rows = [read_metrics(str(tmp_path / side)) for side in ("shared", "own")]
    keys = [k for k in rows[1][0] if not k.startswith(("time/", "perf/tokens_per_s"))]
    assert any(k.startswith("value/") for k in keys) and "objective/scores" in keys
    for a, b in zip(*rows, strict=True):
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
    assert rows[1][-1]["objective/scores"] != rows[1][0]["objective/scores"]  # it learned
    for saved in ("model.safetensors", "critic/model.safetensors"):
        from safetensors.torch import load_file

        ours, theirs = (load_file(str(tmp_path / s / saved)) for s in ("shared", "own"))
        assert ours.keys() == theirs.keys()
        assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_not_shared_where_the_critic_is_not_the_reward_model(tiny_lm, prompts, reward_model):
    """critic_model policy, a full critic (critic_lora_r 0) and offload_frozen_roles keep the
    reward model's own copy."""
    for overrides in (
        dict(critic_model="policy"),
        dict(critic_lora_r=0),
        dict(offload_frozen_roles=True),
    ):
        cfg = config(tiny_lm, prompts, reward_model, Path("unused"), **overrides)
        rewards = roles.load_rewards(role_settings(cfg).rewards)
        models = roles.load_models(role_settings(cfg).models, ppo.build(cfg))
        run_options = (cfg.offload_frozen_roles, cfg.async_rollout)
        assert not roles.share_reward_model(models, rewards, *run_options), overrides
        assert rewards.sources[0].model is not models.critic.module
