"""FSDP2 (``fully_shard``) on the online path, 2 CPU processes over gloo.

1. The PPO update (actor and a separate critic sharded; same saved rollout, 2 epochs × 2
   minibatches × 4 micro-batches) under ``torchrun`` with the FSDP request in the environment
   gives the 1-process weights and stats: float64, max |Δ| ≤ 1e-9 while the actor moves ~1e-2.
2. Sampling from sharded weights (``gathered_for_generation``) gives the tokens the unsharded
   weights give with the same seed, with both built-in samplers, while the ranks decode
   different numbers of steps, and issue no collective while sampling (transformers' generate
   would all-reduce every step on an FSDP module); outside generation each rank holds about
   half the weights.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file

from tests.distributed.launch import FSDP_CONFIG, FSDP_ENV, accelerate_launch, check
from tests.distributed.test_dp_online import (  # noqa: F401 (prompts: a fixture)
    WEIGHT_TOL,
    _one_process,
    prompts,
    two_process_updates,
)

GENERATION_SCRIPT = Path(__file__).with_name("sharded_generation_script.py")


STEP_WIDE = ("policy_loss=clip_cov", "clip_cov_lb=-1.0", "clip_cov_ratio=0.2")
STEP_WIDE += ("off_policy_mask=m2po", "m2po_tau=0.001")


def test_ppo_and_step_wide_updates_sharded_match_one_process(tiny_lm, prompts, tmp_path):  # noqa: F811
    """The PPO update, and GRPO with M2PO's mask and Clip-Cov's draw (both chosen over each
    optimizer step's rows: the forward without gradient over the step runs on the sharded
    actor, each rank its micro-batches), under FSDP give one process's weights and stats; both
    choices acted. (Both 2-process updates in one launch.)"""
    ppo_dir, grpo_dir = tmp_path / "ppo", tmp_path / "grpo"
    jobs = [
        ["ppo", tiny_lm, prompts, str(ppo_dir)],
        ["grpo", tiny_lm, prompts, str(grpo_dir), *STEP_WIDE],
    ]
    for job in jobs:
        Path(job[3]).mkdir()
        _one_process("make", *job)
        _one_process("update", *job)
    two_process_updates(jobs, env=FSDP_ENV)
    held = json.loads((ppo_dir / "world2_fsdp_held.json").read_text())
    assert 0.4 < held["actor"] < 0.6 and 0.4 < held["critic"] < 0.6, held  # both sharded
    one = load_file(str(ppo_dir / "world1.safetensors"))
    two = load_file(str(ppo_dir / "world2_fsdp.safetensors"))
    assert one.keys() == two.keys()
    assert any(k.startswith("critic.") for k in one)
    diff = max(float((one[k] - two[k]).abs().max()) for k in one)
    stats1 = json.loads((ppo_dir / "world1.json").read_text())
    stats2 = json.loads((ppo_dir / "world2_fsdp.json").read_text())
    assert stats1.keys() == stats2.keys()
    stat_diff = max(abs(stats1[k] - stats2[k]) for k in stats1)
    base = load_file(str(Path(tiny_lm) / "model.safetensors"))
    moved = max(float((one[f"actor.{k}"] - base[k].double()).abs().max()) for k in base)
    print(f"ppo update FSDP 2 procs vs 1: max |Δw| {diff:.2e}, max |Δstat| {stat_diff:.2e}")
    assert stats1["steps"] == 4.0
    assert moved > 1e-3
    assert diff <= WEIGHT_TOL
    assert stat_diff <= WEIGHT_TOL

    tag = "".join(f"_{item}" for item in STEP_WIDE)
    one = load_file(str(grpo_dir / f"world1{tag}.safetensors"))
    two = load_file(str(grpo_dir / f"world2{tag}_fsdp.safetensors"))
    stats1 = json.loads((grpo_dir / f"world1{tag}.json").read_text())
    stats2 = json.loads((grpo_dir / f"world2{tag}_fsdp.json").read_text())
    diff = max(float((one[k] - two[k]).abs().max()) for k in one)
    print(f"grpo m2po + clip_cov FSDP 2 procs vs 1: max |Δw| {diff:.2e}")
    assert stats1["steps"] == 4.0
    assert stats1["off_policy_masked"] > 0.01 and stats1["cov_dropped"] > 0.01, stats1
    assert diff <= WEIGHT_TOL
    assert max(abs(stats1[k] - stats2[k]) for k in stats1) <= WEIGHT_TOL


def test_generation_from_sharded_weights_gives_the_unsharded_tokens(tiny_lm, tmp_path):
    out = tmp_path / "generation.json"
    result = accelerate_launch(
        [str(GENERATION_SCRIPT), tiny_lm, str(out)], config=FSDP_CONFIG, timeout=120
    )
    check(result)
    ranks = json.loads(out.read_text())
    print(f"generation from sharded weights: {ranks}")
    assert len(ranks) == 2
    for report in ranks:
        assert 0.4 < report["held_share"] < 0.6  # sharded outside generation
        for sampler in ("cached", "hf"):
            assert report[sampler]["same_tokens"]
            assert report[sampler]["logprob_diff"] <= 1e-10
            assert report[sampler]["collectives_while_sampling"] == []
    assert [r["cached"]["length"] for r in ranks] == [6, 11]  # unequal numbers of steps


def test_ppo_run_sharded_saves_whole_weights_that_resume_on_one_process(
    tiny_lm,
    prompts,  # noqa: F811
    tmp_path,
):
    """``accelerate launch`` with the FSDP config runs PPO end to end (rollouts from gathered
    weights, sharded updates, checkpoints, the final save): the final actor and critic hold
    the full tensors, equal to the last checkpoint's, and the checkpoint resumes on 1 process."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from proxrl.algos.online import ppo
    from proxrl.runtime.checkpoint import CheckpointManager
    from proxrl.runtime.config import parse_config

    fields = {
        "model": tiny_lm,
        "prompts": prompts,
        "reward_fn": ["tests.algos.online_rewards:target_fraction"],
        "iterations": 2,
        "rollout_batch_size": 4,
        "group_size": 2,
        "max_new_tokens": 6,
        "mini_batch_size": 8,
        "grad_accum": 2,
        "ppo_epochs": 1,
        "learning_rate": 3e-3,
        "dtype": "float64",
        "progress": False,
        "seed": 3,
        "save_every": 1,
    }
    cfg = tmp_path / "ppo.yaml"
    cfg.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in fields.items()))
    out = tmp_path / "run"
    args = ["-m", "proxrl", "ppo", "--config", str(cfg), "--output-dir", str(out)]
    check(accelerate_launch(args, config=FSDP_CONFIG, timeout=240))
    manager = CheckpointManager(out)
    tensors, _ = manager.load(manager.latest())
    actor = AutoModelForCausalLM.from_pretrained(out, dtype="float64").state_dict()
    critic = AutoModelForSequenceClassification.from_pretrained(out / "critic", dtype="float64")
    assert tensors["actor"].keys() <= actor.keys()
    assert max(float((actor[k] - v).abs().max()) for k, v in tensors["actor"].items()) == 0.0
    critic_state = critic.state_dict()
    assert max(float((critic_state[k] - v).abs().max()) for k, v in tensors["critic"].items()) == 0
    base = load_file(str(Path(tiny_lm) / "model.safetensors"))
    assert max(float((actor[k] - base[k].double()).abs().max()) for k in base) > 1e-4  # trained
    resumed = fields | {"iterations": 3}
    cfg.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in resumed.items()))
    argv = ["--config", str(cfg), "--output-dir", str(out), "--resume", "--resume-with-changes"]
    ppo.train(parse_config(ppo.Config, argv, prog="proxrl"))
    assert CheckpointManager.step_of(manager.latest()) == 3
