"""The online loop's multi-turn side: with ``environment`` set, a rollout's responses are whole
episodes (``rollout.multiturn``) and their scores the environment's rewards; without it, one
sampled response per row, scored by the reward sources, as ever.

The rollout calls these three functions wherever it samples, scores and asks which responses
stopped, so the rest of the loop (forward passes, advantages, the update) sees one
``Experience`` whichever it got: ``Experience.loss_mask`` keeps every loss on the model's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from torch import Tensor

from proxrl.data.formats import PromptExample
from proxrl.rollout.environment import (
    EnvironmentFactory,
    load_environment_factory,
    new_environment,
    tool_schemas,
)
from proxrl.rollout.generation import Sampler, Samples, SamplingSettings, stopped
from proxrl.rollout.multiturn import EpisodeLimits, Episodes, run_episodes
from proxrl.rollout.rewards import RewardRole, RewardScores, with_extras


@cache
def _factory(spec: str) -> EnvironmentFactory:
    return load_environment_factory(spec)


def environment_tools(
    environment: str | None, tool_call_format: str
) -> list[dict[str, Any]] | None:
    """The JSON schemas of the tools the environment ``environment`` (module:factory) offers
    (None: no environment or no tools), for rendering its prompts and observations."""
    if environment is None:
        return None
    return tool_schemas(new_environment(_factory(environment), tool_call_format).tools)


@dataclass(frozen=True)
class EpisodeSettings:
    """What a rollout's multi-turn episodes read of the run's options (``environment`` set;
    built when the run opens, ``run_settings``: None without an environment, one sampled
    response per row)."""

    environment: str  # module:factory of each episode's Environment
    tool_call_format: str  # how a model turn's tool calls are parsed
    limits: EpisodeLimits  # most model turns, most tokens after the prompt


def episode_row(prompt: PromptExample) -> dict[str, Any]:
    """The dataset row an environment starts from: the prompt, its messages, the other fields."""
    return {"prompt": prompt.prompt, "messages": prompt.messages, **prompt.columns}


def conversation(prompt: PromptExample) -> list[dict[str, Any]]:
    """The prompt as chat messages (a standard prompt as one user message)."""
    if prompt.messages is not None:
        return [dict(m) for m in prompt.messages]
    return [{"role": "user", "content": prompt.prompt}]


def sample_responses(
    episodes: EpisodeSettings | None,
    sampler: Sampler,
    tokenizer: Any,
    prompts: list[PromptExample],
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    settings: SamplingSettings,
    with_logprobs: bool,
) -> Samples:
    """One response per row of ``prompt_ids``: a sampled one, or with ``episodes`` a whole
    episode (``Episodes``) started from ``prompts[i]``."""
    if episodes is None:
        return sampler.sample(prompt_ids, prompt_mask, settings, with_logprobs=with_logprobs)
    factory = _factory(episodes.environment)
    return run_episodes(
        sampler,
        tokenizer,
        [new_environment(factory, episodes.tool_call_format) for _ in prompts],
        [episode_row(p) for p in prompts],
        [conversation(p) for p in prompts],
        prompt_ids,
        prompt_mask,
        settings,
        episodes.limits,
        with_logprobs=with_logprobs,
        tools=environment_tools(episodes.environment, episodes.tool_call_format),
    )


def score_responses(
    samples: Samples,
    rewards: RewardRole,
    prompts: list[PromptExample],
    completions: list[str],
    columns: dict[str, list[Any]],
) -> RewardScores:
    """The reward sources' scores of each completion, an episode's reward from its environment
    one more source (``reward/environment``). Reward functions also get each completion's token
    ids and the run's ``trainer_state``, as TRL passes them."""
    mask = samples.response_mask.bool()
    ids = [row[keep].tolist() for row, keep in zip(samples.response_ids, mask, strict=True)]
    messages = samples.messages if isinstance(samples, Episodes) else None
    columns = with_extras(columns, ids, rewards.trainer_state, messages)
    scored = rewards(prompts, completions, columns)
    if isinstance(samples, Episodes):
        assert samples.scores is not None
        scored = scored.with_source("environment", samples.scores.cpu(), samples.metrics)
    return scored


def responses_stopped(samples: Samples, eos_token_id: int, max_new_tokens: int) -> Tensor:
    """(B,) True where a response ended by itself (``generation.stopped``); an episode, where
    its last model turn did and the token budget did not cut it."""
    if isinstance(samples, Episodes):
        assert samples.stopped is not None
        return samples.stopped.to(samples.response_ids.device)
    return stopped(samples.response_mask, samples.response_ids, eos_token_id, max_new_tokens)
