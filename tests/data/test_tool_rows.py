"""TRL's tool-use conversations as SFT rows: an assistant message with ``tool_calls``, role
"tool" results, a ``tools`` column. The episode after the last user message is trained on, the
tool results are masked, and the chat template gets the tools."""

from __future__ import annotations

import json

import pytest

from proxrl.data.encoding import encode_sft
from proxrl.data.formats import load_sft_examples
from proxrl.models.tiny import build_tiny_tokenizer
from proxrl.runtime.errors import ProxrlError

USER = {"role": "user", "content": "2*3?"}
CALL = {"type": "function", "function": {"name": "calc", "arguments": {"expression": "2*3"}}}
ASKS = {"role": "assistant", "content": None, "tool_calls": [CALL]}
RESULT = {"role": "tool", "name": "calc", "tool_call_id": "c1", "content": "6"}
ANSWER = {"role": "assistant", "content": "It is 6."}
SCHEMA = {"type": "function", "function": {"name": "calc", "parameters": {}}}
# renders tool calls and the tools' names so the tests can see both
TEMPLATE = (
    "{% if tools %}[tools:{% for t in tools %} {{ t.function.name }}{% endfor %}]{% endif %}"
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} "
    "{{ c.function.arguments | tojson }}"
    "{% endfor %}{% if m.role == 'assistant' %}<|eos|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    tok = build_tiny_tokenizer(['2*3? It is 6. CALL calc {"expression": "2*3"} [tools: calc]'] * 4)
    tok.chat_template = TEMPLATE
    return tok


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _pieces(tokenizer, encoded):
    """The decoded runs of trained (1) and untrained (0) tokens, in order."""
    runs: list[tuple[int, list[int]]] = []
    for token, m in zip(encoded.input_ids, encoded.loss_mask, strict=True):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(token)
        else:
            runs.append((m, [token]))
    return [(m, tokenizer.decode(ids)) for m, ids in runs]


def test_a_tool_episode_trains_on_each_assistant_turn_and_masks_the_result(tokenizer, tmp_path):
    row = {"messages": [USER, ASKS, RESULT, ANSWER], "tools": [SCHEMA]}
    (example,) = load_sft_examples(_write(tmp_path / "t.jsonl", [row]))
    assert example.prompt == [USER]
    assert [m["role"] for m in example.completion] == ["assistant", "tool", "assistant"]
    assert example.completion[0]["content"] == ""  # None with tool calls is an empty content
    assert example.completion[1] == RESULT  # name and tool_call_id kept for the template
    assert example.tools == [SCHEMA]
    (encoded,) = encode_sft([example], tokenizer, max_length=128)
    assert _pieces(tokenizer, encoded) == [
        (0, "[tools: calc]<|user|>2*3?<|assistant|>"),
        (1, 'CALL calc {"expression": "2*3"}<|eos|>'),
        (0, "<|tool|>6<|assistant|>"),
        (1, "It is 6.<|eos|>"),
    ]


def test_earlier_exchanges_are_prompt_and_arguments_may_be_a_json_string(tokenizer, tmp_path):
    asks = {**ASKS, "tool_calls": [{"function": {"name": "calc", "arguments": '{"x": 1}'}}]}
    row = {"messages": [USER, ANSWER, USER, asks, RESULT, ANSWER]}
    (example,) = load_sft_examples(_write(tmp_path / "t.jsonl", [row]))
    assert example.prompt == [USER, ANSWER, USER]
    assert example.completion[0]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'
    assert example.tools is None
    (encoded,) = encode_sft([example], tokenizer, max_length=128)
    assert [m for m, _ in _pieces(tokenizer, encoded)] == [0, 1, 0, 1]


def test_a_truncated_episode_keeps_its_mask_aligned(tokenizer, tmp_path):
    row = {"messages": [USER, ASKS, RESULT, ANSWER]}
    (full,) = encode_sft(load_sft_examples(_write(tmp_path / "t.jsonl", [row])), tokenizer, 128)
    cut = len(full) - 3
    (short,) = encode_sft(load_sft_examples(_write(tmp_path / "t.jsonl", [row])), tokenizer, cut)
    assert short.input_ids == full.input_ids[:cut]
    assert short.loss_mask == full.loss_mask[:cut]


def test_without_a_chat_template_the_call_is_written_on_the_assistants_line(tmp_path):
    tok = build_tiny_tokenizer(["user: 2*3? assistant: tool: 6 calc expression"] * 4)
    tok.chat_template = None
    row = {"messages": [USER, ASKS, RESULT, ANSWER]}
    (encoded,) = encode_sft(load_sft_examples(_write(tmp_path / "t.jsonl", [row])), tok, 128)
    pieces = _pieces(tok, encoded)
    assert pieces[1] == (1, '{"name": "calc", "arguments": {"expression": "2*3"}}\n')
    assert pieces[2] == (0, "tool: 6\nassistant: ")


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        (
            [USER, {**ASKS, "tool_calls": [{"function": {"name": "calc", "arguments": "{x"}}]}],
            "field 'messages[1].tool_calls[0].function.arguments': expected a JSON object",
        ),
        (
            [USER, {**ASKS, "tool_calls": []}, ANSWER],
            'field \'messages[1]\': expected {"role": str, "content": str}',
        ),
        (
            [{**RESULT, "name": 3}, ANSWER],
            "field 'messages[0].name': expected a string",
        ),
        (
            [ASKS, RESULT, ANSWER],
            "a tool-use conversation needs a user message before the assistant's turns",
        ),
    ],
)
def test_bad_tool_rows_are_refused_naming_the_field(tmp_path, messages, message):
    with pytest.raises(ProxrlError, match=r"t\.jsonl:1: ") as error:
        load_sft_examples(_write(tmp_path / "t.jsonl", [{"messages": messages}]))
    assert message in str(error.value)
