"""Environments the multi-turn tests name as ``tests.algos.mt_envs:<factory>``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxrl.rollout.environment import ToolEnvironment, Turn

TARGET = set("abcdefghijklm")


def target_fraction(text: str) -> float:
    """Share of the text's characters among the first thirteen letters (0 for no text)."""
    return sum(ch in TARGET for ch in text) / max(len(text), 1)


class TwoTurns:
    """Answers the first model turn with a user message, ends after the second: the reward is
    the length of the second turn's text alone, /10 (never the same for every episode of a
    random model, whose text is mostly not letters)."""

    tools: list[Any] = []

    def reset(self, row: Mapping[str, Any]) -> None:
        self.turns = 0

    def step(self, completion: str) -> Turn:
        self.turns += 1
        if self.turns == 1:
            return Turn([{"role": "user", "content": "again:"}])
        return Turn([], reward=len(completion) / 10, done=True)


def two_turns() -> TwoTurns:
    return TwoTurns()


def echo(text: str) -> str:
    """Repeat a text.

    Args:
        text: what to repeat
    """
    return text


def tools() -> ToolEnvironment:
    return ToolEnvironment([echo], lambda row, text: target_fraction(text))


def not_an_environment() -> object:
    return object()


class EchoOnce(TwoTurns):
    """As TwoTurns, but the observation repeats the model's first turn: observations of
    different lengths."""

    def step(self, completion: str) -> Turn:
        if not self.turns:
            self.turns += 1
            return Turn([{"role": "user", "content": completion * 2}])
        return super().step(completion)


def echo_once() -> EchoOnce:
    return EchoOnce()
