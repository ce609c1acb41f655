"""Rows that parse but would train on nonsense are refused by file, line and field: a chat role
the template does not know, a negative margin, ranks outside 0..K-1, a prompt conversation
that already holds its answer. The rows just inside each rule still load."""

from __future__ import annotations

import json

import pytest

from proxrl.data.formats import (
    ROLES,
    load_comparison_examples,
    load_preference_examples,
    load_prompt_examples,
    load_sft_examples,
)
from proxrl.runtime.errors import ProxrlError


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _conversation(*roles: str) -> dict:
    return {"messages": [{"role": r, "content": f"{r} says hi"} for r in roles]}


GOOD = {
    load_sft_examples: _conversation("system", "user", "assistant"),
    load_prompt_examples: _conversation("system", "user"),
    load_preference_examples: {"prompt": "a", "chosen": "x", "rejected": "y", "margin": 1},
}
GOOD[load_comparison_examples] = {"prompt": "a", "responses": ["x", "y"], "ranking": [1, 0]}


@pytest.mark.parametrize(
    ("loader", "row", "message"),
    [
        (
            load_sft_examples,
            _conversation("user", "asistant", "user", "assistant"),
            "field 'messages[1].role': expected one of system, user, assistant, tool, "
            "got 'asistant'; did you mean assistant?",
        ),
        (
            load_sft_examples,
            _conversation("User", "assistant"),
            "field 'messages[0].role': expected one of system, user, assistant, tool, "
            "got 'User'; did you mean user?",
        ),
        (
            load_sft_examples,
            _conversation("human", "assistant"),
            "field 'messages[0].role': expected one of system, user, assistant, tool, got 'human'",
        ),
        (
            load_prompt_examples,
            _conversation("sytem", "user"),
            "field 'messages[0].role': expected one of system, user, assistant, tool, "
            "got 'sytem'; did you mean system?",
        ),
        (
            load_prompt_examples,
            _conversation("user", "assistant"),
            "field 'messages': a prompt must not end with the assistant's message (the policy "
            "would see its answer)",
        ),
        (
            load_preference_examples,
            {"prompt": "a", "chosen": "x", "rejected": "y", "margin": -0.5},
            "field 'margin': expected >= 0, got -0.5",
        ),
        (
            load_preference_examples,
            {"prompt": "a", "chosen": "x", "rejected": "y", "margin": "-2"},
            "field 'margin': expected >= 0, got '-2'",
        ),
        (
            load_comparison_examples,
            {"prompt": "a", "responses": ["x", "y", "z"], "ranking": [1, 2, 3]},
            "field 'ranking': expected ranks 0 (best) to 2 (worst), got [1, 2, 3]",
        ),
        (
            load_comparison_examples,
            {"prompt": "a", "responses": ["x", "y"], "ranking": [0, 7]},
            "field 'ranking': expected ranks 0 (best) to 1 (worst), got [0, 7]",
        ),
    ],
)
def test_a_row_that_would_train_on_nonsense_is_refused(tmp_path, loader, row, message):
    path = _write(tmp_path / "d.jsonl", [GOOD[loader], row])
    with pytest.raises(ProxrlError) as info:
        loader(path)
    assert str(info.value) == f"{path}:2: {message}"


def test_the_rows_just_inside_each_rule_load(tmp_path):
    every_role = _conversation("system", "user", "assistant", "tool", "user", "assistant")
    assert len(load_sft_examples(_write(tmp_path / "s.jsonl", [every_role]))) == 1
    prompts = [_conversation("system", "user"), _conversation("user", "assistant", "tool")]
    assert len(load_prompt_examples(_write(tmp_path / "p.jsonl", prompts))) == 2
    pairs = [
        {"prompt": "a", "chosen": "x", "rejected": "y", "margin": 0},
        {"prompt": "a", "chosen": "x", "rejected": "y", "margin": "0.0"},
    ]
    assert [e.margin for e in load_preference_examples(_write(tmp_path / "m.jsonl", pairs))] == [
        0.0,
        0.0,
    ]
    rankings = [
        {"prompt": "a", "responses": ["x", "y", "z"], "ranking": [2, 0, 1]},
        {"prompt": "a", "responses": ["x", "y", "z"], "ranking": [0, 0, 2]},  # a tie for first
    ]
    loaded = load_comparison_examples(_write(tmp_path / "r.jsonl", rankings))
    assert [e.ranking for e in loaded] == [[2, 0, 1], [0, 0, 2]]


def test_a_pair_that_differs_only_in_whitespace_is_dropped_like_an_equal_one(tmp_path, caplog):
    import logging

    rows = [
        {"prompt": "a", "chosen": " yes.", "rejected": "yes.\n"},
        {"prompt": "a", "chosen": " yes.", "rejected": " no."},
    ]
    path = _write(tmp_path / "w.jsonl", rows)
    with caplog.at_level(logging.WARNING):
        kept = load_preference_examples(path)
    assert [e.rejected for e in kept] == [" no."]
    assert "dropped 1 of 2 rows whose 'chosen' equals 'rejected'" in caplog.text
    assert f"{path}:1" in caplog.text


def test_the_roles_are_those_chat_templates_use():
    assert ROLES == ("system", "user", "assistant", "tool")
