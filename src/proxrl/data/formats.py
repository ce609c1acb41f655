"""Row formats and their validation.

- SFT: ``{"prompt", "completion"}`` or ``{"messages": [{"role", "content"}, ...]}`` whose last
  message is the assistant's (the chat template is applied at encoding time). Roles are those
  chat templates know: system, user, assistant, tool (a typo would silently move which tokens
  are trained on).
- Preference: ``{"prompt", "chosen", "rejected"}`` with an optional ``"margin"``, a finite
  number >= 0 (how much better chosen is).
- Ranking: ``{"prompt", "responses": [K strings], "ranking": [K ints]}`` where ``ranking[i]``
  is the rank of ``responses[i]``, 0 the best, K - 1 the worst; equal ranks are ties (no pair
  is formed). Ranks outside 0..K-1 (scores, where higher is better, or 1-based ranks) are
  refused rather than guessed at.
- Prompt (RL rollouts): ``{"prompt"}`` or ``{"messages": [...]}`` (continued by the assistant;
  a conversation that already ends with the assistant's answer is refused).

Every row is checked; the first bad one stops the run with its file, line, field and what was
expected, as one line. A preference row whose ``chosen`` equals ``rejected`` (up to
surrounding whitespace) teaches nothing, or a preference for whitespace, and is dropped with a
warning that counts them.
"""

from __future__ import annotations

import difflib
import logging
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from proxrl.data.readers import Row, read_rows
from proxrl.runtime.errors import ProxrlError

log = logging.getLogger(__name__)

Message = dict[str, str]

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class SFTExample:
    prompt: str  # text before the completion ("" for a messages row: the template decides)
    completion: str  # the text trained on
    messages: list[Message] | None  # the conversation, when the row had one
    where: str


@dataclass(frozen=True)
class PreferenceExample:
    prompt: str
    chosen: str
    rejected: str
    margin: float | None  # how much better chosen is, when the data says
    where: str


@dataclass(frozen=True)
class RankingExample:
    prompt: str
    responses: list[str]  # K responses
    ranking: list[int]  # ranking[i] = rank of responses[i], 0 = best
    where: str


@dataclass(frozen=True)
class PromptExample:
    prompt: str
    messages: list[Message] | None
    where: str
    columns: dict[str, Any] = field(
        default_factory=dict
    )  # the row's other fields, for reward functions


def _expect_text(row: Row, name: str, allow_empty: bool = False) -> str:
    if name not in row.data or row.data[name] is None:
        raise ProxrlError(f"{row.where}: missing field '{name}'")
    value = row.data[name]
    if not isinstance(value, str):
        raise ProxrlError(
            f"{row.where}: field '{name}': expected a string, got {type(value).__name__}"
        )
    if not allow_empty and not value.strip():
        raise ProxrlError(f"{row.where}: field '{name}': expected a non-empty string")
    return value


def _expect_messages(row: Row, final_role: str | None) -> list[Message]:
    messages = row.data["messages"]
    if not isinstance(messages, list) or not messages:
        raise ProxrlError(f"{row.where}: field 'messages': expected a non-empty list of messages")
    for i, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or not isinstance(message.get("role"), str)
            or not isinstance(message.get("content"), str)
        ):
            raise ProxrlError(
                f'{row.where}: field \'messages[{i}]\': expected {{"role": str, "content": str}}'
            )
        if message["role"] not in ROLES:
            close = difflib.get_close_matches(message["role"], ROLES, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ProxrlError(
                f"{row.where}: field 'messages[{i}].role': expected one of {', '.join(ROLES)}, "
                f"got {_shown(message['role'])}{hint}"
            )
    if final_role is not None and messages[-1]["role"] != final_role:
        raise ProxrlError(
            f"{row.where}: field 'messages': the last message must have role '{final_role}', "
            f"got {messages[-1]['role']!r}"
        )
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def parse_sft(row: Row) -> SFTExample:
    if "messages" in row.data and row.data["messages"] is not None:
        messages = _expect_messages(row, final_role="assistant")
        if not messages[-1]["content"].strip():
            raise ProxrlError(f"{row.where}: field 'messages': the assistant message is empty")
        return SFTExample("", messages[-1]["content"], messages, row.where)
    if "prompt" not in row.data and "completion" not in row.data:
        raise ProxrlError(
            f"{row.where}: missing field 'completion' (an SFT row needs 'prompt' and 'completion', "
            "or 'messages')"
        )
    return SFTExample(
        _expect_text(row, "prompt", allow_empty=True),
        _expect_text(row, "completion"),
        None,
        row.where,
    )


def parse_preference(row: Row) -> PreferenceExample:
    prompt = _expect_text(row, "prompt", allow_empty=True)
    chosen = _expect_text(row, "chosen")
    rejected = _expect_text(row, "rejected")
    return PreferenceExample(prompt, chosen, rejected, _margin(row), row.where)


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
    if "messages" in row.data and row.data["messages"] is not None:
        messages = _expect_messages(row, final_role=None)
        if messages[-1]["role"] == "assistant":  # the answer would be part of the prompt
            raise ProxrlError(
                f"{row.where}: field 'messages': a prompt must not end with the assistant's "
                "message (the policy would see its answer)"
            )
        return PromptExample("", messages, row.where, columns)
    return PromptExample(_expect_text(row, "prompt"), None, row.where, columns)


def load_sft_examples(source: str, split: str = "train") -> list[SFTExample]:
    return _nonempty([parse_sft(row) for row in read_rows(source, split)], source)


def load_preference_examples(source: str, split: str = "train") -> list[PreferenceExample]:
    """Validated preference rows; rows with chosen == rejected are dropped with a warning."""
    return preference_examples(read_rows(source, split), source)


def _same_answer(example: PreferenceExample) -> bool:
    """chosen and rejected differ at most in surrounding whitespace: nothing to prefer but the
    whitespace itself."""
    return example.chosen.strip() == example.rejected.strip()


def preference_examples(rows: list[Row], source: str) -> list[PreferenceExample]:
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
