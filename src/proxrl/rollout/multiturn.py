"""Multi-turn episodes through any ``Sampler``: token in, token out.

B episodes advance turn by turn as one batch: every still-running episode's context (its prompt
and every token of its episode so far) goes to ``Sampler.sample`` as token ids, the tokens it
samples are appended exactly as sampled, the decoded turn goes to the episode's environment,
and the observation it answers with is appended as the chat template renders it: the text that
rendering the conversation with the observation messages (and the generation prompt of the
next assistant turn) adds to rendering it without them, tokenised on its own. The text so far
is never re-tokenised, so the trainer scores exactly the tokens the sampler drew (BPE is not a
bijection: decoding and re-encoding a sample can give other ids).

``action_mask`` marks the tokens the model sampled; observation tokens are 1 in
``response_mask`` (attention sees them) and 0 in ``action_mask`` (no loss, KL, entropy, value
loss or advantage reads them). Whatever a template writes after the model's stop token (a
newline after an end-of-turn token, say) belongs to neither: the model did not sample it and the
delta starts after it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from proxrl.data.batching import pad_left, pad_right
from proxrl.data.encoding import render_conversation
from proxrl.rollout.environment import Environment, Turn
from proxrl.rollout.generation import Sampler, Samples, SamplingSettings
from proxrl.runtime.errors import ProxrlError


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int  # model turns per episode
    max_episode_tokens: int  # model + observation tokens after the prompt


@dataclass
class Episodes(Samples):
    """``Samples`` of whole episodes: response_ids / response_mask span model and observation
    tokens, logprobs and entropy are the sampler's at model tokens (0 elsewhere)."""

    scores: Tensor | None = None  # (B,) the episode's reward: the sum of its turns' rewards
    stopped: Tensor | None = None  # (B,) bool, the last model turn ended by itself (EOS) and
    # the token budget did not cut the episode
    turn_rewards: list[list[float]] = field(default_factory=list)  # per episode, per model turn
    metrics: dict[str, float] = field(default_factory=dict)  # episode/… means over the batch
    messages: list[list[dict[str, Any]]] = field(default_factory=list)  # per episode, its turns
    # after the prompt (assistant, observations, assistant…): what reward functions get


def observation_ids(
    tokenizer: Any,
    conversation: list[dict[str, Any]],
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
) -> list[int]:
    """The tokens of observation ``messages`` after ``conversation`` (which ends with the
    model's turn), up to the next assistant turn's generation prompt, as the chat template
    renders them."""
    before = render_conversation(tokenizer, conversation, False, tools)
    after = render_conversation(tokenizer, conversation + messages, True, tools)
    if not after.startswith(before):
        raise ProxrlError(
            "environment: the chat template renders the earlier turns differently once an "
            "observation follows them, so the observation's tokens cannot be appended"
        )
    return list(tokenizer(after[len(before) :], add_special_tokens=False)["input_ids"])


@dataclass
class _Episode:
    environment: Environment
    conversation: list[dict[str, Any]]
    context: list[int]  # prompt tokens
    prompt_turns: int = 0  # the conversation's messages before the episode's own
    tokens: list[int] = field(default_factory=list)
    actions: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    tool_calls: int = 0
    malformed_calls: int = 0
    stopped: bool = False
    budget_cut: bool = False
    turn_limited: bool = False

    def append(
        self, ids: list[int], action: int, logprobs: list[float], entropy: list[float]
    ) -> None:
        self.tokens += ids
        self.actions += [action] * len(ids)
        self.logprobs += logprobs
        self.entropy += entropy


@torch.no_grad()
def run_episodes(
    sampler: Sampler,
    tokenizer: Any,
    environments: Sequence[Environment],
    rows: Sequence[Mapping[str, Any]],
    conversations: Sequence[list[dict[str, Any]]],
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    settings: SamplingSettings,
    limits: EpisodeLimits,
    with_logprobs: bool = False,
    tools: list[dict[str, Any]] | None = None,
) -> Episodes:
    """Run one episode per row: ``environments[i].reset(rows[i])``, then model turns and
    observations until the environment is done, ``max_turns`` model turns were taken or the
    token budget is spent. ``conversations[i]`` is row i's prompt as chat messages (for
    rendering observations after it), ``prompt_ids`` / ``prompt_mask`` (B, P) its left-padded
    tokens, ``tools`` the JSON schemas the prompt offered.

    Each model turn may take ``settings.max_new_tokens`` tokens, fewer where the episode's
    budget has less room; an observation that does not fit with one more model token ends the
    episode (cut by the budget), so an episode always ends on a model token."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    episodes = []
    for environment, row, conversation, ids, mask in zip(
        environments, rows, conversations, prompt_ids, prompt_mask, strict=True
    ):
        environment.reset(row)
        context = ids[mask.bool()].tolist()
        episodes.append(_Episode(environment, list(conversation), context, len(conversation)))
    running = list(episodes)
    while running:
        room = [
            min(settings.max_new_tokens, limits.max_episode_tokens - len(e.tokens)) for e in running
        ]
        contexts = [e.context + e.tokens for e in running]
        samples = sampler.sample(
            pad_left(contexts, pad).to(prompt_ids.device),
            pad_left([[1] * len(c) for c in contexts], 0).to(prompt_ids.device),
            replace(settings, max_new_tokens=max(room)),
            with_logprobs=with_logprobs,
        )
        still_running = []
        for row_index, (episode, allowed) in enumerate(zip(running, room, strict=True)):
            valid = int(samples.response_mask[row_index].sum())
            kept = min(max(valid, 1), allowed)  # an empty turn keeps its first token
            turn = samples.response_ids[row_index, :kept].tolist()
            # A sampler ends a row before its max_new_tokens only by stopping (EOS, a stop
            # string); the turn stopped by itself if that happened within this episode's room.
            ended = valid < max(room) or eos in samples.response_ids[row_index, :valid].tolist()
            episode.stopped = ended and valid <= allowed
            logprobs = entropy = [0.0] * kept
            if with_logprobs:
                logprobs = samples.logprobs[row_index, :kept].tolist()  # type: ignore[index]
                entropy = samples.entropy[row_index, :kept].tolist()  # type: ignore[index]
            episode.append(turn, 1, logprobs, entropy)
            text = tokenizer.decode(turn, skip_special_tokens=True)
            outcome = episode.environment.step(text)
            if not isinstance(outcome, Turn):
                raise ProxrlError(
                    f"environment: step returned {type(outcome).__name__}, not a Turn"
                )
            episode.rewards.append(float(outcome.reward))
            episode.tool_calls += outcome.tool_calls
            episode.malformed_calls += outcome.malformed_calls
            episode.conversation.append({"role": "assistant", "content": text})
            if outcome.done:
                continue
            if not episode.stopped and allowed < settings.max_new_tokens:  # the budget cut it
                episode.budget_cut = True
                continue
            if len(episode.rewards) >= limits.max_turns:
                episode.turn_limited = True
                continue
            observation = observation_ids(tokenizer, episode.conversation, outcome.messages, tools)
            if len(episode.tokens) + len(observation) + 1 > limits.max_episode_tokens:
                episode.budget_cut = True
                continue
            zeros = [0.0] * len(observation)
            episode.append(observation, 0, zeros, zeros)
            episode.conversation += outcome.messages
            still_running.append(episode)
        running = still_running
    return _collate(episodes, pad, prompt_ids.device, with_logprobs)


def _collate(
    episodes: list[_Episode], pad: int, device: torch.device, with_logprobs: bool
) -> Episodes:
    def padded(rows: list[list[Any]], value: Any, dtype: torch.dtype) -> Tensor:
        width = max(len(r) for r in rows)
        return torch.tensor([list(r) + [value] * (width - len(r)) for r in rows], dtype=dtype)

    result = Episodes(
        response_ids=pad_right([e.tokens for e in episodes], pad).to(device),
        response_mask=pad_right([[1] * len(e.tokens) for e in episodes], 0).to(device),
        action_mask=pad_right([e.actions for e in episodes], 0).to(device),
        scores=torch.tensor([sum(e.rewards) for e in episodes], dtype=torch.float32),
        stopped=torch.tensor([e.stopped and not e.budget_cut for e in episodes]),
        turn_rewards=[e.rewards for e in episodes],
        metrics=episode_metrics(episodes),
        messages=[e.conversation[e.prompt_turns :] for e in episodes],
    )
    if with_logprobs:
        result.logprobs = padded([e.logprobs for e in episodes], 0.0, torch.float32).to(device)
        result.entropy = padded([e.entropy for e in episodes], 0.0, torch.float32).to(device)
    return result


def episode_metrics(episodes: list[_Episode]) -> dict[str, float]:
    """Means over the batch: model turns, tool calls and observation tokens per episode, the
    share of attempted calls that were malformed, the shares of episodes cut by the token budget
    and stopped by max_turns."""
    n = len(episodes)
    calls = sum(e.tool_calls for e in episodes)
    malformed = sum(e.malformed_calls for e in episodes)
    return {
        "episode/turns_mean": sum(len(e.rewards) for e in episodes) / n,
        "episode/tool_calls_mean": calls / n,
        "episode/malformed_call_rate": malformed / max(calls + malformed, 1),
        "episode/budget_cut_rate": sum(e.budget_cut for e in episodes) / n,
        "episode/max_turns_rate": sum(e.turn_limited for e in episodes) / n,
        "episode/observation_tokens_mean": sum(e.actions.count(0) for e in episodes) / n,
    }
