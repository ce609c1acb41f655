"""The critic's warm-up (VC-PPO's value pretraining, issue 35): it ends early once its value
loss stops falling (critic_warmup_patience), logs the explained variance at every warm-up
iteration, and a resumed run keeps where it ended."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from proxrl.algos.online import ppo
from proxrl.algos.online.critic import CriticSettings, ValueHeadCritic, WarmupStop
from proxrl.models.value_head import ValueHead
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.metrics import read_metrics
from tests.algos.test_online import WORDS, small


@pytest.fixture
def say_prompts(tmp_path: Path) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in WORDS))
    return str(path)


def constant(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    """Every response scores 1: with kl_coef 0 and λ = 1 the value targets are 1 at every
    token, so a zero head whose weights do not move has the same value loss every iteration."""
    return [1.0] * len(prompts)


def test_warmup_stop_by_hand():
    """Patience 2 over losses 1.0, 0.8 (best), 0.9, 0.85: two iterations in a row without a new
    best end the warm-up after iteration 3 (0-based): 4 warm-up iterations instead of 10."""
    stop = WarmupStop(10, patience=2)
    assert [stop.observe(i, loss) for i, loss in enumerate([1.0, 0.8, 0.9, 0.85])] == [
        False,
        False,
        False,
        True,
    ]
    assert stop.iterations == 4
    restored = WarmupStop(10, patience=2)
    restored.load_state_dict(stop.state_dict())
    assert (restored.iterations, restored.best, restored.stalled) == (4, 0.8, 2)


def test_warmup_stop_resets_on_a_new_best_and_never_outlasts_the_plan():
    stop = WarmupStop(5, patience=2)
    losses = [1.0, 1.1, 0.9, 1.0, 1.0]  # stalled once, a new best resets, then the plan ends
    assert not any(stop.observe(i, loss) for i, loss in enumerate(losses))
    assert stop.iterations == 5 and stop.best == 0.9
    assert WarmupStop(3, 1).best == math.inf


def test_a_critic_without_patience_runs_the_whole_warmup():
    settings = CriticSettings(learning_rate=1e-3, vf_coef=0.1, value_clip=None, warmup_iterations=4)
    critic = ValueHeadCritic(ValueHead(8), settings)
    assert critic.warmup_stop is None
    assert not critic.end_warmup_iteration(0, 1.0) and not critic.end_warmup_iteration(1, 1.0)
    assert critic.warmup_iterations == 4
    patient = ValueHeadCritic(
        ValueHead(8), CriticSettings(**vars(settings) | {"warmup_patience": 1})
    )
    assert not patient.end_warmup_iteration(0, 1.0) and patient.end_warmup_iteration(1, 1.0)
    assert patient.warmup_iterations == 2
    assert patient.wrapped(lambda m: m).warmup_iterations == 2  # one state, shared


def test_patience_needs_a_warmup():
    fields = {"model": "m", "prompts": "p", "reward_fn": "a:f"}
    with pytest.raises(ProxrlError, match=r"^critic_warmup_patience: needs a warm-up"):
        ppo.Config(**fields, critic_warmup_patience=2).validate()


def warmup_config(tiny_lm, prompts_path, out, **overrides):
    return small(
        ppo.Config,
        tiny_lm,
        prompts_path,
        out,
        reward_fn=("tests.algos.test_critic_warmup:constant",),
        critic="head",
        critic_lam=1.0,
        kl_coef=0.0,
        critic_learning_rate=1e-30,  # the head does not move: the value loss stalls at once
        iterations=4,
        critic_warmup_iterations=3,
        critic_warmup_patience=1,
        save_every=2,
        group_size=2,
        **overrides,
    )


def test_the_warmup_ends_when_the_value_loss_stalls_and_a_resume_keeps_it(
    tiny_lm, say_prompts, tmp_path
):
    """Warm-up planned for 3 of 4 iterations, patience 1: the value loss of iteration 2 is not
    below that of iteration 1, so the policy trains from iteration 3 on (rows 3 and 4 have a
    clip fraction); the explained variance is logged at every warm-up iteration. A run resumed
    from its checkpoint at iteration 2 trains the policy at iteration 3 as well (the warm-up's
    end is checkpointed; without it the resumed run would warm up once more)."""
    whole = tmp_path / "whole"
    ppo.train(warmup_config(tiny_lm, say_prompts, whole))
    rows = read_metrics(whole)
    assert [row["value/loss"] for row in rows[:2]] == [0.5, 0.5]
    assert ["policy/clipfrac" in row for row in rows] == [False, False, True, True]
    assert all("value/explained_var" in row for row in rows[:2])
    resumed = tmp_path / "resumed"
    shutil.copytree(whole, resumed)
    shutil.rmtree(
        resumed
        / "checkpoints"
        / next(p.name for p in (resumed / "checkpoints").iterdir() if p.name.endswith("4"))
    )
    ppo.train(warmup_config(tiny_lm, say_prompts, resumed, resume=True))
    assert ["policy/clipfrac" in row for row in read_metrics(resumed)] == [False, False, True, True]
