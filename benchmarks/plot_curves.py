"""Plot ``charts/episodic_return`` against ``global_step`` for one or more runs.

.venv/bin/python benchmarks/plot_curves.py runs/hopper-1m --out benchmarks/results/hopper_1m.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (output_dir)")
    parser.add_argument("--out", type=Path, required=True, help="PNG to write")
    parser.add_argument("--smooth", type=int, default=10, help="moving-average window (rows)")
    args = parser.parse_args()
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in args.runs:
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
        rows = [r for r in rows if "charts/episodic_return" in r]
        x = np.array([r["global_step"] for r in rows])
        y = np.array([r["charts/episodic_return"] for r in rows])
        k = max(1, min(args.smooth, len(y)))
        ax.plot(x[k - 1 :], np.convolve(y, np.ones(k) / k, mode="valid"), label=str(run))
    ax.set_xlabel("environment steps")
    ax.set_ylabel(f"episodic return ({args.smooth}-iteration moving mean)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=100)


if __name__ == "__main__":
    main()
