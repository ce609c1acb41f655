"""Does the demo's story hold on any CPU? ``proxrl demo`` under perturbations that change only
float round-off (issue 51): torch's CPU kernels (``ATEN_CPU_CAPABILITY``), the thread count, and
the seed.

    .venv/bin/python benchmarks/demo_robustness.py --out runs/robust            # the default grid
    .venv/bin/python benchmarks/demo_robustness.py --out runs/robust --grid 1:default:1 1:avx2:2
    .venv/bin/python benchmarks/demo_robustness.py --out runs/robust --only-no-kl runs/demo \\
        --grid 1:avx2:1 -- --no-kl-learning-rate 5e-4

Each grid point ``SEED:KERNEL:THREADS`` is one ``proxrl demo`` in a process of its own (the kernel
is chosen when torch is imported), run one after another: timings of parallel runs on a small
machine mean nothing. ``--only-no-kl DIR`` copies a finished demo's data, SFT policy, reward model,
ppo and grpo into each point's directory and reruns only the ppo_no_kl stage (``--resume
--resume-with-changes``): the cheap way to try its settings, though the kernels then perturb only
that stage (the seed must be DIR's). Options after ``--`` go to every ``proxrl demo``.

Per point: gold / proxy / KL of every policy, ppo_no_kl's two most common held-out answers and
their shares, the share of answers made of nines only (``" 9"``, ``" 9 9 9 9"``, ...: the reward
model's shortcut), of ``" 9 9 9 9"``, and of held-out lists that hold a 9 (the gold of always
``" 9"``), the health rules that fire on ppo_no_kl (rule@iteration), the ppo_no_kl stage's and
the whole demo's wall seconds and the peak RSS. Printed as a markdown table and written to
``OUT/robustness.md`` and ``OUT/robustness.json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from proxrl.runtime.health import diagnose
from proxrl.runtime.metrics import read_metrics

KERNELS = ("default", "avx2", "avx512")
DEFAULT_GRID = [f"{seed}:avx512:1" for seed in range(1, 6)] + [
    "1:avx2:1",
    "1:default:1",
    "1:avx512:2",
]
"""Seeds 1-5 at this CPU's own kernels (AVX-512 here) and one thread (the demo's default), then
seed 1 under each other kernel and two threads."""
KEPT = ("data", "base", "sft", "rm", "ppo", "grpo", "demo_config.yaml", ".proxrl-run")
NINES = " 9 9 9 9"


def point_dir(out: Path, point: str) -> Path:
    return out / point.replace(":", "_")


def run_point(out: Path, point: str, demo_args: list[str], only_no_kl: Path | None) -> Path:
    seed, kernel, threads = point.split(":")
    if kernel not in KERNELS:
        raise SystemExit(f"{point}: kernel is one of {', '.join(KERNELS)}")
    run_dir = point_dir(out, point)
    command = [sys.executable, "-m", "proxrl", "demo", "--output-dir", str(run_dir)]
    command += ["--seed", seed, "--threads", threads, "--no-progress", *demo_args]
    if only_no_kl is not None:
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        for name in KEPT:
            source = only_no_kl / name
            if source.is_dir():
                shutil.copytree(source, run_dir / name)
            else:
                shutil.copy(source, run_dir / name)
        command += ["--resume", "--resume-with-changes"]
    # ATEN_CPU_CAPABILITY picks torch's kernels at import; OMP_NUM_THREADS matches --threads so
    # that nothing else in the process starts a larger pool
    env = os.environ | {"ATEN_CPU_CAPABILITY": kernel, "OMP_NUM_THREADS": threads}
    log = (out / f"{run_dir.name}.log").open("w")
    subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    return run_dir


def is_nines(answer: str) -> bool:
    return bool(answer.split()) and set(answer.split()) == {"9"}


def measure(run_dir: Path, point: str) -> dict[str, Any]:
    summary = json.loads((run_dir / "summary.json").read_text())
    answers = collections.Counter(
        row["completion"]
        for line in (run_dir / "eval_samples.jsonl").read_text().splitlines()
        if (row := json.loads(line))["policy"] == "ppo_no_kl"
    )
    total = sum(answers.values())
    prompts = [
        json.loads(line)["prompt"]
        for line in (run_dir / "data" / "eval_prompts.jsonl").read_text().splitlines()
    ]
    return {
        "point": point,
        "policies": summary["policies"],
        "no_kl_top": [[a, round(n / total, 3)] for a, n in answers.most_common(2)],
        "no_kl_four_nines": round(answers[NINES] / total, 3),
        # answers made of nines only (" 9", " 9 9", ...): the reward model's shortcut, whatever
        # the list; " 9" alone is right exactly on the lists that hold a 9
        "no_kl_nines": round(sum(n for a, n in answers.items() if is_nines(a)) / total, 3),
        "lists_with_9": round(sum("9" in p.split()[1:-1] for p in prompts) / len(prompts), 3),
        "no_kl_health": [
            f"{f.rule}@{f.since}" for f in diagnose(read_metrics(run_dir / "ppo_no_kl"))
        ],
        "no_kl_s": summary["wall_s"]["ppo_no_kl"],
        "wall_s": summary["wall_s"]["total"],
        "peak_rss_mb": summary["peak_rss_mb"],
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| seed:kernel:threads | sft gold | ppo gold / proxy / KL | ppo_no_kl gold / proxy / KL "
        "| grpo gold / proxy / KL | ppo_no_kl top answers (share) | nines only | ' 9 9 9 9' "
        "| lists with a 9 | ppo_no_kl health (rule@iteration) | ppo_no_kl s | total s "
        "| peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r["policies"]
        cells = [f"{p[n]['gold']:.3f} / {p[n]['proxy']:+.2f} / {p[n]['kl']:.2f}" for n in p]
        lines.append(
            f"| {r['point']} | {p['sft']['gold']:.3f} | {' | '.join(cells[1:])} "
            f"| {', '.join(f'`{a}` ({n:.2f})' for a, n in r['no_kl_top'])} "
            f"| {r['no_kl_nines']:.2f} "
            f"| {r['no_kl_four_nines']:.2f} | {r['lists_with_9']:.2f} "
            f"| {', '.join(r['no_kl_health']) or '—'} | {r['no_kl_s']:.0f} | {r['wall_s']:.0f} "
            f"| {r['peak_rss_mb']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/robust")
    parser.add_argument("--grid", nargs="+", default=DEFAULT_GRID, help="SEED:KERNEL:THREADS")
    parser.add_argument("--only-no-kl", type=Path, help="a finished demo: rerun only ppo_no_kl")
    parser.add_argument("--reuse", action="store_true", help="read points already run in OUT")
    parser.add_argument("demo_args", nargs="*", help="after --: options of every proxrl demo")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for point in args.grid:
        run_dir = point_dir(out, point)
        if not (args.reuse and (run_dir / "summary.json").exists()):
            run_dir = run_point(out, point, args.demo_args, args.only_no_kl)
        rows.append(measure(run_dir, point))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    (out / "robustness.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    (out / "robustness.md").write_text(table(rows) + "\n", encoding="utf-8")
    print(table(rows))


if __name__ == "__main__":
    main()
