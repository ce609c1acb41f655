"""The registries are the only source of option names: each config choice is its registry's
names (plus the config edge's aliases, each mapped to a registered name), an old spelling
trains exactly as its canonical name, and every online estimator has a hand-computed case."""

from __future__ import annotations

import math
import typing

import pytest
import torch

from proxrl.algos.online import config, grpo, ppo
from proxrl.algos.online.collect import NO_STOP_RULES
from proxrl.algos.online.critic import CRITICS
from proxrl.algos.online.run import KL_CONTROLLERS
from proxrl.algos.online.samplers import ENGINES
from proxrl.core import (
    AGGREGATIONS,
    DISTILL_LOSSES,
    ENSEMBLE_COMBINATIONS,
    KL_ESTIMATORS,
    OFF_POLICY_MASKS,
    POLICY_LOSSES,
    REWARD_KL_ESTIMATORS,
    REWARD_SCALES,
    ROLLOUT_CORRECTIONS,
    Aggregation,
    PolicyLossSettings,
    aggregate_loss,
)
from proxrl.rollout.experience import Experience
from proxrl.rollout.vllm_sampler import LORA_SYNCS
from proxrl.runtime.config import narrowed
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.fields import field_table

BASE = {"model": "m", "prompts": "p", "reward_fn": "tests.algos.online_rewards:target_fraction"}


def choices(cls: type, field: str) -> tuple[str, ...]:
    return typing.get_args(field_table(cls)[field].type)


@pytest.mark.parametrize(
    ("cls", "field", "names"),
    [
        (ppo.Config, "policy_loss", (*POLICY_LOSSES,)),
        (ppo.Config, "loss_aggregation", (*AGGREGATIONS, *config.LOSS_AGGREGATION_ALIASES)),
        (ppo.Config, "kl_estimator", REWARD_KL_ESTIMATORS),
        (ppo.Config, "rollout_correction", ("none", *ROLLOUT_CORRECTIONS)),
        (ppo.Config, "reward_ensemble", (*ENSEMBLE_COMBINATIONS,)),
        (ppo.Config, "critic", (*CRITICS,)),
        (grpo.Config, "estimator", (*grpo.ESTIMATORS,)),
        (grpo.Config, "scale_rewards", (*REWARD_SCALES, *grpo.SCALE_REWARDS_ALIASES)),
        (grpo.Config, "kl_loss_type", (*KL_ESTIMATORS,)),
        (ppo.Config, "sampler", (*ENGINES,)),
        (grpo.Config, "vllm_lora_sync", tuple(LORA_SYNCS)),
        (ppo.Config, "kl_controller", (*KL_CONTROLLERS,)),
        (ppo.Config, "no_stop_mode", (*NO_STOP_RULES,)),
        (ppo.Config, "surrogate", (*ppo.PPO_SURROGATES,)),
        (ppo.Config, "off_policy_mask", ("none", *OFF_POLICY_MASKS)),
        (grpo.Config, "off_policy_mask", ("none", *OFF_POLICY_MASKS)),
        (ppo.Config, "distill_loss", (*DISTILL_LOSSES,)),
        (grpo.Config, "distill_kl_estimator", REWARD_KL_ESTIMATORS),
    ],
)
def test_config_choices_are_the_registry_names(cls, field, names):
    assert choices(cls, field) == names


@pytest.mark.parametrize(
    ("aliases", "registry"),
    [
        (config.LOSS_AGGREGATION_ALIASES, AGGREGATIONS),
        (grpo.SCALE_REWARDS_ALIASES, REWARD_SCALES),
    ],
)
def test_aliases_name_registered_entries_and_never_shadow_one(aliases, registry):
    assert set(aliases.values()) <= set(registry)
    assert not set(aliases) & set(registry)


def test_the_help_choices_did_not_change():
    """The choices users saw before the registries, and the new ones at the end: sapo, issue
    37's dppo_tv, dppo_kl, clip_cov, kl_cov and unclipped."""
    assert choices(ppo.Config, "loss_aggregation") == (
        "token-mean",
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
        "dapo",
        "bnpo",
        "grpo",
        "dr_grpo",
    )
    assert choices(ppo.Config, "policy_loss") == (
        "ppo",
        "gspo",
        "gspo_token",
        "cispo",
        "sapo",
        "dppo_tv",
        "dppo_kl",
        "clip_cov",
        "kl_cov",
        "unclipped",
    )
    assert choices(ppo.Config, "kl_estimator") == ("k1", "k2", "k3")
    assert choices(ppo.Config, "rollout_correction") == (
        "none",
        "tis",
        "seq_tis",
        "mis",
        "seq_mis",
        "icepop",
    )
    assert choices(grpo.Config, "estimator") == (
        "grpo",
        "rloo",
        "remax",
        "reinforce_pp",
        "reinforce_pp_baseline",
        "reinforce",
        "maxrl",
        "asymre",
        "gdpo",
    )
    assert choices(grpo.Config, "scale_rewards") == ("group", "batch", "none", "std")


@pytest.mark.parametrize(("alias", "name"), sorted(config.LOSS_AGGREGATION_ALIASES.items()))
def test_an_aggregation_alias_reduces_as_its_name(alias, name):
    loss, mask = torch.randn(3, 4, dtype=torch.float64), torch.tensor([[1, 1, 0, 0]] * 3)
    aliased = ppo.Config(**BASE, loss_aggregation=alias).aggregation
    canonical = ppo.Config(**BASE, loss_aggregation=name).aggregation
    assert aliased == canonical
    assert torch.equal(aliased(loss, mask), aggregate_loss(loss, mask, name, horizon=64))


def test_the_dppo_knobs_are_config_fields_with_ranges():
    cfg = grpo.Config(**BASE, policy_loss="dppo_kl", dppo_delta_low=0.05, dppo_delta_high=0.1)
    cfg.validate()
    for name in ("dppo_delta_low", "dppo_delta_high"):
        with pytest.raises(ProxrlError, match=f"^{name}: expected > 0, got 0.0$"):
            grpo.Config(**BASE, **{name: 0.0}).validate()


def _policy_loss(cfg: grpo.Config) -> tuple[str, PolicyLossSettings, Aggregation]:
    """What ``surrogate`` binds of ``cfg`` (``run_settings`` narrows the knobs so)."""
    return cfg.policy_loss, narrowed(PolicyLossSettings, cfg), cfg.aggregation


def test_the_dppo_binding_reads_the_config_knobs():
    """surrogate with dppo_tv: μ = 1/2 at every token, π = 0.8 | 0.2 (rows of A = ±1): the
    change 0.3 is past δ_high 0.25 (A > 0 dropped), within δ_low 0.35 (A < 0 kept, −r·A = 0.4)."""
    from proxrl.algos.online.algorithm import surrogate

    cfg = grpo.Config(**BASE, policy_loss="dppo_tv", dppo_delta_low=0.35, dppo_delta_high=0.25)
    mb = _experience(scores=[1.0, 0.0])
    mb.logprobs = torch.full((2, 2), 0.5).log()
    mb.advantages = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    logprobs = torch.tensor([[0.8, 0.8], [0.2, 0.2]]).log()
    loss, stats = surrogate(*_policy_loss(cfg))(logprobs, mb)
    assert math.isclose(loss.item(), 2 * 0.4 / 4, rel_tol=1e-6)
    assert math.isclose(stats["clipfrac"].item(), 0.5)


@pytest.mark.parametrize("name", ["opsm", "m2po"])
def test_the_off_policy_mask_binding_zeroes_the_dropped_advantages(name):
    """surrogate with a mask, on PPO-Clip: row 0 has log(μ/π) = 1 at both tokens (ratio
    e^−1, clipped for A < 0 at 0.8: −A·0.8 = 0.8 per token), row 1 is on-policy (−A·1 = 1).
    opsm (δ 0.5) drops row 0 (A < 0, diverged); m2po (τ 0.4) drops one of row 0's tokens
    ((log r)² 1, 1, 0, 0: mean 0.5 > 0.4, then 1/3 ≤ 0.4). token-mean over 4 tokens. m2po's
    moment spans the whole step: its binding (``step_selection``) runs over the step's rows
    before the loss, opsm's runs in the loss."""
    from proxrl.algos.online.algorithm import step_selection, surrogate

    cfg = grpo.Config(**BASE, off_policy_mask=name, opsm_delta=0.5, m2po_tau=0.4)
    mb = _experience(scores=[1.0, 0.0])
    mb.advantages = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    logprobs = mb.logprobs - torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    select = step_selection(*_policy_loss(cfg)[:2])
    assert (select is None) == (name == "opsm")
    if select is not None:
        mb, step_stats = select(logprobs, mb, None)
    loss, stats = surrogate(*_policy_loss(cfg))(logprobs, mb)
    stats = step_stats if select is not None else stats
    kept_of_row_0 = {"opsm": 0, "m2po": 1}[name]
    assert math.isclose(loss.item(), (kept_of_row_0 * 0.8 + 2 * 1.0) / 4, rel_tol=1e-6)
    assert math.isclose(float(stats["off_policy_masked"]), (2 - kept_of_row_0) / 4)


def test_m2po_on_the_unclipped_loss_keeps_the_ratio_a_clip_would_cut():
    """M2PO as its paper states it: policy_loss unclipped with off_policy_mask m2po. The case
    above: m2po (τ 0.4) drops row 0's first token (ties by position); its second (r = e^−1,
    A = −1) keeps −A·r = e^−1 and its gradient, where PPO-Clip takes 0.8 and none. Row 1 is
    on-policy: 1 per token. token-mean over 4."""
    from proxrl.algos.online.algorithm import step_selection, surrogate

    cfg = grpo.Config(**BASE, policy_loss="unclipped", off_policy_mask="m2po", m2po_tau=0.4)
    mb = _experience(scores=[1.0, 0.0])
    mb.advantages = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    logprobs = (mb.logprobs - torch.tensor([[1.0, 1.0], [0.0, 0.0]])).requires_grad_()
    select = step_selection(*_policy_loss(cfg)[:2])
    assert select is not None
    rows, _ = select(logprobs.detach(), mb, None)
    loss, stats = surrogate(*_policy_loss(cfg))(logprobs, rows)
    assert math.isclose(loss.item(), (math.exp(-1.0) + 2.0) / 4, rel_tol=1e-6)
    loss.backward()
    expected = torch.tensor([[0.0, math.exp(-1.0)], [1.0, 1.0]]) / 4
    assert torch.allclose(logprobs.grad, expected, rtol=1e-6, atol=0.0)
    assert stats["clipfrac"].item() == 0.0


def test_the_mask_knobs_are_config_fields_with_ranges():
    grpo.Config(**BASE, off_policy_mask="m2po", m2po_tau=0.1).validate()
    grpo.Config(**BASE, off_policy_mask="opsm", opsm_delta=0.0).validate()
    with pytest.raises(ProxrlError, match="^m2po_tau: expected > 0, got 0.0$"):
        grpo.Config(**BASE, m2po_tau=0.0).validate()
    with pytest.raises(ProxrlError, match="^opsm_delta: expected >= 0, got -1.0$"):
        grpo.Config(**BASE, opsm_delta=-1.0).validate()


def test_the_covariance_knobs_are_config_fields_with_ranges():
    cfg = grpo.Config(**BASE, policy_loss="clip_cov", clip_cov_ratio=0.01, clip_cov_lb=0.5)
    cfg.validate()
    for name in ("clip_cov_ratio", "kl_cov_ratio"):
        with pytest.raises(ProxrlError, match=rf"^{name}: expected in \(0, 1\], got 0.0$"):
            grpo.Config(**BASE, **{name: 0.0}).validate()
    with pytest.raises(ProxrlError, match="^kl_cov_coef: expected >= 0, got -1.0$"):
        grpo.Config(**BASE, kl_cov_coef=-1.0).validate()


def test_clip_cov_draws_from_the_generator_it_is_given():
    """clip_cov's binding draws over the step's rows (``step_selection``) from the generator
    passed to it: two tokens inside the window (on-policy, A = +1 | −3 by row), one drawn; the
    loss then drops it."""
    from proxrl.algos.online.algorithm import step_selection, surrogate

    cfg = grpo.Config(**BASE, policy_loss="clip_cov", clip_cov_lb=-10.0, clip_cov_ratio=0.25)
    mb = _experience(scores=[1.0, 0.0])
    mb.advantages = torch.tensor([[1.0, 1.0], [-3.0, -3.0]])
    select = step_selection(*_policy_loss(cfg)[:2])
    assert select is not None
    drawn = []
    for seed in (0, 0, 1, 2, 3):
        rows, _ = select(mb.logprobs, mb, torch.Generator().manual_seed(seed))
        _, stats = surrogate(*_policy_loss(cfg))(mb.logprobs.clone(), rows)
        drawn.append(float(stats["policy_loss"]))
        assert math.isclose(stats["cov_dropped"].item(), 1 / 4)
    # the same seed draws the same token; some other seed another one
    assert drawn[0] == drawn[1] and len(set(drawn)) == 2


def test_the_sapo_knobs_are_config_fields_with_ranges():
    cfg = grpo.Config(**BASE, policy_loss="sapo", sapo_tau_pos=0.5, sapo_tau_neg=2.0)
    cfg.validate()
    for name in ("sapo_tau_pos", "sapo_tau_neg"):
        with pytest.raises(ProxrlError, match=f"^{name}: expected > 0, got 0.0$"):
            grpo.Config(**BASE, **{name: 0.0}).validate()


def test_the_sapo_knobs_reach_yaml_and_the_command_line(tmp_path):
    from proxrl.runtime.config import parse_config

    path = tmp_path / "grpo.yaml"
    path.write_text("model: m\nprompts: p\nreward_fn: a:f\npolicy_loss: sapo\nsapo_tau_neg: 2\n")
    argv = ["--config", str(path), "--sapo-tau-pos", "0.25"]
    cfg = parse_config(grpo.Config, argv, "proxrl grpo")
    assert (cfg.policy_loss, cfg.sapo_tau_pos, cfg.sapo_tau_neg) == ("sapo", 0.25, 2.0)


def test_the_policy_loss_binding_reads_the_config_knobs():
    """surrogate with sapo: the config's τ reach the core loss (r = 1: loss −(2/τ)·A)."""
    from proxrl.algos.online.algorithm import surrogate

    cfg = grpo.Config(**BASE, policy_loss="sapo", sapo_tau_pos=4.0, sapo_tau_neg=0.5)
    mb = _experience(scores=[1.0, 3.0, 0.0, 2.0])
    mb.advantages = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [1.0, 1.0], [-1.0, -1.0]])
    loss, _ = surrogate(*_policy_loss(cfg))(mb.logprobs, mb)
    # token-mean over 8 tokens: 4 tokens at −(2/4)·1, 4 at −(2/0.5)·(−1) = +4
    assert math.isclose(loss.item(), (4 * -0.5 + 4 * 4.0) / 8, rel_tol=1e-6)


# -- every grpo estimator by hand ------------------------------------------------------------


def _experience(scores: list[float], greedy: list[float] | None = None) -> Experience:
    """One-turn responses of two tokens (prompts × two samples), π_old = π_ref (every KL 0),
    V = 0; float32, as the loop's masks (``loss_mask.float()``) are."""
    n, width = len(scores), 2
    zeros = torch.zeros(n, width)
    return Experience(
        prompt_ids=torch.zeros(n, 1, dtype=torch.long),
        prompt_mask=torch.ones(n, 1, dtype=torch.long),
        response_ids=torch.zeros(n, width, dtype=torch.long),
        response_mask=torch.ones(n, width, dtype=torch.long),
        logprobs=zeros - 0.5,
        ref_logprobs=zeros - 0.5,
        values=zeros,
        scores=torch.tensor(scores),
        greedy_scores=None if greedy is None else torch.tensor(greedy),
    )


R2 = math.sqrt(2)
# Scores 1, 3 | 0, 2 (groups of 2), greedy baselines 0.5 | 1, KL 0, γ = 1: the (N,) advantage
# each estimator puts on both tokens of a response.
ESTIMATOR_CASES = {
    # group mean 2 | 1, unbiased std √2 | √2: ±1/(√2 + 1e-6)
    "grpo": [-1 / (R2 + 1e-6), 1 / (R2 + 1e-6), -1 / (R2 + 1e-6), 1 / (R2 + 1e-6)],
    # s_i − the other sample's score
    "rloo": [-2.0, 2.0, -2.0, 2.0],
    # s_i − the prompt's greedy score
    "remax": [0.5, 2.5, -1.0, 1.0],
    # s_i − the batch mean 1.5
    "reinforce": [-0.5, 1.5, -1.5, 0.5],
    # returns (s, s) per row, whitened over 8 tokens: mean 1.5, unbiased var (4·0.25 + 4·2.25)/7
    "reinforce_pp": [d / math.sqrt(10 / 7 + 1e-8) for d in (-0.5, 1.5, -1.5, 0.5)],
    # group-centred ±1 at the last token, returns (c, c), whitened: mean 0, var 8/7
    "reinforce_pp_baseline": [c / math.sqrt(8 / 7 + 1e-8) for c in (-1.0, 1.0, -1.0, 1.0)],
    # (s − mean) ÷ (mean + 1e-6): ±1/2 | ±1/1
    "maxrl": [-1 / (2 + 1e-6), 1 / (2 + 1e-6), -1 / (1 + 1e-6), 1 / (1 + 1e-6)],
    # s − (mean − 0.1), the default baseline_shift −0.1
    "asymre": [-0.9, 1.1, -0.9, 1.1],
    # combined scores (set below: 1, 3, 0, 2, as the score) whitened over the batch: mean 1.5,
    # unbiased std √(5/3)
    "gdpo": [d / (math.sqrt(5 / 3) + 1e-6) for d in (-0.5, 1.5, -1.5, 0.5)],
}


def test_every_estimator_has_a_case():
    assert set(ESTIMATOR_CASES) == set(grpo.ESTIMATORS)


@pytest.mark.parametrize("name", sorted(ESTIMATOR_CASES))
def test_estimators_by_hand(name):
    cfg = grpo.Config(**BASE, estimator=name, group_size=2)
    exp = _experience([1.0, 3.0, 0.0, 2.0], greedy=[0.5, 1.0])
    exp.combined_scores = exp.scores.clone()
    _, advantages, _ = grpo.ESTIMATORS[name](narrowed(grpo.EstimatorOptions, cfg), exp, 0.0)
    expected = torch.tensor(ESTIMATOR_CASES[name])
    torch.testing.assert_close(advantages, expected[:, None].expand(4, 2), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["maxrl", "asymre"])
def test_group_estimators_on_ragged_rows(name):
    """Responses of 2 and 1 tokens (a length-1 response), a constant group (0, 0): the sequence
    advantage on every valid token and 0 in padding; the score at the last valid token; the KL
    paid in the loss (kl_loss set), as grpo's."""
    cfg = grpo.Config(**BASE, estimator=name, group_size=2, baseline_shift=0.5)
    exp = _experience([1.0, 0.0, 0.0, 0.0])
    exp.response_mask = torch.tensor([[1, 1], [1, 0], [1, 0], [1, 1]])
    rewards, advantages, returns = grpo.ESTIMATORS[name](
        narrowed(grpo.EstimatorOptions, cfg), exp, 0.0
    )
    # maxrl: mean 1/2, (±1/2)/(1/2 + 1e-6); asymre: ±1/2 − 0.5; the constant group 0 | −0.5
    a = 0.5 / (0.5 + 1e-6)
    sequence = {"maxrl": [a, -a, 0.0, 0.0], "asymre": [0.0, -1.0, -0.5, -0.5]}[name]
    per_token = torch.tensor(sequence)[:, None] * exp.response_mask
    torch.testing.assert_close(advantages, per_token, rtol=1e-6, atol=0.0)
    torch.testing.assert_close(
        rewards, torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    )
    torch.testing.assert_close(
        returns, torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    )
    assert grpo.build(cfg).kl_loss is not None


def test_gdpo_combines_the_sources_when_scored_and_whitens_at_estimation():
    """The algorithm's combine_sources on (B, K) = 4 × 2 sources, weights (1, 0.5), groups of 2:
    source 1 (1, 0 | 1, 1) → ±½/(√½ + ε) | 0, 0; source 2 (0, 2 | 4, 0) → ∓1/(√2 + ε) |
    ±2/(2√2 + ε). The estimate whitens those sums over the batch; ragged rows (a length-1
    response) carry it on every valid token."""
    cfg = grpo.Config(**BASE, estimator="gdpo", group_size=2)
    algo = grpo.build(cfg)
    assert algo.combine_sources is not None and algo.kl_loss is not None
    sources = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 4.0], [1.0, 0.0]], dtype=torch.float64)
    combined = algo.combine_sources(sources, [1.0, 0.5])
    a = 0.5 / (math.sqrt(0.5) + 1e-6) - 0.5 / (math.sqrt(2) + 1e-6)
    b = 0.5 * 2 / (2 * math.sqrt(2) + 1e-6)
    torch.testing.assert_close(combined, torch.tensor([a, -a, b, -b], dtype=torch.float64))
    exp = _experience([1.0, 0.0, 1.0, 1.0])
    exp.response_mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 0]])
    exp.combined_scores = combined.float()
    _, advantages, _ = grpo.ESTIMATORS["gdpo"](narrowed(grpo.EstimatorOptions, cfg), exp, 0.0)
    std = math.sqrt((2 * a * a + 2 * b * b) / 3)
    expected = torch.tensor([a, -a, b, -b]) / (std + 1e-6)
    torch.testing.assert_close(
        advantages, expected[:, None] * exp.response_mask, rtol=1e-6, atol=0.0
    )


def test_gdpo_needs_the_combined_scores():
    cfg = grpo.Config(**BASE, estimator="gdpo", group_size=2)
    with pytest.raises(ValueError, match="^gdpo: the rollout carries no combined_scores"):
        grpo.ESTIMATORS["gdpo"](
            narrowed(grpo.EstimatorOptions, cfg), _experience([1.0, 0.0, 1.0, 1.0]), 0.0
        )


def test_maxrl_refuses_negative_rewards_naming_the_field():
    cfg = grpo.Config(**BASE, estimator="maxrl", group_size=2)
    with pytest.raises(ProxrlError, match=r"^reward_fn: maxrl takes rewards in \[0, 1\]; got -1 "):
        grpo.ESTIMATORS["maxrl"](
            narrowed(grpo.EstimatorOptions, cfg), _experience([1.0, -1.0, 0.0, 0.0]), 0.0
        )


def _options(**fields):
    return narrowed(grpo.EstimatorOptions, grpo.Config(**BASE, **fields))


def test_the_old_scale_spelling_is_group():
    exp = _experience([1.0, 3.0, 0.0, 5.0])
    old = grpo.ESTIMATORS["grpo"](_options(scale_rewards="std"), exp, 0.0)
    new = grpo.ESTIMATORS["grpo"](_options(scale_rewards="group"), exp, 0.0)
    for a, b in zip(old, new, strict=True):
        assert torch.equal(a, b)


def test_ppo_gae_estimate_by_hand():
    """No whitening, γ = 1, λ = 0.5, V = 0, KL 0: the score s at the last token; A = s there
    and δ + γλ·A = 0 + 0.5·s one token earlier; returns = A + V = A."""
    cfg = ppo.Config(**BASE, whiten_advantages=False, lam=0.5)
    rewards, advantages, returns = ppo.gae_estimate(
        narrowed(ppo.GAEOptions, cfg), _experience([1.0, 3.0]), 0.0
    )
    torch.testing.assert_close(rewards, torch.tensor([[0.0, 1.0], [0.0, 3.0]]))
    torch.testing.assert_close(advantages, torch.tensor([[0.5, 1.0], [1.5, 3.0]]))
    torch.testing.assert_close(returns, advantages)
