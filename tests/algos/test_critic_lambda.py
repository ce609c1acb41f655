"""Issue 35's critic PPO on PPO's estimator and loss: decoupled λ (critic_lam), VAPO's
length-adaptive λ and positive-example NLL, each against the core functions computed by hand
in tests/core, and today's behaviour kept exactly when they are off."""

from __future__ import annotations

import json
import math

import pytest
import torch

from proxrl.algos.online import ppo
from proxrl.core import discounted_returns, gae, length_adaptive_lam, masked_whiten, shaped_rewards
from proxrl.models.scalar_head import load_score_model
from proxrl.runtime.config import narrowed
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.metrics import read_metrics
from tests.algos.test_critic import experience
from tests.algos.test_critic_start import config as start_config
from tests.algos.test_critic_start import critic_weights, same

BASE = {"model": "m", "prompts": "p", "reward_fn": "tests.algos.online_rewards:target_fraction"}


def config(**fields: object) -> ppo.Config:
    cfg = ppo.Config(**BASE | {"gamma": 1.0, "kl_coef": 0.05} | fields)  # type: ignore[arg-type]
    cfg.validate()
    return cfg


def rewards_of(cfg: ppo.Config, exp) -> torch.Tensor:
    mask = exp.loss_mask.float()
    return shaped_rewards(
        exp.scores, exp.logprobs, exp.ref_logprobs, mask, cfg.kl_coef, cfg.kl_estimator
    )


def test_defaults_are_todays_estimator_exactly():
    """critic_lam None, no length-adaptive λ: one GAE at lam for both, bit for bit."""
    cfg, exp = config(), experience(8)
    rewards, advantages, returns = ppo.gae_estimate(narrowed(ppo.GAEOptions, cfg), exp, cfg.kl_coef)
    mask = exp.loss_mask.float()
    expected_a, expected_r = gae(rewards_of(cfg, exp), exp.values, mask, 1.0, 0.95)
    assert torch.equal(advantages, masked_whiten(expected_a, mask))
    assert torch.equal(returns, expected_r)


def test_critic_lam_one_gives_monte_carlo_value_targets_and_leaves_the_advantages():
    """critic_lam 1: the returns are the reward-to-go (λ = 1 telescopes), the advantages those
    of lam 0.95, as the defaults give them."""
    exp = experience(8)
    _, today, _ = ppo.gae_estimate(narrowed(ppo.GAEOptions, config()), exp, 0.05)
    cfg = config(critic_lam=1.0)
    rewards, advantages, returns = ppo.gae_estimate(narrowed(ppo.GAEOptions, cfg), exp, 0.05)
    mask = exp.loss_mask.float()
    assert torch.equal(advantages, today)
    torch.testing.assert_close(returns, discounted_returns(rewards, mask, 1.0))
    assert cfg.value_lam == 1.0 and config().value_lam == 0.95


def test_length_adaptive_lam_sets_each_responses_policy_lambda():
    """α = 0.5 on responses of 5, 2, 4, 1 tokens: λ = 1 − 1/(0.5·l) = 0.6, 0, 0.5, 0; the value
    targets keep lam (critic_lam None) unless critic_lam is given."""
    exp = experience(4)
    mask = exp.loss_mask.float()
    lam = length_adaptive_lam(mask, 0.5)
    torch.testing.assert_close(lam, torch.tensor([0.6, 0.0, 0.5, 0.0]))
    cfg = config(length_adaptive_alpha=0.5, whiten_advantages=False)
    rewards, advantages, returns = ppo.gae_estimate(narrowed(ppo.GAEOptions, cfg), exp, 0.05)
    expected_a, _ = gae(rewards, exp.values, mask, 1.0, lam)
    _, expected_r = gae(rewards, exp.values, mask, 1.0, 0.95)
    assert torch.equal(advantages, expected_a)
    assert torch.equal(returns, expected_r)
    vapo = narrowed(ppo.GAEOptions, config(length_adaptive_alpha=0.5, critic_lam=1.0))
    _, _, vapo_returns = ppo.gae_estimate(vapo, exp, 0.05)
    torch.testing.assert_close(vapo_returns, discounted_returns(rewards, mask, 1.0))


def test_positive_nll_needs_a_threshold_with_a_reward_model():
    with pytest.raises(ProxrlError) as info:
        ppo.Config(model="m", prompts="p", reward_model=("rm",), positive_nll_coef=0.1).validate()
    assert str(info.value) == (
        "positive_threshold: positive_nll_coef with a reward model needs the score at or above "
        "which a response is positive (a learned score has no 'correct')"
    )
    ppo.Config(
        model="m", prompts="p", reward_model=("rm",), positive_nll_coef=0.1, positive_threshold=2.0
    ).validate()
    # a reward model logged at weight 0 beside a verifiable reward: the best score is positive
    ppo.Config(
        model="m",
        prompts="p",
        reward_model=("rm",),
        reward_fn=("a:f",),
        reward_weights=(0.0, 1.0),
        positive_nll_coef=0.1,
    ).validate()


def test_positive_nll_is_added_on_the_rollouts_best_rows_by_hand():
    """Scores (0, 1, 0, 1) over responses of 5, 2, 4, 1 tokens: rows 1 and 3 positive, 3 of the
    12 tokens; the term is 12/3 · Σ_{rows 1, 3}(−log π) / 12 = the token-mean NLL of those
    rows; the policy loss gets coef × it, on any micro-batch of the rows."""
    cfg = config(positive_nll_coef=0.1)
    algo = ppo.build(cfg)
    exp = experience(4)
    exp.scores = torch.tensor([0.0, 1.0, 0.0, 1.0])
    _, advantages, returns = algo.estimate(exp, 0.05)
    exp.advantages, exp.returns = advantages, returns
    logprobs = -torch.rand(4, 5, generator=torch.Generator().manual_seed(1))
    plain = ppo.build(config())
    total, stats = algo.policy_loss(logprobs, exp)
    base, _ = plain.policy_loss(logprobs, exp)
    nll = -(logprobs[1, :2].sum() + logprobs[3, :1].sum()) / 3
    torch.testing.assert_close(stats["positive_nll"], nll)
    torch.testing.assert_close(total, base + 0.1 * nll)
    # micro-batches (rows 0-1 | 2-3), each weighed by its tokens ÷ the minibatch's, add up
    shares = torch.zeros(())
    for rows in (torch.tensor([0, 1]), torch.tensor([2, 3])):
        mb = exp.select(rows)  # (trimmed of the columns that are padding in both rows)
        loss, _ = algo.policy_loss(logprobs[rows][:, : mb.response_mask.shape[1]], mb)
        shares = shares + loss * mb.response_mask.sum() / 12
    torch.testing.assert_close(shares, total)


def test_no_positive_row_when_every_score_is_equal():
    algo = ppo.build(config(positive_nll_coef=0.1))
    exp = experience(4)
    exp.scores = torch.zeros(4)
    exp.advantages, exp.returns = algo.estimate(exp, 0.0)[1:]
    _, stats = algo.policy_loss(-torch.rand(4, 5), exp)
    assert stats["positive_nll"] == 0


@pytest.fixture
def say_prompts(tmp_path) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in "abcdefgh"))
    return str(path)


def test_a_critic_pretrained_with_critic_lam_starts_a_vapo_run(tiny_lm, say_prompts, tmp_path):
    """Value pretraining in one run (critic_lam 1, the policy not trained), its saved critic/
    the start of a second run with VAPO's set: the second run's critic is the first's, and it
    trains with finite value metrics, the positive-example NLL in its policy loss."""
    earlier = tmp_path / "earlier"
    vapo = {"critic_lam": 1.0, "critic_model": "policy"}
    ppo.train(
        start_config(
            ppo, tiny_lm, say_prompts, earlier, iterations=3, critic_warmup_iterations=2, **vapo
        )
    )
    saved = load_score_model(str(earlier / "critic")).state_dict()
    later = start_config(
        ppo,
        tiny_lm,
        say_prompts,
        tmp_path / "later",
        critic_model=str(earlier),
        critic_lam=1.0,
        length_adaptive_alpha=0.05,
        positive_nll_coef=0.1,
    )
    assert same(critic_weights(later), saved)
    ppo.train(later)
    rows = read_metrics(tmp_path / "later")
    assert all(math.isfinite(row["value/loss"]) for row in rows)
    # VAPO's terms act: the positive rows' NLL joins the policy loss, and the critic it
    # started from trains on (its saved weights moved from the first run's)
    assert all(math.isfinite(row["policy/positive_nll"]) for row in rows)
    assert any(row["policy/positive_nll"] > 0 for row in rows)
    trained = load_score_model(str(tmp_path / "later" / "critic")).state_dict()
    assert trained.keys() == saved.keys()
    assert any(not torch.equal(trained[k], saved[k]) for k in saved)
