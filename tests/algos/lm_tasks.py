"""Synthetic language tasks a two-layer, 32-wide Llama learns in a few seconds on one CPU core.

- SFT: the completion of "<letters> =" is the same letters (copy), so the per-token loss of
  held-out completions falls well below its starting ~log(V) ≈ 5.7.
- Preferences: the chosen response is drawn from "abcd", the rejected one from "wxyz"; both end
  in "." so the score, read at the last token (EOS), must look back at the response.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

GOOD, BAD = "abcd", "wxyz"
CORPUS = ["abcdefghijklmnopqrstuvwxyz =.:->" * 3, "copy: abc = abc", "prompt chosen rejected"]


def _word(rng: random.Random, letters: str, low: int = 3, high: int = 6) -> str:
    return "".join(rng.choice(letters) for _ in range(rng.randint(low, high)))


def sft_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        word = _word(rng, "abcdefgh")
        rows.append({"prompt": f"copy: {word} =", "completion": f" {word}"})
    return rows


def preference_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "prompt": f"say: {_word(rng, 'efghijkl')} ->",
            "chosen": f" {_word(rng, GOOD)}.",
            "rejected": f" {_word(rng, BAD)}.",
        }
        for _ in range(n)
    ]


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)
