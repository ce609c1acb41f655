"""PPO written with the training client (issue 38): a ``ppo`` client loads the run's critic,
``logprobs`` gives V_old, ``forward_backward`` adds the value loss on the batch's returns and
``optim_step`` steps the critic with the policy, so a user's PPO loop is ``proxrl ppo``'s, to
the bit on the same seed (float64, tiny model, a rollouts file)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from proxrl.algos.online import ppo
from proxrl.algos.online.client import TrainingClient
from proxrl.core import gae, masked_whiten, shaped_rewards
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.metrics import read_metrics
from tests.algos.test_client import config
from tests.algos.test_client_rollouts import prompts, write_rollouts  # noqa: F401 (a fixture)


def _ppo_config(tiny_lm: str, out: Path, rollouts: Path, critic: str) -> ppo.Config:
    return ppo.Config(
        model=tiny_lm,
        rollouts_file=str(rollouts),
        output_dir=str(out),
        iterations=2,
        rollout_batch_size=2,
        group_size=2,
        mini_batch_size=2,  # two minibatches × two epochs: four steps per iteration
        ppo_epochs=2,
        max_new_tokens=8,
        learning_rate=3e-3,
        critic_learning_rate=1e-2,
        lr_schedule="constant",
        dtype="float64",
        critic=critic,
        save_every=0,
        sample_every=0,
        progress=False,
        report_to=["none"],
        seed=3,
    )


def ppo_iteration(client: TrainingClient, rollouts: Path) -> list[dict[str, float]]:
    """One iteration of PPO written with the client: KL-shaped rewards, GAE over the critic's
    values, whitened advantages, the value targets; epochs of minibatch steps."""
    cfg = client.cfg
    batch = client.logprobs(client.read_rollouts(rollouts), recorded=True)  # π_old, π_ref, V_old
    mask = batch.loss_mask.float()
    rewards = shaped_rewards(batch.scores, batch.logprobs, batch.ref_logprobs, mask, cfg.kl_coef)
    advantages, returns = gae(rewards, batch.values, mask, cfg.gamma, cfg.lam)
    batch = replace(batch, advantages=masked_whiten(advantages, mask), returns=returns)
    steps = []
    for _ in range(cfg.ppo_epochs):
        for rows in client.minibatches(len(batch)):
            stats = client.forward_backward(batch.select(rows), "ppo")  # + the value loss
            steps.append(stats | client.optim_step())
    return steps


@pytest.fixture
def rollouts(tiny_lm, prompts, tmp_path) -> Path:  # noqa: F811 (the fixture imported above)
    writer = TrainingClient(config=config(tiny_lm, prompts, tmp_path / "w", seed=5))
    path = tmp_path / "rollouts.jsonl"
    write_rollouts(writer, path)
    return path


def _weights(directory: Path, critic: str) -> dict[str, torch.Tensor]:
    critic_file = "critic/model.safetensors" if critic == "separate" else "value_head.safetensors"
    policy = load_file(directory / "model.safetensors")
    return policy | {f"critic.{k}": v for k, v in load_file(directory / critic_file).items()}


@pytest.mark.parametrize("critic", ["head", "separate"])
def test_a_ppo_loop_written_with_the_client_equals_proxrl_ppo(critic, tiny_lm, rollouts, tmp_path):
    """Same seed, float64: each iteration's policy and value metrics, and the final policy and
    critic weights, equal ``proxrl ppo``'s on the same rollouts file exactly."""
    cfg = _ppo_config(tiny_lm, tmp_path / "builtin", rollouts, critic)
    ppo.train(cfg)
    rows = read_metrics(tmp_path / "builtin")
    client = TrainingClient(config=replace(cfg, output_dir=str(tmp_path / "unused")))
    for row in rows:
        steps = ppo_iteration(client, rollouts)
        assert len(steps) == 4  # (a step whose policy gradient is 0, all clipped, takes none)
        assert row["policy/optimizer_steps"] == sum(s["stepped"] for s in steps) >= 1
        for key, name in (("loss", "policy/total_loss"), ("value_loss", "value/loss")):
            total = 0.0
            for s in steps:  # the update's mean over its steps, summed in the same order
                total += s[key]
            assert row[name] == total / len(steps), name
    client.save_model(tmp_path / "client")
    built_in, ours = _weights(tmp_path / "builtin", critic), _weights(tmp_path / "client", critic)
    assert built_in.keys() == ours.keys() and any(k.startswith("critic.") for k in ours)
    assert all(torch.equal(built_in[k], ours[k]) for k in built_in)
    start = load_file(Path(tiny_lm) / "model.safetensors")
    assert not all(torch.equal(start[k].double(), ours[k].double()) for k in start)


def test_the_critic_alone_the_returns_required_and_an_exact_resume(tiny_lm, rollouts, tmp_path):
    """loss="value" moves the separate critic and not the policy (no policy gradient even with
    advantages in the batch, which "ppo" learns from); a batch without returns is
    refused; save_state → load_state → one more iteration equals the uninterrupted loop (the
    critic's weights and optimizer in the checkpoint)."""
    cfg = _ppo_config(tiny_lm, tmp_path / "x", rollouts, "separate")
    client = TrainingClient(config=cfg)
    batch = client.logprobs(client.read_rollouts(rollouts), recorded=True)
    with pytest.raises(ProxrlError, match="batch: returns: expected the critic's"):
        client.forward_backward(batch, "ppo")
    policy = {k: v.clone() for k, v in client.model.state_dict().items()}
    critic = [p.clone() for p in client.models.critic.parameters()]
    ones = torch.ones_like(batch.values) * batch.loss_mask
    # advantages the policy would learn from (without them its gradient is 0 anyway)
    stats = client.forward_backward(replace(batch, returns=ones, advantages=ones), "value")
    assert not any(p.grad is not None and p.grad.any() for p in client.model.parameters())
    assert stats["value_loss"] > 0 and client.optim_step()["stepped"] == 0.0
    assert all(torch.equal(policy[k], v) for k, v in client.model.state_dict().items())
    moved = [p for p, q in zip(client.models.critic.parameters(), critic, strict=True)]
    assert any(not torch.equal(p, q) for p, q in zip(moved, critic, strict=True))
    client.forward_backward(replace(batch, returns=ones, advantages=ones), "ppo")
    assert any(p.grad is not None and p.grad.any() for p in client.model.parameters())
    client.optimization.zero_grad()
    with pytest.raises(ProxrlError, match="loss: value trains a critic; this client has none"):
        TrainingClient(config=config(tiny_lm, "", tmp_path / "y")).forward_backward(batch, "value")
    by_options = TrainingClient(tiny_lm, command="ppo", critic="head", dtype="float64")
    assert isinstance(by_options.cfg, ppo.Config) and by_options.models.critic.modules()
    with pytest.raises(ProxrlError, match="command: expected one of grpo, ppo, got 'dpo'"):
        TrainingClient(tiny_lm, command="dpo")

    whole = TrainingClient(config=cfg)
    ppo_iteration(whole, rollouts)
    whole.save_state(tmp_path / "state")
    ppo_iteration(whole, rollouts)
    resumed = TrainingClient(config=cfg)
    assert resumed.load_state(tmp_path / "state") == 4
    ppo_iteration(resumed, rollouts)
    for a, b in zip(whole.optimization.parameters, resumed.optimization.parameters, strict=True):
        assert torch.equal(a, b)
