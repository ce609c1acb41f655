"""Score a policy on the calculator task: whole episodes through the multi-turn runner
(``rollout.multiturn``), greedy by default, each one kept as its turns for the report."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from proxrl.data.batching import pad_left
from proxrl.data.encoding import encode_prompt_text
from proxrl.rollout.generation import CachedSampler, SamplingSettings


@dataclass
class TaskScores:
    accuracy: float  # share of episodes whose final answer is exactly the product
    tool_call_rate: float  # share of episodes with at least one tool call answered without error
    malformed_call_rate: float  # calls answered with an error / calls attempted
    episodes: list[dict[str, Any]]  # {"prompt", "answer", "turns": [{"role", "text"}], "correct"}


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def split_turns(tokenizer: Any, ids: list[int], actions: list[int]) -> list[dict[str, str]]:
    """An episode's tokens as alternating model / observation pieces (decoded)."""
    turns: list[dict[str, str]] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or actions[i] != actions[start]:
            role = "model" if actions[start] else "observation"
            text = tokenizer.decode(ids[start:i], skip_special_tokens=False)
            turns.append({"role": role, "text": text})
            start = i
    return turns


@torch.no_grad()
def evaluate_task(
    policy: Any,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    environment_factory: Callable[[], Any],
    *,
    max_turns: int = 3,
    max_new_tokens: int = 32,
    max_episode_tokens: int = 96,
    greedy: bool = True,
    temperature: float = 1.0,
    batch_size: int = 200,
    seed: int = 0,
) -> TaskScores:
    """Run one episode per row (``rows``: {messages, answer}) and score the final answers."""
    from proxrl.rollout.environment import tool_schemas
    from proxrl.rollout.multiturn import EpisodeLimits, run_episodes

    policy.eval()
    sampler = CachedSampler(policy, tokenizer)
    settings = SamplingSettings(
        max_new_tokens=max_new_tokens, temperature=temperature, greedy=greedy
    )
    limits = EpisodeLimits(max_turns=max_turns, max_episode_tokens=max_episode_tokens)
    episodes: list[dict[str, Any]] = []
    called = malformed = attempted = 0
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            environments = [environment_factory() for _ in chunk]
            tools = tool_schemas(environments[0].tools)
            ids = [encode_prompt_text(tokenizer, "", r["messages"], tools) for r in chunk]
            result = run_episodes(
                sampler,
                tokenizer,
                environments,
                chunk,
                [r["messages"] for r in chunk],
                pad_left(ids, tokenizer.pad_token_id),
                pad_left([[1] * len(x) for x in ids], 0),
                settings,
                limits,
                tools=tools,
            )
            assert result.scores is not None
            for i, row in enumerate(chunk):
                n = int(result.response_mask[i].sum())
                turns = split_turns(
                    tokenizer,
                    result.response_ids[i, :n].tolist(),
                    result.action_mask[i, :n].tolist(),  # type: ignore[index]
                )
                observations = [t["text"] for t in turns if t["role"] == "observation"]
                bad = sum("error:" in t for t in observations)
                called += len(observations) > bad
                malformed += bad
                attempted += len(observations)
                episodes.append(
                    {
                        "prompt": row["messages"][-1]["content"],
                        "answer": row["answer"],
                        "turns": turns,
                        "correct": bool(result.scores[i] > 0.5),
                    }
                )
    n = len(episodes)
    return TaskScores(
        accuracy=sum(e["correct"] for e in episodes) / n,
        tool_call_rate=called / n,
        malformed_call_rate=malformed / max(attempted, 1),
        episodes=episodes,
    )
