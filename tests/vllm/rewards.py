"""Reward functions the vLLM runs import as ``rewards:<name>``."""

from __future__ import annotations

TARGET = set("abcdefghijklm")


def target_fraction(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    return [sum(ch in TARGET for ch in c) / max(len(c), 1) for c in completions]
