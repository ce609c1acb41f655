"""Defaults that follow what the user chose: one reward function written as a single string (as
TRL's ``reward_funcs`` takes it) in YAML, on the command line and in Python, and a default
``mini_batch_size`` that divides the ``rollout_batch_size`` the user picked, while an explicit
bad pair is still refused naming both fields."""

from __future__ import annotations

import json

import pytest

from proxrl.algos.online import grpo, ppo
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.metrics import read_metrics

BASE = {"model": "m", "prompts": "p", "reward_fn": "tests.algos.online_rewards:target_fraction"}


def test_one_reward_function_as_a_string_is_a_list_of_one():
    cfg = ppo.Config(**BASE, reward_weights=2)
    cfg.validate()
    assert cfg.reward_fn == (
        "tests.algos.online_rewards:target_fraction",
    ) and cfg.reward_weights == (2.0,)
    listed = ppo.Config(**BASE | {"reward_fn": ["a:f", "b:g"]})
    assert list(listed.reward_fn) == ["a:f", "b:g"]


@pytest.mark.parametrize(
    ("config_cls", "fields", "step"),
    [
        (ppo.Config, {}, 16),  # the default batch: unchanged
        (ppo.Config, {"rollout_batch_size": 8}, 8),
        (ppo.Config, {"rollout_batch_size": 24}, 12),
        (ppo.Config, {"rollout_batch_size": 7}, 7),
        (ppo.Config, {"rollout_batch_size": 8, "grad_accum": 8}, 8),
        (ppo.Config, {"rollout_batch_size": 36, "grad_accum": 4}, 12),
        (grpo.Config, {}, 16),  # 16 prompts x 4
        (grpo.Config, {"rollout_batch_size": 3, "group_size": 2}, 6),
        (ppo.Config, {"rollout_batch_size": 8, "mini_batch_size": 4}, 4),  # the user's own
    ],
)
def test_the_default_mini_batch_follows_the_rollout_batch(config_cls, fields, step):
    cfg = config_cls(**BASE | fields)
    cfg.validate()
    assert cfg.responses_per_step == step
    assert cfg.responses_per_iteration % step == 0 and step % cfg.grad_accum == 0
    assert cfg.micro_batch_size == step // cfg.grad_accum


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"rollout_batch_size": 8, "mini_batch_size": 16},
            "mini_batch_size: 16 does not divide the 8 responses of an iteration "
            "(rollout_batch_size 8 × group_size 1)",
        ),
        (
            {"rollout_batch_size": 8, "grad_accum": 3},
            "grad_accum: 3 does not divide mini_batch_size 8 (the default: give mini_batch_size)",
        ),
    ],
)
def test_a_bad_pair_is_still_refused_naming_both_fields(fields, message):
    with pytest.raises(ProxrlError) as info:
        ppo.Config(**BASE | fields).validate()
    assert str(info.value) == message


def test_ppo_with_rollout_batch_size_8_and_one_reward_string_runs(tiny_lm, tmp_path):
    """The user's own config, as written: one reward function as a string in YAML, another on
    the command line, rollout_batch_size 8 and no mini_batch_size."""
    from proxrl.cli import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in "abcd"))
    config = tmp_path / "ppo.yaml"
    config.write_text(
        f"model: {tiny_lm}\nprompts: {prompts}\n"
        "reward_fn: tests.algos.online_rewards:target_fraction\n"
        "rollout_batch_size: 8\niterations: 1\nmax_new_tokens: 4\nprogress: false\n"
    )
    out = tmp_path / "run"
    assert main(["ppo", "--config", str(config), "--output-dir", str(out)]) == 0
    assert len(read_metrics(out)) == 1
    saved = (out / "config.yaml").read_text()
    assert (
        "- tests.algos.online_rewards:target_fraction" in saved and "mini_batch_size: null" in saved
    )
    again = tmp_path / "run2"
    argv = ["ppo", "--config", str(config), "--output-dir", str(again)]
    assert main([*argv, "--reward-fn", "tests.algos.online_rewards:target_fraction"]) == 0
