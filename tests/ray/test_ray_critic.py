"""``placement: ray`` with PPO's separate critic in an actor of its own: the same run as in one
process (the critic's values, its step on the same micro-batches, one global clip over policy and
critic, its warm-up), and its weights and optimizer state through a checkpoint and a resume."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from proxrl.algos.online import ppo
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.metrics import read_metrics
from tests.ray.test_placement import WORDS, assert_same_run, config

MAX_GRAD_NORM = 0.005
CRITIC = dict(
    critic_learning_rate=3e-3,
    vf_coef=0.5,
    critic_warmup_iterations=1,  # iteration 1: the critic alone (the policy's loss has no graph)
    max_grad_norm=MAX_GRAD_NORM,  # binds at every step: the clip coefficient is the global one
    save_every=1,
)


def prompts_with(path: Path, **columns: object) -> str:
    path.write_text(
        "".join(json.dumps({"prompt": f"say: {w} ->", **columns}) + "\n" for w in WORDS)
    )
    return str(path)


def assert_same_critic(out: Path, expected: Path) -> None:
    a = load_file(expected / "critic" / "model.safetensors")
    b = load_file(out / "critic" / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-10, atol=1e-12)
    files = sorted(p.name for p in (expected / "critic").iterdir())
    assert sorted(p.name for p in (out / "critic").iterdir()) == files
    assert (out / "critic" / "config.json").read_text() == (
        expected / "critic" / "config.json"
    ).read_text()


@pytest.fixture(scope="module")
def in_process(tiny_lm, tmp_path_factory) -> Path:
    """The reference run: policy and critic in this process; the critic moved, and every
    optimizer step's gradient norm exceeded max_grad_norm (so the clip bound the step)."""
    root = tmp_path_factory.mktemp("in_process_critic")
    out = root / "run"
    ppo.train(config(tiny_lm, prompts_with(root / "prompts.jsonl"), out, **CRITIC))
    rows = read_metrics(out)
    assert all(r["policy/grad_norm"] > 10 * MAX_GRAD_NORM for r in rows), rows
    # iteration 1 is the critic's warm-up: the policy's optimizer takes no step; then 4 a time
    steps = [r["policy/optimizer_steps"] for r in rows]
    assert steps == [0.0] + [4.0] * (len(rows) - 1), steps
    start = load_file(Path(tiny_lm) / "model.safetensors")["model.embed_tokens.weight"].double()
    final = load_file(out / "critic" / "model.safetensors")
    assert not torch.equal(final["model.embed_tokens.weight"], start), "the critic did not train"
    return out


def test_the_critic_actor_trains_as_the_critic_in_one_process_and_a_killed_one_resumes(
    local_ray, tiny_lm, in_process, tmp_path
):
    """The critic in its own process (not the trainer's, the reward's nor the driver's), killed
    in the third iteration: one-line error naming it, the checkpoint of iteration 2 whole (the
    critic's weights and AdamW state fetched into it); --resume puts them back in a fresh critic
    actor, and the run gives the one in one process to round-off: every loss (value loss and
    total loss included), score and gradient norm (iterations 1 and 2 from the first critic
    actor, the warm-up and a step after it; 3 from the fresh one), the final policy and the
    final critic. (One run for both: each Ray run starts five actors.)"""
    pids = tmp_path / "pids.json"
    prompts = prompts_with(tmp_path / "prompts.jsonl", pids=str(pids))
    reward = ("tests.ray.ray_rewards:record_pids_then_kill_critic_at_third_call",)
    out = tmp_path / "run"
    cfg = config(tiny_lm, prompts, out, placement="ray", reward_fn=reward, **CRITIC)
    with pytest.raises(ProxrlError, match="the critic actor died.*--resume continues"):
        ppo.train(cfg)
    found = json.loads(pids.read_text())
    assert len({found["trainer"], found["critic"], found["reward"], os.getpid()}) == 4, found
    assert not (out / "model.safetensors").exists()
    ppo.train(replace(cfg, resume=True))
    assert_same_run(out, in_process)
    assert_same_critic(out, in_process)
