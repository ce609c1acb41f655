"""The README's GRPO example ("From Python"), run as a user would on ``make demo``'s models:
does it learn, and with which settings?

    PROXRL_NUM_THREADS=1 .venv/bin/python benchmarks/readme_grpo_example.py      # seeds 1 2 3
    PROXRL_NUM_THREADS=1 .venv/bin/python benchmarks/readme_grpo_example.py \
        --demo runs/demo --seeds 1 --learning-rate 1e-6                  # grpo's default

In ``--out`` it writes the README's ``myreward.py`` (its ``score``) and ``prompts.jsonl`` (the
demo's RL prompts, ``{"prompt", "answer"}`` rows), then runs the README's command there, word for
word (``--learning-rate`` may replace its 5e-4), plus ``--seed S`` and ``--output-dir``
(``--api``: its Python example, ``proxrl.grpo(...)`` with the model and tokenizer objects):

    proxrl grpo --model DEMO/sft --prompts prompts.jsonl --reward-fn myreward:score \\
        --max-new-tokens 4 --group-size 4 --iterations 50 --learning-rate 5e-4 ...

Measured per seed: gold (exact accuracy) of the SFT policy and of the trained one on the demo's
200 held-out prompts, 4 samples each at T = 1 (the demo's own evaluation, ``demo.evaluate``), and
the training reward (``objective/scores``) over the first and the last 5 iterations. ``--demo``
must hold a finished ``proxrl demo`` (``make demo`` writes ``runs/demo``). Results:
``OUT/results.json`` (measured: benchmarks/results/readme_grpo/).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REWARD = """def score(prompts, completions, **columns):          # the shape --reward-fn takes
    return [float(c.strip() == a) for c, a in zip(completions, columns["answer"])]
"""
README_COMMAND = (
    "--prompts prompts.jsonl --reward-fn myreward:score --max-new-tokens 4 --group-size 4 "
    "--iterations 50 --learning-rate 5e-4"
)
"""The README example's words after ``--model`` (kept in step with README.md by hand)."""


def gold(demo: Path, policy_dir: Path, seed: int) -> float:
    from proxrl.data.formats import load_prompt_examples
    from proxrl.demo.evaluate import evaluate_policy
    from proxrl.models.causal_lm import load_causal_lm
    from proxrl.models.scalar_head import load_score_model
    from proxrl.models.tokenizer import load_tokenizer
    from proxrl.rollout.rewards import RewardModelReward

    tokenizer = load_tokenizer(str(demo / "sft"))
    reward = RewardModelReward(
        load_score_model(str(demo / "rm")).eval(), load_tokenizer(str(demo / "rm"))
    )
    scores = evaluate_policy(
        load_causal_lm(str(policy_dir)).eval(),
        load_causal_lm(str(demo / "sft")).eval(),
        reward,
        tokenizer,
        load_prompt_examples(str(demo / "data" / "eval_prompts.jsonl")),
        samples_per_prompt=4,
        max_new_tokens=4,
        temperature=1.0,
        seed=seed,
    )
    return round(scores.gold, 3)


def python_example(demo: Path, out: Path, run: Path, seed: int, learning_rate: str) -> None:
    """The README's Python example, as written."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import proxrl

    namespace: dict = {}
    exec(REWARD, namespace)  # noqa: S102 (the README's reward function, above)
    rows = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    proxrl.grpo(
        model=AutoModelForCausalLM.from_pretrained(demo / "sft"),
        tokenizer=AutoTokenizer.from_pretrained(demo / "sft"),
        prompts=rows,
        reward_fn=namespace["score"],
        max_new_tokens=4,
        group_size=4,
        iterations=50,
        learning_rate=float(learning_rate),
        output_dir=str(run),
        seed=seed,
        overwrite=True,
        progress=False,
    )


def window_mean(rows: list[dict], last: bool) -> float:
    values = [r["objective/scores"] for r in rows if "objective/scores" in r]
    values = values[-5:] if last else values[:5]
    return round(sum(values) / len(values), 3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--demo", default="runs/demo")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--out", default="runs/readme_grpo")
    p.add_argument("--learning-rate", default="5e-4", help="in place of the README's 5e-4")
    p.add_argument("--api", action="store_true", help="the README's Python example instead")
    args = p.parse_args()
    demo, out = Path(args.demo).resolve(), Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "myreward.py").write_text(REWARD, encoding="utf-8")
    shutil.copy(demo / "data" / "rl_prompts.jsonl", out / "prompts.jsonl")
    proxrl = str(Path(sys.executable).with_name("proxrl"))
    results = []
    for seed in args.seeds:
        run = out / f"seed{seed}"
        command = [proxrl, "grpo", "--model", str(demo / "sft"), *shlex.split(README_COMMAND)]
        command += ["--output-dir", str(run), "--seed", str(seed), "--overwrite"]
        command += ["--no-progress"]
        command[command.index("--learning-rate") + 1] = args.learning_rate
        started = time.perf_counter()
        if args.api:
            python_example(demo, out, run, seed, args.learning_rate)
        else:
            subprocess.run(command, cwd=out, check=True, env={**os.environ})
        wall = round(time.perf_counter() - started, 1)
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        result = {
            "seed": seed,
            "learning_rate": args.learning_rate,
            "api": args.api,
            "gold_sft": gold(demo, demo / "sft", seed),
            "gold_trained": gold(demo, run, seed),
            "score_first5": window_mean(rows, last=False),
            "score_last5": window_mean(rows, last=True),
            "wall_s": wall,
        }
        print(json.dumps(result), flush=True)
        results.append(result)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
