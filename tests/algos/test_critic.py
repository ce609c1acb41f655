"""The critic interface of the online loop (none, separate value model, value head) and the
typed fields of the rollout record that estimators read (ReMax's greedy scores)."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
import torch

from proxrl.algos.online import collect as online_rollout
from proxrl.algos.online import ppo
from proxrl.algos.online.critic import (
    CRITICS,
    CriticSettings,
    NoCritic,
    SeparateCritic,
    ValueHeadCritic,
)
from proxrl.core import value_loss
from proxrl.models.scalar_head import load_score_model
from proxrl.models.value_head import ValueHead
from proxrl.rollout.experience import Experience
from proxrl.rollout.forward import critic_forward

SETTINGS = CriticSettings(learning_rate=1e-3, vf_coef=0.25, value_clip=0.2, warmup_iterations=2)


def experience(
    batch: int = 4, prompt: int = 3, response: int = 5, greedy: bool = True, seed: int = 0
) -> Experience:
    """A random rollout whose responses stop after 5, 2, 4, 1 … tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 2, 4, 1] * (batch // 4))[:batch]
    response_mask = (torch.arange(response) < lengths[:, None]).long()

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    return Experience(
        prompt_ids=torch.randint(3, 50, (batch, prompt), generator=g),
        prompt_mask=torch.ones(batch, prompt, dtype=torch.long),
        response_ids=torch.randint(3, 50, (batch, response), generator=g) * response_mask,
        response_mask=response_mask,
        logprobs=rand(batch, response),
        ref_logprobs=rand(batch, response),
        values=rand(batch, response),
        scores=rand(batch),
        rewards=rand(batch, response),
        advantages=rand(batch, response),
        returns=rand(batch, response),
        greedy_scores=rand(batch) if greedy else None,
    )


# ---------------------------------------------------------------- greedy scores on the record


def test_select_carries_greedy_scores_row_by_row():
    """Rows (3, 0) of a rollout: greedy_scores are those two rows' (B,) entries, like scores."""
    exp = experience()
    mb = exp.select(torch.tensor([3, 0]))
    assert torch.equal(mb.greedy_scores, exp.greedy_scores[[3, 0]])
    assert torch.equal(mb.scores, exp.scores[[3, 0]])
    assert mb.values.shape == (2, 5)  # row 0 is 5 tokens long: nothing trimmed


def test_select_leaves_an_absent_field_absent_and_trims_padding():
    """Rows 1 and 3 are 2 and 1 tokens long: the (B, T) fields are cut to 2 columns; no greedy
    scores stays None."""
    mb = experience(greedy=False).select(torch.tensor([1, 3]))
    assert mb.greedy_scores is None
    assert (
        mb.response_mask.shape == (2, 2)
        and mb.logprobs.shape == (2, 2)
        and mb.prompt_ids.shape == (2, 3)
    )


@pytest.mark.parametrize("greedy", [True, False])
def test_gather_rollout_concatenates_greedy_scores_in_rank_order(greedy, monkeypatch):
    """Two ranks (all_gather patched to return rank 0's and rank 1's parts): each response keeps
    its own prompt's greedy score after the gather, so ReMax's baseline stays aligned with the
    global batch; without greedy scores the field stays None."""
    ranks = [experience(seed=0, greedy=greedy), experience(seed=1, greedy=greedy, response=3)]
    gathered_parts = []

    def all_gather(obj):
        gathered_parts.append(obj)
        other = {
            "experience": {
                k: None if v is None else v.clone() for k, v in ranks[1].tensors().items()
            },
            "raw_scores": obj["raw_scores"],
            "ended": obj["ended"],
            "entropy": obj["entropy"][:, :3],
            "completions": obj["completions"],
        }
        return [obj, other]

    monkeypatch.setattr(online_rollout.dist, "all_gather_objects", all_gather)
    entropy = torch.zeros(4, 5)
    merged, _, _, _, _ = online_rollout.gather_rollout(
        ranks[0], torch.zeros(4), torch.ones(4, dtype=torch.bool), entropy, ["a"] * 4, pad_id=0
    )
    assert len(merged) == 8 and merged.response_ids.shape == (8, 5)
    if greedy:
        assert torch.equal(
            merged.greedy_scores, torch.cat([ranks[0].greedy_scores, ranks[1].greedy_scores])
        )
    else:
        assert merged.greedy_scores is None
    assert torch.equal(merged.scores, torch.cat([ranks[0].scores, ranks[1].scores]))


# ---------------------------------------------------------------- the critics


def test_the_table_has_a_critic_for_every_ppo_option():
    options = typing.get_args(typing.get_type_hints(ppo.Config)["critic"])
    assert set(options) == set(CRITICS) == {"separate", "head"}


def test_no_critic_gives_zero_values_and_trains_nothing():
    exp = experience()
    critic = NoCritic()
    values = critic.values(exp.input_ids, exp.attention_mask, exp.prompt_ids.shape[1], None)
    assert values.dtype == torch.float32 and values.shape == (4, 5) and not values.any()
    loss, stats = critic.loss(exp, None, "token-mean")
    assert float(loss) == 0.0 and stats == {}
    assert (
        list(critic.parameters()),
        critic.modules(),
        critic.optimizers(),
        critic.state_dict(),
    ) == ([], [], [], {})
    assert critic.checkpoint_weights() is None
    assert critic.rollout_metrics(exp) == {} and critic.warmup_iterations == 0
    assert critic.wrapped(lambda m: pytest.fail("nothing to wrap")) is critic


def test_value_head_critic_reads_the_hidden_state_and_weighs_its_loss():
    """A head with weight (1, -1) and bias 0.5 on hidden states h: V = h₀ − h₁ + 0.5; its loss is
    vf_coef × the clipped value loss of core."""
    torch.manual_seed(0)
    exp = experience()
    head = ValueHead(2)
    with torch.no_grad():
        head.linear.weight.copy_(torch.tensor([[1.0, -1.0]]))
        head.linear.bias.fill_(0.5)
    critic = ValueHeadCritic(head, SETTINGS)
    assert critic.needs_hidden and critic.warmup_iterations == 2
    hidden = torch.randn(4, 5, 2)
    values = critic.values(exp.input_ids, exp.attention_mask, exp.prompt_ids.shape[1], hidden)
    torch.testing.assert_close(values, hidden[..., 0] - hidden[..., 1] + 0.5, rtol=0, atol=1e-6)
    loss, stats = critic.loss(exp, hidden, "token-mean")
    expected, expected_stats = value_loss(
        values, exp.values, exp.returns, exp.response_mask.float(), 0.2, "token-mean"
    )
    torch.testing.assert_close(loss, 0.25 * expected, rtol=1e-6, atol=0)
    assert stats.keys() == expected_stats.keys()
    with pytest.raises(ValueError, match="hidden state"):
        critic.values(exp.input_ids, exp.attention_mask, exp.prompt_ids.shape[1], None)


def test_value_head_state_round_trips_and_saves_beside_the_policy(tmp_path: Path):
    from safetensors.torch import load_file

    torch.manual_seed(0)
    trained = ValueHeadCritic(ValueHead(3), SETTINGS)
    with torch.no_grad():
        trained.module.linear.weight.normal_()
    fresh = ValueHeadCritic(ValueHead(3), SETTINGS)
    fresh.checkpoint_weights().load_state_dict(trained.checkpoint_weights().state_dict())
    assert all(
        torch.equal(a, b) for a, b in zip(fresh.parameters(), trained.parameters(), strict=True)
    )
    [optimizer] = trained.optimizers()
    assert (
        optimizer.param_groups[0]["lr"] == 1e-3 and optimizer.param_groups[0]["weight_decay"] == 0.0
    )
    trained.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "value_head.safetensors")
    assert torch.equal(saved["linear.weight"], trained.module.linear.weight)


def test_separate_critic_is_the_score_model_at_every_token(tiny_lm, tmp_path):
    """Its values are ``critic_forward`` of its model; wrapping keeps its settings; it saves a
    sequence classifier under critic/."""
    model = load_score_model(tiny_lm, new_head="reward")
    critic = SeparateCritic(model, SETTINGS)
    exp = experience()
    with torch.no_grad():
        values = critic.values(exp.input_ids, exp.attention_mask, 3, None)
        torch.testing.assert_close(
            values, critic_forward(model, exp.input_ids, exp.attention_mask, 3), rtol=0, atol=0
        )
    wrapped = critic.wrapped(lambda m: m)
    assert (
        isinstance(wrapped, SeparateCritic)
        and wrapped.module is model
        and wrapped.settings is SETTINGS
    )
    assert {name for name, _ in critic.named_parameters()} == set(critic.state_dict())
    critic.save_pretrained(tmp_path)
    assert (tmp_path / "critic" / "config.json").exists()
