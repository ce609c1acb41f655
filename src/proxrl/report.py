"""``proxrl report RUN_DIR``: PNG plots of a run's ``metrics.jsonl`` and a ``report.md`` that
links them, with a few before/after samples.

RUN_DIR is one run (it holds ``metrics.jsonl``) or a directory of runs (each sub-directory that
holds one, e.g. ``runs/demo/{sft,rm,ppo,ppo_no_kl,grpo}``); runs are drawn as one line each.
Plots go to ``RUN_DIR/plots/<panel>.png``, one per panel that some run logged: score, KL,
KL coefficient, value loss, clip fraction, entropy, response length, training loss, and gold
vs proxy for every run that logged both (``reward/gold`` and ``reward/reward_model`` by
default: the demo logs the signal a run does not optimise at weight 0); the held-out score or
loss, and a teacher's reverse KL and distillation loss, for runs that logged them. A run with
held-out evaluations also gets a line each: its last and its best ``eval/score``.

One unit per axis: a panel whose values are in the units of a run's reward (score, value loss,
β, a classic run's episode return) draws one sub-panel per reward — the reward sources a run
weighs (its config.yaml's ``reward_model``, ``reward_fn``, ``reward_weights``, ``environment``;
a classic run's ``env``) — so a GRPO run on a 0/1 reward is not drawn on the axis of a PPO run's
reward-model scores (where its learning curve looks flat). Runs with the same reward share one.

Health: the rules of ``runtime.health`` (KL first, then the value loss, then the reward) applied
to every run, in words, with the iteration each finding starts at.

A ``classic`` run gets the panels of its own metrics (episode return, value loss, clip
fraction, entropy) and its summary.json as a table; a run whose last logged step falls short of
the steps it was configured for (noted in its run marker) is marked incomplete.

Samples: ``samples.jsonl`` (rows ``{iteration, prompt, completion, score}`` written by the
online trainers) gives the first and last logged iteration of each run; a ``summary.json`` and
an ``eval_samples.jsonl`` (rows ``{policy, prompt, completion, ...}``, written by the demo) add
the summary table and held-out completions of every policy side by side.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any

import tyro
import yaml

from proxrl.runtime.checkpoint import RUN_MARKER, planned_steps
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.fields import Range, check_ranges
from proxrl.runtime.health import render_markdown as health_section
from proxrl.runtime.health import trailing_mean
from proxrl.runtime.metrics import METRICS_FILE, read_metrics
from proxrl.runtime.run_dir import not_writable

# panel file name → (title, metric names tried in order: the first one a run logged is drawn)
PANELS: Mapping[str, tuple[str, tuple[str, ...]]] = MappingProxyType(
    {
        "score": ("score (objective/scores)", ("objective/scores",)),
        "kl": ("KL to the reference (objective/kl, per sequence)", ("objective/kl",)),
        "episodic_return": ("episode return (charts/episodic_return)", ("charts/episodic_return",)),
        "kl_coef": ("KL coefficient β (policy/kl_coef)", ("policy/kl_coef",)),
        "value_loss": ("value loss (value/loss)", ("value/loss", "losses/value_loss")),
        "clip_fraction": (
            "clip fraction (policy/clipfrac)",
            ("policy/clipfrac", "losses/clipfrac"),
        ),
        "entropy": (
            "entropy per token (objective/entropy)",
            ("objective/entropy", "policy/entropy", "losses/entropy"),
        ),
        "response_length": (
            "response length in tokens (response/length_mean)",
            ("response/length_mean",),
        ),
        "loss": ("training loss (train/loss)", ("train/loss",)),
        "heldout_score": ("held-out score (eval/score)", ("eval/score",)),
        "eval_loss": ("held-out loss (eval/loss)", ("eval/loss",)),
        "teacher_kl": (
            "reverse KL to the teacher (distill/reverse_kl, per token)",
            ("distill/reverse_kl",),
        ),
        "distill_loss": ("distillation loss (distill/loss)", ("distill/loss",)),
    }
)
UNIT_OF_PANEL: Mapping[str, str] = MappingProxyType(
    {
        "score": "reward",
        "value_loss": "reward",
        "kl_coef": "reward",
        "heldout_score": "eval_reward_fn",
        "episodic_return": "env",
    }
)
"""Panels whose values are in a run's own units: the panel → what sets them."""
GOLD_METRIC = "reward/gold"
PROXY_METRIC = "reward/reward_model"
MAIN_PLOT = "gold_vs_proxy"


def find_runs(run_dir: Path) -> dict[str, list[dict[str, float]]]:
    """Run name → metric rows: RUN_DIR itself when it holds metrics, else its sub-directories."""
    if (run_dir / METRICS_FILE).exists():
        return {run_dir.name or str(run_dir): read_metrics(run_dir)}
    dirs = [d for d in run_dir.iterdir() if (d / METRICS_FILE).exists()]
    dirs.sort(
        key=lambda d: (
            ((d / RUN_MARKER) if (d / RUN_MARKER).exists() else d / METRICS_FILE).stat().st_mtime,
            d.name,
        )
    )
    runs = {d.name: read_metrics(d) for d in dirs}  # in the order the runs started
    if not runs:
        raise ProxrlError(f"{run_dir}: no {METRICS_FILE} in it or in any sub-directory")
    return runs


def run_config(run_dir: Path, name: str) -> dict[str, Any]:
    """The config.yaml of run ``name`` ({} when it has none)."""
    path = (run_dir / name if (run_dir / name).is_dir() else run_dir) / "config.yaml"
    if not path.exists():
        return {}
    loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    return loaded if isinstance(loaded, dict) else {}


def _listed(value: Any) -> list[Any]:
    if value is None or value == "":
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def reward_unit(config: dict[str, Any]) -> str | None:
    """What a run's scores are measured in: the reward sources it weighs (non-zero weight), as
    ``"a, b"``; None when its config says nothing about a reward (all such runs share a panel)."""
    models = _listed(config.get("reward_model"))  # several: one ensemble, one source
    sources = ([", ".join(map(str, models))] if models else []) + _listed(config.get("reward_fn"))
    weights = _listed(config.get("reward_weights"))
    weights = weights if len(weights) == len(sources) else [1.0] * len(sources)
    weighed = [
        f"{w:g} × {s}" if float(w) != 1.0 else str(s)
        for s, w in zip(sources, weights, strict=True)
        if float(w) != 0.0
    ]
    if config.get("environment"):
        weighed.append(f"environment {config['environment']}")
    return ", ".join(weighed) or None


def unit_of(panel: str, config: dict[str, Any]) -> str | None:
    """The unit a run's line on ``panel`` is in (None: the panel's own, shared by every run)."""
    what = UNIT_OF_PANEL.get(panel)
    if what == "eval_reward_fn" and not config.get(what):  # scored by the training reward
        what = "reward"
    if what == "reward":
        return reward_unit(config)
    if what is not None and config.get(what) is not None:
        return f"{what} {config[what]}"
    return None


def panel_groups(
    lines: list[tuple[str, Any, Any]], units: dict[str, str | None]
) -> list[tuple[str | None, list[tuple[str, Any, Any]]]]:
    """The lines of one panel, grouped by their run's unit (``units``: run name → unit), in the
    order each unit first appears: one sub-panel, one y-axis, per group."""
    groups: dict[str | None, list[tuple[str, Any, Any]]] = {}
    for line in lines:
        groups.setdefault(units.get(line[0]), []).append(line)
    return list(groups.items())


def series(rows: list[dict[str, float]], metric: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the rows that logged ``metric`` with a finite value."""
    points = [(r["step"], r[metric]) for r in rows if metric in r and math.isfinite(r[metric])]
    return [p[0] for p in points], [p[1] for p in points]


def _plot_line(ax: Any, steps: list[float], values: list[float], label: str, color: Any) -> None:
    window = max(1, len(values) // 15)
    if window > 1:
        ax.plot(steps, values, color=color, alpha=0.25, linewidth=0.8)
    ax.plot(steps, trailing_mean(values, window), color=color, linewidth=1.6, label=label)


def plot_panels(
    runs: dict[str, list[dict[str, float]]],
    plot_dir: Path,
    configs: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Path]:
    """One PNG per panel that at least one run logged, one sub-panel per unit (``configs``: run
    name → its config.yaml, which says what its reward is); returns panel name → path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = configs or {}
    colors = {name: plt.get_cmap("tab10")(i % 10) for i, name in enumerate(runs)}
    written = {}
    for panel, (title, metrics) in PANELS.items():
        lines = []
        for name, rows in runs.items():
            for metric in metrics:
                steps, values = series(rows, metric)
                if steps:
                    lines.append((name, steps, values))
                    break
        if not lines:
            continue
        units = {name: unit_of(panel, configs.get(name, {})) for name in runs}
        groups = panel_groups(lines, units)
        fig, axes = plt.subplots(
            1, len(groups), figsize=(6 * len(groups), 3.6), dpi=100, squeeze=False
        )
        for ax, (unit, group) in zip(axes[0], groups, strict=True):
            for name, steps, values in group:
                _plot_line(ax, steps, values, name, colors[name])
            ax.set_title(title if len(groups) == 1 else f"{title}\n{unit}", fontsize=9)
            ax.set_xlabel("step (iterations for LM RL runs, env steps for classic)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        written[panel] = plot_dir / f"{panel}.png"
        fig.savefig(written[panel])
        plt.close(fig)
    gold_runs = {
        n: r for n, r in runs.items() if series(r, GOLD_METRIC)[0] and series(r, PROXY_METRIC)[0]
    }
    if gold_runs:
        written[MAIN_PLOT] = plot_gold_vs_proxy(gold_runs, plot_dir / f"{MAIN_PLOT}.png")
    return written


def plot_gold_vs_proxy(runs: dict[str, list[dict[str, float]]], path: Path) -> Path:
    """One panel per run: gold (left axis, exact accuracy) and proxy (right axis, reward-model
    score) of the sampled responses at each iteration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.4), dpi=100, squeeze=False)
    proxy_range = [
        min(min(series(r, PROXY_METRIC)[1]) for r in runs.values()),
        max(max(series(r, PROXY_METRIC)[1]) for r in runs.values()),
    ]
    pad = 0.05 * (proxy_range[1] - proxy_range[0] or 1.0)
    for ax, (name, rows) in zip(axes[0], runs.items(), strict=True):
        _plot_line(ax, *series(rows, GOLD_METRIC), "gold (exact accuracy)", "tab:green")
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("iteration")
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
        twin = ax.twinx()
        _plot_line(twin, *series(rows, PROXY_METRIC), "proxy (reward model)", "tab:purple")
        twin.set_ylim(proxy_range[0] - pad, proxy_range[1] + pad)
        if ax is axes[0][0]:
            ax.set_ylabel("gold", color="tab:green")
        if ax is axes[0][-1]:
            twin.set_ylabel("proxy", color="tab:purple")
    handles = [axes[0][0].get_lines()[-1], fig.axes[len(runs)].get_lines()[-1]]
    fig.legend(handles, [h.get_label() for h in handles], loc="lower center", ncol=2, fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return path


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", "⏎") or "∅"


def training_samples(run_dir: Path, runs: list[str], per_side: int) -> list[str]:
    """Markdown: the first and last logged iteration's samples of each run with samples.jsonl."""
    lines: list[str] = []
    for name in runs:
        path = (run_dir / name if (run_dir / name).is_dir() else run_dir) / "samples.jsonl"
        if not path.exists():
            continue
        rows = _read_jsonl(path)
        if not rows:
            continue
        first, last = min(r["iteration"] for r in rows), max(r["iteration"] for r in rows)
        lines += [
            f"### {name}: iteration {first} → iteration {last}",
            "",
            "| when | prompt | completion | score |",
            "|---|---|---|---|",
        ]
        for when, it in (("before", first), ("after", last)):
            for r in [r for r in rows if r["iteration"] == it][:per_side]:
                lines.append(
                    f"| {when} | `{_cell(r['prompt'])}` | `{_cell(r['completion'])}` "
                    f"| {r['score']:+.3f} |"
                )
        lines.append("")
    return lines


def eval_samples_table(path: Path, n_prompts: int) -> list[str]:
    """Markdown: held-out prompts with each policy's completion (✓ when exactly right)."""
    by_policy: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    prompts: list[str] = []
    for row in _read_jsonl(path):
        by_policy[row["policy"]].setdefault(row["prompt"], row)
        if row["prompt"] not in prompts:
            prompts.append(row["prompt"])
    names = list(by_policy)
    lines = ["| prompt | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for prompt in prompts[:n_prompts]:
        cells = []
        for name in names:
            r = by_policy[name].get(prompt)
            cells.append(
                ""
                if r is None
                else f"`{_cell(r['completion'])}` {'✓' if r.get('correct') else '✗'}"
            )
        lines.append(f"| `{_cell(prompt)}` | " + " | ".join(cells) + " |")
    return lines + [""]


def is_demo_summary(summary: dict[str, Any]) -> bool:
    """Whether a summary.json is the demo's (reward-model accuracy and per-policy scores)."""
    return isinstance(summary.get("reward_model"), dict) and isinstance(
        summary.get("policies"), dict
    )


def summary_table(summary: dict[str, Any]) -> list[str]:
    """Markdown of a summary.json: the demo's held-out table, or any other run's (``classic``)
    numbers and words as a two-column table."""
    if not is_demo_summary(summary):
        rows = [
            f"| {key} | {_value(value)} |"
            for key, value in summary.items()
            if isinstance(value, (int, float, str, bool)) or value is None
        ]
        return ["| summary.json | value |", "|---|---|", *rows, ""]
    lines = [
        f"Reward model accuracy on held-out preference pairs: "
        f"**{summary['reward_model']['heldout_accuracy']:.3f}**",
        "",
        "| policy | gold (exact accuracy) | proxy (reward model) | KL to SFT |",
        "|---|---|---|---|",
    ]
    for name, s in summary["policies"].items():
        lines.append(f"| {name} | {s['gold']:.3f} | {s['proxy']:+.3f} | {s['kl']:.3f} |")
    wall = summary.get("wall_s", {})
    if wall:
        stages = ", ".join(f"{k} {v:.0f} s" for k, v in wall.items() if k != "total")
        upto = "" if "report" in wall else " up to this report"
        lines += [
            "",
            f"Wall time{upto} {wall.get('total', 0):.0f} s ({stages}); peak RSS "
            f"{summary.get('peak_rss_mb', 0):.0f} MB.",
        ]
    return lines + [""]


def _value(value: Any) -> str:
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.4g}"
    return _cell(value)


def held_out_lines(runs: dict[str, list[dict[str, float]]]) -> list[str]:
    """Markdown: per run that evaluated on held-out prompts, its last ``eval/score`` and its
    best with the iteration it came at (what ``final_model: best`` keeps)."""
    lines = []
    for name, rows in runs.items():
        steps, scores = series(rows, "eval/score")
        if not steps:
            continue
        best = max(range(len(scores)), key=lambda i: (scores[i], -steps[i]))  # the first best
        lines.append(
            f"- {name}: {len(steps)} evaluations; last eval/score {scores[-1]:.4g} (iteration "
            f"{steps[-1]:.0f}); best {scores[best]:.4g} (iteration {steps[best]:.0f})"
        )
    return ["## Held-out evaluation during training", "", *lines, ""] if lines else []


def unfinished(run_dir: Path, runs: dict[str, list[dict[str, float]]]) -> dict[str, str]:
    """Run name → "stopped at step X of Y" for each run whose last logged step falls short of
    the steps it was configured for (noted in its run marker; runs without one are not judged)."""
    out = {}
    for name, rows in runs.items():
        planned = planned_steps(run_dir / name if (run_dir / name).is_dir() else run_dir)
        last = max((int(r["step"]) for r in rows), default=0)
        if planned is not None and last < planned:
            out[name] = f"stopped at step {last} of {planned}"
    return out


def write_report(
    run_dir: str | Path, summary: dict[str, Any] | None = None, samples: int = 4
) -> Path:
    """Draw the plots and write ``RUN_DIR/report.md``; returns its path."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ProxrlError(f"{run_dir}: not a directory")
    try:
        return _write_report(run_dir, summary, samples)
    except OSError as exc:  # a read-only run directory: one line, not a traceback
        refused = not_writable(run_dir, exc)
        if refused is None:
            raise
        raise refused from None


def _write_report(run_dir: Path, summary: dict[str, Any] | None, samples: int) -> Path:
    runs = find_runs(run_dir)
    plot_dir = run_dir / "plots"
    plot_dir.mkdir(exist_ok=True)
    plots = plot_panels(runs, plot_dir, {name: run_config(run_dir, name) for name in runs})
    if summary is None and (run_dir / "summary.json").exists():
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    stopped = unfinished(run_dir, runs)
    names = [f"{n} (**incomplete**: {stopped[n]})" if n in stopped else n for n in runs]

    lines = [f"# Report: {run_dir.name or run_dir}", "", f"Runs: {', '.join(names)}.", ""]
    if isinstance(summary, dict):
        heading = "## Held-out evaluation" if is_demo_summary(summary) else "## Summary"
        lines += [heading, "", *summary_table(summary)]
    lines += health_section(runs)
    lines += held_out_lines(runs)
    if MAIN_PLOT in plots:
        lines += [
            "## Gold vs proxy during training",
            "",
            f"![gold vs proxy](plots/{MAIN_PLOT}.png)",
            "",
        ]
    lines += ["## Training curves", ""]
    lines += [f"![{panel}](plots/{panel}.png)" for panel in plots if panel != MAIN_PLOT] + [""]
    if (run_dir / "eval_samples.jsonl").exists():
        lines += [
            "## Held-out samples, every policy on the same prompts",
            "",
            *eval_samples_table(run_dir / "eval_samples.jsonl", 2 * samples),
        ]
    sample_lines = training_samples(run_dir, list(runs), samples)
    if sample_lines:
        lines += ["## Samples before and after training", "", *sample_lines]
    path = run_dir / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


@dataclass
class Config:
    """proxrl report RUN_DIR: plots and report.md of a run or a directory of runs."""

    run_dir: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")]
    """A run directory, or a directory of runs."""
    samples: Annotated[int, Range(ge=0)] = 4
    """Samples shown before and after, per run."""

    def validate(self) -> None:
        check_ranges(self)


def train(cfg: Config) -> None:
    path = write_report(cfg.run_dir, samples=cfg.samples)
    print(f"wrote {path} and the plots in {Path(cfg.run_dir) / 'plots'}")
