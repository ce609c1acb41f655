"""The demo's synthetic task: name the largest digit of a short list.

A prompt is ``"max 3 8 1 5 ="``; the correct completion is ``" 8"``. True quality ("gold") is
exact: a completion is right when, stripped of spaces, it is the largest digit. The task is
chosen so that a two-layer model can learn the rule (attend to the largest digit) and generalise
it to prompts it never saw, while the data sets tell the classic RLHF story:

- Demonstrations (SFT) come from a sloppy annotator who names the largest digit only
  ``demo_accuracy`` of the time and otherwise another digit of the list: imitation learns the
  format and the annotator's error rate.
- Comparisons (the reward model's preference pairs) are easier to get right than
  demonstrations: the chosen answer is always the largest digit, the rejected one another digit
  of the list (or, a share ``off_list_rejects`` of the time, any other digit), so a reward
  model trained on them knows more than the SFT policy. With no off-list rejects, "a bigger
  digit is better" ranks every pair correctly: a shortcut the reward model can learn instead
  of the rule, and one a policy can exploit by naming a digit that is not in the list.
- RL prompts and held-out evaluation prompts are fresh lists; the evaluation prompts are seen
  by no stage of training.

Every split is drawn from its own seeded generator and no prompt appears in two splits.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

PROMPT_RE = re.compile(r"max((?: \d)+) =")


def make_prompt(digits: list[int]) -> str:
    return "max " + " ".join(str(d) for d in digits) + " ="


def answer_of(prompt: str) -> str:
    """The correct completion's text (without its leading space) for a task prompt."""
    match = PROMPT_RE.fullmatch(prompt.strip())
    if match is None:
        raise ValueError(f"not a task prompt: {prompt!r}")
    return str(max(int(d) for d in match.group(1).split()))


def is_correct(prompt: str, completion: str) -> bool:
    """Exact check: the completion, stripped of surrounding whitespace, is the largest digit."""
    return completion.strip() == answer_of(prompt)


def gold(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    """The verifiable reward (``proxrl.demo.task:gold``): 1 for a correct completion, else 0."""
    return [float(is_correct(p, c)) for p, c in zip(prompts, completions, strict=True)]


def tokenizer_corpus() -> list[str]:
    """Text the demo's byte-level BPE is trained on: the task's words, each digit as ``" d"``."""
    return ["max", " =", *(f" {d}" for d in range(10))] * 20


@dataclass(frozen=True)
class TaskSizes:
    """How many rows each split holds."""

    sft: int = 2000
    preference: int = 2000
    preference_eval: int = 400
    rl: int = 1000
    eval: int = 200
    num_digits: int = 4
    demo_accuracy: float = 0.3
    """Share of demonstrations that name the largest digit (the rest name another digit)."""
    off_list_rejects: float = 0.0
    """Share of rejected answers drawn from all ten digits rather than from the list."""


def _unique_prompts(rng: random.Random, n: int, num_digits: int, taken: set[str]) -> list[str]:
    """``n`` prompts not in ``taken`` (added to it), lists with at least two distinct digits."""
    capacity = 10**num_digits - 10
    if len(taken) + n > capacity:
        raise ValueError(
            f"{n} more prompts do not fit in the {capacity} lists of {num_digits} digits"
        )
    prompts = []
    while len(prompts) < n:
        digits = [rng.randrange(10) for _ in range(num_digits)]
        prompt = make_prompt(digits)
        if len(set(digits)) > 1 and prompt not in taken:
            taken.add(prompt)
            prompts.append(prompt)
    return prompts


def _digits(prompt: str) -> list[int]:
    return [int(d) for d in prompt.split()[1:-1]]


def sloppy_answer(rng: random.Random, prompt: str, accuracy: float) -> str:
    """The annotator: the largest digit with probability ``accuracy``, else another digit of the
    list."""
    best = int(answer_of(prompt))
    others = [d for d in _digits(prompt) if d != best]
    return str(best if rng.random() < accuracy else rng.choice(others))


def wrong_answer(rng: random.Random, prompt: str, off_list: float) -> str:
    """Any digit but the largest: with probability ``off_list`` any of 0-9, else one of the list."""
    best = int(answer_of(prompt))
    others = [d for d in _digits(prompt) if d != best]
    if rng.random() < off_list:
        return str(rng.choice([d for d in range(10) if d != best]))
    return str(rng.choice(others))


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def generate(data_dir: Path, sizes: TaskSizes, seed: int) -> dict[str, Path]:
    """Write the five splits as JSONL under ``data_dir``; returns their paths by name:
    ``sft`` {prompt, completion}, ``preferences`` and ``preferences_eval`` {prompt, chosen,
    rejected}, ``rl_prompts`` and ``eval_prompts`` {prompt, answer}."""
    taken: set[str] = set()
    rng = random.Random(seed)
    split_seeds = {
        name: rng.randrange(2**31) for name in ("sft", "pref", "pref_eval", "rl", "eval")
    }

    def prompts(name: str, n: int) -> tuple[random.Random, list[str]]:
        split_rng = random.Random(split_seeds[name])
        return split_rng, _unique_prompts(split_rng, n, sizes.num_digits, taken)

    eval_rng, eval_prompts = prompts("eval", sizes.eval)  # drawn first: the same for any sizes
    sft_rng, sft_prompts = prompts("sft", sizes.sft)
    pref_rng, pref_prompts = prompts("pref", sizes.preference)
    pref_eval_rng, pref_eval_prompts = prompts("pref_eval", sizes.preference_eval)
    _, rl_prompts = prompts("rl", sizes.rl)

    def pairs(rng_: random.Random, ps: list[str]) -> list[dict]:
        return [
            {
                "prompt": p,
                "chosen": " " + answer_of(p),
                "rejected": " " + wrong_answer(rng_, p, sizes.off_list_rejects),
            }
            for p in ps
        ]

    rows = {
        "sft": [
            {"prompt": p, "completion": " " + sloppy_answer(sft_rng, p, sizes.demo_accuracy)}
            for p in sft_prompts
        ],
        "preferences": pairs(pref_rng, pref_prompts),
        "preferences_eval": pairs(pref_eval_rng, pref_eval_prompts),
        "rl_prompts": [{"prompt": p, "answer": answer_of(p)} for p in rl_prompts],
        "eval_prompts": [{"prompt": p, "answer": answer_of(p)} for p in eval_prompts],
    }
    return {name: write_jsonl(data_dir / f"{name}.jsonl", r) for name, r in rows.items()}
