"""What the DAPO tests share: a reward named ``tests.algos.dapo_rewards:<name>`` whose constant
groups are known in advance, and the hand replay of dynamic sampling over it."""

from __future__ import annotations

from proxrl.algos.online.prompts import prompt_order

WORDS = ["abc", "def", "ghi", "jkl", "mno", "pqr", "stu", "vwx"]  # first four: constant

GROUP = 4


def constant_for_early_words(
    prompts: list[str], completions: list[str], word: list[str], **columns: list
) -> list[float]:
    """0.5 for every sample of a prompt whose ``word`` sorts before "m" (a constant group); for
    the others the sample's position in its group of 4 (never constant), whatever was sampled.
    The scorer sees the whole batch, a prompt's samples consecutive."""
    return [0.5 if w < "m" else float(i % GROUP) for i, w in enumerate(word)]


def replay_dynamic_sampling(
    iterations: int, batch: int, max_rounds: int, seed: int, world: int = 1
) -> list[tuple[int, int, int, list[str]]]:
    """Dynamic sampling over ``constant_for_early_words``, by hand: per iteration (rounds,
    dropped groups, filled groups, the words of the trained batch in order). With ``world``
    processes rank r samples prompts r, r + world, … of each draw, gathered in rank order."""
    out, extra = [], 0
    for iteration in range(iterations):
        kept: list[str] = []
        dropped: list[str] = []
        rounds = 0
        while len(kept) < batch and rounds < max_rounds:
            order = prompt_order(len(WORDS), batch, iteration + extra + rounds, seed)
            for i in [i for r in range(world) for i in order[r::world]]:
                (dropped if WORDS[i] < "m" else kept).append(WORDS[i])
            rounds += 1
        filled = max(0, batch - len(kept))
        out.append((rounds, len(dropped), filled, (kept + dropped)[:batch]))
        extra += rounds - 1
    return out
