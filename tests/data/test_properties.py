"""Property-based: any JSON value in any field of a row, any line in a JSONL file, any bytes in
a data file either load into validated examples or raise ProxrlError (one line naming the
place), never another exception."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxrl.data.formats import (
    ROLES,
    PreferenceExample,
    PromptExample,
    RankingExample,
    SFTExample,
    load_comparison_examples,
    load_prompt_examples,
    load_sft_examples,
    parse_preference,
    parse_prompt,
    parse_ranking,
    parse_sft,
)
from proxrl.data.readers import Row
from proxrl.runtime.errors import ProxrlError

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FIELDS = [
    "prompt",
    "completion",
    "messages",
    "chosen",
    "rejected",
    "margin",
    "responses",
    "ranking",
    "role",
    "content",
    "text",
    "label",
]

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)
# Rows mostly hold the fields the formats know, so the validators get past their first check.
rows = st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), json_values, max_size=6)
valid_texts = st.text(min_size=1, max_size=10).filter(str.strip)
nearly_valid = st.fixed_dictionaries(
    {
        "prompt": st.text(max_size=10),
        "completion": valid_texts,
        "chosen": valid_texts,
        "rejected": valid_texts,
    },
    optional={
        "margin": json_values,
        "messages": json_values,
        "responses": json_values,
        "ranking": json_values,
    },
)
# Conversational rows: every text field a list of messages of known roles (or not quite).
conversations = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(ROLES), "content": st.text(max_size=6)}),
    min_size=1,
    max_size=4,
)
nearly_valid_chat = st.fixed_dictionaries(
    {"chosen": conversations, "rejected": conversations},
    optional={
        "prompt": conversations | st.text(max_size=5),
        "completion": conversations,
        "messages": conversations,
        "label": st.booleans() | st.sampled_from(["true", "False", "maybe"]),
        "text": st.text(max_size=5),
    },
)

PARSERS = {
    parse_sft: SFTExample,
    parse_preference: PreferenceExample,
    parse_ranking: RankingExample,
    parse_prompt: PromptExample,
}


def _loads_or_clean_error(fn, *args):
    try:
        return fn(*args)
    except ProxrlError as exc:
        message = str(exc)
        assert message and "\n" not in message
        return None


@pytest.mark.parametrize("parse", list(PARSERS), ids=lambda f: f.__name__)
@FAST
@given(data=rows | nearly_valid | nearly_valid_chat)
def test_any_row_parses_or_gets_a_clean_error_naming_the_row(parse, data):
    row = Row(data, "train.jsonl:7")
    try:
        example = parse(row)
    except ProxrlError as exc:
        assert str(exc).startswith("train.jsonl:7: ") and "\n" not in str(exc)
        return
    assert isinstance(example, PARSERS[parse]) and example.where == "train.jsonl:7"
    texts = {
        SFTExample: lambda e: [e.prompt, e.completion],
        PreferenceExample: lambda e: [e.prompt, e.chosen, e.rejected],
        RankingExample: lambda e: [e.prompt, *e.responses],
        PromptExample: lambda e: [e.prompt],
    }[type(example)](example)
    # Each text is a string (standard) or a conversation of known roles (conversational).
    assert all(
        isinstance(t, str)
        or (
            isinstance(t, list)
            and all(m["role"] in ROLES and isinstance(m["content"], str) for m in t)
        )
        for t in texts
    )
    if isinstance(example, PreferenceExample) and example.margin is not None:
        assert math.isfinite(example.margin) and example.margin >= 0
    if isinstance(example, RankingExample):
        assert len(example.ranking) == len(example.responses) >= 2
        assert all(type(r) is int and 0 <= r < len(example.ranking) for r in example.ranking)
        assert min(example.ranking) == 0
    messages = getattr(example, "messages", None) or []
    assert all(m["role"] in ROLES for m in messages)
    if isinstance(example, PromptExample) and messages:
        assert messages[-1]["role"] != "assistant"


LOADERS = [load_sft_examples, load_comparison_examples, load_prompt_examples]


@pytest.mark.parametrize("load", LOADERS, ids=lambda f: f.__name__)
@FAST
@given(lines=st.lists(rows.map(lambda r: json.dumps(r)) | st.text(max_size=30), max_size=5))
def test_any_jsonl_file_loads_or_gets_a_clean_error(load, lines):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data.jsonl"
        path.write_text("\n".join(lines), encoding="utf-8")
        examples = _loads_or_clean_error(load, str(path))
    if examples is not None:
        assert examples and all(e.where.startswith(f"{path}:") for e in examples)


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv"])
@FAST
@given(content=st.binary(max_size=200))
def test_any_bytes_in_a_data_file_load_or_get_a_clean_error(suffix, content):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"data{suffix}"
        path.write_bytes(content)
        for load in LOADERS:
            examples = _loads_or_clean_error(load, str(path))
            assert examples is None or len(examples) >= 1
