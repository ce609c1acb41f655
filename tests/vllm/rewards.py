"""Reward functions the vLLM runs import as ``tests.vllm.rewards:<name>``."""

from __future__ import annotations

import random

TARGET = set("abcdefghijklm")


def target_fraction(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    return [sum(ch in TARGET for ch in c) / max(len(c), 1) for c in completions]


_NOISE = random.Random(0)


def noise(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    """A seeded uniform score per response, for speed benchmarks on models whose tokens do not
    decode (random weights over a vocabulary larger than the tokenizer's): the update then
    trains on non-zero advantages, as a real run would."""
    return [_NOISE.random() for _ in completions]
