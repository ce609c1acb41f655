"""Every online estimator / loss on the demo's task, three seeds each: does it learn?

    .venv/bin/python benchmarks/algorithms.py                       # every row, seeds 1 2 3
    .venv/bin/python benchmarks/algorithms.py --rows grpo dapo --seeds 1

For each seed the demo (``proxrl demo``: data, tiny Llama, SFT, reward model, its PPO and GRPO
runs) is built once with the demo's defaults; then every row of ``ROWS`` trains from the demo's
SFT policy with the demo's RL budget (``rl_iterations`` iterations of ``rollout_batch_size``
prompts, its learning rate and epochs) and is evaluated like the demo's policies (gold: exact
accuracy on the held-out prompts, ``eval_samples`` samples each). The critic-free rows optimise
the exact reward, as the demo's ``grpo`` stage does; the ``ppo`` rows are the demo's PPO
(reward model, β = 3, gold logged at weight 0) with the critic started three ways.

Printed: final gold per seed, its mean, the gain over SFT (the smallest over the seeds), the
mean wall time of the RL run, and for the group rows the groups sampled per informative group
trained on ("wasted per useful": a group whose scores are all equal has zero advantage; plain
GRPO trains on it, dynamic sampling drops it after sampling it). Results also go to
``OUT/results.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from proxrl.algos.online import grpo, ppo
from proxrl.data.formats import load_prompt_examples
from proxrl.demo import pipeline
from proxrl.demo.evaluate import evaluate_policy
from proxrl.models.causal_lm import load_causal_lm
from proxrl.models.scalar_head import load_score_model
from proxrl.models.tokenizer import load_tokenizer
from proxrl.rollout.rewards import RewardModelReward
from proxrl.runtime.metrics import read_metrics


@dataclass(frozen=True)
class Row:
    name: str
    command: str  # "grpo" (critic-free, exact reward) or "ppo" (the demo's PPO)
    overrides: dict[str, Any] = field(default_factory=dict)


# The table of configurations: add a row per estimator / loss option.
ROWS = [
    Row("grpo", "grpo"),  # the demo's grpo stage (token-mean, group std)
    Row("dr_grpo_adv", "grpo", {"scale_rewards": "none"}),  # Dr. GRPO advantages
    Row("dr_grpo", "grpo", {"scale_rewards": "none", "loss_aggregation": "dr_grpo"}),
    Row("grpo_seq_mean", "grpo", {"loss_aggregation": "seq-mean-token-mean"}),  # GRPO paper
    Row("grpo_seq_sum", "grpo", {"loss_aggregation": "seq-mean-token-sum"}),
    Row("clip_high", "grpo", {"clip_high": 0.28}),  # DAPO clip-higher
    Row("dynamic_sampling", "grpo", {"dynamic_sampling": True}),
    Row(
        "dapo",  # clip-higher + token-mean + dynamic sampling + overlong shaping
        "grpo",
        {"clip_high": 0.28, "dynamic_sampling": True, "overlong_buffer": 2},
    ),
    Row("mask_truncated", "grpo", {"mask_truncated": True}),
    Row("rloo", "grpo", {"estimator": "rloo"}),
    Row("remax", "grpo", {"estimator": "remax"}),
    Row("reinforce_pp", "grpo", {"estimator": "reinforce_pp"}),
    Row("reinforce_pp_baseline", "grpo", {"estimator": "reinforce_pp_baseline"}),
    Row("scale_batch", "grpo", {"scale_rewards": "batch"}),  # Lite PPO's batch std
    Row("gspo", "grpo", {"policy_loss": "gspo"}),
    Row("gspo_token", "grpo", {"policy_loss": "gspo_token"}),
    Row("cispo", "grpo", {"policy_loss": "cispo"}),
    Row("kl_k1", "grpo", {"kl_coef": 0.05, "kl_loss_type": "k1"}),
    Row("kl_k2", "grpo", {"kl_coef": 0.05, "kl_loss_type": "k2"}),
    Row("kl_k3", "grpo", {"kl_coef": 0.05, "kl_loss_type": "k3"}),
    Row("kl_k3_plus", "grpo", {"kl_coef": 0.05, "kl_loss_type": "k3+"}),
    # issue 37: the 2026 set
    Row("maxrl", "grpo", {"estimator": "maxrl"}),
    Row("asymre", "grpo", {"estimator": "asymre"}),  # baseline_shift −0.1
    Row("dppo_tv", "grpo", {"policy_loss": "dppo_tv"}),
    Row("dppo_kl", "grpo", {"policy_loss": "dppo_kl"}),
    Row("opsm", "grpo", {"off_policy_mask": "opsm"}),
    Row("m2po", "grpo", {"off_policy_mask": "m2po"}),
    Row("clip_cov", "grpo", {"policy_loss": "clip_cov"}),
    Row("kl_cov", "grpo", {"policy_loss": "kl_cov"}),
    Row("gdpo", "grpo", {"estimator": "gdpo"}),  # sources: the reward model (weight 0), gold
    # stale data: 8 epochs over each rollout (the demo: 2), plain clip against the masks
    Row("stale_clip", "grpo", {"ppo_epochs": 8}),
    Row("stale_dppo_tv", "grpo", {"ppo_epochs": 8, "policy_loss": "dppo_tv"}),
    Row("stale_opsm", "grpo", {"ppo_epochs": 8, "off_policy_mask": "opsm"}),
    Row("stale_m2po", "grpo", {"ppo_epochs": 8, "off_policy_mask": "m2po"}),
    # M2PO as its paper states it: the second-moment mask instead of the ratio clip
    Row(
        "stale_m2po_unclipped",
        "grpo",
        {"ppo_epochs": 8, "policy_loss": "unclipped", "off_policy_mask": "m2po"},
    ),
    Row("ppo_critic_rm", "ppo"),  # the demo's PPO: critic from the reward model
    Row("ppo_critic_policy", "ppo", {"critic_model": "policy"}),
    Row("ppo_critic_warm", "ppo", {"critic_model": "{demo}/ppo"}),  # the demo PPO's critic/
]
GAIN = 0.3  # the gold over SFT each row should reach on every seed


def build_demo(out: Path, seed: int) -> dict[str, Any]:
    summary_file = out / "summary.json"
    if summary_file.exists():
        return dict(json.loads(summary_file.read_text()))
    return pipeline.train(pipeline.Config(output_dir=str(out), seed=seed, progress=False))


def rl_config(row: Row, demo: pipeline.Config, out: Path) -> grpo.Config | ppo.Config:
    fields = pipeline.online_fields(demo, out, f"bench_{row.name}")
    rm_dir = str(out / "rm")
    overrides = {
        k: v.format(demo=out) if isinstance(v, str) else v for k, v in row.overrides.items()
    }
    fields = {k: v for k, v in fields.items() if k not in overrides}  # a row's ppo_epochs wins
    if row.command == "ppo":
        return ppo.Config(
            **fields,
            reward_model=rm_dir,
            reward_fn=(pipeline.GOLD_FN,),
            reward_weights=(1.0, 0.0),
            group_size=demo.group_size,
            mini_batch_size=demo.rollout_batch_size * demo.group_size,
            critic_learning_rate=demo.critic_learning_rate,
            **({"kl_coef": demo.kl_coef} | overrides),
        )
    return grpo.Config(
        **fields,
        reward_model=rm_dir,
        reward_fn=(pipeline.GOLD_FN,),
        reward_weights=(0.0, 1.0),
        group_size=demo.grpo_group_size,
        mini_batch_size=demo.rollout_batch_size * demo.grpo_group_size,
        **({"kl_coef": demo.grpo_kl_coef} | overrides),
    )


def gold_of(policy_dir: Path, demo: pipeline.Config, out: Path) -> float:
    tokenizer = load_tokenizer(str(out / "sft"))
    sft_model = load_causal_lm(str(out / "sft")).eval()
    rm = RewardModelReward(
        load_score_model(str(out / "rm")).eval(), load_tokenizer(str(out / "rm"))
    )
    prompts = load_prompt_examples(str(out / "data" / "eval_prompts.jsonl"))
    policy = load_causal_lm(str(policy_dir)).eval()
    scores = evaluate_policy(
        policy,
        sft_model,
        rm,
        tokenizer,
        prompts,
        demo.eval_samples,
        demo.max_new_tokens,
        demo.temperature,
        seed=demo.seed,
    )
    return float(scores.gold)


def waste(run_dir: Path, batch: int) -> dict[str, float] | None:
    """Groups sampled, informative groups trained on, over the run (group rows only)."""
    rows = [r for r in read_metrics(run_dir) if "sampling/constant_groups" in r]
    if not rows:
        return None
    sampled = sum(r.get("sampling/rounds", 1.0) * batch for r in rows)
    useful = sum(batch - r["sampling/constant_groups"] for r in rows)
    return {
        "sampled_groups": sampled,
        "useful_groups": useful,
        "wasted_per_useful": (sampled - useful) / max(useful, 1.0),
        "mean_rounds": sum(r.get("sampling/rounds", 1.0) for r in rows) / len(rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/bench-algorithms")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--rows", nargs="+", default=[r.name for r in ROWS])
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    root = Path(args.out)
    results_file = root / "results.json"
    results: dict[str, Any] = json.loads(results_file.read_text()) if results_file.exists() else {}
    rows = [r for r in ROWS if r.name in args.rows]
    for seed in args.seeds:
        out = root / f"seed{seed}"
        summary = build_demo(out, seed)
        demo = pipeline.Config(output_dir=str(out), seed=seed, progress=False)
        results.setdefault(f"sft/{seed}", summary["policies"]["sft"]["gold"])
        for row in rows:
            key = f"{row.name}/{seed}"
            if key in results:
                continue
            cfg = rl_config(row, demo, out)
            started = time.perf_counter()
            (ppo if row.command == "ppo" else grpo).train(cfg)
            wall = time.perf_counter() - started
            results[key] = {
                "gold": gold_of(Path(cfg.output_dir), demo, out),
                "wall_s": wall,
                "waste": waste(Path(cfg.output_dir), demo.rollout_batch_size),
            }
            print(f"{key}: gold {results[key]['gold']:.3f}, {wall:.0f} s", flush=True)
            results_file.write_text(json.dumps(results, indent=1))
    print_table(results, rows, args.seeds)
    print_stale(root, [r for r in rows if r.name.startswith("stale_")], args.seeds)


def print_stale(root: Path, rows: list[Row], seeds: list[int]) -> None:
    """The stale-data rows per seed, from each run's metrics: the largest ratio π/π_old of an
    iteration (its steps' mean of ``policy/ratio_max``: the first and last iteration, the
    largest over the run) and the share of tokens without gradient (ratio-clipped or DPPO-masked:
    ``policy/clipfrac``; an off-policy mask's: ``policy/off_policy_masked``), mean over the run
    and at the first and last iteration."""
    if not rows:
        return
    print("\n| row | seed | ratio_max first / last / max | clipped share mean (first, last) "
          "| masked share mean (first, last) |")  # fmt: skip
    print("|---|---|---|---|---|")
    for row in rows:
        for seed in seeds:
            run = root / f"seed{seed}" / f"bench_{row.name}"
            if not (run / "metrics.jsonl").exists():
                continue
            metrics = [m for m in read_metrics(run) if "policy/ratio_max" in m]
            ratio = [m["policy/ratio_max"] for m in metrics]
            cells = []
            for key in ("policy/clipfrac", "policy/off_policy_masked"):
                share = [m.get(key, 0.0) for m in metrics]
                cells.append(f"{statistics.mean(share):.4f} ({share[0]:.4f}, {share[-1]:.4f})")
            print(
                f"| {row.name} | {seed} | {ratio[0]:.3f} / {ratio[-1]:.3f} / {max(ratio):.3f} "
                f"| {cells[0]} | {cells[1]} |"
            )


def print_table(results: dict[str, Any], rows: list[Row], seeds: list[int]) -> None:
    """Markdown table. Waste columns (group rows): groups generated per informative group trained
    on, and groups trained on without signal (all scores equal) per informative group."""
    sft = [results[f"sft/{s}"] for s in seeds]
    head = " | ".join(f"seed {s}" for s in seeds)
    print(
        f"\n| row | options | {head} | mean | min Δ vs SFT | ≥ {GAIN} on every seed | wall s "
        "| generated / useful groups | flat trained / useful groups |"
    )
    print("|---|---|" + "---|" * len(seeds) + "---|---|---|---|---|---|")
    print(
        f"| sft | | {' | '.join(f'{g:.3f}' for g in sft)} | {statistics.mean(sft):.3f} | | | | | |"
    )
    for row in rows:
        runs = [results.get(f"{row.name}/{s}") for s in seeds]
        if any(r is None for r in runs):
            continue
        gold = [r["gold"] for r in runs]
        gain = min(g - s for g, s in zip(gold, sft, strict=True))
        waste = [r["waste"] for r in runs if r["waste"]]
        generated = [w["sampled_groups"] / w["useful_groups"] for w in waste]
        flat = [(w["sampled_groups"] / w["mean_rounds"] - w["useful_groups"]) / w["useful_groups"]
                for w in waste]  # fmt: skip
        options = ", ".join(f"{k}={v}" for k, v in row.overrides.items()) or "(defaults)"
        print(
            f"| {row.name} | {row.command}: {options} | {' | '.join(f'{g:.3f}' for g in gold)} "
            f"| {statistics.mean(gold):.3f} | {gain:+.3f} | {'yes' if gain >= GAIN else 'NO'} "
            f"| {statistics.mean(r['wall_s'] for r in runs):.0f} "
            f"| {f'{statistics.mean(generated):.2f}' if generated else ''} "
            f"| {f'{statistics.mean(flat):.2f}' if flat else ''} |"
        )


if __name__ == "__main__":
    main()
