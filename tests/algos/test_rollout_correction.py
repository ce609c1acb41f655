"""Rollout corrections in the online update: the weights reach every algorithm's policy loss
through one place, and a run with each correction logs the mismatch metrics."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from proxrl.algos.online import grpo, ppo
from proxrl.algos.online.advantages import estimate
from proxrl.algos.online.roles import load_models, load_prompts, load_rewards, role_settings
from proxrl.algos.online.run_settings import run_settings
from proxrl.algos.online.update import Losses, UpdateStep, terms
from proxrl.core import ROLLOUT_CORRECTIONS, tis_weights
from proxrl.rollout.forward import policy_forward
from proxrl.runtime.metrics import read_metrics
from tests.algos.collected import rollout_of

CORRECTIONS = list(ROLLOUT_CORRECTIONS)
METRICS = [
    "rollout/mismatch_kl",
    "rollout/mismatch_kl_k1",
    "rollout/is_ratio_mean",
    "rollout/is_ratio_min",
    "rollout/is_ratio_max",
    "rollout/masked_share",
    "rollout/truncated_share",
]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    words = ["abc", "def", "ghi", "jkl", "mno", "pqr", "stu", "vwx"]
    path.write_text(
        "".join(json.dumps({"prompt": f"say: {w} ->", "word": w}) + "\n" for w in words)
    )
    return str(path)


def config(module, tiny_lm, prompts, out, **overrides):
    fields = dict(
        model=tiny_lm,
        prompts=prompts,
        reward_fn=("tests.algos.online_rewards:target_fraction",),
        output_dir=str(out),
        iterations=2,
        rollout_batch_size=4,
        group_size=2,
        max_new_tokens=10,
        temperature=0.7,
        top_k=5,
        top_p=0.9,
        mini_batch_size=8,
        learning_rate=3e-3,
        loss_aggregation="token-mean",
        skip_old_logprobs_pass=False,  # these tests read the rollout's π_old
        progress=False,
        seed=3,
    )
    return module.Config(**(fields | overrides))


def rollout(cfg, module):
    algo = module.build(cfg)
    models = load_models(role_settings(cfg).models, algo)
    examples, ids = load_prompts(role_settings(cfg).prompts, models.tokenizer)
    torch.manual_seed(0)
    experience, _, metrics = rollout_of(
        cfg, algo, models, load_rewards(role_settings(cfg).rewards), examples[:4], ids[:4], 0.0, {}
    )
    return algo, models, estimate(algo, experience, 0.0), metrics


def policy_grads(cfg, algo, models, mb):
    models.actor.zero_grad()
    P = mb.prompt_ids.shape[1]
    with cfg.autocast():
        loss, _, _ = terms(
            Losses(
                run_settings(cfg, algo, models.critic).updating,
                algo,
                models,
                P,
                UpdateStep(0.0, True, 1),
            ),
            mb,
        )
    loss.backward()
    return [p.grad.clone() for p in models.actor.parameters() if p.grad is not None]


def test_corrected_rollout_takes_pi_old_from_the_trainer(tiny_lm, prompts, tmp_path):
    """With a correction, π_old is the trainer's forward pass (bit-equal to a run without
    sampler_logprobs), and the weights are tis of (π_old − π_sampler) at the sampled tokens."""
    cfg = config(grpo, tiny_lm, prompts, tmp_path, sampler_logprobs=True, rollout_correction="tis")
    _, _, corrected, metrics = rollout(cfg, grpo)
    _, _, plain, _ = rollout(replace(cfg, sampler_logprobs=False, rollout_correction="none"), grpo)
    assert torch.equal(corrected.response_ids, plain.response_ids)
    assert torch.equal(corrected.logprobs, plain.logprobs)
    assert plain.rollout_weights is None
    mask = corrected.response_mask.bool()
    # the cached sampler's log-probs differ from the full pass by float rounding only
    assert torch.allclose(corrected.rollout_weights[mask], torch.ones(()), atol=1e-4)
    assert not corrected.rollout_weights[~mask].any()
    assert all(math.isfinite(metrics[name]) for name in METRICS)
    assert 0 <= metrics["rollout/mismatch_kl"] < 1e-8


@pytest.mark.parametrize("module", [grpo, ppo])
def test_weights_of_one_leave_the_gradient_bit_identical(module, tiny_lm, prompts, tmp_path):
    """rollout_weights None (rollout_correction none) and all ones give the same bits."""
    cfg = config(module, tiny_lm, prompts, tmp_path)
    algo, models, experience, _ = rollout(cfg, module)
    assert experience.rollout_weights is None
    plain = policy_grads(cfg, algo, models, experience)
    ones = replace(experience, rollout_weights=torch.ones_like(experience.advantages))
    for a, b in zip(plain, policy_grads(cfg, algo, models, ones), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("estimator", ["grpo", "reinforce"])
def test_tis_gradient_equals_the_hand_scaled_one(estimator, tiny_lm, prompts, tmp_path):
    """A synthetic mismatch (sampler log-probs = π_old + noise) and tis with cap 1.2: the
    update's gradient equals that of Σ_t w_t·ℓ_t / Σ mask, with ℓ_t PPO-Clip's (grpo) or
    REINFORCE's (reinforce) per-token loss written out here, w_t = min(π_old/π_s, 1.2)."""
    cfg = config(grpo, tiny_lm, prompts, tmp_path, estimator=estimator, group_size=2)
    algo, models, experience, _ = rollout(cfg, grpo)
    noise = 0.3 * torch.randn(experience.logprobs.shape, generator=torch.Generator().manual_seed(1))
    mask = experience.response_mask.float()
    weights = tis_weights(noise, mask, 1.2)  # log π_old − log π_s = noise
    assert (weights[mask.bool()] == 1.2).any() and (weights[mask.bool()] < 1).any()
    mb = replace(experience, rollout_weights=weights)
    # π moves away from π_old so that clipping is active for some tokens
    with torch.no_grad():
        for p in models.actor.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    got = policy_grads(cfg, algo, models, mb)

    models.actor.zero_grad()
    out = policy_forward(
        models.actor,
        mb.input_ids,
        mb.attention_mask,
        mb.prompt_ids.shape[1],
        0.7,
        top_k=5,
        top_p=0.9,
    )
    A = mb.advantages
    if estimator == "reinforce":
        per_token = -A * out.logprobs
    else:
        ratio = torch.exp(out.logprobs - mb.logprobs)
        per_token = torch.maximum(-A * ratio, -A * ratio.clamp(0.8, 1.2))
        assert ((ratio - 1).abs() > 0.2)[mask.bool()].any()  # some tokens clipped
    ((weights * per_token * mask).sum() / mask.sum()).backward()
    expected = [p.grad.clone() for p in models.actor.parameters() if p.grad is not None]
    unweighted = policy_grads(cfg, algo, models, experience)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)
    assert any(not torch.allclose(a, c, rtol=1e-3) for a, c in zip(got, unweighted, strict=True))


@pytest.mark.parametrize("surrogate", ["penalty", "clip+penalty"])
def test_the_penalty_kl_stays_unweighted(surrogate, tiny_lm, prompts, tmp_path):
    """PPO-Penalty's β·KL(π_old‖π) is a trust region, not an advantage term: weights of 0 on
    every token (a rollout MIS/IcePop would mask whole) remove the surrogate's gradient and keep
    the penalty's, i.e. they give the gradient of the rollout with advantages 0, which is not 0."""
    cfg = config(ppo, tiny_lm, prompts, tmp_path, surrogate=surrogate, penalty_beta=3.0)
    algo, models, experience, _ = rollout(cfg, ppo)
    with torch.no_grad():  # π away from π_old, so that the KL has a gradient
        for p in models.actor.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    zeros = torch.zeros_like(experience.advantages)
    masked = policy_grads(cfg, algo, models, replace(experience, rollout_weights=zeros))
    penalty_only = policy_grads(cfg, algo, models, replace(experience, advantages=zeros))
    for a, b in zip(masked, penalty_only, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-10)
    assert max(float(g.abs().max()) for g in masked) > 1e-4


@pytest.mark.parametrize("correction", CORRECTIONS)
def test_grpo_runs_with_each_correction_and_logs_the_metrics(
    correction, tiny_lm, prompts, tmp_path
):
    """A tiny grpo run with the cached sampler, sampler_logprobs true and the correction: every
    iteration logs the mismatch metrics, finite."""
    grpo.train(
        config(
            grpo,
            tiny_lm,
            prompts,
            tmp_path,
            min_p=0.05,
            sampler_logprobs=True,
            rollout_correction=correction,
            rollout_correction_cap=1.5,
        )
    )
    rows = read_metrics(tmp_path)
    assert len(rows) == 2
    for row in rows:
        assert all(math.isfinite(row[name]) for name in METRICS), row
        assert (
            row["rollout/is_ratio_min"]
            <= row["rollout/is_ratio_mean"]
            <= row["rollout/is_ratio_max"]
        )
