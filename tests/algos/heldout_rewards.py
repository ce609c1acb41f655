"""Held-out metrics the held-out-evaluation tests name as
``tests.algos.heldout_rewards:<name>``."""

from __future__ import annotations


def constant(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    """The same score whatever the policy does: no evaluation ever improves on the first."""
    return [0.5] * len(completions)


def length(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    """Characters of the completion: a score that moves from one evaluation to the next."""
    return [float(len(c)) for c in completions]
