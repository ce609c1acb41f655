"""Reward functions the DAPO tests import as ``dapo_rewards:<name>``."""

from __future__ import annotations

GROUP = 4


def constant_for_early_words(
    prompts: list[str], completions: list[str], word: list[str], **columns: list
) -> list[float]:
    """0.5 for every sample of a prompt whose ``word`` sorts before "m" (a constant group); for
    the others the sample's position in its group of 4 (never constant), whatever was sampled.
    The scorer sees the whole batch, a prompt's samples consecutive."""
    return [0.5 if w < "m" else float(i % GROUP) for i, w in enumerate(word)]
