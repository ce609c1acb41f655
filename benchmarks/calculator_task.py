"""The calculator task (``proxrl.demo.calculator``): SFT, then multi-turn PPO and GRPO with the
``calculator`` tool, on three seeds, and the no-tool ablation; greedy exact accuracy on 200
held-out products before and after, and the trajectories side by side.

    nice -n 19 .venv/bin/python benchmarks/calculator_task.py                  # seeds 1 2 3
    nice -n 19 .venv/bin/python benchmarks/calculator_task.py --seeds 1 --stages sft ablation

Per seed, under ``--out`` (default runs/calculator/seed<N>):
1. ``data``: the splits (``calculator.generate``) and the tiny Llama with the task's tokenizer.
2. ``sft``: ``proxrl sft`` on the sloppy annotator's demonstrations (a share of them call the
   calculator, the rest state the product), then greedy episodes on the held-out prompts.
3. ``ppo`` / ``grpo``: from the SFT policy, ``environment: proxrl.demo.calculator:environment``,
   the exact final-answer reward; greedy episodes again.
4. ``ablation``: the same SFT on the same expressions, every one answered directly with no tool
   offered, then GRPO with the same exact reward and no tool (a single-turn run); greedy
   accuracy of both.

Writes ``benchmarks/results/calculator/seed<N>.json`` (accuracies, tool-call rates, wall times)
and ``benchmarks/results/calculator/trajectories.md`` (the same held-out prompts, before and
after, side by side).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "calculator"
ENVIRONMENT = "proxrl.demo.calculator:environment"
NO_TOOL = "proxrl.demo.calculator:environment_without_tool"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument(
        "--stages",
        nargs="*",
        help="what to train (every policy already trained under --out is evaluated either way)",
        default=["sft", "ppo", "grpo", "ablation"],
        choices=["sft", "ppo", "grpo", "ablation"],
    )
    p.add_argument("--out", default="runs/calculator")
    p.add_argument("--sft-examples", type=int, default=1500)
    p.add_argument("--tool-use", type=float, default=0.4)
    p.add_argument("--sft-epochs", type=int, default=12)
    p.add_argument("--sft-learning-rate", type=float, default=3e-3)
    p.add_argument("--rl-iterations", type=int, default=30)
    p.add_argument("--rollout-batch-size", type=int, default=16)
    p.add_argument("--group-size", type=int, default=4, help="episodes per prompt in PPO")
    p.add_argument("--grpo-group-size", type=int, default=8)
    p.add_argument("--grpo-iterations", type=int, default=60)
    p.add_argument("--grpo-learning-rate", type=float, default=1.5e-3)
    p.add_argument("--report-only", action="store_true", help="write trajectories.md only")
    p.add_argument("--rl-learning-rate", type=float, default=5e-4)
    p.add_argument("--eval-prompts", type=int, default=200)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args()


def sft_stage(args: argparse.Namespace, out: Path, data: Path, name: str, seed: int) -> Path:
    from proxrl.algos.offline import sft

    cfg = sft.Config(
        model=str(out / "base"),
        data=str(data),
        output_dir=str(out / name),
        epochs=args.sft_epochs,
        learning_rate=args.sft_learning_rate,
        batch_size=16,
        lr_schedule="linear",
        warmup_steps=5,
        max_length=64,
        seed=seed,
        progress=False,
        overwrite=True,
    )
    sft.train(cfg)
    return out / name


def rl_fields(args: argparse.Namespace, out: Path, name: str, seed: int) -> dict[str, Any]:
    return dict(
        output_dir=str(out / name),
        prompts=str(out / "data" / "rl_prompts.jsonl"),
        model=str(out / "sft"),
        iterations=args.rl_iterations,
        rollout_batch_size=args.rollout_batch_size,
        group_size=args.group_size,
        mini_batch_size=args.rollout_batch_size * args.group_size,
        max_new_tokens=32,
        temperature=1.0,
        learning_rate=args.rl_learning_rate,
        seed=seed,
        progress=False,
        overwrite=True,
        save_every=args.rl_iterations,
    )


def multiturn_fields(environment: str) -> dict[str, Any]:
    return dict(environment=environment, max_turns=3, max_episode_tokens=64)


def ppo_stage(args: argparse.Namespace, out: Path, seed: int) -> Path:
    from proxrl.algos.online import ppo

    ppo.train(
        ppo.Config(
            **rl_fields(args, out, "ppo", seed),
            **multiturn_fields(ENVIRONMENT),
            kl_coef=0.0,
            critic_learning_rate=1e-3,
        )
    )
    return out / "ppo"


def grpo_stage(
    args: argparse.Namespace,
    out: Path,
    seed: int,
    name: str = "grpo",
    model: str = "sft",
    environment: str = ENVIRONMENT,
) -> Path:
    from proxrl.algos.online import grpo

    grpo.train(
        grpo.Config(
            **{
                **rl_fields(args, out, name, seed),
                "model": str(out / model),
                "group_size": args.grpo_group_size,
                "iterations": args.grpo_iterations,
                "save_every": args.grpo_iterations,
                "learning_rate": args.grpo_learning_rate,
                "mini_batch_size": args.rollout_batch_size * args.grpo_group_size,
            },
            **multiturn_fields(environment),
            estimator="grpo",
            kl_coef=0.0,
        )
    )
    return out / name


def score(
    policy_dir: Path, rows: list[dict[str, Any]], environment: Any, greedy: bool = True
) -> dict[str, Any]:
    from proxrl.demo.calculator_eval import evaluate_task
    from proxrl.models.causal_lm import load_causal_lm
    from proxrl.models.tokenizer import load_tokenizer

    scores = evaluate_task(
        load_causal_lm(str(policy_dir)),
        load_tokenizer(str(policy_dir)),
        rows,
        environment,
        greedy=greedy,
    )
    return asdict(scores)


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    from proxrl.demo import calculator
    from proxrl.demo.calculator_eval import read_rows
    from proxrl.runtime.seeding import seed_everything

    out = Path(args.out) / f"seed{seed}"
    out.mkdir(parents=True, exist_ok=True)
    seed_everything(seed)
    wall: dict[str, float] = {}
    result: dict[str, Any] = {"seed": seed, "policies": {}}

    def timed(name: str, fn: Any, *a: Any, **k: Any) -> Any:
        started = time.perf_counter()
        value = fn(*a, **k)
        wall[name] = round(time.perf_counter() - started, 1)
        logging.info("[calculator] seed %d %s: %.1f s", seed, name, wall[name])
        return value

    sizes = calculator.TaskSizes(
        sft=args.sft_examples, eval=args.eval_prompts, tool_use=args.tool_use
    )
    names = ("sft", "sft_no_tool", "rl_prompts", "eval_prompts")
    data = {n: out / "data" / f"{n}.jsonl" for n in names}
    if not data["eval_prompts"].exists():  # a later call on the same --out reuses them
        data = timed("data", calculator.generate, out / "data", sizes, seed)
        calculator.build_base(
            out / "base", seed=seed, hidden_size=args.hidden_size, num_layers=args.num_layers
        )
    rows = read_rows(data["eval_prompts"])
    with_tool, without_tool = calculator.environment, calculator.environment_without_tool

    def record(name: str, policy: Path, environment: Any, greedy: bool = True) -> None:
        scores = timed(f"eval_{name}", score, policy, rows, environment, greedy)
        result["policies"][name] = {k: v for k, v in scores.items() if k != "episodes"}
        (out / f"episodes_{name}.json").write_text(json.dumps(scores["episodes"]) + "\n")
        logging.info(
            "[calculator] seed %d %s: accuracy %.3f, tool calls %.3f, malformed %.3f",
            seed,
            name,
            scores["accuracy"],
            scores["tool_call_rate"],
            scores["malformed_call_rate"],
        )

    if "sft" in args.stages:
        timed("sft", sft_stage, args, out, data["sft"], "sft", seed)
    if "ppo" in args.stages:
        timed("ppo", ppo_stage, args, out, seed)
    if "grpo" in args.stages:
        timed("grpo", grpo_stage, args, out, seed)
    if "ablation" in args.stages:
        if not (out / "sft_no_tool" / "model.safetensors").exists():  # kept from an earlier call
            timed("sft_no_tool", sft_stage, args, out, data["sft_no_tool"], "sft_no_tool", seed)
        timed("grpo_no_tool", grpo_stage, args, out, seed, "grpo_no_tool", "sft_no_tool", NO_TOOL)

    def trained(name: str) -> bool:  # a finished run: its final model is saved at the top
        return (out / name / "model.safetensors").exists()

    for name in ("sft", "ppo", "grpo"):
        if trained(name):
            record(name, out / name, with_tool)
            record(f"{name}_tool_withheld", out / name, without_tool)
    if trained("sft"):
        record("sft_sampled", out / "sft", with_tool, greedy=False)  # what RL explores (T = 1)
    for name in ("sft_no_tool", "grpo_no_tool"):
        if trained(name):
            record(name, out / name, without_tool)
    result["wall_s"] = wall
    result["settings"] = {k: v for k, v in vars(args).items() if k not in ("seeds", "results")}
    return result


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        write_report(args, results)
        return
    for seed in args.seeds:
        result = run_seed(args, seed)
        path = results / f"seed{seed}.json"
        if path.exists():  # runs of other stages on the same --out: keep their wall times
            before = json.loads(path.read_text())
            result["wall_s"] = {**before.get("wall_s", {}), **result["wall_s"]}
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "settings"}, indent=2))
    write_report(args, results)


POLICY_ORDER = (
    "sft",
    "sft_sampled",
    "ppo",
    "grpo",
    "sft_no_tool",
    "grpo_no_tool",
    "sft_tool_withheld",
    "ppo_tool_withheld",
    "grpo_tool_withheld",
)


def write_report(args: argparse.Namespace, results: Path, shown: int = 8) -> None:
    """trajectories.md: the accuracy table of every seed found in ``results``, then the first
    held-out prompts of the first seed, SFT beside PPO and GRPO."""
    seeds = sorted(results.glob("seed*.json"))
    if not seeds:
        return
    rows = [json.loads(p.read_text()) for p in seeds]
    for r in rows:  # the ablation when it ran as its own call (--results .../ablation)
        ablation = results / "ablation" / f"seed{r['seed']}.json"
        if ablation.exists():
            r["policies"] = {**json.loads(ablation.read_text())["policies"], **r["policies"]}
    names = [n for n in POLICY_ORDER if all(n in r["policies"] for r in rows)]
    lines = [
        "# Calculator task: greedy exact accuracy on 200 held-out products, before and after RL",
        "",
        "Written by `benchmarks/calculator_task.py`. Accuracy (tool-call rate) per seed.",
        "",
        "| seed | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for r in rows:
        cells = [
            f"{r['policies'][n]['accuracy']:.3f} ({r['policies'][n]['tool_call_rate']:.2f})"
            for n in names
        ]
        lines.append(f"| {r['seed']} | " + " | ".join(cells) + " |")
    first = rows[0]["seed"]
    episodes = {}
    for n in ("sft", "ppo", "grpo", "sft_no_tool"):
        for out in (Path(args.out), Path(f"{args.out}_ablation")):
            path = out / f"seed{first}" / f"episodes_{n}.json"
            if n not in episodes and path.exists():
                episodes[n] = json.loads(path.read_text())
    shown_names = list(episodes)
    if shown_names:
        lines += [
            "",
            f"## The first {shown} held-out prompts of seed {first}, before and after",
            "",
            "Each cell is the whole episode: the model's turns and the observations (the tool's "
            "result) between them; ✓ marks an exact final answer. sft_no_tool: the ablation's "
            "SFT policy (trained to state the product, no tool offered).",
            "",
            "| prompt | answer | " + " | ".join(shown_names) + " |",
            "|---|---|" + "---|" * len(shown_names),
        ]
        for i in range(shown):
            cells = []
            for n in shown_names:
                e = episodes[n][i]
                text = " ⏎ ".join(t["text"] for t in e["turns"]).replace("|", "\\|")
                cells.append(("✓ " if e["correct"] else "✗ ") + f"`{text}`")
            e = episodes[shown_names[0]][i]
            lines.append(f"| {e['prompt']} | {e['answer']} | " + " | ".join(cells) + " |")
    (results / "trajectories.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
