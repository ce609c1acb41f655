"""On-policy distillation on the demo's task (issue 36): a student samples, the teacher scores
every sampled token, against GRPO with the exact reward and against SFT on the teacher's samples.

    PROXRL_NUM_THREADS=1 .venv/bin/python benchmarks/distill.py --out runs/bench-distill
    PROXRL_NUM_THREADS=1 .venv/bin/python benchmarks/distill.py --seeds 1 --rows sft grpo

For each seed the demo (``proxrl demo``'s defaults) is built once (``algorithms.build_demo``,
kept in ``OUT/seedN``). The teacher is the demo's GRPO policy (gold ~0.96), the student its SFT
policy (gold ~0.25). Every online row trains from the student with the demo's RL budget (100
iterations of 32 prompts × 4 responses, lr 5e-4, 2 epochs, ``algorithms.rl_config``) and
answers the 200 held-out prompts once after every iteration (``eval/score``: gold of one sampled
answer each), which gives the first iteration at 90% of the teacher's gold. Rows:

- ``sft``: the student as it is.
- ``grpo``: the demo's grpo stage (the exact reward, the baseline the published claim compares
  against). The teacher rides along at λ 0 (it scores the samples for the ``distill/`` curves
  and adds nothing: the run is the one without it). With the demo's seed this row repeats the
  run that made the teacher, so it ends at the teacher itself.
- ``opd``: on-policy distillation alone: per-token reward −λ(log π − log π_teacher), λ 1, no
  reward source (the held-out gold is still measured every iteration).
- ``opd_gold``: on-policy distillation plus the exact reward (weight 1).
- ``offpolicy_sft`` (``_rl_lr``: at the RL runs' learning rate 5e-4 instead of the demo's SFT
  one, 3e-3): SFT of the student (the demo's SFT settings, one epoch) on responses the
  teacher samples from the RL prompts (``external_rollouts.write_rollouts_with_transformers``,
  the demo's temperature and length), as many teacher tokens as ``opd`` consumed; also on
  1/64 ... 1/2 of them (each its own run), for the first budget at 90% of the teacher.
- ``arch_*`` and ``wide_*``: students of other shapes (``arch``: hidden 32, 2 heads, 3 layers,
  narrower and deeper; ``wide``: hidden 128, 4 heads, 1 layer; the demo's: 64, 4, 2), the same
  tokenizer, each its own SFT on the demo's SFT data: ``*_sft``, ``*_grpo``, ``*_opd``
  (distilled from the same teacher).
- ``grpo_reseeded``, ``opd_reseeded``: ``grpo`` and ``opd`` with the training seed + 1000.
- ``gjsd``: the supervised generalised JSD on the student's own samples (β 0.5).

Every final policy is scored like the demo's (``demo.evaluate.evaluate_policy``: 4 sampled
answers per held-out prompt, the demo's seed) with the teacher as the reference, so its ``kl``
is the reverse KL(student‖teacher) per response (k1 on the student's samples; 0 for the
teacher). Results: ``OUT/results.json``; the markdown tables are printed.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from algorithms import Row, build_demo, rl_config
from external_rollouts import write_rollouts_with_transformers

from proxrl.algos.offline import sft
from proxrl.algos.online import grpo
from proxrl.data.formats import load_prompt_examples
from proxrl.demo import pipeline, task
from proxrl.demo.evaluate import evaluate_policy
from proxrl.models.causal_lm import load_causal_lm
from proxrl.models.scalar_head import load_score_model
from proxrl.models.tiny import build_tiny_lm
from proxrl.models.tokenizer import load_tokenizer
from proxrl.rollout.rewards import RewardModelReward
from proxrl.runtime.metrics import read_metrics

TEACHER_SHARE = 0.9  # "reached the teacher": held-out gold ≥ this share of the teacher's
DISTILL_COEF = 1.0  # λ (Thinking Machines' on-policy distillation uses 1)
SHAPES = {  # the other students' shapes
    "arch": {"hidden_size": 32, "num_heads": 2, "num_layers": 3},
    "wide": {"hidden_size": 128, "num_heads": 4, "num_layers": 1},
}
OFFPOLICY_SHARES = (0.015625, 0.03125, 0.0625, 0.125, 0.25, 0.5, 1.0)  # of opd's teacher tokens
CURVE_KEYS = (
    "eval/score",
    "reward/gold",
    "response/length_mean",
    "distill/reverse_kl",
    "distill/teacher_logprob",
    "distill/teacher_argmax_agreement",
)


@dataclass(frozen=True)
class OnlineRow:
    name: str
    student: str  # "sft" (the demo's) or a name in SHAPES
    overrides: dict[str, Any] = field(default_factory=dict)  # "{demo}" is the demo's directory
    seed_offset: int = 0  # the run's seed: the demo's + this (0: the teacher's own run's seed)


REWARD_SOURCES = ("reward_model", "reward_fn", "reward_weights")
GOLD_ONLY = {"reward_weights": (0.0, 1.0)}  # as the demo's grpo (reward model logged, weight 0)
NO_REWARD = {"reward_model": None, "reward_fn": (), "reward_weights": ()}  # the teacher alone
DISTILL = {"teacher_model": "{demo}/grpo", "distill_coef": DISTILL_COEF}
# λ 0: the teacher scores the samples for the distill/ metrics and adds nothing to the update
WATCH_TEACHER = {"teacher_model": "{demo}/grpo", "distill_coef": 0.0}
ONLINE_ROWS = [
    OnlineRow("grpo", "sft", GOLD_ONLY | WATCH_TEACHER),
    OnlineRow("opd", "sft", DISTILL | NO_REWARD),
    OnlineRow("opd_gold", "sft", DISTILL | GOLD_ONLY),
    # the same two with another training seed: GRPO then no longer repeats the teacher's run
    OnlineRow("grpo_reseeded", "sft", GOLD_ONLY | WATCH_TEACHER, seed_offset=1000),
    OnlineRow("opd_reseeded", "sft", DISTILL | NO_REWARD, seed_offset=1000),
    OnlineRow("arch_grpo", "arch", GOLD_ONLY | WATCH_TEACHER),
    OnlineRow("arch_opd", "arch", DISTILL | NO_REWARD),
    OnlineRow("wide_grpo", "wide", GOLD_ONLY | WATCH_TEACHER),
    OnlineRow("wide_opd", "wide", DISTILL | NO_REWARD),
    OnlineRow(
        "gjsd",
        "sft",
        DISTILL | NO_REWARD | {"distill_loss": "gjsd", "distill_beta": 0.5},
    ),
]
STUDENT_ROWS = {"sft": "sft", "arch_sft": "arch", "wide_sft": "wide"}  # a student as it is
# off-policy rows: their runs' directory prefix and learning rate (the demo's SFT one, 3e-3, and
# the RL runs' 5e-4, so that the step size per token is not what sets them apart)
OFFPOLICY_ROWS: dict[str, tuple[str, Callable[[pipeline.Config], float]]] = {
    "offpolicy_sft": ("distill_offpolicy", lambda demo: demo.sft_learning_rate),
    "offpolicy_sft_rl_lr": ("distill_offpolicy_rl_lr", lambda demo: demo.rl_learning_rate),
}
ROW_NAMES = [*STUDENT_ROWS, *(r.name for r in ONLINE_ROWS), *OFFPOLICY_ROWS]


def heldout_fields(out: Path) -> dict[str, Any]:
    """One sampled answer per held-out prompt after every iteration, scored by the gold."""
    return {
        "eval_data": str(out / "data" / "eval_prompts.jsonl"),
        "eval_every": 1,
        "eval_reward_fn": pipeline.GOLD_FN,
        "eval_greedy": False,
    }


def score(policy_dir: Path, demo: pipeline.Config, out: Path) -> dict[str, float]:
    """The demo's evaluation of ``policy_dir`` with the teacher as the reference: gold, and the
    reverse KL(policy‖teacher) per response on the policy's samples."""
    tokenizer = load_tokenizer(str(out / "sft"))
    rm = RewardModelReward(
        load_score_model(str(out / "rm")).eval(), load_tokenizer(str(out / "rm"))
    )
    scores = evaluate_policy(
        load_causal_lm(str(policy_dir)).eval(),
        load_causal_lm(str(out / "grpo")).eval(),
        rm,
        tokenizer,
        load_prompt_examples(str(out / "data" / "eval_prompts.jsonl")),
        demo.eval_samples,
        demo.max_new_tokens,
        demo.temperature,
        seed=demo.seed,
    )
    return {"gold": scores.gold, "reverse_kl": scores.kl}


def student_dir(shape: str, demo: pipeline.Config, out: Path) -> Path:
    """The demo's SFT policy ("sft"), or a student of the shape ``SHAPES[shape]``: its own base
    model (the demo's tokenizer corpus, so the same tokenizer, checked) and its own SFT on the
    demo's SFT data with the demo's SFT settings."""
    if shape == "sft":
        return out / "sft"
    student = out / f"{shape}_sft"
    if (student / "model.safetensors").exists():
        return student
    base = build_tiny_lm(
        out / f"{shape}_base",
        task.tokenizer_corpus(),
        vocab_size=300,
        max_positions=64,
        seed=demo.seed,
        **SHAPES[shape],
    )
    if (base / "tokenizer.json").read_text() != (out / "base" / "tokenizer.json").read_text():
        raise SystemExit(f"{shape} student: its tokenizer differs from the demo's")
    sft.train(
        replace(
            pipeline.sft_config(demo, out, out / "data" / "sft.jsonl"),
            model=str(base),
            output_dir=str(student),
        )
    )
    return student


def curve(run_dir: Path, tokens_per_response_mean: Callable[[float], float]) -> dict[str, list]:
    """Per iteration: the logged ``CURVE_KEYS`` (None where absent) and the response tokens
    sampled so far."""
    rows = [r for r in read_metrics(run_dir) if "response/length_mean" in r]
    series: dict[str, list] = {k: [r.get(k) for r in rows] for k in CURVE_KEYS}
    total, cumulative = 0.0, []
    for length in series["response/length_mean"]:
        total += tokens_per_response_mean(length)
        cumulative.append(total)
    series["response_tokens"] = cumulative
    return series


def first_reaching(values: list[float | None], target: float) -> int | None:
    """1-based index of the first value ≥ target (None: never)."""
    return next((i + 1 for i, v in enumerate(values) if v is not None and v >= target), None)


def run_online(row: OnlineRow, demo: pipeline.Config, out: Path, teacher_gold: float) -> dict:
    # rl_config sets the reward sources itself: a row's are put in after
    sources = {k: v for k, v in row.overrides.items() if k in REWARD_SOURCES}
    overrides = {k: v for k, v in row.overrides.items() if k not in REWARD_SOURCES}
    cfg = rl_config(Row(f"distill_{row.name}", "grpo", overrides), demo, out)
    student = student_dir(row.student, demo, out)
    cfg = replace(
        cfg, model=str(student), seed=cfg.seed + row.seed_offset, **sources, **heldout_fields(out)
    )
    started = time.perf_counter()
    grpo.train(cfg)
    wall = time.perf_counter() - started
    series = curve(
        Path(cfg.output_dir), lambda mean: mean * cfg.rollout_batch_size * cfg.group_size
    )
    reached = first_reaching(series["eval/score"], TEACHER_SHARE * teacher_gold)
    return score(Path(cfg.output_dir), demo, out) | {
        "wall_s": wall,
        "iterations_to_target": reached,
        "tokens_to_target": series["response_tokens"][reached - 1] if reached else None,
        "response_tokens": series["response_tokens"][-1],
        "curve": series,
    }


def teacher_samples(out: Path, demo: pipeline.Config, tokens: float) -> list[dict[str, Any]]:
    """Responses of the teacher to the RL prompts, 32 prompts × 4 per round as a rollout, until
    their response tokens (EOS included) reach ``tokens``; cached in ``OUT/teacher_samples``."""
    cache = out / "teacher_samples.jsonl"
    lines = [json.loads(x) for x in cache.read_text().splitlines()] if cache.exists() else []
    if sum(len(x["response_ids"]) for x in lines if x["response"].strip()) < tokens:
        teacher = load_causal_lm(str(out / "grpo")).eval()
        tokenizer = load_tokenizer(str(out / "grpo"))
        prompts = [p.prompt for p in load_prompt_examples(str(out / "data" / "rl_prompts.jsonl"))]
        generator = torch.Generator().manual_seed(demo.seed)
        order = torch.randperm(len(prompts), generator=generator).tolist()
        path = out / "teacher_round.jsonl"
        round_ = len(lines) // (demo.rollout_batch_size * demo.grpo_group_size)
        while sum(len(x["response_ids"]) for x in lines if x["response"].strip()) < tokens:
            start = round_ * demo.rollout_batch_size % len(prompts)
            chosen = [
                prompts[order[(start + i) % len(prompts)]] for i in range(demo.rollout_batch_size)
            ]
            write_rollouts_with_transformers(
                teacher,
                tokenizer,
                chosen,
                demo.grpo_group_size,
                task.gold,
                path,
                demo.seed * 100_003 + round_,
            )
            for text in path.read_text().splitlines():
                line = json.loads(text)
                lines.append(line | {"prompt": chosen[line["group"]]})
            round_ += 1
        cache.write_text("".join(json.dumps(x) + "\n" for x in lines))
    kept, total = [], 0
    for line in lines:
        if total >= tokens:
            break
        if line["response"].strip():  # an SFT row needs a completion; an empty one is dropped
            kept.append(line)
            total += len(line["response_ids"])
    return kept


def run_offpolicy(
    demo: pipeline.Config, out: Path, tokens: float, name: str, learning_rate: float
) -> dict[str, Any]:
    """SFT of the student on the teacher's samples worth ``tokens`` response tokens, one epoch
    with the demo's SFT settings at ``learning_rate``."""
    samples = teacher_samples(out, demo, tokens)
    data = out / f"{name}.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": s["prompt"], "completion": s["response"]}) + "\n" for s in samples
        )
    )
    cfg = replace(
        pipeline.sft_config(demo, out, data),
        model=str(out / "sft"),
        output_dir=str(out / name),
        epochs=1,
        learning_rate=learning_rate,
    )
    started = time.perf_counter()
    sft.train(cfg)
    return score(Path(cfg.output_dir), demo, out) | {
        "wall_s": time.perf_counter() - started,
        "teacher_tokens": sum(len(s["response_ids"]) for s in samples),
        "teacher_responses": len(samples),
        "teacher_sample_gold": statistics.mean(s["reward"] for s in samples),
    }


def teacher_tokens_of(results: dict[str, Any], seed: int) -> tuple[float, str]:
    """The teacher tokens ``opd`` consumed (its sampled response tokens), or, before an ``opd``
    run exists, the GRPO row's (marked so the off-policy rows are redone)."""
    for source in ("opd", "grpo"):
        run = results.get(f"{source}/{seed}")
        if run:
            return run["response_tokens"], source
    raise SystemExit("offpolicy_sft: needs the opd (or grpo) row of the same seed first")


def run_seed(
    seed: int, rows: list[str], root: Path, results: dict[str, Any], save: Callable
) -> None:
    out = root / f"seed{seed}"
    summary = build_demo(out, seed)
    demo = pipeline.Config(output_dir=str(out), seed=seed, progress=False)
    teacher_gold = summary["policies"]["grpo"]["gold"]
    target = TEACHER_SHARE * teacher_gold
    results[f"teacher/{seed}"] = score(out / "grpo", demo, out)
    for name in rows:
        key = f"{name}/{seed}"
        if name in OFFPOLICY_ROWS:
            tokens, source = teacher_tokens_of(results, seed)
            if results.get(key, {}).get("budget_from") != source:
                results[key] = {"budget_from": source, "budgets": {}}
            budgets = results[key]["budgets"]
            prefix, learning_rate = OFFPOLICY_ROWS[name]
            for share in OFFPOLICY_SHARES:
                if str(share) not in budgets:
                    run = run_offpolicy(
                        demo, out, share * tokens, f"{prefix}_{share}", learning_rate(demo)
                    )
                    budgets[str(share)] = run
                    print(f"{key} {share}: gold {run['gold']:.3f}", flush=True)
                    save()
            reached = [float(s) for s, b in budgets.items() if b["gold"] >= target]
            first = min(reached, default=None)
            results[key] |= budgets["1.0"] | {
                "share_to_target": first,
                "tokens_to_target": budgets[str(first)]["teacher_tokens"] if first else None,
            }
        elif key in results:
            continue
        elif name in STUDENT_ROWS:
            results[key] = score(student_dir(STUDENT_ROWS[name], demo, out), demo, out)
        else:
            row = next(r for r in ONLINE_ROWS if r.name == name)
            missing = [k for k in row.overrides if not hasattr(grpo.Config, k)]
            if missing:
                print(f"{key}: skipped, grpo has no {', '.join(missing)} yet", flush=True)
                continue
            results[key] = run_online(row, demo, out, teacher_gold)
        print(f"{key}: gold {results[key]['gold']:.3f}", flush=True)
        save()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/bench-distill")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--rows", nargs="+", default=ROW_NAMES, choices=ROW_NAMES)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    results_file = root / "results.json"
    results: dict[str, Any] = json.loads(results_file.read_text()) if results_file.exists() else {}

    def save() -> None:
        results_file.write_text(json.dumps(results, indent=1))

    for seed in args.seeds:
        run_seed(seed, args.rows, root, results, save)
    save()
    print_tables(results, args.rows, args.seeds)
    print_curves(results, args.rows, args.seeds)
    print_summary(results, args.rows, args.seeds)


def cell(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def share_cell(run: dict[str, Any]) -> str:
    """The first-reaching cell of a row without iterations: never (online) or the budget share."""
    if "curve" in run:
        return "never"
    if "budgets" in run:
        share = run.get("share_to_target")
        return f"{share:g} of the budget" if share else "never"
    return ""


def print_tables(results: dict[str, Any], rows: list[str], seeds: list[int]) -> None:
    """Per row and seed: final gold, reverse KL to the teacher, the first iteration (and response
    tokens) at TEACHER_SHARE of the teacher's gold; then the off-policy budgets."""
    print(
        f"\n| row | seed | gold | reverse KL to teacher | first iteration ≥ {TEACHER_SHARE} × "
        "teacher | response tokens to there | response tokens in all | wall s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for seed in seeds:
        teacher = results.get(f"teacher/{seed}")
        if teacher:
            print(f"| teacher (demo grpo) | {seed} | {teacher['gold']:.3f} | 0 | | | | |")
    for name in rows:
        for seed in seeds:
            run = results.get(f"{name}/{seed}")
            if not run:
                continue
            reached = run.get("iterations_to_target")
            print(
                f"| {name} | {seed} | {run['gold']:.3f} | {run['reverse_kl']:.3f} "
                f"| {reached or share_cell(run)} "
                f"| {cell(run.get('tokens_to_target'), 0)} "
                f"| {cell(run.get('response_tokens', run.get('teacher_tokens')), 0)} "
                f"| {cell(run.get('wall_s'), 0)} |"
            )
    print(
        "\n| off-policy SFT | seed | share of opd's tokens | teacher tokens | teacher responses "
        "| their gold | student gold | reverse KL |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, seed in ((n, s) for n in OFFPOLICY_ROWS for s in seeds):
        run = results.get(f"{name}/{seed}")
        budgets = (run or {}).get("budgets", {})
        for share, b in sorted(budgets.items(), key=lambda item: float(item[0])):
            print(
                f"| {name} | {seed} | {share} | {b['teacher_tokens']} "
                f"| {b['teacher_responses']} | {b['teacher_sample_gold']:.3f} | {b['gold']:.3f} "
                f"| {b['reverse_kl']:.3f} |"
            )


CURVE_AT = (1, 5, 10, 20, 30, 50, 75, 100)  # iterations shown of each curve


def print_curves(results: dict[str, Any], rows: list[str], seeds: list[int]) -> None:
    """Per online row and seed: the held-out gold (one sampled answer per prompt) and the
    training batch's reverse KL to the teacher (``distill/reverse_kl``, per token) at
    ``CURVE_AT``."""
    head = " | ".join(str(i) for i in CURVE_AT)
    print(f"\n| row | seed | series | {head} |")
    print("|---|---|---|" + "---|" * len(CURVE_AT))
    for name in rows:
        for seed in seeds:
            series = (results.get(f"{name}/{seed}") or {}).get("curve")
            if not series:
                continue
            for key, label in (("eval/score", "held-out gold"), ("distill/reverse_kl", "rev. KL")):
                values = series[key]
                picked = [values[i - 1] if i <= len(values) else None for i in CURVE_AT]
                print(f"| {name} | {seed} | {label} | {' | '.join(cell(v) for v in picked)} |")


SMOOTHING = 5  # iterations a held-out curve is averaged over for the steadier first crossing


def steady_reaching(run: dict[str, Any], target: float) -> int | None:
    """The first iteration whose next ``SMOOTHING`` held-out evaluations average ≥ target (one
    evaluation of 200 answers is noisy, and the first of 100 such crossing is biased early)."""
    values = run["curve"]["eval/score"]
    means = [statistics.mean(values[i : i + SMOOTHING]) for i in range(len(values) - SMOOTHING + 1)]
    return first_reaching(means, target)


def print_summary(results: dict[str, Any], rows: list[str], seeds: list[int]) -> None:
    """One line per row over the seeds: gold, the first iteration at TEACHER_SHARE of the
    teacher (single evaluation; steady: averaged over SMOOTHING), and the response tokens (for
    the off-policy row: the teacher tokens of the smallest budget that reaches it)."""
    print(
        f"\n| row | gold per seed | mean | first iteration ≥ {TEACHER_SHARE} × teacher "
        f"(steady: {SMOOTHING}-iteration mean) | response tokens to there |"
    )
    print("|---|---|---|---|---|")
    for name in rows:
        runs = [results.get(f"{name}/{s}") for s in seeds]
        if any(r is None for r in runs):
            continue
        gold = [r["gold"] for r in runs]
        firsts, tokens = [], []
        for seed, run in zip(seeds, runs, strict=True):
            if "curve" in run:
                target = TEACHER_SHARE * results[f"teacher/{seed}"]["gold"]
                steady = steady_reaching(run, target)
                firsts.append(f"{run['iterations_to_target'] or 'never'} ({steady or 'never'})")
            elif "budgets" in run:
                firsts.append(share_cell(run))
            tokens.append(cell(run.get("tokens_to_target"), 0))
        print(
            f"| {name} | {' / '.join(f'{g:.3f}' for g in gold)} | {statistics.mean(gold):.3f} "
            f"| {' / '.join(firsts)} | {' / '.join(tokens)} |"
        )


if __name__ == "__main__":
    main()
