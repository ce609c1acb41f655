"""Environments of multi-turn episodes: what answers the model's turns, and tools as plain
Python functions.

An ``Environment`` starts from a dataset row, receives each model turn as decoded text and
returns a ``Turn``: the observation messages appended after it (rendered by the chat template),
the turn's reward and whether the episode is over. ``ToolEnvironment`` is the ready-made one for
tool use: it parses the model's tool calls in the format of ``TOOL_CALL_PARSERS``, runs the
functions and answers each call with a role "tool" message; a turn without a call ends the
episode and is scored.

Chat templates declare how tools are *offered* (``tools=`` takes JSON schemas, derived here by
transformers' ``get_json_schema`` from a function's signature and docstring) but not how a
model *calls* them, so the call format is an option: ``hermes`` (Hermes / Qwen 2.5 style,
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``) by default.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from proxrl.runtime.errors import ProxrlError


@dataclass(frozen=True)
class Turn:
    """What follows one model turn."""

    messages: list[dict[str, Any]]
    """Observation messages appended after the model's turn (role "tool" with "name" and
    "content", or role "user"); [] when done."""
    reward: float = 0.0
    """Reward of the model's turn just taken."""
    done: bool = False
    """The episode is over: no further model turn."""
    tool_calls: int = 0
    """Well-formed tool calls in the turn (a metric; 0 from an environment without tools)."""
    malformed_calls: int = 0
    """Tool calls that could not be parsed or named no tool (a metric)."""


@runtime_checkable
class Environment(Protocol):
    """One episode's counterpart; a factory makes a new one per episode."""

    tools: Sequence[Callable[..., Any]]
    """Plain Python functions offered to the model ([] for none), passed to the chat template
    as ``tools=`` by their JSON schemas (``tool_schemas``)."""

    def reset(self, row: Mapping[str, Any]) -> None:
        """Start an episode from a dataset row (its prompt, messages and other fields)."""
        ...

    def step(self, completion: str) -> Turn:
        """The model's decoded turn → the observation, the turn's reward, whether it is done."""
        ...


def tool_schemas(tools: Sequence[Callable[..., Any]]) -> list[dict[str, Any]] | None:
    """The JSON schemas of ``tools`` from their signatures and docstrings (transformers'
    ``get_json_schema``, what chat templates take as ``tools=``); None for no tools. A function
    it cannot describe (no docstring, an undocumented argument) is a ``ProxrlError``."""
    if not tools:
        return None
    from transformers.utils.chat_template_utils import get_json_schema

    schemas = []
    for tool in tools:
        try:
            schemas.append(get_json_schema(tool))
        except Exception as error:  # transformers' DocstringParsingException, TypeHint…
            name = getattr(tool, "__name__", repr(tool))
            raise ProxrlError(
                f"environment: tool {name}: no JSON schema from its signature and docstring "
                f"({error})"
            ) from error
    return schemas


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote: a tool's name and its arguments, or why it is malformed."""

    name: str
    arguments: dict[str, Any]
    error: str | None = None  # why the call is malformed; None for a well-formed one


HERMES_CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


def parse_hermes(text: str) -> list[ToolCall]:
    """Hermes / Qwen 2.5 tool calls: each ``<tool_call>{"name": str, "arguments": {...}}
    </tool_call>`` in ``text``, in order (arguments also as a JSON string of an object, as some
    models write them). An unclosed tag, invalid JSON or a missing name is a malformed call."""
    calls = []
    for match in HERMES_CALL.finditer(text):
        body, closed = match.group(1).strip(), bool(match.group(2))
        if not closed:
            calls.append(ToolCall("", {}, "the <tool_call> tag is not closed"))
            continue
        try:
            call = json.loads(body)
        except json.JSONDecodeError as error:
            calls.append(ToolCall("", {}, f"the tool call is not valid JSON ({error.msg})"))
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            calls.append(ToolCall("", {}, 'the tool call has no "name" string'))
            continue
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):
            with contextlib.suppress(json.JSONDecodeError):  # else: not an object, below
                arguments = json.loads(arguments)
        if not isinstance(arguments, dict):
            calls.append(ToolCall(call["name"], {}, '"arguments" is not a JSON object'))
            continue
        calls.append(ToolCall(call["name"], arguments))
    return calls


TOOL_CALL_PARSERS: Mapping[str, Callable[[str], list[ToolCall]]] = MappingProxyType(
    {"hermes": parse_hermes}
)
"""``tool_call_format`` → a parser of a model turn's text into its tool calls."""


def tool_call_parser(name: str) -> Callable[[str], list[ToolCall]]:
    """The parser ``tool_call_format`` names; a ``ProxrlError`` naming the field otherwise."""
    if name not in TOOL_CALL_PARSERS:
        raise ProxrlError(
            f"tool_call_format: expected one of {', '.join(TOOL_CALL_PARSERS)}, got {name!r}"
        )
    return TOOL_CALL_PARSERS[name]


class ToolEnvironment:
    """Tool use: each turn's tool calls run and are answered with role "tool" messages; a turn
    without a call is the final answer, scored by ``reward_fn(row, text_of_that_turn)``.

    A malformed call, a call to an unknown tool or a tool that raises is answered with an
    ``error: …`` tool message (the model can read it and retry), never a crash. The result of a
    tool is sent as its ``str()`` (a dict or list as JSON).

    ``tool_call_format`` None follows the run's ``tool_call_format`` (the episode runner sets
    it); a name of ``TOOL_CALL_PARSERS`` fixes it."""

    def __init__(
        self,
        tools: Sequence[Callable[..., Any]],
        reward_fn: Callable[[Mapping[str, Any], str], float],
        tool_call_format: str | None = None,
    ) -> None:
        self.tools = list(tools)
        self.reward_fn = reward_fn
        self.tool_call_format = tool_call_format
        if tool_call_format is not None:
            tool_call_parser(tool_call_format)
        self.functions = {tool.__name__: tool for tool in self.tools}
        self.row: Mapping[str, Any] = {}

    def reset(self, row: Mapping[str, Any]) -> None:
        self.row = row

    def step(self, completion: str) -> Turn:
        calls = tool_call_parser(self.tool_call_format or "hermes")(completion)
        if not calls:
            return Turn([], float(self.reward_fn(self.row, completion)), done=True)
        messages, malformed = [], 0
        for call in calls:
            content = self._answer(call)
            malformed += call.error is not None or call.name not in self.functions
            messages.append({"role": "tool", "name": call.name or "unknown", "content": content})
        return Turn(messages, tool_calls=len(calls) - malformed, malformed_calls=malformed)

    def _answer(self, call: ToolCall) -> str:
        if call.error is not None:
            return f"error: {call.error}"
        if call.name not in self.functions:
            return f"error: no tool named {call.name!r} (tools: {', '.join(self.functions)})"
        try:
            result = self.functions[call.name](**call.arguments)
        except Exception as error:  # the model's arguments, the tool's bug: both are its answer
            return f"error: {type(error).__name__}: {error}"
        return result if isinstance(result, str) else json.dumps(result, default=str)


EnvironmentFactory = Callable[[], Environment]


def load_environment_factory(spec: str) -> EnvironmentFactory:
    """``environment``: ``"module:factory"`` (or a Python API handle) → the factory."""
    from proxrl.rollout.rewards import import_function

    return import_function(spec, "environment")


def new_environment(factory: EnvironmentFactory, tool_call_format: str) -> Environment:
    """A fresh episode's environment from ``factory``; a ``ToolEnvironment`` without a format of
    its own takes the run's ``tool_call_format``."""
    environment = factory()
    if not isinstance(environment, Environment):
        raise ProxrlError(
            f"environment: the factory returned {type(environment).__name__}, not an "
            "Environment (tools, reset(row), step(completion) -> Turn)"
        )
    if isinstance(environment, ToolEnvironment) and environment.tool_call_format is None:
        tool_call_parser(tool_call_format)  # a name it has
        environment.tool_call_format = tool_call_format
    return environment
