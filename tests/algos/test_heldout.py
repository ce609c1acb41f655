"""Held-out evaluation during online training, early stop and the best policy in best/: what
is logged, what is saved, when a run stops, and that resuming decides as the whole run did."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from proxrl.algos.online import grpo, heldout, ppo
from proxrl.algos.online.heldout import (
    EarlyStopState,
    evaluations_without_improvement,
    stop_reason,
)
from proxrl.algos.online.roles import load_models, role_settings
from proxrl.algos.online.run_settings import run_settings
from proxrl.runtime.metrics import read_metrics
from tests.algos.killed_runs import comparable, sigkill_after_first_checkpoint
from tests.algos.test_online import prompts, small  # noqa: F401  (the module's prompt fixture)


def test_evaluations_without_improvement_by_hand():
    assert evaluations_without_improvement([]) == 0
    # best 0.5 at index 1; 0.5 again does not beat it; 0.4 neither: 2 since the best
    assert evaluations_without_improvement([0.1, 0.5, 0.5, 0.4]) == 2
    assert evaluations_without_improvement([0.1, 0.5, 0.6]) == 0
    # with a threshold 0.2, 0.6 does not count as beating 0.5
    assert evaluations_without_improvement([0.1, 0.5, 0.6], threshold=0.2) == 1


def test_stop_reason_patience_and_hacking():
    flat = EarlyStopState(steps=[5, 10, 15], scores=[0.5, 0.4, 0.5], rewards=[1.0, 2.0, 3.0])
    flat.best_score = 0.5
    assert stop_reason(flat, patience=3, on_hacking=False) == ""
    assert stop_reason(flat, patience=2, on_hacking=False).startswith("2 evaluations without")
    # the series of tests/runtime/test_health.py: held-out best 0.5 at 25, then 0.1 lower per
    # evaluation while the reward climbs; the reward_hacking rule (window 2) fires from 35
    steps = list(range(5, 101, 5))
    gold = [0.3 + 0.05 * i if i < 5 else 0.5 - 0.1 * (i - 4) for i in range(len(steps))]
    state = EarlyStopState(steps=steps, scores=gold, rewards=[float(i) for i in range(20)])
    assert stop_reason(state, patience=None, on_hacking=True).startswith(
        "reward hacking since iteration 35"
    )
    assert stop_reason(state, patience=None, on_hacking=False) == ""

    # During the run the rule sees the evaluations so far, its noise measured on them: up to
    # 40 the differences are +0.05 four times and −0.1 three times, MAD 0, so the floor (1% of
    # 0.5) sets a bar of 0.02 and 30 (0.025 under the best mean) already counts; 30, 35 are two
    # points (no stop), 30, 35, 40 three: stop at 40, hacking since 30.
    def prefix(n):
        return EarlyStopState(steps=steps[:n], scores=gold[:n], rewards=state.rewards[:n])

    assert stop_reason(prefix(7), patience=None, on_hacking=True) == ""
    assert stop_reason(prefix(8), patience=None, on_hacking=True).startswith(
        "reward hacking since iteration 30"
    )


def heldout_run(tiny_lm, prompts, out, config=ppo.Config, **overrides):  # noqa: F811
    fields = dict(
        iterations=4,
        group_size=2,
        eval_data=prompts,
        eval_every=1,
        eval_reward_fn="tests.algos.heldout_rewards:length",
    )
    return config.__module__, small(config, tiny_lm, prompts, out, **(fields | overrides))


def train(config):
    (ppo if config.__class__ is ppo.Config else grpo).train(config)


def test_eval_metrics_best_dir_and_final_model(tiny_lm, prompts, tmp_path):  # noqa: F811
    _, cfg = heldout_run(tiny_lm, prompts, tmp_path / "run", final_model="best")
    train(cfg)
    rows = read_metrics(tmp_path / "run")
    scores = [r["eval/score"] for r in rows]
    assert len(scores) == 4 and all(math.isfinite(r["eval/reward"]) for r in rows)
    assert all(r["eval/length_mean"] >= 1 for r in rows)
    best_step = 1 + max(range(4), key=lambda i: (scores[i], -i))  # the first of the highest
    info = json.loads((tmp_path / "run" / "best" / "best.json").read_text())
    assert info == {"iteration": best_step, "eval/score": scores[best_step - 1]}
    best = load_file(tmp_path / "run" / "best" / "model.safetensors")
    final = load_file(tmp_path / "run" / "model.safetensors")
    assert all(torch.equal(best[k], final[k]) for k in best)  # final_model best


def test_evaluation_samples_as_shared_prefix_says(tiny_lm, prompts, tmp_path, monkeypatch):  # noqa: F811
    """The held-out answers come from the cached sampler with the run's shared_prefix: a
    duplicated held-out prompt is prefilled once, or (false) on every row."""
    seen = []

    def record(cfg, sampler, *args, **kwargs):
        seen.append(sampler.shared_prefill)
        raise StopIteration  # the sampler is all this test reads

    monkeypatch.setattr(heldout, "sample_responses", record)
    for flag in (False, True):
        _, cfg = heldout_run(tiny_lm, prompts, tmp_path / str(flag), shared_prefix=flag)
        algo = ppo.build(cfg)
        models = load_models(role_settings(cfg).models, algo)
        settings = run_settings(cfg, algo, models.critic).held_out
        held_out = heldout.HeldOut.create(settings, models.tokenizer, None, tmp_path)
        with pytest.raises(StopIteration):
            held_out.evaluate(models, 1)
    assert seen == [False, True]


def test_sampled_evaluation_leaves_training_unchanged(tiny_lm, prompts, tmp_path):  # noqa: F811
    """Its own random stream: the training rows of a run with held-out sampling equal those of
    the same run without an evaluation."""
    _, with_eval = heldout_run(tiny_lm, prompts, tmp_path / "eval", eval_greedy=False)
    _, without = heldout_run(
        tiny_lm, prompts, tmp_path / "plain", eval_data=None, eval_reward_fn=None
    )
    train(with_eval)
    train(without)

    def training(rows):
        return [
            {k: v for k, v in r.items() if not k.startswith(("eval/", "time/", "perf/"))}
            for r in rows
        ]

    assert training(read_metrics(tmp_path / "eval")) == training(read_metrics(tmp_path / "plain"))


def test_patience_stops_the_run_and_a_resume_keeps_it_stopped(tiny_lm, prompts, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    _, cfg = heldout_run(
        tiny_lm,
        prompts,
        out,
        config=grpo.Config,
        iterations=8,
        eval_reward_fn="tests.algos.heldout_rewards:constant",
        early_stopping_patience=2,
        final_model="best",
    )
    train(cfg)
    # evaluations at 1 (the best), 2 and 3 (no better): stopped after iteration 3
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]
    assert json.loads((out / "best" / "best.json").read_text())["iteration"] == 1
    (checkpoint,) = (out / "checkpoints").iterdir()
    assert checkpoint.name == "step_000000003"
    # final_model best: the output directory holds iteration 1's policy, the checkpoint the last
    final, best = (
        load_file(out / "model.safetensors"),
        load_file(out / "best" / "model.safetensors"),
    )
    last = load_file(checkpoint / "actor.safetensors")
    assert all(torch.equal(final[k], best[k]) for k in best)
    assert not all(torch.equal(final[k], last[k]) for k in last)
    before = (out / "metrics.jsonl").read_text()
    train(type(cfg)(**{**cfg.__dict__, "resume": True, "overwrite": False}))
    assert (out / "metrics.jsonl").read_text() == before  # nothing more to run


def test_resume_equals_the_whole_run_with_held_out_state(tiny_lm, prompts, tmp_path):  # noqa: F811
    """The early-stop history is in the checkpoint: a run resumed from iteration 2 logs the same
    rows, keeps the same best/ and ends with the same weights as the whole run."""
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    common = dict(
        save_every=2, eval_greedy=False, stop_on_reward_hacking=True, early_stopping_patience=3
    )
    _, cfg = heldout_run(tiny_lm, prompts, whole, **common)
    train(cfg)
    # the best is at 1 or 2: a resume that lost the state would write best/ again at 3
    assert json.loads((whole / "best" / "best.json").read_text())["iteration"] <= 2
    shutil.copytree(whole, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_000000004")
    _, cfg = heldout_run(tiny_lm, prompts, resumed, resume=True, overwrite=False, **common)
    train(cfg)

    assert comparable(read_metrics(resumed)) == comparable(read_metrics(whole))
    for name in ("model.safetensors", "best/model.safetensors"):
        a, b = load_file(whole / name), load_file(resumed / name)
        assert all(torch.equal(a[k], b[k]) for k in a), name
    assert (resumed / "best" / "best.json").read_text() == (
        whole / "best" / "best.json"
    ).read_text()


def test_sigkill_and_resume_keeps_the_held_out_state(tiny_lm, prompts, tmp_path):  # noqa: F811
    """Killed with SIGKILL after its first checkpoint and resumed: the same rows (eval/ ones
    too), the same best/ and bit-identical weights as the run left alone."""

    import yaml

    from proxrl.cli import main

    def config(out: Path) -> Path:
        fields = {
            "model": tiny_lm,
            "prompts": prompts,
            "reward_fn": ["tests.algos.online_rewards:target_fraction"],
            "output_dir": str(out),
            "iterations": 6,
            "rollout_batch_size": 8,
            "group_size": 2,
            "max_new_tokens": 8,
            "mini_batch_size": 8,
            "learning_rate": 3e-3,
            "progress": False,
            "seed": 5,
            "save_every": 1,
            "keep_checkpoints": 2,
            "eval_data": prompts,
            "eval_every": 1,
            "eval_greedy": False,
            "eval_reward_fn": "tests.algos.heldout_rewards:length",
            "stop_on_reward_hacking": True,
            "early_stopping_patience": 4,
        }
        path = out.with_suffix(".yaml")
        path.write_text(yaml.safe_dump(fields))
        return path

    whole, killed = tmp_path / "whole", tmp_path / "killed"
    argv = ["ppo", "--config", str(config(killed))]
    sigkill_after_first_checkpoint(argv, killed, tmp_path / "killed.log")
    # The run left alone and the resume run in this process: the killed run's state reaches
    # the resume through its checkpoint alone.
    assert main(["ppo", "--config", str(config(whole))]) == 0
    assert main(["ppo", "--config", str(config(killed)), "--resume", "True"]) == 0

    assert comparable(read_metrics(killed)) == comparable(read_metrics(whole))
    for name in ("model.safetensors", "best/model.safetensors"):
        a, b = load_file(whole / name), load_file(killed / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    assert (killed / "best" / "best.json").read_text() == (whole / "best" / "best.json").read_text()
