"""Reward functions the online-RL tests import as ``online_rewards:<name>``."""

from __future__ import annotations

TARGET = set("abcdefghijklm")


def target_fraction(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    """Share of the completion's characters among the first thirteen letters: learnable by a
    tiny model in a few dozen iterations; 0 for an empty completion."""
    return [sum(ch in TARGET for ch in c) / max(len(c), 1) for c in completions]


def raises(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    raise RuntimeError("boom")


def wrong_count(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    return [0.0]


def not_finite(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    return [float("nan")] * len(completions)
