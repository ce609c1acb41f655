"""The running-sum task (issue 35): long responses, one final reward. The worked sum and the
annotator's slips by hand, the exact final-answer check, splits without shared prompts, and
responses of 30–80 model tokens (one token per character) on the task's own tokenizer."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from proxrl.demo import running_sum as task
from proxrl.models.tiny import build_tiny_tokenizer


def test_the_worked_sum_by_hand():
    assert task.make_prompt([3, 8, 5, 2, 9, 1]) == "sum a3 b8 c5 d2 e9 f1 ="
    assert task.worked([3, 8, 5, 2, 9, 1]) == " a3+b8=11 c5=16 d2=18 e9=27 f1=28 = 28"
    # a slip of −1 at step 2 (c's partial sum 15, not 16) carries on to a wrong total
    assert task.worked([3, 8, 5, 2], 2, -1) == " a3+b8=11 c5=15 d2=17 = 17"
    assert task.answer_of("sum a3 b8 c5 d2 =") == "18"
    assert task.digits_of("sum a3 b8 =") == [3, 8]


def test_only_the_final_answer_is_read():
    prompt = "sum a3 b8 c5 d2 ="
    assert task.is_correct(prompt, " a3+b8=11 c5=16 d2=18 = 18")
    assert task.is_correct(prompt, " a1+b1=2 = 18")  # wrong steps, right total: rewarded
    assert not task.is_correct(prompt, " a3+b8=11 c5=16 d2=18 = 17")
    assert not task.is_correct(prompt, " a3+b8=11 c5=16 d2=18")  # the last step is not a total
    assert not task.is_correct(prompt, " a3+b8=11 c5=16 d2=18 = 18 +")
    assert task.gold([prompt, prompt], [" = 18", " = 1"]) == [1.0, 0.0]
    with pytest.raises(ValueError, match="not a running-sum prompt"):
        task.answer_of("max 3 8 =")


def test_the_annotator_slips_once_by_one_or_two():
    rng = random.Random(0)
    digits = [3, 8, 5, 2, 9, 1, 4]
    completions = [task.sloppy_completion(rng, digits, 0.5) for _ in range(400)]
    right = sum(c == task.worked(digits) for c in completions)
    assert 150 < right < 250
    for c in completions:
        total = int(task.final_answer(c))
        assert total - sum(digits) in (-2, -1, 0, 1, 2)


def test_splits_and_response_lengths(tmp_path: Path):
    sizes = task.TaskSizes(sft=300, rl=100, eval=50)
    paths = task.generate(tmp_path / "data", sizes, seed=1)
    rows = {name: [json.loads(line) for line in p.open()] for name, p in paths.items()}
    prompts = [r["prompt"] for split in rows.values() for r in split]
    assert len(prompts) == len(set(prompts)) == 450
    assert {len(task.digits_of(p)) for p in prompts} == set(range(6, 13))
    tokenizer = build_tiny_tokenizer(task.tokenizer_corpus(), 300)
    for row in rows["sft"]:
        ids = tokenizer(row["completion"])["input_ids"]
        assert len(ids) == len(row["completion"])  # one token per character
        assert 30 <= len(ids) + 1 <= 80  # with EOS
    assert [r["answer"] for r in rows["eval_prompts"]] == [
        task.answer_of(r["prompt"]) for r in rows["eval_prompts"]
    ]
