"""Turn validated examples into token ids, with a mask of the tokens a loss reads and an
over-length policy.

Prompt and response are tokenised separately and concatenated, so the prompt's tokens are the
same ones the policy is later conditioned on at generation time and the boundary is exact. The
response ends with EOS (the model must learn to stop). A conversation is rendered with the
tokenizer's chat template (without one: ``role: content`` lines): the prompt's messages with the
generation prompt, the reply as what the whole conversation's rendering adds to it. A reply
with tool turns (assistant, tool, assistant, ...) is cut at each message the same way, and each
piece is tokenised on its own, as a multi-turn rollout concatenates the model's tokens and each
observation's: the assistant's pieces are trained on, a tool result and the generation prompt
after it are not. A row's ``tools`` reach the chat template as ``tools=``.

Over-length policy (``overlong``): ``"truncate"`` keeps the first ``max_length`` tokens (the
response loses its end, and its EOS); ``"drop"`` removes the example. An example whose prompt
alone leaves no room for a response token is dropped under both. Counts are logged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from proxrl.data.formats import (
    Message,
    PreferenceExample,
    PromptExample,
    RankingExample,
    SFTExample,
    Text,
)
from proxrl.registry import Registry
from proxrl.runtime.errors import ProxrlError

if TYPE_CHECKING:  # transformers loads with the first model or tokenizer, not with a config
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

OVERLONG: Registry[None] = Registry("overlong policy")
"""``overlong`` → what happens to an example longer than max_length."""
OVERLONG.add("truncate", None, "cut at max_length (the prompt's left side first)")
OVERLONG.add("drop", None, "leave the example out (counted in the log)", drops=True)
Overlong = OVERLONG.choice()


@dataclass(frozen=True)
class EncodedSequence:
    input_ids: list[int]  # prompt + response (+ EOS)
    loss_mask: list[int]  # 1 on response tokens (the ones a loss reads), 0 on the prompt
    prompt_length: int

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass(frozen=True)
class EncodedPair:
    chosen: EncodedSequence
    rejected: EncodedSequence
    margin: float | None

    def __len__(self) -> int:
        return max(len(self.chosen), len(self.rejected))


@dataclass(frozen=True)
class EncodedRanking:
    responses: list[EncodedSequence]
    ranking: list[int]  # ranking[i] = rank of responses[i], 0 = best

    def __len__(self) -> int:
        return max(len(r) for r in self.responses)


@dataclass
class OverlongReport:
    """What the over-length policy did."""

    total: int = 0
    truncated: int = 0
    dropped: int = 0
    where_dropped: list[str] = field(default_factory=list)
    where_prompt_fills: list[str] = field(default_factory=list)  # dropped: no room for a response

    def log(self, name: str, max_length: int) -> None:
        if self.truncated or self.dropped:
            why = ""
            if self.where_prompt_fills:  # dropped even under truncate: say why, and where
                why = (
                    f" ({len(self.where_prompt_fills)} because the prompt alone has "
                    f"{max_length} tokens or more, leaving no room for a response; first "
                    f"{self.where_prompt_fills[0]})"
                )
            log.warning(
                "%s: %d of %d examples exceed max_length=%d: %d truncated, %d dropped%s",
                name,
                self.truncated + self.dropped,
                self.total,
                max_length,
                self.truncated,
                self.dropped,
                why,
            )


def render_conversation(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[Message],
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The chat template applied to ``messages``, offering ``tools`` (JSON schemas) when given
    (``role: content`` lines without a template; an assistant's tool calls as their JSON on its
    line)."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            tools=tools,  # type: ignore[arg-type]
        )
        return str(text)
    text = "".join(
        f"{m['role']}: {m['content']}"
        + "".join(json.dumps(c["function"]) for c in m.get("tool_calls", []))
        + "\n"
        for m in messages
    )
    return text + ("assistant: " if add_generation_prompt else "")


def encode_prompt_text(
    tokenizer: PreTrainedTokenizerBase,
    prompt: str,
    messages: list[Message] | None,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Prompt ids: a chat-templated conversation (the template writes its own special tokens;
    ``tools``: the JSON schemas it offers) or a plain string (with the tokenizer's BOS if it
    adds one)."""
    if messages is not None:
        text = render_conversation(tokenizer, messages, add_generation_prompt=True, tools=tools)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])


def encode_response_text(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Response ids ending with EOS (not added twice when a template already wrote it)."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if not ids or ids[-1] != tokenizer.eos_token_id:
        ids.append(tokenizer.eos_token_id)
    return ids


def response_ids_with_eos(ids: Sequence[int], eos_token_id: int) -> list[int]:
    """A sampled response's ids ended as ``encode_response_text`` ends a text's, the way a
    reward model was trained on every response: with EOS, added when the response has none
    (cut at max_new_tokens, or stopped by a stop string)."""
    ids = list(ids)
    if not ids or ids[-1] != eos_token_id:
        ids.append(eos_token_id)
    return ids


def encode_prompt_ids(
    tokenizer: PreTrainedTokenizerBase, prompt: Text, tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """Ids of a standard prompt (a string) or a conversational one (messages)."""
    if isinstance(prompt, str):
        return encode_prompt_text(tokenizer, prompt, None)
    return encode_prompt_text(tokenizer, "", prompt, tools)


def encode_reply_ids(
    tokenizer: PreTrainedTokenizerBase,
    prompt: Text,
    reply: Text,
    where: str,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Ids of what follows ``prompt``, ending with EOS: a string, or the assistant's messages
    as the chat template renders them after the prompt's messages."""
    if isinstance(reply, str):
        return encode_response_text(tokenizer, reply)
    assert isinstance(prompt, list)
    prompt_text = render_conversation(tokenizer, prompt, add_generation_prompt=True, tools=tools)
    full_text = render_conversation(
        tokenizer, prompt + reply, add_generation_prompt=False, tools=tools
    )
    if not full_text.startswith(prompt_text):
        raise ProxrlError(
            f"{where}: the chat template does not render the conversation as prompt + assistant "
            "reply, so the prompt cannot be masked"
        )
    return encode_response_text(tokenizer, full_text[len(prompt_text) :])


def encode_tool_episode(
    tokenizer: PreTrainedTokenizerBase,
    prompt: list[Message],
    reply: list[Message],
    where: str,
    tools: list[dict[str, Any]] | None = None,
) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of an episode with tool turns after ``prompt``: each message's piece is
    what its rendering adds to the conversation before it; a tool message's piece runs to the
    generation prompt of the assistant turn after it (mask 0: an observation), an assistant's
    piece is its turn (mask 1). The last piece ends with EOS, added when the template writes
    none."""
    done = render_conversation(tokenizer, prompt, add_generation_prompt=True, tools=tools)
    ids: list[int] = []
    mask: list[int] = []
    for i, message in enumerate(reply):
        assistant_next = i + 1 < len(reply) and reply[i + 1]["role"] == "assistant"
        upto = render_conversation(
            tokenizer,
            prompt + reply[: i + 1],
            add_generation_prompt=message["role"] != "assistant" and assistant_next,
            tools=tools,
        )
        if not upto.startswith(done):
            raise ProxrlError(
                f"{where}: the chat template does not render the conversation message by "
                f"message (message {len(prompt) + i} changes the text before it), so the "
                "tool results cannot be masked"
            )
        piece = upto[len(done) :]
        done = upto
        if i == len(reply) - 1:
            piece_ids = encode_response_text(tokenizer, piece)
        else:
            piece_ids = list(tokenizer(piece, add_special_tokens=False)["input_ids"])
        ids += piece_ids
        mask += [int(message["role"] == "assistant")] * len(piece_ids)
    return ids, mask


def _join(
    prompt_ids: list[int],
    response_ids: list[int],
    max_length: int,
    overlong: Overlong,
    response_mask: list[int] | None = None,
) -> tuple[EncodedSequence | None, bool]:
    """Prompt + response under the over-length policy: (the sequence or None if dropped,
    whether it was truncated). ``response_mask``: which response tokens a loss reads (all of
    them by default)."""
    if response_mask is None:
        response_mask = [1] * len(response_ids)
    truncated = len(prompt_ids) + len(response_ids) > max_length
    if truncated:
        if OVERLONG.trait(overlong, "drops") or len(prompt_ids) >= max_length:
            return None, False
        response_ids = response_ids[: max_length - len(prompt_ids)]
        response_mask = response_mask[: len(response_ids)]
    sequence = EncodedSequence(
        prompt_ids + response_ids, [0] * len(prompt_ids) + response_mask, len(prompt_ids)
    )
    return sequence, truncated


def _count(
    report: OverlongReport, kept: bool, truncated: bool, where: str, prompt_fills: bool = False
) -> None:
    """Count one example; ``prompt_fills``: its prompt alone reaches max_length."""
    if not kept:
        report.dropped += 1
        report.where_dropped.append(where)
        if prompt_fills:
            report.where_prompt_fills.append(where)
    elif truncated:
        report.truncated += 1


ROUND_TRIP_ROWS = 8  # rows whose texts judge the tokenizer


def check_tokenizer_on(tokenizer: PreTrainedTokenizerBase, examples: Sequence[Any]) -> None:
    """``models.tokenizer.check_round_trip`` on the texts of the data's first rows."""
    check_round_trip(tokenizer, [t for e in examples[:ROUND_TRIP_ROWS] for t in e.texts()])


def _check_policy(overlong: str, max_length: int) -> None:
    if overlong not in ("truncate", "drop"):
        raise ProxrlError(f"overlong: expected 'truncate' or 'drop', got '{overlong}'")
    if max_length < 2:
        raise ProxrlError(f"max_length: expected at least 2, got {max_length}")


def _finish(encoded: list, report: OverlongReport, name: str, max_length: int) -> list:
    report.log(name, max_length)
    if not encoded:
        raise ProxrlError(f"{name}: every example is longer than max_length={max_length}")
    return encoded


def encode_sft(
    examples: list[SFTExample],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    overlong: Overlong = "truncate",
    name: str = "sft data",
) -> list[EncodedSequence]:
    _check_policy(overlong, max_length)
    check_tokenizer_on(tokenizer, examples)
    report = OverlongReport(total=len(examples))
    encoded = []
    for example in examples:
        prompt_ids = encode_prompt_ids(tokenizer, example.prompt, example.tools)
        response_mask = None
        if isinstance(example.completion, list) and any(
            m["role"] == "tool" for m in example.completion
        ):
            assert isinstance(example.prompt, list)
            response_ids, response_mask = encode_tool_episode(
                tokenizer, example.prompt, example.completion, example.where, example.tools
            )
        else:
            response_ids = encode_reply_ids(
                tokenizer, example.prompt, example.completion, example.where, example.tools
            )
        sequence, truncated = _join(prompt_ids, response_ids, max_length, overlong, response_mask)
        fills = len(prompt_ids) >= max_length
        _count(report, sequence is not None, truncated, example.where, fills)
        if sequence is not None:
            encoded.append(sequence)
    return _finish(encoded, report, name, max_length)


def encode_preferences(
    examples: list[PreferenceExample],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    overlong: Overlong = "truncate",
    name: str = "preference data",
) -> list[EncodedPair]:
    """Each pair shares the prompt ids; a pair is dropped when either side must be."""
    _check_policy(overlong, max_length)
    check_tokenizer_on(tokenizer, examples)
    report = OverlongReport(total=len(examples))
    encoded = []
    for example in examples:
        prompt_ids = encode_prompt_ids(tokenizer, example.prompt)
        chosen, chosen_cut = _join(
            prompt_ids,
            encode_reply_ids(tokenizer, example.prompt, example.chosen, example.where),
            max_length,
            overlong,
        )
        rejected, rejected_cut = _join(
            prompt_ids,
            encode_reply_ids(tokenizer, example.prompt, example.rejected, example.where),
            max_length,
            overlong,
        )
        kept = chosen is not None and rejected is not None
        fills = len(prompt_ids) >= max_length
        _count(report, kept, chosen_cut or rejected_cut, example.where, fills)
        if chosen is not None and rejected is not None:
            encoded.append(EncodedPair(chosen, rejected, example.margin))
    return _finish(encoded, report, name, max_length)


def encode_rankings(
    examples: list[RankingExample],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    overlong: Overlong = "truncate",
    name: str = "ranking data",
) -> list[EncodedRanking]:
    _check_policy(overlong, max_length)
    check_tokenizer_on(tokenizer, examples)
    report = OverlongReport(total=len(examples))
    encoded = []
    for example in examples:
        prompt_ids = encode_prompt_text(tokenizer, example.prompt, None)
        joined = [
            _join(prompt_ids, encode_response_text(tokenizer, r), max_length, overlong)
            for r in example.responses
        ]
        responses = [sequence for sequence, _ in joined if sequence is not None]
        kept = len(responses) == len(joined)
        fills = len(prompt_ids) >= max_length
        _count(report, kept, any(cut for _, cut in joined), example.where, fills)
        if kept:
            encoded.append(EncodedRanking(responses, example.ranking))
    return _finish(encoded, report, name, max_length)


def encode_prompts(
    examples: list[PromptExample],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    overlong: Overlong = "drop",
    name: str = "prompt data",
) -> list[list[int]]:
    """Prompt ids for generation. ``truncate`` keeps the last ``max_length`` tokens (the end
    of a prompt is what the response continues)."""
    _check_policy(overlong, max_length)
    check_tokenizer_on(tokenizer, examples)
    report = OverlongReport(total=len(examples))
    encoded = []
    for example in examples:
        ids = encode_prompt_text(tokenizer, example.prompt, example.messages)
        if len(ids) > max_length:
            if OVERLONG.trait(overlong, "drops"):
                report.dropped += 1
                report.where_dropped.append(example.where)
                continue
            report.truncated += 1
            ids = ids[-max_length:]
        encoded.append(ids)
    return _finish(encoded, report, name, max_length)


def check_round_trip(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], source: str | None = None
) -> None:
    """Judge the tokenizer on ``texts``, the run's own (the first rows' prompts and responses):
    raise if none of them encodes to a token, or if all decode to empty text; warn when some do
    not come back exactly (tokens it does not know, normalised whitespace)."""
    source = source or getattr(tokenizer, "name_or_path", "") or "tokenizer"
    samples = [t for t in texts if t.strip()]
    if not samples:
        return
    encoded = [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in samples]
    if not any(encoded):
        raise ProxrlError(
            f"tokenizer from '{source}' encodes the data's first {len(samples)} texts "
            f"({_shown(samples[0])}, ...) to zero tokens; it is broken (transformers may have "
            "loaded it with the wrong tokenizer class)"
        )
    decoded = [tokenizer.decode(ids, skip_special_tokens=True) for ids in encoded]
    if not any(d.strip() for d in decoded):
        raise ProxrlError(
            f"tokenizer from '{source}' decodes the data's first {len(samples)} texts "
            f"({_shown(samples[0])}, ...) to empty text: it knows none of their tokens"
        )
    changed = [(t, d) for t, d in zip(samples, decoded, strict=True) if d.strip() != t.strip()]
    if changed:
        log.warning(
            "tokenizer from '%s' does not round-trip %d of the data's first %d texts exactly "
            "(first: %r -> %r)",
            source,
            len(changed),
            len(samples),
            *changed[0],
        )


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 30 else repr(text[:27] + "...")
