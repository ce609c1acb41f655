"""A reward-model ensemble (``reward_model`` with several models) as one reward source: each
member standardised by its own training-score std, combined as configured, its members and
spread logged; how ``reward_weights`` count it and where a critic starts."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

from proxrl.algos.online import grpo, ppo
from proxrl.algos.online.critic import critic_start
from proxrl.algos.online.roles import load_rewards, role_settings
from proxrl.data.formats import PromptExample
from proxrl.models.scalar_head import load_score_model, store_score_normalization
from proxrl.models.tokenizer import load_tokenizer
from proxrl.rollout.ensemble import EnsembleReward
from proxrl.rollout.rewards import RewardModelReward
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.metrics import read_metrics
from tests.algos.test_online import REWARD, prompts, small  # noqa: F401  (the module's prompt fixture)

# (seed, training-score mean, training-score std) of each member
MEMBERS = [(0, 0.3, 2.0), (1, -1.0, 0.5), (2, 0.0, 4.0)]


@pytest.fixture(scope="module")
def members(tiny_lm: str, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    paths = []
    for seed, mean, std in MEMBERS:
        out = tmp_path_factory.mktemp("rm") / f"rm{seed}"
        torch.manual_seed(seed)
        model = load_score_model(tiny_lm, new_head="reward")
        store_score_normalization(model, mean, std)
        model.save_pretrained(out)
        load_tokenizer(tiny_lm).save_pretrained(out)
        paths.append(str(out))
    return paths


PROMPTS = [PromptExample("say: abc ->", None, "p:1"), PromptExample("say: def ->", None, "p:2")]
COMPLETIONS = [" abc", " xyz qq"]


def member_scores(paths: list[str]) -> torch.Tensor:
    """(K, B) each member's own score (training mean subtracted) divided by its std."""
    rows = []
    for path, (_, _, std) in zip(paths, MEMBERS, strict=False):
        source = RewardModelReward(load_score_model(path).eval(), load_tokenizer(path))
        rows.append(source(PROMPTS, COMPLETIONS, {}) / std)
    return torch.stack(rows)


@pytest.mark.parametrize("combination", ["mean", "min", "mean_minus_std"])
def test_the_ensemble_is_one_source_scoring_standardised_members(members, combination):
    cfg = grpo.Config(
        model="m",
        prompts="p",
        reward_model=tuple(members),
        reward_ensemble=combination,
        reward_ensemble_std_coef=0.5,
    )
    rewards = load_rewards(role_settings(cfg).rewards)
    (source,) = rewards.sources
    assert isinstance(source, EnsembleReward)
    scored = rewards(PROMPTS, COMPLETIONS, {})
    total, parts = scored.total, scored.parts
    z = member_scores(members)
    mean, spread = z.mean(0), z.std(0, correction=0)
    expected = {"mean": mean, "min": z.min(0).values, "mean_minus_std": mean - 0.5 * spread}
    torch.testing.assert_close(total, expected[combination], rtol=1e-6, atol=1e-6)
    assert parts["reward/reward_model"] == pytest.approx(expected[combination].mean().item())
    for i in range(3):
        assert parts[f"reward/reward_model_{i}"] == pytest.approx(z[i].mean().item(), abs=1e-6)
    assert parts["reward/reward_model_spread"] == pytest.approx(spread.mean().item(), abs=1e-6)


def test_one_reward_model_keeps_its_own_units(members):
    cfg = grpo.Config(model="m", prompts="p", reward_model=members[1])
    (source,) = load_rewards(role_settings(cfg).rewards).sources
    assert isinstance(source, RewardModelReward)  # no standardisation: the demo's numbers


def test_reward_weights_count_the_ensemble_once(members):
    fields = dict(model="m", prompts="p", reward_model=tuple(members), reward_fn=REWARD)
    grpo.Config(**fields, reward_weights=(1.0, 0.5)).validate()
    with pytest.raises(ProxrlError, match="expected 2 weights .one per reward source., got 4"):
        grpo.Config(**fields, reward_weights=(1.0, 1.0, 1.0, 0.5)).validate()


def test_a_critic_starts_from_the_first_member(members):
    cfg = ppo.Config(model="policy", prompts="p", reward_model=tuple(members[::-1]))
    assert critic_start(None, cfg.model, cfg.reward_model) == members[2]


@pytest.fixture(scope="module")
def bare(tiny_lm: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A reward model trained elsewhere: no reward_mean, no reward_std in its config."""
    out = tmp_path_factory.mktemp("bare") / "rm"
    torch.manual_seed(7)
    load_score_model(tiny_lm, new_head="reward").save_pretrained(out)
    load_tokenizer(tiny_lm).save_pretrained(out)
    return str(out)


BATCH_2 = [" ghi jkl", " a", " zzz z"]
PROMPTS_2 = [PromptExample("say: ghi ->", None, "p:3")] * 3


def test_a_member_trained_elsewhere_is_calibrated_on_its_first_batch(members, bare):
    """Without reward_std a member's first batch fixes its centre and scale (that batch: mean
    0, std 1 once standardised), logged; later batches use the same ones, and a fresh ensemble
    given the saved state scores them as the first one does (not calibrated anew)."""
    cfg = grpo.Config(model="m", prompts="p", reward_model=(members[0], bare))
    rewards = load_rewards(role_settings(cfg).rewards)
    (ensemble,) = rewards.sources
    raw = RewardModelReward(load_score_model(bare).eval(), load_tokenizer(bare))
    first = raw(PROMPTS, COMPLETIONS, {}).double()
    mean, std = first.mean().item(), first.std(correction=0).item()
    assert std > 0
    parts = rewards(PROMPTS, COMPLETIONS, {}).parts
    assert parts["reward/reward_model_1"] == pytest.approx(0.0, abs=1e-6)
    assert parts["reward/reward_model_1_calibrated_mean"] == pytest.approx(mean, rel=1e-6)
    assert parts["reward/reward_model_1_calibrated_std"] == pytest.approx(std, rel=1e-6)
    assert "reward/reward_model_0_calibrated_std" not in parts  # member 0 has its own scale
    scored = rewards(PROMPTS_2, BATCH_2, {})
    total, parts = scored.total, scored.parts
    second = (raw(PROMPTS_2, BATCH_2, {}).double() - mean) / std
    assert parts["reward/reward_model_1"] == pytest.approx(second.mean().item(), abs=1e-6)
    assert parts["reward/reward_model_1_calibrated_std"] == pytest.approx(std, rel=1e-6)

    resumed = load_rewards(role_settings(cfg).rewards)
    resumed.sources[0].load_state_dict(ensemble.state_dict())
    again = resumed(PROMPTS_2, BATCH_2, {}).total
    torch.testing.assert_close(again, total, rtol=0, atol=0)
    fresh = load_rewards(role_settings(cfg).rewards)(
        PROMPTS_2, BATCH_2, {}
    ).total  # calibrated on this batch instead
    assert not torch.allclose(fresh, total, atol=1e-3)


def test_a_member_whose_reward_std_is_not_a_positive_number_is_refused(members, tmp_path):
    from transformers import AutoConfig

    odd = tmp_path / "odd"
    shutil.copytree(members[1], odd)
    config = AutoConfig.from_pretrained(odd)
    config.reward_std = -2.0
    config.save_pretrained(odd)
    cfg = grpo.Config(model="m", prompts="p", reward_model=(members[0], str(odd)))
    with pytest.raises(ProxrlError, match=f"reward_model: {odd} has reward_std -2.0 in its"):
        load_rewards(role_settings(cfg).rewards)


def test_a_run_resumed_after_calibration_scores_as_the_uninterrupted_one(
    members,
    bare,
    tiny_lm,
    prompts,  # noqa: F811
    tmp_path: Path,
):
    """GRPO on an ensemble with a member calibrated at iteration 1, resumed from the checkpoint
    of iteration 1: iteration 2 is scored on iteration 1's calibration, as without the stop."""
    options = dict(
        reward_fn=(),
        reward_model=(members[0], bare),
        iterations=2,
        save_every=1,
        keep_checkpoints=5,
    )
    straight = tmp_path / "straight"
    grpo.train(small(grpo.Config, tiny_lm, prompts, straight, **options))
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_000000002")
    for path in resumed.glob("*.safetensors"):
        path.unlink()
    grpo.train(small(grpo.Config, tiny_lm, prompts, resumed, resume=True, **options))
    want, got = read_metrics(straight), read_metrics(resumed)
    assert [r["step"] for r in got] == [1, 2]
    for key in ("reward/reward_model", "reward/reward_model_1", "objective/scores"):
        assert got[1][key] == pytest.approx(want[1][key], rel=1e-9, abs=1e-12), key
    assert (
        got[1]["reward/reward_model_1_calibrated_std"]
        == want[0]["reward/reward_model_1_calibrated_std"]
    )


def test_ppo_trains_on_an_ensemble_and_logs_members_and_spread(
    members,
    tiny_lm,
    prompts,  # noqa: F811
    tmp_path: Path,
):
    cfg = small(
        ppo.Config,
        tiny_lm,
        prompts,
        tmp_path / "run",
        reward_fn=(),
        reward_model=tuple(members[:2]),
        reward_ensemble="mean_minus_std",
        iterations=2,
    )
    ppo.train(cfg)
    rows = read_metrics(tmp_path / "run")
    for key in ("reward/reward_model", "reward/reward_model_0", "reward/reward_model_1"):
        assert all(math.isfinite(r[key]) for r in rows), key
    assert all(r["reward/reward_model_spread"] > 0 for r in rows)  # two random heads disagree
    assert [r["objective/scores"] for r in rows] == [r["reward/reward_model"] for r in rows]
