"""A rollouts file goes through one schema (issue 49): every column named (a misspelt one is
refused with the column it likely means, not dropped), log-probabilities finite and <= 0,
per-token columns as long as the response, prompt + response within the model's context, and
something to train in every row; a bad row is one line naming file:line (Parquet: file:row N)
and the field, given before the run's output directory is touched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxrl.algos.online import grpo
from proxrl.algos.online.rollouts_file import (
    Limits,
    RolloutsFile,
    read_rollouts,
    rollout_row,
    validate_rollouts_file,
)
from proxrl.runtime.config import narrowed
from proxrl.runtime.errors import ProxrlError

GOOD = {
    "prompt_ids": [5, 6],
    "response_ids": [7, 8],
    "logprobs": [-0.5, -1.0],
    "reward": 1.0,
    "group": "a",
}
LIMITS = Limits(vocab_size=300, group_size=2, max_prompt_length=8, max_new_tokens=8)


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    """``rows`` one per line, as JSON writes them (``-Infinity`` and ``NaN`` included)."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _refused(tmp_path: Path, second: dict[str, Any]) -> str:
    """The message for a file whose second line is ``second`` (line numbers count from 1)."""
    path = _jsonl(tmp_path / "rollouts.jsonl", [GOOD, second])
    with pytest.raises(ProxrlError) as refused:
        read_rollouts(path, None, LIMITS)
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_a_good_file_reads(tmp_path):
    first = {**GOOD, "loss_mask": [1, 0], "rewards": [0.5, 0.0], "reward": None}
    rows = read_rollouts(_jsonl(tmp_path / "r.jsonl", [first, GOOD]), None, LIMITS)
    assert [r.score for r in rows] == [0.5, 1.0] and rows[0].loss_mask == [1, 0]
    assert [r.where for r in rows] == [f"{tmp_path}/r.jsonl:1", f"{tmp_path}/r.jsonl:2"]


def test_an_unknown_column_is_refused_with_the_one_it_likely_means(tmp_path):
    """A misspelt loss_mask was dropped, and the observation tokens trained as the policy's."""
    message = _refused(tmp_path, {**GOOD, "loss_masks": [1, 0]})
    assert (
        message
        == f"{tmp_path}/rollouts.jsonl:2: loss_masks: unknown column; did you mean loss_mask?"
    )
    message = _refused(tmp_path, {**GOOD, "advantage": [1.0, 1.0]})
    assert message.endswith(
        ":2: advantage: unknown column; expected prompt_ids, response_ids, logprobs, group, "
        "reward, rewards, loss_mask, response"
    )


@pytest.mark.parametrize(
    ("logprobs", "mask", "message"),
    [
        # -inf passed `<= 0`, and the run skipped every update step without a word
        ([-0.5, float("-inf")], None, "logprobs: expected finite log-probabilities <= 0, got -inf"),
        ([-0.5, 0.25], None, "logprobs: expected finite log-probabilities <= 0, got 0.25"),
        # masked by multiplication: -inf × 0 is NaN, so an observation's value must be finite too
        (
            [-0.5, float("-inf")],
            [1, 0],
            "logprobs: expected a finite number at token 1 (loss_mask 0: any finite value), "
            "got -inf",
        ),
    ],
    ids=["minus-infinity", "positive", "minus-infinity-on-an-observation"],
)
def test_a_log_probability_must_be_finite_and_at_most_0(tmp_path, logprobs, mask, message):
    second = {**GOOD, "logprobs": logprobs} | ({} if mask is None else {"loss_mask": mask})
    assert _refused(tmp_path, second).endswith(f"rollouts.jsonl:2: {message}")


def test_a_positive_log_probability_on_an_observation_token_is_read(tmp_path):
    """Where loss_mask is 0 any finite value goes (README: the row's log-prob is not used)."""
    second = {**GOOD, "logprobs": [-0.5, 3.0], "loss_mask": [1, 0]}
    assert len(read_rollouts(_jsonl(tmp_path / "r.jsonl", [GOOD, second]), None, LIMITS)) == 2


@pytest.mark.parametrize(
    ("field", "values", "noun"),
    [
        ("logprobs", [-1.0] * 3, "numbers"),
        ("loss_mask", [1], "values"),
        ("rewards", [0.0] * 3, "numbers"),
    ],
)
def test_per_token_columns_are_as_long_as_the_response(tmp_path, field, values, noun):
    second = {**GOOD, field: values} | ({"reward": None} if field == "rewards" else {})
    assert _refused(tmp_path, second).endswith(
        f"rollouts.jsonl:2: {field}: expected 2 {noun} (one per response token), got {len(values)}"
    )


def test_a_row_with_nothing_to_train_is_refused(tmp_path):
    """An all-0 loss_mask ended in a traceback from deep in the core, mid-run."""
    message = _refused(tmp_path, {**GOOD, "loss_mask": [0, 0]})
    assert message.endswith(
        "rollouts.jsonl:2: loss_mask: expected at least one 1 (a token the policy produced), "
        "got all 2 0: the row has nothing to train on"
    )


def test_a_parquet_row_is_named_by_its_row_counted_from_0(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [GOOD, {**GOOD, "logprobs": [-0.5, float("-inf")]}]
    pq.write_table(pa.table({k: [r[k] for r in rows] for k in GOOD}), tmp_path / "r.parquet")
    with pytest.raises(ProxrlError, match=r"r\.parquet:row 1: logprobs: expected finite"):
        read_rollouts(tmp_path / "r.parquet", None, LIMITS)
    pq.write_table(
        pa.table({**{k: [v] for k, v in GOOD.items()}, "rewrd": [1.0]}), tmp_path / "u.parquet"
    )
    with pytest.raises(
        ProxrlError, match=r"u\.parquet:row 0: rewrd: unknown column; did you mean reward\?"
    ):
        read_rollouts(tmp_path / "u.parquet", None, LIMITS)


def _context_config(tiny_lm: str, tmp_path: Path, prompt: int, response: int) -> grpo.Config:
    """grpo on a file of one group of two rows of ``prompt`` + ``response`` tokens, with room
    for both in max_prompt_length and max_new_tokens: only the model's context limits them."""
    row = {
        **GOOD,
        "prompt_ids": [5] * prompt,
        "response_ids": [7] * response,
        "logprobs": [-1.0] * response,
    }
    path = _jsonl(tmp_path / "rollouts.jsonl", [row, row])
    return grpo.Config(
        model=tiny_lm,
        rollouts_file=str(path),
        output_dir=str(tmp_path / "run"),
        rollout_batch_size=1,
        group_size=2,
        mini_batch_size=2,
        max_prompt_length=250,
        max_new_tokens=16,
    )


def _context_file(tiny_lm: str, tmp_path: Path, prompt: int, response: int) -> RolloutsFile:
    """What the run reads of ``_context_config``'s options (``run_settings`` narrows it so)."""
    return narrowed(RolloutsFile, _context_config(tiny_lm, tmp_path, prompt, response))


def test_prompt_and_response_fit_the_models_context(tiny_lm, tmp_path):
    """The tiny model has 256 positions (max_position_embeddings): 250 + 6 fill them, and
    250 + 7 is refused (it trained, past the positions a rotary model was trained on)."""
    rows = validate_rollouts_file(_context_file(tiny_lm, tmp_path, 250, 6))
    assert [len(r.prompt_ids) + len(r.response_ids) for r in rows] == [256, 256]
    with pytest.raises(ProxrlError) as refused:
        validate_rollouts_file(_context_file(tiny_lm, tmp_path, 250, 7))
    assert str(refused.value) == (
        f"{tmp_path}/rollouts.jsonl:1: response_ids: prompt_ids (250 tokens) + response_ids "
        "(7 tokens) = 257 tokens is longer than the model's context (256 positions)"
    )


def test_a_row_outside_a_file_reads_through_the_same_schema():
    """A harness may check its rows as it writes them (no tokenizer, no limits: columns,
    types and the row's own consistency)."""
    assert rollout_row("row 3", GOOD).score == 1.0
    with pytest.raises(
        ProxrlError, match=r"^row 3: group: expected a string or an integer, got \[1\]$"
    ):
        rollout_row("row 3", {**GOOD, "group": [1]})


def test_a_refused_file_leaves_the_output_directory_as_it_was(tiny_lm, tmp_path, capsys):
    """proxrl grpo on a file with an all-0 loss_mask: exit code 2, the one line, and no run
    directory (it was left half-made after a traceback from the core)."""
    from proxrl.cli import main

    rollouts = _jsonl(tmp_path / "rollouts.jsonl", [GOOD, {**GOOD, "loss_mask": [0, 0]}])
    out = tmp_path / "run"
    before = sorted(p.name for p in tmp_path.iterdir())
    argv = ["grpo", "--model", tiny_lm, "--rollouts-file", str(rollouts), "--output-dir", str(out)]
    argv += ["--group-size", "2", "--rollout-batch-size", "1", "--mini-batch-size", "2"]
    argv += ["--no-progress", "--report-to", "none"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"proxrl grpo: error: {rollouts}:2: loss_mask: expected at least one 1 (a token the "
        "policy produced), got all 2 0: the row has nothing to train on"
    )
    assert "Traceback" not in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ([1, 2], "row 3: expected an object of columns, got list"),
        (
            {k: v for k, v in GOOD.items() if k != "group"},
            "row 3: group: expected a string or an integer; the row has none",
        ),
        ({**GOOD, "reward": "high"}, "row 3: reward: expected a number, got 'high'"),
        (
            {**GOOD, "prompt_ids": [5, "x"]},
            "row 3: prompt_ids: expected a non-empty list of token ids (integers), got 'x' at "
            "position 1",
        ),
    ],
    ids=["not-an-object", "missing", "one-type-error", "position"],
)
def test_a_rows_type_error_is_one_line_naming_the_field(record, message):
    """Pydantic's complaint in the row's words, each whole: the row that is no object, a
    missing column, a value of another type (pydantic's only error there: its first is read),
    and the position inside a list."""
    with pytest.raises(ProxrlError) as refused:
        rollout_row("row 3", record)
    assert str(refused.value) == message
