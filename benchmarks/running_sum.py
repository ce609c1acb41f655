"""Critic PPO for long responses (issue 35) on the running-sum task (``proxrl.demo.running_sum``):
SFT on a sloppy annotator, then, from the same SFT policy and with the same budget, PPO with
today's defaults, PPO with ``critic_lam`` 1.0, PPO with VAPO's set (decoupled λ, length-adaptive
λ, value pretraining, positive-example NLL) and GRPO, on the exact final-answer reward.

    PROXRL_NUM_THREADS=1 nice -n 19 .venv/bin/python benchmarks/running_sum.py  # seeds 1 2 3
    PROXRL_NUM_THREADS=1 .venv/bin/python benchmarks/running_sum.py --seeds 1 --runs sft ppo

Per seed, under ``--out`` (default runs/running_sum/seed<N>): the data and the tiny Llama built
from scratch, ``sft``, then one directory per RL run. The digits are 0–4 by default
(``--largest-digit``): in trial SFT runs (seed 1, 10 epochs) the tiny model reached 0.06 gold
on 0–9 and 0.12 on 0–4, and 0.06 leaves too few right answers for 12 iterations of RL to learn
from; with 0–1 and an annotator right on 80% (``--largest-digit 1 --demo-accuracy 0.8``) SFT
reaches about 0.4 (results/running_sum/digits01/). Each seed is one process (``--seeds 1``,
``--seeds 2``, ``--seeds 3`` side by side).

VC-PPO's setting, a critic started from a reward model: ``rm`` trains a Bradley–Terry reward
model from the SFT policy on the SFT prompts (the worked sum over the annotator's slipped one,
a tenth held out), and ``ppo_rm_critic`` (today's defaults), ``ppo_rm_critic_vc`` (``critic_lam``
1 and value pretraining) and ``ppo_rm_critic_vapo`` (VAPO's set) start their critic from it; the
reward stays the exact gold one. ``ppo_rm_critic_vc_alpha`` and ``ppo_rm_critic_vc_nll`` are
VAPO's set less one of its two additions to VC-PPO (the positive NLL, the length-adaptive λ).

    .venv/bin/python benchmarks/running_sum.py --runs sft rm ppo ppo_rm_critic ppo_rm_critic_vc
Every policy is scored on the same held-out prompts, one response each sampled at temperature 1:
gold accuracy (exact total) and mean response length in tokens; each PPO run's
``value/explained_var`` (first, last, and its median over the last quarter of iterations) comes
from its metrics.jsonl. Writes
``benchmarks/results/running_sum/seed<N>.json`` and ``table.md`` (every seed as measured).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "running_sum"
GOLD_FN = "proxrl.demo.running_sum:gold"
RL_RUNS = ("ppo", "ppo_critic_lam1", "ppo_vapo", "grpo")
# PPO with its critic started from a reward model trained on the task (VC-PPO's setting: a value
# head that scores only finished responses is biased at the tokens before the end); `rm` trains it
RM_RUNS = ("ppo_rm_critic", "ppo_rm_critic_vc", "ppo_rm_critic_vapo")
# VAPO's set less one piece each (which of its two additions to VC-PPO moves the result)
ABLATIONS = ("ppo_rm_critic_vc_alpha", "ppo_rm_critic_vc_nll")
ALL_RUNS = ("sft", "rm", *RL_RUNS, *RM_RUNS, *ABLATIONS)

# Each PPO variant's options beyond the shared ones (today's defaults: lam 0.95 for both).
PPO_VARIANTS: dict[str, dict[str, Any]] = {
    "ppo": {},
    "ppo_critic_lam1": {"critic_lam": 1.0},
    "ppo_vapo": {
        "critic_lam": 1.0,
        "length_adaptive_alpha": 0.05,
        "positive_nll_coef": 0.1,
    },  # and value pretraining: critic_warmup_iterations = --vapo-warmup, inside the budget
    "ppo_rm_critic": {},
    "ppo_rm_critic_vc": {"critic_lam": 1.0},  # and value pretraining (VC-PPO)
    "ppo_rm_critic_vapo": {
        "critic_lam": 1.0,
        "length_adaptive_alpha": 0.05,
        "positive_nll_coef": 0.1,
    },  # and value pretraining
    "ppo_rm_critic_vc_alpha": {"critic_lam": 1.0, "length_adaptive_alpha": 0.05},
    "ppo_rm_critic_vc_nll": {"critic_lam": 1.0, "positive_nll_coef": 0.1},
}
PRETRAINED_CRITIC = ("ppo_vapo", "ppo_rm_critic_vc", "ppo_rm_critic_vapo", *ABLATIONS)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--runs", nargs="*", default=["sft", *RL_RUNS], choices=ALL_RUNS)
    p.add_argument("--out", default="runs/running_sum")
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--sft-examples", type=int, default=2000)
    p.add_argument("--demo-accuracy", type=float, default=0.5)
    p.add_argument("--largest-digit", type=int, default=4)
    p.add_argument("--sft-epochs", type=int, default=8)
    p.add_argument("--sft-learning-rate", type=float, default=5e-3)
    p.add_argument("--rm-epochs", type=int, default=2, help="`rm`: the reward model's epochs")
    p.add_argument("--rm-learning-rate", type=float, default=1e-3)
    p.add_argument("--iterations", type=int, default=12)
    p.add_argument("--rollout-batch-size", type=int, default=16, help="prompts per iteration")
    p.add_argument("--group-size", type=int, default=4, help="responses per prompt (every run)")
    p.add_argument("--rl-learning-rate", type=float, default=5e-4)
    p.add_argument("--critic-learning-rate", type=float, default=1e-3)
    p.add_argument(
        "--vapo-warmup",
        type=int,
        default=2,
        help="value pretraining of " + ", ".join(PRETRAINED_CRITIC) + ", of --iterations",
    )
    p.add_argument("--eval-prompts", type=int, default=100)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--plot-only", action="store_true", help="table.md and curves.png of --out")
    return p.parse_args()


def sft_stage(args: argparse.Namespace, out: Path, data: Path, seed: int) -> None:
    from proxrl.algos.offline import sft

    sft.train(
        sft.Config(
            model=str(out / "base"),
            data=str(data),
            output_dir=str(out / "sft"),
            epochs=args.sft_epochs,
            learning_rate=args.sft_learning_rate,
            batch_size=32,
            lr_schedule="linear",
            warmup_steps=10,
            max_length=128,
            seed=seed,
            progress=False,
            overwrite=True,
        )
    )


def rm_stage(args: argparse.Namespace, out: Path, seed: int) -> None:
    """A Bradley–Terry reward model from the SFT policy: per SFT prompt, the worked sum (chosen)
    against the annotator's slipped one (rejected), the pairs a right/wrong total makes."""
    import random

    from proxrl.algos.offline import reward
    from proxrl.demo import running_sum

    rng = random.Random(seed)
    rows = []
    for line in (out / "data" / "sft.jsonl").open():
        digits = running_sum.digits_of(json.loads(line)["prompt"])
        rows.append(
            {
                "prompt": running_sum.make_prompt(digits),
                "chosen": running_sum.worked(digits),
                "rejected": running_sum.sloppy_completion(rng, digits, accuracy=0.0),
            }
        )
    held_out = len(rows) // 10
    running_sum.write_jsonl(out / "data" / "preferences.jsonl", rows[held_out:])
    running_sum.write_jsonl(out / "data" / "preferences_eval.jsonl", rows[:held_out])
    reward.train(
        reward.Config(
            model=str(out / "sft"),
            data=str(out / "data" / "preferences.jsonl"),
            eval_data=str(out / "data" / "preferences_eval.jsonl"),
            output_dir=str(out / "rm"),
            epochs=args.rm_epochs,
            learning_rate=args.rm_learning_rate,
            batch_size=32,
            lr_schedule="linear",
            warmup_steps=10,
            max_length=128,
            seed=seed,
            progress=False,
            overwrite=True,
        )
    )


def rl_fields(args: argparse.Namespace, out: Path, name: str, seed: int) -> dict[str, Any]:
    """What every RL run shares: the same prompts, samples per iteration and updates."""
    return dict(
        output_dir=str(out / name),
        prompts=str(out / "data" / "rl_prompts.jsonl"),
        model=str(out / "sft"),
        reward_fn=(GOLD_FN,),
        iterations=args.iterations,
        rollout_batch_size=args.rollout_batch_size,
        group_size=args.group_size,
        mini_batch_size=args.rollout_batch_size * args.group_size // 2,
        ppo_epochs=1,
        max_new_tokens=96,
        temperature=1.0,
        learning_rate=args.rl_learning_rate,
        kl_coef=0.0,
        seed=seed,
        progress=False,
        overwrite=True,
        save_every=0,
    )


def rl_stage(args: argparse.Namespace, out: Path, name: str, seed: int) -> None:
    from proxrl.algos.online import grpo, ppo

    fields = rl_fields(args, out, name, seed)
    if name == "grpo":
        grpo.train(grpo.Config(**fields, estimator="grpo"))
        return
    ppo.train(
        ppo.Config(
            **fields,
            critic_model=str(out / "rm") if name in (*RM_RUNS, *ABLATIONS) else "policy",
            critic_learning_rate=args.critic_learning_rate,
            **PPO_VARIANTS[name],
            **({"critic_warmup_iterations": args.vapo_warmup} if name in PRETRAINED_CRITIC else {}),
        )
    )


def score(policy_dir: Path, prompts: list[str], seed: int) -> dict[str, float]:
    """Gold accuracy and mean response length (tokens, EOS included) of one response per prompt
    sampled at temperature 1."""
    import torch

    from proxrl.data.batching import pad_left
    from proxrl.demo.running_sum import is_correct
    from proxrl.models.causal_lm import load_causal_lm
    from proxrl.models.tokenizer import load_tokenizer
    from proxrl.rollout.generation import CachedSampler, SamplingSettings

    model = load_causal_lm(str(policy_dir)).eval()
    tokenizer = load_tokenizer(str(policy_dir))
    sampler = CachedSampler(model, tokenizer)
    ids = [tokenizer(p)["input_ids"] for p in prompts]
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        sampled = sampler.sample(
            pad_left(ids, tokenizer.pad_token_id),
            pad_left([[1] * len(r) for r in ids], 0),
            SamplingSettings(max_new_tokens=96, temperature=1.0),
        )
    texts = tokenizer.batch_decode(sampled.response_ids, skip_special_tokens=True)
    correct = [is_correct(p, c) for p, c in zip(prompts, texts, strict=True)]
    return {
        "gold": sum(correct) / len(correct),
        "length": float(sampled.response_mask.sum(1).float().mean()),
    }


def rm_accuracy(run_dir: Path) -> dict[str, float]:
    """The reward model's last held-out accuracy (right total over slipped one)."""
    from proxrl.runtime.metrics import read_metrics

    evals = [r for r in read_metrics(run_dir) if "eval/accuracy" in r]
    return {"eval_accuracy": evals[-1]["eval/accuracy"]} if evals else {}


def rm_value_profile(out: Path, prompts: list[str]) -> dict[str, Any]:
    """Where a critic started from the reward model begins: its raw head, read at every token of
    the worked sum and of a slipped one per prompt, averaged by tenth of the response (the value
    of the state each token is drawn from, as GAE reads it), and its score at the last token."""
    import random

    import torch

    from proxrl.demo import running_sum
    from proxrl.models.scalar_head import load_score_model
    from proxrl.models.tokenizer import load_tokenizer

    model = load_score_model(str(out / "rm"), new_head="zero").eval()
    tokenizer = load_tokenizer(str(out / "rm"))
    rng = random.Random(0)
    tenths: list[list[float]] = [[] for _ in range(10)]
    final: dict[str, list[float]] = {"right": [], "slipped": []}
    for prompt in prompts:
        digits = running_sum.digits_of(prompt)
        prompt_ids = tokenizer(prompt)["input_ids"]
        for kind, completion in (
            ("right", running_sum.worked(digits)),
            ("slipped", running_sum.sloppy_completion(rng, digits, accuracy=0.0)),
        ):
            response = tokenizer(completion)["input_ids"] + [tokenizer.eos_token_id]
            with torch.no_grad():
                hidden = model.model(input_ids=torch.tensor([prompt_ids + response]))
                scores = model.score(hidden.last_hidden_state)[0, :, 0].tolist()
            values = scores[len(prompt_ids) - 1 : -1]
            for index, value in enumerate(values):
                tenths[10 * index // len(values)].append(value)
            final[kind].append(scores[-1])
    mean = lambda xs: round(sum(xs) / len(xs), 3)  # noqa: E731
    return {
        "value_by_tenth": [mean(t) for t in tenths],
        "score_at_end": {kind: mean(xs) for kind, xs in final.items()},
    }


def value_curve(run_dir: Path) -> dict[str, Any]:
    """``value/explained_var`` per iteration of a PPO run, and its summary."""
    from proxrl.runtime.metrics import read_metrics

    curve = [r["value/explained_var"] for r in read_metrics(run_dir) if "value/explained_var" in r]
    if not curve:
        return {}
    tail = sorted(curve[-max(1, len(curve) // 4) :])
    return {
        "explained_var_first": curve[0],
        "explained_var_last": curve[-1],
        # the median: a rollout whose every score is 0 has constant value targets (λ = 1) and an
        # explained variance of −1e14, which would swamp a mean
        "explained_var_last_quarter": tail[len(tail) // 2],
        "explained_var_curve": curve,
    }


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    from proxrl.demo import running_sum
    from proxrl.runtime.seeding import seed_everything

    out = Path(args.out) / f"seed{seed}"
    out.mkdir(parents=True, exist_ok=True)
    seed_everything(seed)
    sizes = running_sum.TaskSizes(
        sft=args.sft_examples,
        eval=args.eval_prompts,
        demo_accuracy=args.demo_accuracy,
        largest_digit=args.largest_digit,
    )
    data = running_sum.generate(out / "data", sizes, seed)
    if not (out / "base" / "config.json").exists():
        running_sum.build_base(
            out / "base", seed=seed, hidden_size=args.hidden_size, num_layers=args.num_layers
        )
    prompts = [json.loads(line)["prompt"] for line in data["eval_prompts"].open()]
    result: dict[str, Any] = {"seed": seed, "policies": {}, "wall_s": {}}
    for name in args.runs:
        started = time.perf_counter()
        if name == "sft":
            sft_stage(args, out, data["sft"], seed)
        elif name == "rm":
            rm_stage(args, out, seed)
            result["wall_s"][name] = round(time.perf_counter() - started, 1)
            result["rm"] = rm_accuracy(out / "rm") | rm_value_profile(out, prompts[:40])
            continue
        else:
            rl_stage(args, out, name, seed)
        result["wall_s"][name] = round(time.perf_counter() - started, 1)
        scores: dict[str, Any] = score(out / name, prompts, seed)
        if name.startswith("ppo"):
            scores |= value_curve(out / name)
        result["policies"][name] = scores
        logging.info(
            "[running_sum] seed %d %s: gold %.3f, length %.1f, %.0f s",
            seed,
            name,
            scores["gold"],
            scores["length"],
            result["wall_s"][name],
        )
    result["settings"] = {k: v for k, v in vars(args).items() if k not in ("seeds", "results")}
    return result


def refresh_value_curves(out: Path, results: Path) -> None:
    """Recompute each PPO run's explained-variance summary in seed<N>.json from its metrics, and
    the reward model's summary where the seed has one."""
    for path in sorted(results.glob("seed*.json")):
        result = json.loads(path.read_text())
        seed_dir = out / f"seed{result['seed']}"
        if (seed_dir / "rm" / "config.json").is_file():
            prompts = [
                json.loads(x)["prompt"] for x in (seed_dir / "data" / "eval_prompts.jsonl").open()
            ]
            result["rm"] = rm_accuracy(seed_dir / "rm") | rm_value_profile(seed_dir, prompts[:40])
        for name, scores in result["policies"].items():
            run_dir = out / f"seed{result['seed']}" / name
            if name.startswith("ppo") and run_dir.is_dir():
                scores.update(value_curve(run_dir))
        path.write_text(json.dumps(result, indent=2) + "\n")


def write_table(results: Path) -> None:
    """table.md: every seed as measured, and the mean over seeds."""
    rows = [json.loads(p.read_text()) for p in sorted(results.glob("seed*.json"))]
    names = [n for n in ALL_RUNS if any(n in r["policies"] for r in rows)]
    lines = [
        "| run | " + " | ".join(f"seed {r['seed']}" for r in rows) + " | mean |",
        "|---|" + "---|" * (len(rows) + 1),
    ]
    for name in names:
        cells, golds = [], []
        for r in rows:
            p = r["policies"].get(name)
            if p is None:
                cells.append("—")
                continue
            golds.append(p["gold"])
            ev = p.get("explained_var_last_quarter")
            ev_text = f", EV {ev:.2f}" if ev is not None else ""
            cells.append(f"{p['gold']:.3f} ({p['length']:.0f} tok{ev_text})")
        mean = f"{sum(golds) / len(golds):.3f}" if golds else "—"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {mean} |")
    rm = [f"{r['rm']['eval_accuracy']:.3f}" for r in rows if r.get("rm")]
    if rm:
        accuracies = ", ".join(rm)
        lines.append(f"\nThe critics' reward model, held-out pair accuracy: {accuracies}")
    (results / "table.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


CURVES = (
    ("objective/scores", "training reward (gold)"),
    ("response/length_mean", "response length (tokens)"),
    ("value/explained_var", "value explained variance"),
)


def plot(out: Path, results: Path) -> None:
    """curves.png: each RL run's training reward, response length and value explained variance
    per iteration, the mean over the seeds found under ``out`` (every seed thin, the mean bold)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from proxrl.runtime.metrics import read_metrics

    fig, axes = plt.subplots(1, len(CURVES), figsize=(13, 3.6))
    for index, name in enumerate((*RL_RUNS, *RM_RUNS)):
        color = f"C{index}"
        runs = [read_metrics(d / name) for d in sorted(out.glob("seed*")) if (d / name).is_dir()]
        for ax, (key, title) in zip(axes, CURVES, strict=True):
            curves = [[r[key] for r in rows if key in r] for rows in runs]
            curves = [c for c in curves if c]
            if not curves:
                continue
            for c in curves:
                ax.plot(range(1, len(c) + 1), c, color=color, alpha=0.25, lw=0.8)
            width = min(len(c) for c in curves)
            mean = [sum(c[i] for c in curves) / len(curves) for i in range(width)]
            ax.plot(range(1, width + 1), mean, color=color, lw=2, label=name)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("iteration", fontsize=8)
    axes[-1].set_ylim(-1, 1)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(results / "curves.png", dpi=90)


def main() -> None:
    args = parse_args()
    if args.plot_only:
        refresh_value_curves(Path(args.out), Path(args.results))
        plot(Path(args.out), Path(args.results))
        write_table(Path(args.results))
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ.setdefault("PROXRL_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        result = run_seed(args, seed)
        path = results / f"seed{seed}.json"
        if path.exists():  # runs of another call on the same seed are kept
            before = json.loads(path.read_text())
            result["policies"] = {**before.get("policies", {}), **result["policies"]}
            result["wall_s"] = {**before.get("wall_s", {}), **result["wall_s"]}
            result.setdefault("rm", before.get("rm"))
        path.write_text(json.dumps(result, indent=2) + "\n")
        write_table(results)


if __name__ == "__main__":
    main()
