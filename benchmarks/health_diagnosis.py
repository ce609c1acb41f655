"""The training-health diagnosis on the demo, three seeds: is ``ppo_no_kl`` flagged for reward
hacking, and are ``ppo`` and ``grpo`` not?

    .venv/bin/python benchmarks/health_diagnosis.py                 # seeds 1 2 3
    .venv/bin/python benchmarks/health_diagnosis.py --seeds 1 --out runs/health

For each seed the whole demo runs with its defaults (``proxrl demo --seed S``); then the rules of
``proxrl.runtime.health`` (the report's "Health" section) read each RL run's metrics.jsonl. The
held-out score they pair with the trained reward is ``reward/gold``, the exact reward the demo
logs at weight 0 on every rollout. Printed: every finding of every run (rule and first
iteration), and whether the expectation holds. Results also go to ``OUT/health.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import torch

from proxrl.demo import pipeline
from proxrl.runtime.health import diagnose
from proxrl.runtime.metrics import read_metrics

RUNS = ("ppo", "ppo_no_kl", "grpo")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", default="runs/bench_health")
    parser.add_argument("--reuse", action="store_true", help="read demos already in OUT/seed_S")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    out = Path(args.out)
    results: dict[str, dict[str, list[list[object]]]] = {}
    for seed in args.seeds:
        demo_dir = out / f"seed_{seed}"
        if not (args.reuse and (demo_dir / "summary.json").exists()):
            pipeline.train(pipeline.Config(output_dir=str(demo_dir), seed=seed, progress=False))
        results[str(seed)] = {
            run: [[f.rule, f.since] for f in diagnose(read_metrics(demo_dir / run))] for run in RUNS
        }
    print(f"{'seed':>4} | " + " | ".join(f"{run:<40}" for run in RUNS))
    holds = True
    for seed, runs in results.items():
        cells = [", ".join(f"{rule}@{since}" for rule, since in runs[run]) or "—" for run in RUNS]
        print(f"{seed:>4} | " + " | ".join(f"{c:<40}" for c in cells))
        hacked = {run: any(rule == "reward_hacking" for rule, _ in runs[run]) for run in RUNS}
        holds &= hacked["ppo_no_kl"] and not hacked["ppo"] and not hacked["grpo"]
    print(f"ppo_no_kl flagged for reward hacking on every seed, ppo and grpo on none: {holds}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "health.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
