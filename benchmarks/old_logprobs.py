"""Where log π_old comes from, on vs_trl.py's GRPO workload (8 prompts × 4 responses × 32
tokens, one optimizer step of 2 micro-batches, β = 0), proxrl alone, three ways side by side:

- ``pass``: a separate forward pass in the rollout (``skip_old_logprobs_pass: false``; what the
  default ``sampler_logprobs: false`` paid before);
- ``update``: from the update's own forward (the default now: ``rollout.old_logprobs_pass``);
- ``sampler``: from the sampler's logits (``sampler_logprobs: true``, as vs_trl.py runs it).

Runs alternate pass, update, sampler, pass, … in fresh processes, so machine noise hits all
alike; the first update of each run is warm-up. The load average is printed before and after.

    .venv/bin/python benchmarks/old_logprobs.py --size 128x2 --pairs 3 --updates 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from vs_trl import ROOT, Run, build_models, worker_proxrl  # noqa: E402

VARIANTS = {
    "pass": {"sampler_logprobs": False, "skip_old_logprobs_pass": False},
    "update": {"sampler_logprobs": False, "skip_old_logprobs_pass": True},
    "sampler": {"sampler_logprobs": True},
}


def run(variant: str, paths: dict, args: argparse.Namespace, out: Path) -> Run:
    command = [
        sys.executable,
        __file__,
        "--worker",
        variant,
        "--paths",
        json.dumps(paths),
        "--updates",
        str(args.updates),
        "--precision",
        args.precision,
        "--out",
        str(out),
    ]
    env = os.environ | {
        "OMP_NUM_THREADS": str(args.threads),
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(Path(__file__).parent)]),
    }
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise SystemExit(f"{variant} failed:\n{result.stderr[-3000:]}")
    numbers = json.loads(lines[-1])
    passes = numbers.pop("old_logprobs_pass")
    if passes != (1.0 if variant == "pass" else 0.0):  # the path the variant names really ran
        raise SystemExit(f"{variant}: perf/old_logprobs_pass {passes}")
    return Run.of(numbers, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="128x2", help="hidden x layers")
    parser.add_argument("--pairs", type=int, default=3, help="rounds of the three variants")
    parser.add_argument("--updates", type=int, default=6, help="updates per run (first: warm-up)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--worker", choices=list(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--paths", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        import logging

        import torch

        from proxrl.runtime.metrics import read_metrics

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
        logging.disable(logging.WARNING)
        worker_args = argparse.Namespace(
            trainer="grpo",
            out=args.out,
            updates=args.updates,
            tokens=32,
            precision=args.precision,
            compile_sampler=False,
            overrides=VARIANTS[args.worker],
        )
        numbers = worker_proxrl(worker_args, json.loads(args.paths))
        rows = read_metrics(args.out)
        numbers["old_logprobs_pass"] = max(r["perf/old_logprobs_pass"] for r in rows)
        print(json.dumps(numbers))
        return

    root = Path(tempfile.mkdtemp(prefix="old_logprobs_"))
    hidden, layers = (int(x) for x in args.size.split("x"))
    paths = build_models(root, hidden, layers)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    print(
        f"{'pair':<5}"
        + "".join(f"{v + ' s/update':>18}" for v in VARIANTS)
        + f"{'pass/update':>13}"
    )
    seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
    ratios = []
    for pair in range(args.pairs):
        runs = {v: run(v, paths, args, root / f"{v}-{pair}") for v in VARIANTS}
        for v, r in runs.items():
            seconds[v].append(r.seconds)
        ratios.append(runs["pass"].seconds / runs["update"].seconds)
        print(
            f"{pair:<5}"
            + "".join(f"{r.seconds:>18.4f}" for r in runs.values())
            + f"{ratios[-1]:>13.3f}",
            flush=True,
        )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    medians = {v: statistics.median(s) for v, s in seconds.items()}
    print(
        f"median s/update ({args.size}, {args.precision}): "
        + ", ".join(f"{v} {m:.4f}" for v, m in medians.items())
        + f"; pass/update {statistics.median(ratios):.3f} (pair by pair: "
        + ", ".join(f"{x:.3f}" for x in ratios)
        + ")"
    )


if __name__ == "__main__":
    main()
