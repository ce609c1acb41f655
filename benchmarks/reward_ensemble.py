"""A reward-model ensemble on the demo's task, three seeds: what it does to the gold-vs-proxy
gap of PPO with and without the KL penalty.

    .venv/bin/python benchmarks/reward_ensemble.py                   # seeds 1 2 3
    .venv/bin/python benchmarks/reward_ensemble.py --seeds 1 --out runs/ens --reuse

For each seed the demo runs with its defaults (``proxrl demo --seed S``; ``--reuse`` reads one
already in OUT/seed_S, e.g. from benchmarks/health_diagnosis.py): its ``ppo`` (β = 3) and
``ppo_no_kl`` rows are the single reward model. Then ``MEMBERS`` more reward models are trained
like the demo's, each on its own random half of the preference pairs (twice the epochs, so as
many steps) with its own seed, and PPO runs on the ensemble of the three — combined as the
mean, the minimum or mean − 1·std of their standardised scores — with β = 3 / σ (σ: the mean
training-score std of the members, so a unit of KL costs what it costs the demo's PPO) and
with β = 0. Every policy is evaluated like the demo's (gold: exact accuracy; proxy: the demo's
reward model, in its units; KL to SFT; 200 held-out prompts × 4 samples). Printed per row: gold
and proxy per seed and their means; results also go to ``OUT/ensemble_<seeds>.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
from pathlib import Path

import torch

from proxrl.algos.offline import reward
from proxrl.algos.online import ppo
from proxrl.data.formats import load_prompt_examples
from proxrl.demo import pipeline
from proxrl.demo.evaluate import evaluate_policy
from proxrl.models.causal_lm import load_causal_lm
from proxrl.models.scalar_head import load_score_model
from proxrl.models.tokenizer import load_tokenizer
from proxrl.rollout.rewards import RewardModelReward

MEMBERS = 3
COMBINATIONS = ("mean", "min", "mean_minus_std")


def train_members(out: Path, seed: int, demo: pipeline.Config) -> list[str]:
    """Reward models on random halves of the demo's preference pairs, each with its own seed."""
    lines = (out / "data" / "preferences.jsonl").read_text(encoding="utf-8").splitlines()
    paths = []
    for k in range(MEMBERS):
        member_seed = 1000 * seed + k
        path = out / f"rm_member{k}"
        if not (path / "config.json").exists():
            half = random.Random(member_seed).sample(lines, len(lines) // 2)
            data = out / "data" / f"preferences_member{k}.jsonl"
            data.write_text("".join(line + "\n" for line in half), encoding="utf-8")
            reward.train(
                reward.Config(
                    model=str(out / "base"),
                    batch_size=demo.batch_size,
                    seed=member_seed,
                    progress=False,
                    lr_schedule="linear",
                    warmup_steps=10,
                    max_length=32,
                    output_dir=str(path),
                    data=str(data),
                    eval_data=str(out / "data" / "preferences_eval.jsonl"),
                    epochs=2 * demo.rm_epochs,
                    learning_rate=demo.rm_learning_rate,
                )
            )
        paths.append(str(path))
    return paths


def evaluate(out: Path, names: list[str], demo: pipeline.Config) -> dict[str, dict[str, float]]:
    tokenizer = load_tokenizer(str(out / "sft"))
    sft_model = load_causal_lm(str(out / "sft")).eval()
    proxy = RewardModelReward(
        load_score_model(str(out / "rm")).eval(), load_tokenizer(str(out / "rm"))
    )
    prompts = load_prompt_examples(str(out / "data" / "eval_prompts.jsonl"))
    scores = {}
    for name in names:
        s = evaluate_policy(
            load_causal_lm(str(out / name)).eval(),
            sft_model,
            proxy,
            tokenizer,
            prompts,
            demo.eval_samples,
            demo.max_new_tokens,
            demo.temperature,
            seed=demo.seed,
        )
        scores[name] = {"gold": s.gold, "proxy": s.proxy, "kl": s.kl}
    return scores


def run_seed(out: Path, seed: int, reuse: bool) -> dict[str, dict[str, float]]:
    demo = pipeline.Config(output_dir=str(out), seed=seed, progress=False)
    if not (reuse and (out / "summary.json").exists()):
        pipeline.train(demo)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))["policies"]
    members = train_members(out, seed, demo)
    stds = [float(load_score_model(m).config.reward_std) for m in members]
    beta = demo.kl_coef / statistics.mean(stds)
    names = []
    for combination in COMBINATIONS:
        for kl_name, kl_coef in (("kl", beta), ("no_kl", 0.0)):
            name = f"ensemble_{combination}_{kl_name}"
            names.append(name)
            if (out / name / "model.safetensors").exists():
                continue
            ppo.train(
                ppo.Config(
                    **pipeline.online_fields(demo, out, name),
                    reward_model=tuple(members),
                    reward_ensemble=combination,
                    reward_fn=(pipeline.GOLD_FN,),
                    reward_weights=(1.0, 0.0),
                    group_size=demo.group_size,
                    mini_batch_size=demo.rollout_batch_size * demo.group_size,
                    critic_learning_rate=demo.critic_learning_rate,
                    kl_coef=kl_coef,
                )
            )
    results = {
        "single_kl": summary["ppo"],
        "single_no_kl": summary["ppo_no_kl"],
        "sft": summary["sft"],
        **evaluate(out, names, demo),
    }
    results["beta"] = {"ensemble": beta, "member_stds": stds}  # type: ignore[dict-item]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", default="runs/bench_ensemble")
    parser.add_argument("--reuse", action="store_true", help="reuse demos and runs in OUT")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    out = Path(args.out)
    results = {str(s): run_seed(out / f"seed_{s}", s, args.reuse) for s in args.seeds}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"ensemble_{'_'.join(map(str, args.seeds))}.json").write_text(
        json.dumps(results, indent=2) + "\n", encoding="utf-8"
    )
    print_table(results)


def print_table(results: dict[str, dict[str, dict[str, float]]]) -> None:
    rows = ["sft", "single_kl", "single_no_kl"] + [
        f"ensemble_{c}_{k}" for c in COMBINATIONS for k in ("kl", "no_kl")
    ]
    seeds = list(results)
    print(f"{'policy':<28} | gold per seed (mean) | proxy per seed (mean) | KL mean")
    for row in rows:
        gold = [results[s][row]["gold"] for s in seeds]
        proxy = [results[s][row]["proxy"] for s in seeds]
        kl = statistics.mean(results[s][row]["kl"] for s in seeds)
        print(
            f"{row:<28} | {' '.join(f'{g:.3f}' for g in gold)} ({statistics.mean(gold):.3f}) | "
            f"{' '.join(f'{p:+.2f}' for p in proxy)} ({statistics.mean(proxy):+.2f}) | {kl:.2f}"
        )


if __name__ == "__main__":
    main()
