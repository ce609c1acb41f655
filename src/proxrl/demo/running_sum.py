"""A task with long responses and only a final reward: the running sum of 6–12 digits, written
step by step.

A prompt is ``"sum a3 b8 c5 d2 e9 f1 ="``; the correct completion writes every partial sum
and then the total::

     a3+b8=11 c5=16 d2=18 e9=27 f1=28 = 28

(``c5=16``: add c's 5, the sum so far is 16.) Each digit carries its letter so that a tiny model
finds the next one by content (the letter after the last one it wrote), not by counting
positions, which two layers do not learn from a few thousand examples. Every character is a
token of the tiny tokenizer (``tokenizer_corpus`` never puts two of them side by side, so BPE
learns no merge), so a response is 39–80 model tokens long (6 digits: 39 with EOS; 12 digits:
about 76), and the reward is paid once, at its end: 1 when the number after
the last ``=`` is the sum of the digits, else 0 (``gold``). The steps themselves earn nothing: a
critic has to carry the final reward back over tens of tokens, which is what GAE's λ and the
critic's bias decide (issue 35, benchmarks/running_sum.py).

Demonstrations (SFT rows) come from a sloppy annotator in the demo's way: with probability
``1 − demo_accuracy`` it slips once, at a random step, writing a partial sum off by 1 or 2, and
carries on correctly from its wrong number, so its total is wrong. Imitation learns the format,
the addition and the annotator's slips; RL with the exact reward learns that slips do not pay.

Every split is drawn from its own seeded generator and no prompt appears in two splits.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

PROMPT_RE = re.compile(r"sum((?: [a-z]\d)+) =")
FINAL_RE = re.compile(r" = (\d+)\s*$")  # the total line; a step has no space before =


LABELS = "abcdefghijklmnopqrstuvwxyz"


def make_prompt(digits: list[int]) -> str:
    return "sum " + " ".join(f"{LABELS[i]}{d}" for i, d in enumerate(digits)) + " ="


def digits_of(prompt: str) -> list[int]:
    match = PROMPT_RE.fullmatch(prompt.strip())
    if match is None:
        raise ValueError(f"not a running-sum prompt: {prompt!r}")
    return [int(item[1]) for item in match.group(1).split()]


def answer_of(prompt: str) -> str:
    """The total (the final answer's text) of a task prompt."""
    return str(sum(digits_of(prompt)))


def worked(digits: list[int], slip_step: int | None = None, slip: int = 0) -> str:
    """The step-by-step completion, with a leading space: ``" a3+b8=11 c5=16 = 16"``; with
    ``slip_step`` s (1-based, ≥ 1), the partial sum written at step s is off by ``slip`` and the
    later steps carry on from it."""
    total = digits[0] + digits[1] + (slip if slip_step == 1 else 0)
    parts = [f"a{digits[0]}+b{digits[1]}={total}"]
    for step, digit in enumerate(digits[2:], start=2):
        total += digit + (slip if slip_step == step else 0)
        parts.append(f"{LABELS[step]}{digit}={total}")
    return " " + " ".join(parts) + f" = {total}"


def final_answer(completion: str) -> str | None:
    """The total after the completion's closing `` = `` (None when it does not end in one)."""
    match = FINAL_RE.search(completion)
    return match.group(1) if match else None


def is_correct(prompt: str, completion: str) -> bool:
    """Exact check of the final answer only (the steps are not read)."""
    return final_answer(completion) == answer_of(prompt)


def gold(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    """The verifiable reward (``proxrl.demo.running_sum:gold``): 1 for a correct final answer."""
    return [float(is_correct(p, c)) for p, c in zip(prompts, completions, strict=True)]


def tokenizer_corpus() -> list[str]:
    """Each symbol of the task on its own (no two side by side: BPE learns no merge, so every
    digit, letter, ``+``, ``=`` and space is one token), and the prompt's word."""
    return ["sum", " ", "+", "=", *(str(d) for d in range(10)), *LABELS] * 20


@dataclass(frozen=True)
class TaskSizes:
    """How many rows each split holds, and the task's knobs."""

    sft: int = 2000
    rl: int = 1000
    eval: int = 200
    min_digits: int = 6
    max_digits: int = 12
    demo_accuracy: float = 0.5
    """Share of demonstrations without a slip (the rest slip once, so their total is wrong)."""
    largest_digit: int = 9
    """Digits are drawn from 0..largest_digit."""


def sloppy_completion(rng: random.Random, digits: list[int], accuracy: float) -> str:
    """The annotator: the worked sum with probability ``accuracy``, else one slip of ±1 or ±2
    at a random step (never below 0), carried on to the end."""
    if rng.random() < accuracy:
        return worked(digits)
    step = rng.randrange(1, len(digits))
    partial = sum(digits[: step + 1])
    slips = [s for s in (-2, -1, 1, 2) if partial + s >= 0]
    return worked(digits, step, rng.choice(slips))


def _unique_prompts(rng: random.Random, n: int, sizes: TaskSizes, taken: set[str]) -> list[str]:
    prompts: list[str] = []
    while len(prompts) < n:
        length = rng.randint(sizes.min_digits, sizes.max_digits)
        prompt = make_prompt([rng.randint(0, sizes.largest_digit) for _ in range(length)])
        if prompt not in taken:
            taken.add(prompt)
            prompts.append(prompt)
    return prompts


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def generate(data_dir: Path, sizes: TaskSizes, seed: int) -> dict[str, Path]:
    """Write ``sft`` {prompt, completion}, ``rl_prompts`` and ``eval_prompts`` {prompt, answer}
    as JSONL under ``data_dir``; returns their paths by name."""
    if not 2 <= sizes.min_digits <= sizes.max_digits:
        raise ValueError(
            f"digits: expected 2 <= min <= max, got {sizes.min_digits}..{sizes.max_digits}"
        )
    taken: set[str] = set()
    rng = random.Random(seed)
    split_seeds = {name: rng.randrange(2**31) for name in ("sft", "rl", "eval")}
    rngs = {name: random.Random(s) for name, s in split_seeds.items()}
    eval_prompts = _unique_prompts(rngs["eval"], sizes.eval, sizes, taken)  # first: fixed
    sft_prompts = _unique_prompts(rngs["sft"], sizes.sft, sizes, taken)
    rl_prompts = _unique_prompts(rngs["rl"], sizes.rl, sizes, taken)
    rows = {
        "sft": [
            {
                "prompt": p,
                "completion": sloppy_completion(rngs["sft"], digits_of(p), sizes.demo_accuracy),
            }
            for p in sft_prompts
        ],
        "rl_prompts": [{"prompt": p, "answer": answer_of(p)} for p in rl_prompts],
        "eval_prompts": [{"prompt": p, "answer": answer_of(p)} for p in eval_prompts],
    }
    return {name: write_jsonl(data_dir / f"{name}.jsonl", r) for name, r in rows.items()}


def build_base(
    output_dir: str | Path,
    *,
    seed: int,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    max_positions: int = 160,
) -> Path:
    """The tiny Llama built from scratch (``models.tiny``) with this task's tokenizer."""
    from proxrl.models.tiny import build_tiny_lm

    return build_tiny_lm(
        output_dir,
        tokenizer_corpus(),
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        vocab_size=300,
        max_positions=max_positions,
        seed=seed,
    )
