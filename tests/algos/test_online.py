"""PPO and the critic-free family on a tiny model: what a step must do, and that a learnable
reward goes up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from proxrl.algos import grpo, ppo
from proxrl.rollout.generation import response_mask_after_stop, stopped
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.metrics import read_metrics

WORDS = ["abc", "def", "ghi", "jkl", "mno", "pqr", "stu", "vwx"]
REWARD = ("online_rewards:target_fraction",)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say: {w} ->", "word": w}) + "\n" for w in WORDS))
    return str(path)


def small(config_cls, tiny_lm: str, prompts: str, out: Path, **overrides):
    fields = dict(
        model=tiny_lm, prompts=prompts, reward_fn=REWARD, output_dir=str(out), iterations=3,
        rollout_batch_size=8, max_new_tokens=8, temperature=1.0, mini_batch_size=8,
        learning_rate=3e-3, progress=False, seed=3,
    )
    return config_cls(**(fields | overrides))


def scores(out: Path) -> list[float]:
    return [row["objective/scores"] for row in read_metrics(out)]


def test_ppo_raises_a_learnable_reward(tiny_lm, prompts, tmp_path):
    """40 iterations of PPO lift the share of target letters from ~0.2 clearly upward."""
    cfg = small(ppo.Config, tiny_lm, prompts, tmp_path, iterations=40, group_size=2, ppo_epochs=4,
                critic_learning_rate=1e-3, kl_coef=0.01)
    ppo.train(cfg)
    history = scores(tmp_path)
    assert sum(history[-5:]) / 5 > sum(history[:5]) / 5 + 0.2, history


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "remax", "reinforce_pp", "reinforce"])
def test_group_estimators_raise_a_learnable_reward(estimator, tiny_lm, prompts, tmp_path):
    cfg = small(grpo.Config, tiny_lm, prompts, tmp_path, estimator=estimator, iterations=30, group_size=4,
                ppo_epochs=2, mini_batch_size=16)
    grpo.train(cfg)
    history = scores(tmp_path)
    assert sum(history[-5:]) / 5 > sum(history[:5]) / 5 + 0.15, history
