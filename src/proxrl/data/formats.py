"""Row formats and their validation: TRL's dataset types, each in its standard (text) and
conversational (list of ``{"role", "content"}`` messages) form, and the K-way ranking.

| type | standard | conversational |
|---|---|---|
| language modelling | ``{"text"}`` | ``{"messages"}`` (the last message is the assistant's) |
| prompt-only | ``{"prompt"}`` | ``{"prompt": [messages]}`` |
| prompt-completion | ``{"prompt", "completion"}`` | both lists of messages |
| preference | ``{"prompt", "chosen", "rejected"}`` | all three lists of messages |
| preference, implicit prompt | ``{"chosen", "rejected"}`` | the same, whole conversations |
| unpaired preference | ``{"prompt", "completion", "label": bool}`` | prompt and completion lists |

- SFT reads language modelling (``text``: every token is trained on; ``messages``: the last
  assistant message is, the earlier ones are prompt) and prompt-completion rows (the
  completion is trained on). An unpaired-preference row is refused (its ``label`` false rows
  would be imitated).
- Preference (reward model, DPO): explicit or implicit prompt, with an optional ``"margin"``,
  a finite number >= 0 (how much better chosen is). An implicit prompt is the shared beginning
  of chosen and rejected: for text, up to the word boundary before they differ (the answers
  keep their leading space); for conversations, the shared leading messages, after which both
  must continue with the assistant's message (a ``prompt`` string beside two conversations, as
  HuggingFaceH4/ultrafeedback_binarized ships, is then not used). Unpaired-preference rows
  become pairs: every desirable completion of a prompt against every undesirable one.
- Ranking (reward model): ``{"prompt", "responses": [K strings], "ranking": [K ints]}`` where
  ``ranking[i]`` is the rank of ``responses[i]``, 0 the best, K - 1 the worst; equal ranks are
  ties (no pair is formed). Ranks outside 0..K-1 (scores, where higher is better, or 1-based
  ranks) are refused rather than guessed at.
- Prompt (RL rollouts): any row with a prompt, explicit or implicit (a preference row gives
  its shared beginning), or ``{"messages"}`` (continued by the assistant; a conversation that
  already ends with the assistant's answer is refused). The row's other fields reach reward
  functions.

Roles are those chat templates know: system, user, assistant, tool (a typo would silently move
which tokens are trained on). Tool use is TRL's conversational form: an assistant message may
carry ``tool_calls`` (``[{"type": "function", "function": {"name", "arguments"}}]``, its
``content`` then may be empty), a role ``"tool"`` message holds a tool's result (optional
``name``, ``tool_call_id``), and an optional ``tools`` column lists the tools' JSON schemas
(passed to the chat template as ``tools=``). An SFT conversation with tool turns trains on
every assistant message after its last user (or system) message, the episode; the tool
messages between them are masked out of the loss, like the prompt. A conversational row is
rendered with the tokenizer's chat template at encoding time. Every row is checked; the first
bad one stops the run with its file, line, field and what was expected, as one line. A
preference row whose ``chosen`` equals ``rejected`` (up to surrounding whitespace) teaches
nothing, or a preference for whitespace, and is dropped with a warning that counts them.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from proxrl.data.readers import Row, read_rows
from proxrl.runtime.errors import ProxrlError

log = logging.getLogger(__name__)

Message = dict[str, Any]  # role, content; tool_calls (assistant), name / tool_call_id (tool)
Text = str | list[Message]  # standard text, or a conversation rendered with the chat template

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class SFTExample:
    prompt: Text  # what comes before the completion ("" or [] when nothing does)
    completion: Text  # what is trained on: a string, or the assistant's message(s)
    where: str
    tools: list[dict[str, Any]] | None = None  # JSON schemas for the chat template's tools=

    @property
    def messages(self) -> list[Message] | None:
        """The whole conversation, for a conversational row."""
        return None if isinstance(self.prompt, str) else self.prompt + list(self.completion)

    def texts(self) -> list[str]:
        """Every text of the row, as the tokenizer will see it (message contents alone)."""
        return contents(self.prompt) + contents(self.completion)


@dataclass(frozen=True)
class PreferenceExample:
    prompt: Text  # a string with string answers, or messages with message answers
    chosen: Text
    rejected: Text
    margin: float | None  # how much better chosen is, when the data says
    where: str

    def texts(self) -> list[str]:
        return contents(self.prompt) + contents(self.chosen) + contents(self.rejected)


@dataclass(frozen=True)
class RankingExample:
    prompt: str
    responses: list[str]  # K responses
    ranking: list[int]  # ranking[i] = rank of responses[i], 0 = best
    where: str

    def texts(self) -> list[str]:
        return [self.prompt, *self.responses]


@dataclass(frozen=True)
class PromptExample:
    prompt: str
    messages: list[Message] | None
    where: str
    columns: dict[str, Any] = field(
        default_factory=dict
    )  # the row's other fields, for reward functions

    def texts(self) -> list[str]:
        return contents(self.prompt if self.messages is None else self.messages)


def contents(text: Text) -> list[str]:
    """The strings of a text: itself, or its messages' contents."""
    return [text] if isinstance(text, str) else [m["content"] for m in text]


def _present(row: Row, name: str) -> bool:
    return row.data.get(name) is not None


def _expect_text(row: Row, name: str, allow_empty: bool = False) -> str:
    if not _present(row, name):
        raise ProxrlError(f"{row.where}: missing field '{name}'")
    value = row.data[name]
    if not isinstance(value, str):
        raise ProxrlError(
            f"{row.where}: field '{name}': expected a string, got {type(value).__name__}"
        )
    if not allow_empty and not value.strip():
        raise ProxrlError(f"{row.where}: field '{name}': expected a non-empty string")
    return value


def _expect_text_or_messages(row: Row, name: str, allow_empty: bool = False) -> Text:
    """A field that may be standard (a string) or conversational (a list of messages)."""
    if not _present(row, name):
        raise ProxrlError(f"{row.where}: missing field '{name}'")
    value = row.data[name]
    if isinstance(value, list):
        return _expect_messages(row, name)
    if not isinstance(value, str):
        raise ProxrlError(
            f"{row.where}: field '{name}': expected a string or a list of messages, "
            f"got {type(value).__name__}"
        )
    return _expect_text(row, name, allow_empty)


def _expect_messages(
    row: Row, name: str = "messages", final_role: str | None = None
) -> list[Message]:
    messages = row.data[name]
    if not isinstance(messages, list) or not messages:
        raise ProxrlError(f"{row.where}: field '{name}': expected a non-empty list of messages")
    for i, message in enumerate(messages):
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if (
            not isinstance(message, dict)
            or not isinstance(message.get("role"), str)
            or not (
                isinstance(message.get("content"), str)
                or (calls and message.get("content") is None)
            )
        ):
            raise ProxrlError(
                f'{row.where}: field \'{name}[{i}]\': expected {{"role": str, "content": str}}'
            )
        if message["role"] not in ROLES:
            close = difflib.get_close_matches(message["role"], ROLES, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ProxrlError(
                f"{row.where}: field '{name}[{i}].role': expected one of {', '.join(ROLES)}, "
                f"got {_shown(message['role'])}{hint}"
            )
    if final_role is not None and messages[-1]["role"] != final_role:
        raise ProxrlError(
            f"{row.where}: field '{name}': the last message must have role '{final_role}', "
            f"got {messages[-1]['role']!r}"
        )
    return [_message(row, f"{name}[{i}]", m) for i, m in enumerate(messages)]


def _message(row: Row, name: str, message: dict[str, Any]) -> Message:
    """A message with the keys chat templates read: role and content, an assistant's
    ``tool_calls`` (each checked), a tool result's ``name`` and ``tool_call_id``."""
    kept: Message = {"role": message["role"], "content": message.get("content") or ""}
    calls = message.get("tool_calls")
    if calls is not None:
        if message["role"] != "assistant":
            raise ProxrlError(
                f"{row.where}: field '{name}.tool_calls': only an assistant message calls tools, "
                f"got role {message['role']!r}"
            )
        if not isinstance(calls, list) or not calls:
            raise ProxrlError(
                f"{row.where}: field '{name}.tool_calls': expected a non-empty list of calls"
            )
        kept["tool_calls"] = [
            _tool_call(row, f"{name}.tool_calls[{j}]", c) for j, c in enumerate(calls)
        ]
    if message["role"] == "tool":
        for key in ("name", "tool_call_id"):
            if message.get(key) is not None:
                if not isinstance(message[key], str):
                    raise ProxrlError(f"{row.where}: field '{name}.{key}': expected a string")
                kept[key] = message[key]
    return kept


def _tool_call(row: Row, name: str, call: Any) -> dict[str, Any]:
    """``{"type": "function", "function": {"name": str, "arguments": dict | JSON str}}``."""
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if (
        not isinstance(function, dict)
        or not isinstance(function.get("name"), str)
        or not function["name"]
        or not isinstance(arguments, dict | str)
    ):
        raise ProxrlError(
            f'{row.where}: field \'{name}\': expected {{"type": "function", "function": '
            '{"name": str, "arguments": {...}}}'
        )
    if isinstance(arguments, str):
        try:
            json.loads(arguments)
        except json.JSONDecodeError:
            raise ProxrlError(
                f"{row.where}: field '{name}.function.arguments': expected a JSON object, got "
                f"{_shown(arguments)}"
            ) from None
    kept = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
    if isinstance(call.get("id"), str):
        kept["id"] = call["id"]
    return kept


def _tools(row: Row) -> list[dict[str, Any]] | None:
    """The optional ``tools`` column: the tools' JSON schemas (as ``get_json_schema`` writes
    them)."""
    tools = row.data.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ProxrlError(
            f"{row.where}: field 'tools': expected a list of JSON schemas (objects), got "
            f"{_shown(tools)}"
        )
    return tools


def _uses_tools(messages: list[Message]) -> bool:
    return any(m["role"] == "tool" or "tool_calls" in m for m in messages)


def _episode_start(messages: list[Message]) -> int:
    """Index of the first message after the last user or system message: where the
    assistant's episode (its turns and the tool results between them) begins."""
    start = len(messages)
    while start > 0 and messages[start - 1]["role"] in ("assistant", "tool"):
        start -= 1
    return start


def _check_prompt_turns(row: Row, name: str, messages: list[Message]) -> None:
    if messages[-1]["role"] == "assistant":  # the answer would be part of the prompt
        raise ProxrlError(
            f"{row.where}: field '{name}': a prompt must not end with the assistant's message "
            "(the policy would see its answer)"
        )


def _check_reply_turns(row: Row, name: str, messages: list[Message]) -> None:
    if messages[0]["role"] != "assistant":
        raise ProxrlError(
            f"{row.where}: field '{name}': expected the assistant's reply first, "
            f"got role {messages[0]['role']!r}"
        )
    if not any(m["content"].strip() or m.get("tool_calls") for m in messages):
        raise ProxrlError(f"{row.where}: field '{name}': the assistant's reply is empty")


def _same_form(row: Row, name: str, value: Text, like: str, other: Text) -> None:
    """Standard and conversational fields do not mix within a row."""
    if isinstance(value, str) != isinstance(other, str):
        form = "a string" if isinstance(other, str) else "a list of messages"
        raise ProxrlError(f"{row.where}: field '{name}': expected {form} like '{like}'")


def parse_sft(row: Row) -> SFTExample:
    if _present(row, "messages"):
        messages = _expect_messages(row, final_role="assistant")
        if not messages[-1]["content"].strip():
            raise ProxrlError(f"{row.where}: field 'messages': the assistant message is empty")
        tools = _tools(row)
        if _uses_tools(messages):
            start = _episode_start(messages)
            if start == 0:
                raise ProxrlError(
                    f"{row.where}: field 'messages': a tool-use conversation needs a user message "
                    "before the assistant's turns"
                )
            return SFTExample(messages[:start], messages[start:], row.where, tools)
        return SFTExample(messages[:-1], messages[-1:], row.where, tools)
    if _is_unpaired(row):
        raise ProxrlError(
            f"{row.where}: field 'label': an unpaired preference row; sft would imitate the "
            "completions labelled false too (keep the rows labelled true, without 'label')"
        )
    if not _present(row, "completion") and _present(row, "text"):
        return SFTExample("", _expect_text(row, "text"), row.where)
    if not _present(row, "prompt") and not _present(row, "completion"):
        raise ProxrlError(
            f"{row.where}: missing field 'completion' (an SFT row needs 'prompt' and "
            "'completion', 'text', or 'messages')"
        )
    prompt = _expect_text_or_messages(row, "prompt", allow_empty=True)
    completion = _expect_text_or_messages(row, "completion")
    _same_form(row, "completion", completion, "prompt", prompt)
    if isinstance(prompt, list) and isinstance(completion, list):
        _check_prompt_turns(row, "prompt", prompt)
        _check_reply_turns(row, "completion", completion)
    return SFTExample(prompt, completion, row.where)


def parse_preference(row: Row) -> PreferenceExample:
    for name in ("chosen", "rejected"):
        if not _present(row, name):
            raise ProxrlError(f"{row.where}: missing field '{name}'")
    chosen = _expect_text_or_messages(row, "chosen")
    rejected = _expect_text_or_messages(row, "rejected")
    _same_form(row, "rejected", rejected, "chosen", chosen)
    margin = _margin(row)
    if isinstance(chosen, list) and isinstance(rejected, list):
        if chosen[0]["role"] != "assistant":  # whole conversations: the prompt is implicit
            prompt, chosen, rejected = _shared_messages(row, chosen, rejected)
            return PreferenceExample(prompt, chosen, rejected, margin, row.where)
        if not _present(row, "prompt"):
            raise ProxrlError(
                f"{row.where}: missing field 'prompt' (chosen and rejected start with the "
                "assistant's reply)"
            )
        prompt = _expect_text_or_messages(row, "prompt")
        _same_form(row, "prompt", prompt, "chosen", chosen)
        assert isinstance(prompt, list)
        _check_prompt_turns(row, "prompt", prompt)
        _check_reply_turns(row, "chosen", chosen)
        _check_reply_turns(row, "rejected", rejected)
        return PreferenceExample(prompt, chosen, rejected, margin, row.where)
    assert isinstance(chosen, str) and isinstance(rejected, str)
    if not _present(row, "prompt"):
        prompt_text, chosen, rejected = shared_text_prefix(chosen, rejected)
        return PreferenceExample(prompt_text, chosen, rejected, margin, row.where)
    prompt = _expect_text_or_messages(row, "prompt", allow_empty=True)
    _same_form(row, "prompt", prompt, "chosen", chosen)
    return PreferenceExample(prompt, chosen, rejected, margin, row.where)


def shared_text_prefix(chosen: str, rejected: str) -> tuple[str, str, str]:
    """(prompt, chosen answer, rejected answer) of an implicit-prompt pair of texts: the prompt
    is their common beginning cut back to the word boundary before they differ, and each answer
    keeps the whitespace that leads it (``"The sky is"``, ``" blue."``, ``" green."``)."""
    if chosen == rejected:
        return "", chosen, rejected
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    cut = n
    while cut > 0 and not chosen[cut - 1].isspace():  # back to the start of the word cut into
        cut -= 1
    while cut > 0 and chosen[cut - 1].isspace():  # the whitespace before an answer is its own
        cut -= 1
    return chosen[:cut], chosen[cut:], rejected[cut:]


def _shared_messages(
    row: Row, chosen: list[Message], rejected: list[Message]
) -> tuple[list[Message], list[Message], list[Message]]:
    """(prompt, chosen reply, rejected reply) of two whole conversations: the prompt is their
    shared leading messages, and both must go on with the assistant's message."""
    if chosen == rejected:  # nothing to prefer: kept whole so the same-answer rule drops it
        return chosen[:-1], chosen[-1:], rejected[-1:]
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    if n == 0:
        raise ProxrlError(
            f"{row.where}: field 'rejected': chosen and rejected share no leading message (with "
            "no 'prompt', the prompt is the conversations' shared beginning)"
        )
    for name, conversation in (("chosen", chosen), ("rejected", rejected)):
        if n == len(conversation):
            raise ProxrlError(
                f"{row.where}: field '{name}': the whole conversation is the beginning of the "
                "other one; both must go on with the assistant's reply after their shared part"
            )
        if conversation[n]["role"] != "assistant":
            raise ProxrlError(
                f"{row.where}: field '{name}': chosen and rejected part at message {n}, whose "
                f"role is {conversation[n]['role']!r}; the implicit prompt must end where the "
                "assistant's replies begin"
            )
    return chosen[:n], chosen[n:], rejected[n:]


def _margin(row: Row) -> float | None:
    """The optional ``margin``: a finite number (a numeric string from CSV is accepted; an empty
    cell means none)."""
    raw = row.data.get("margin")
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    value: float | None = None
    if isinstance(raw, str):
        try:
            value = float(raw)
        except ValueError:
            value = None
    elif isinstance(raw, numbers.Real) and not isinstance(raw, bool):
        try:
            value = float(raw)
        except OverflowError:
            value = math.inf
    if value is None or not math.isfinite(value):
        raise ProxrlError(
            f"{row.where}: field 'margin': expected a finite number, got {_shown(raw)}"
        )
    if value < 0:  # chosen worse than rejected: the loss would push the wrong way
        raise ProxrlError(f"{row.where}: field 'margin': expected >= 0, got {_shown(raw)}")
    return value


def _shown(raw: Any) -> str:
    return repr(raw) if len(repr(raw)) <= 40 else repr(raw)[:37] + "..."


def parse_ranking(row: Row) -> RankingExample:
    prompt = _expect_text(row, "prompt", allow_empty=True)
    for name in ("responses", "ranking"):
        if name not in row.data:
            raise ProxrlError(f"{row.where}: missing field '{name}'")
    responses, ranking = row.data["responses"], row.data["ranking"]
    if (
        not isinstance(responses, list)
        or len(responses) < 2
        or not all(isinstance(r, str) and r.strip() for r in responses)
    ):
        raise ProxrlError(
            f"{row.where}: field 'responses': expected a list of at least 2 non-empty strings"
        )
    if (
        not isinstance(ranking, list)
        or len(ranking) != len(responses)
        or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranking)
    ):
        raise ProxrlError(
            f"{row.where}: field 'ranking': expected {len(responses)} non-negative integers "
            "(the rank of each response, 0 = best)"
        )
    if len(set(ranking)) == 1:
        raise ProxrlError(
            f"{row.where}: field 'ranking': all responses tie, so there is no pair to learn"
        )
    if max(ranking) >= len(responses) or min(ranking) != 0:
        raise ProxrlError(
            f"{row.where}: field 'ranking': expected ranks 0 (best) to {len(responses) - 1} "
            f"(worst), got {_shown(ranking)}"
        )
    return RankingExample(prompt, list(responses), list(ranking), row.where)


def parse_prompt(row: Row) -> PromptExample:
    columns = {k: v for k, v in row.data.items() if k not in ("prompt", "messages")}
    if _present(row, "messages"):
        messages = _expect_messages(row)
        _check_prompt_turns(row, "messages", messages)
        return PromptExample("", messages, row.where, columns)
    if not _present(row, "prompt") and _present(row, "chosen") and _present(row, "rejected"):
        shared = parse_preference(row).prompt  # an implicit prompt: the pair's shared beginning
        if isinstance(shared, list) and shared:
            _check_prompt_turns(row, "chosen", shared)  # identical conversations: their start
            return PromptExample("", shared, row.where, columns)
        if not (shared if isinstance(shared, list) else shared.strip()):
            raise ProxrlError(
                f"{row.where}: field 'chosen': chosen and rejected share no beginning, so the "
                "row holds no prompt"
            )
        return PromptExample(shared, None, row.where, columns)
    if not _present(row, "prompt") and _present(row, "text"):
        raise ProxrlError(
            f"{row.where}: field 'text': a language-modelling row holds no prompt to continue; "
            "expected 'prompt' (or 'messages')"
        )
    prompt = _expect_text_or_messages(row, "prompt")
    if isinstance(prompt, list):
        _check_prompt_turns(row, "prompt", prompt)
        return PromptExample("", prompt, row.where, columns)
    return PromptExample(prompt, None, row.where, columns)


def parse_unpaired(row: Row) -> tuple[Text, Text, bool]:
    """(prompt, completion, label) of an unpaired-preference row; ``label`` true is desirable
    (a CSV cell ``true``/``false`` is read as one)."""
    prompt = _expect_text_or_messages(row, "prompt", allow_empty=True)
    completion = _expect_text_or_messages(row, "completion")
    _same_form(row, "completion", completion, "prompt", prompt)
    if isinstance(prompt, list) and isinstance(completion, list):
        _check_prompt_turns(row, "prompt", prompt)
        _check_reply_turns(row, "completion", completion)
    raw = row.data.get("label")
    label = _label(raw)
    if label is None:
        raise ProxrlError(f"{row.where}: field 'label': expected true or false, got {_shown(raw)}")
    return prompt, completion, label


def _label(raw: Any) -> bool | None:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    return None


def _is_unpaired(row: Row) -> bool:
    return _label(row.data.get("label")) is not None and _present(row, "completion")


def paired_from_unpaired(rows: list[Row], source: str) -> list[PreferenceExample]:
    """Unpaired-preference rows as pairs: every desirable completion of a prompt against every
    undesirable completion of the same prompt (a pair is located at its desirable row)."""
    prompts: dict[str, Text] = {}
    groups: dict[str, tuple[list[tuple[Text, str]], list[Text]]] = {}
    for row in rows:
        prompt, completion, label = parse_unpaired(row)
        key = json.dumps(prompt)
        prompts[key] = prompt
        desirable, undesirable = groups.setdefault(key, ([], []))
        if label:
            desirable.append((completion, row.where))
        else:
            undesirable.append(completion)
    alone = sum(1 for good, bad in groups.values() if not good or not bad)
    if alone:
        log.warning(
            "%s: %d of %d prompts have only desirable or only undesirable completions and form "
            "no pair",
            source,
            alone,
            len(groups),
        )
    return [
        PreferenceExample(prompts[key], chosen, rejected, None, where)
        for key, (good, bad) in groups.items()
        for chosen, where in good
        for rejected in bad
    ]


def load_sft_examples(source: str, split: str = "train") -> list[SFTExample]:
    return _nonempty([parse_sft(row) for row in read_rows(source, split)], source)


def load_preference_examples(source: str, split: str = "train") -> list[PreferenceExample]:
    """Validated preference rows; rows with chosen == rejected are dropped with a warning."""
    return preference_examples(read_rows(source, split), source)


def _comparable(text: Text) -> Any:
    if isinstance(text, str):
        return text.strip()
    return [(m["role"], m["content"].strip(), json.dumps(m.get("tool_calls"))) for m in text]


def _same_answer(example: PreferenceExample) -> bool:
    """chosen and rejected differ at most in surrounding whitespace: nothing to prefer but the
    whitespace itself."""
    return _comparable(example.chosen) == _comparable(example.rejected)


def preference_examples(rows: list[Row], source: str) -> list[PreferenceExample]:
    """Pairs from preference rows, or from unpaired-preference rows (decided by the first row:
    ``completion`` with a true/false ``label``)."""
    if rows and _is_unpaired(rows[0]):
        examples = paired_from_unpaired(rows, source)
    else:
        examples = [parse_preference(row) for row in rows]
    kept = [e for e in examples if not _same_answer(e)]
    if len(kept) < len(examples):
        log.warning(
            "%s: dropped %d of %d rows whose 'chosen' equals 'rejected' (up to surrounding "
            "whitespace; first: %s)",
            source,
            len(examples) - len(kept),
            len(examples),
            next(e.where for e in examples if _same_answer(e)),
        )
    return _nonempty(kept, source)


def load_ranking_examples(source: str, split: str = "train") -> list[RankingExample]:
    """Validated rankings; every row must rank the same number K of responses."""
    return ranking_examples(read_rows(source, split), source)


def ranking_examples(rows: list[Row], source: str) -> list[RankingExample]:
    examples = _nonempty([parse_ranking(row) for row in rows], source)
    k = len(examples[0].responses)
    for example in examples:
        if len(example.responses) != k:
            raise ProxrlError(
                f"{example.where}: field 'responses': expected {k} responses like the first row, "
                f"got {len(example.responses)}"
            )
    return examples


def load_comparison_examples(
    source: str, split: str = "train"
) -> list[PreferenceExample] | list[RankingExample]:
    """Preference pairs or K-way rankings, whichever ``source`` holds (decided by its first
    row: ``responses`` without ``chosen`` is a ranking)."""
    rows = read_rows(source, split)
    if rows and "responses" in rows[0].data and "chosen" not in rows[0].data:
        return ranking_examples(rows, source)
    return preference_examples(rows, source)


def load_prompt_examples(source: str, split: str = "train") -> list[PromptExample]:
    return _nonempty([parse_prompt(row) for row in read_rows(source, split)], source)


def _nonempty(examples: list[Any], source: str) -> list[Any]:
    if not examples:
        raise ProxrlError(f"data '{source}' has no usable rows")
    return examples
