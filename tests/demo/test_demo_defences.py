"""End to end on the demo's task (issue 22): the demo's ``ppo_no_kl`` run, evaluated on the
held-out prompts with the exact (gold) reward, stops once gold falls while the reward model's
score rises, and ``best/`` holds the policy of its highest held-out gold."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from proxrl.algos.offline import reward, sft
from proxrl.algos.online import ppo
from proxrl.algos.online.heldout import HeldOut
from proxrl.algos.online.roles import load_rewards, role_settings
from proxrl.algos.online.run_settings import run_settings
from proxrl.demo import pipeline, task
from proxrl.models.causal_lm import load_causal_lm
from proxrl.models.tiny import build_tiny_lm
from proxrl.models.tokenizer import load_tokenizer
from proxrl.runtime.health import diagnose
from proxrl.runtime.metrics import read_metrics


@pytest.fixture(scope="module")
def demo_sft_and_rm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's data, SFT policy and reward model at the demo's defaults (seed 1), with 100
    held-out prompts."""
    torch.set_num_threads(1)
    cfg = pipeline.Config(eval_prompts=100)
    out = tmp_path_factory.mktemp("demo")
    data = task.generate(out / "data", cfg.task_sizes, cfg.seed)
    build_tiny_lm(
        out / "base",
        task.tokenizer_corpus(),
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        vocab_size=300,
        max_positions=64,
        seed=cfg.seed,
    )
    offline = dict(
        model=str(out / "base"),
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        progress=False,
        lr_schedule="linear",
        warmup_steps=10,
        max_length=32,
    )
    sft.train(
        sft.Config(
            **offline,
            output_dir=str(out / "sft"),
            data=str(data["sft"]),
            epochs=cfg.sft_epochs,
            learning_rate=cfg.sft_learning_rate,
        )
    )
    reward.train(
        reward.Config(
            **offline,
            output_dir=str(out / "rm"),
            data=str(data["preferences"]),
            eval_data=str(data["preferences_eval"]),
            epochs=cfg.rm_epochs,
            learning_rate=cfg.rm_learning_rate,
        )
    )
    return out


def test_ppo_no_kl_stops_when_gold_falls_and_keeps_its_best(demo_sft_and_rm: Path) -> None:
    out = demo_sft_and_rm
    demo = pipeline.Config(progress=False)
    cfg = ppo.Config(
        # at PPO's learning rate, where this test was calibrated: at the demo's ppo_no_kl rate
        # (1.5e-3) on these data (100 held-out prompts) the greedy held-out gold stays at its
        # best, 0.53, from iteration 20 on and the rule rightly does not fire (issue 51)
        **pipeline.online_fields(demo, out, "ppo_no_kl"),
        reward_model=str(out / "rm"),
        reward_fn=(pipeline.GOLD_FN,),
        reward_weights=(1.0, 0.0),
        group_size=demo.group_size,
        mini_batch_size=demo.rollout_batch_size * demo.group_size,
        critic_learning_rate=demo.critic_learning_rate,
        kl_coef=0.0,  # the demo's ppo_no_kl, at PPO's learning rate
        eval_data=str(out / "data" / "eval_prompts.jsonl"),
        eval_every=5,
        eval_reward_fn=pipeline.GOLD_FN,
        stop_on_reward_hacking=True,
    )
    ppo.train(cfg)
    rows = read_metrics(out / "ppo_no_kl")
    evals = [r for r in rows if "eval/score" in r]
    stopped = rows[-1]["step"]
    assert stopped < cfg.iterations, "the run was not stopped"
    best = max(evals, key=lambda r: r["eval/score"])
    # stopped with gold below its best and the reward model's score above its value there
    assert evals[-1]["eval/score"] < best["eval/score"] - 0.1
    assert evals[-1]["objective/scores"] > best["objective/scores"] + 1.0
    # the report's Health section reads the same: reward hacking, on the held-out evaluations
    hacking = [f for f in diagnose(rows) if f.rule == "reward_hacking"]
    assert [f.metric for f in hacking] == ["objective/scores vs eval/score"]
    info = json.loads((out / "ppo_no_kl" / "best" / "best.json").read_text())
    assert info == {"iteration": best["step"], "eval/score": best["eval/score"]}
    # best/ is that policy: evaluated again, it scores the logged best gold exactly
    policy = load_causal_lm(str(out / "ppo_no_kl" / "best")).eval()
    tokenizer = load_tokenizer(str(out / "ppo_no_kl" / "best"))
    # the run's held-out settings, as it opened with them (they read nothing of the critic)
    no_hidden = SimpleNamespace(needs_hidden=False)
    settings = run_settings(cfg, ppo.build(cfg), no_hidden).held_out  # type: ignore[arg-type]
    assert settings is not None
    held_out = HeldOut(
        settings, tokenizer, load_rewards(role_settings(cfg).rewards), out / "ppo_no_kl"
    )
    again = held_out.evaluate(SimpleNamespace(actor=policy, tokenizer=tokenizer), best["step"])
    assert again["eval/score"] == best["eval/score"]
