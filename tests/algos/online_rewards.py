"""Reward functions the online-RL tests import as ``tests.algos.online_rewards:<name>``."""

from __future__ import annotations

TARGET = set("abcdefghijklm")


def text(completion: str | list[dict]) -> str:
    """A completion's text: itself, or for a conversational prompt its messages' contents
    (TRL passes ``[{"role": "assistant", "content": ...}]``, an episode all its turns)."""
    return completion if isinstance(completion, str) else "".join(m["content"] for m in completion)


def target_fraction(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    """Share of the completion's characters among the first thirteen letters: learnable by a
    tiny model in a few dozen iterations; 0 for an empty completion."""
    texts = map(text, completions)
    return [sum(ch in TARGET for ch in c) / max(len(c), 1) for c in texts]


def raises(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    raise RuntimeError("boom")


def wrong_count(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    return [0.0]


def not_finite(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    return [float("nan")] * len(completions)


def echoes_word(
    prompts: list[str], completions: list[str], word: list[str], **columns: list
) -> list[float]:
    """1 when the completion contains the prompt row's ``word`` column: shows that dataset
    columns reach reward functions, one entry per completion."""
    assert len(word) == len(completions)
    return [float(w in c) for w, c in zip(word, completions, strict=True)]


def word_in_first_half(
    prompts: list[str], completions: list[str], word: list[str], **columns: list
) -> list[float]:
    """1 for prompts whose ``word`` column sorts before "m": a score the critic can read off
    the prompt, whatever the policy samples."""
    return [float(w < "m") for w in word]


def trl_echoes_word(completions: list[str], word: list[str], **kwargs: object) -> list[float]:
    """TRL's shape: completions and the column by keyword, the rest in ``**kwargs``."""
    assert kwargs["prompts"] and len(word) == len(completions)
    return [float(w in c) for w, c in zip(word, completions, strict=True)]


def trl_needs_answer(completions: list[str], answer: list[str], **kwargs: object) -> list[float]:
    """Names a column the test prompts do not have."""
    return [0.0] * len(completions)
