"""Held-out evaluation during online training, early stop, and the best policy kept in
``best/`` — two of the answers to reward hacking (the third, a reward-model ensemble, is in
``rollout.ensemble``).

Every ``eval_every`` iterations (and after the last) the policy answers the ``eval_data``
prompts, greedily or sampled as the training samples, and the held-out metric scores the
answers: ``eval_reward_fn`` (a verifiable score where one exists) or, without one, the
training reward. Logged under ``eval/``: ``eval/score`` (the held-out metric), ``eval/reward``
(the training reward on the held-out answers) and ``eval/length_mean``.

The best policy by ``eval/score`` (higher is better) is saved to ``OUTPUT_DIR/best/`` (a
``save_pretrained`` directory and ``best.json``); ``final_model: best`` makes it the model of
the output directory at the end. The run stops early when ``early_stopping_patience``
evaluations pass without a new best, or (``stop_on_reward_hacking``) when the held-out score
falls while the training reward rises: ``runtime.health.reward_hacking``, the rule the report's
Health section and the training warnings read, on the same points. The history behind those
decisions is part of the checkpoint, so a resumed run decides as the uninterrupted one.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from proxrl.algos.online.episodes import EpisodeSettings, environment_tools, sample_responses
from proxrl.algos.online.heldout_fields import FINAL_MODELS
from proxrl.data.batching import pad_left
from proxrl.data.encoding import encode_prompt_text
from proxrl.data.formats import PromptExample, load_prompt_examples
from proxrl.models.options import autocast
from proxrl.rollout.engines import PolicySampling
from proxrl.rollout.generation import SamplingSettings
from proxrl.rollout.rewards import (
    FunctionReward,
    RewardRole,
    load_reward_function,
    with_extras,
)
from proxrl.runtime import distributed as dist
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.health import EVAL_WINDOW, reward_hacking

log = logging.getLogger(__name__)

BEST_DIR = "best"
BEST_INFO = "best.json"


def evaluations_without_improvement(scores: list[float], threshold: float = 0.0) -> int:
    """How many evaluations since the best one (an improvement must beat the best by more than
    ``threshold``); 0 right after a new best, and for an empty history."""
    best, since = -math.inf, 0
    for score in scores:
        if score > best + threshold:
            best, since = score, 0
        else:
            since += 1
    return since


@dataclass
class EarlyStopState:
    """What the decisions read: every evaluation's step, held-out score and training reward,
    the best one, and why (and when) the run stopped."""

    steps: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    best_step: int = 0
    best_score: float = -math.inf
    stopped_at: int = 0  # 0: still running
    reason: str = ""

    def state_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def stop_reason(state: EarlyStopState, patience: int | None, on_hacking: bool) -> str:
    """Why the run stops after its latest evaluation ("" while it goes on)."""
    if patience is not None and evaluations_without_improvement(state.scores) >= patience:
        return f"{patience} evaluations without a better eval/score than {state.best_score:.4g}"
    if on_hacking:
        since = reward_hacking(state.steps, state.rewards, state.scores, window=EVAL_WINDOW)
        if since is not None:
            return (
                f"reward hacking since iteration {since}: eval/score falls while the reward rises"
            )
    return ""


def load_eval_prompts(
    path: str, tokenizer: Any, max_length: int, tools: list[dict[str, Any]] | None = None
) -> tuple[list[PromptExample], list[list[int]]]:
    examples = load_prompt_examples(path)
    kept = [(e, encode_prompt_text(tokenizer, e.prompt, e.messages, tools)) for e in examples]
    kept = [(e, ids) for e, ids in kept if len(ids) <= max_length]
    if not kept:
        raise ProxrlError(f"every prompt in {path} is longer than max_prompt_length")
    return [e for e, _ in kept], [ids for _, ids in kept]


@dataclass(frozen=True)
class HeldOutSettings:
    """What the held-out evaluation reads of the run's options (the config's of the same
    names), built when the run opens (``run_settings``; None without ``eval_data``)."""

    eval_data: str  # the held-out prompts
    eval_every: int  # evaluate every N iterations (0: only at the end)
    eval_reward_fn: str | None  # the held-out metric (None: the training reward)
    eval_batch_size: int  # held-out prompts per generation batch
    early_stopping_patience: int | None
    stop_on_reward_hacking: bool
    final_model: str  # FINAL_MODELS' name
    iterations: int  # the run's: the last one is always evaluated
    max_prompt_length: int  # longer held-out prompts are dropped
    seed: int  # a sampled evaluation's stream is seed-derived
    mixed_precision: str  # the evaluation's autocast (models.options.autocast)
    shares_prefix: bool  # a duplicated prompt is prefilled once
    stop_strings: tuple[str, ...]  # (the sampler that honours them)
    distribution: SamplingSettings  # the training's, greedy as eval_greedy says
    episodes: EpisodeSettings | None  # multi-turn episodes (None: one response per prompt)


class HeldOut:
    """The held-out evaluation of one run; ``step`` after every iteration, ``finish`` at the end."""

    def __init__(
        self, settings: HeldOutSettings, tokenizer: Any, rewards: RewardRole, output_dir: Path
    ):
        self.settings = settings
        self.rewards = rewards
        metric = settings.eval_reward_fn
        try:
            self.metric = (
                None if metric is None else FunctionReward(metric, load_reward_function(metric))
            )
        except ProxrlError as exc:
            raise ProxrlError(f"eval_reward_fn: {str(exc).removeprefix('reward_fn: ')}") from exc
        episodes = settings.episodes
        try:
            self.prompts, self.prompt_ids = load_eval_prompts(
                settings.eval_data,
                tokenizer,
                settings.max_prompt_length,
                None
                if episodes is None
                else environment_tools(episodes.environment, episodes.tool_call_format),
            )
        except ProxrlError as exc:
            raise ProxrlError(f"eval_data: {str(exc).removeprefix('eval_data: ')}") from exc
        self.best_dir = output_dir / BEST_DIR
        self.state = EarlyStopState()

    @classmethod
    def create(
        cls, settings: HeldOutSettings | None, tokenizer: Any, rewards: RewardRole, output_dir: Path
    ) -> HeldOut | None:
        """None without ``eval_data`` (``settings`` None)."""
        return None if settings is None else cls(settings, tokenizer, rewards, output_dir)

    # the checkpoint holds the decisions' history
    def state_dict(self) -> dict[str, Any]:
        return self.state.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.load_state_dict(state)

    @property
    def stopped(self) -> bool:
        return self.state.stopped_at > 0

    def due(self, done: int) -> bool:
        every = self.settings.eval_every
        return done == self.settings.iterations or bool(every and done % every == 0)

    @torch.no_grad()
    def evaluate(self, models: Any, done: int) -> dict[str, float]:
        """Answer every held-out prompt once (a whole episode, with an environment) and score
        the answers."""
        held, tokenizer, actor = self.settings, models.tokenizer, models.actor
        # the built-in samplers of the policy itself, whichever engine the rollouts use
        engine = PolicySampling(
            tokenizer, generate=bool(held.stop_strings), shared_prefill=held.shares_prefix
        )
        device = next(actor.parameters()).device
        was_training = actor.training
        actor.eval()
        completions: list[str] = []
        lengths: list[float] = []
        outputs = []  # the episodes carry their environment's rewards
        # its own random stream: sampled evaluations leave the training's untouched (resume)
        with (
            torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
            autocast(held.mixed_precision),
        ):
            torch.manual_seed(held.seed * 100_003 + done)
            for start in range(0, len(self.prompt_ids), held.eval_batch_size):
                ids = self.prompt_ids[start : start + held.eval_batch_size]
                with dist.gathered_for_generation(actor) as whole:
                    out = sample_responses(
                        held.episodes,
                        engine.sampler(whole),
                        tokenizer,
                        self.prompts[start : start + held.eval_batch_size],
                        pad_left(ids, tokenizer.pad_token_id).to(device),
                        pad_left([[1] * len(r) for r in ids], 0).to(device),
                        held.distribution,
                        with_logprobs=False,
                    )
                    outputs.append(out)
                mask = out.response_mask
                completions += tokenizer.batch_decode(
                    out.response_ids * mask + tokenizer.pad_token_id * (1 - mask),
                    skip_special_tokens=True,
                )
                lengths += mask.sum(-1).float().tolist()
        actor.train(was_training)
        columns: dict[str, Any] = {}
        for p in self.prompts:
            for key, value in p.columns.items():
                columns.setdefault(key, []).append(value)
        ids = [
            r[m.bool()].tolist()
            for o in outputs
            for r, m in zip(o.response_ids, o.response_mask, strict=True)
        ]
        messages = [m for o in outputs for m in getattr(o, "messages", ())]  # episodes' turns
        columns = with_extras(columns, ids, self.rewards.trainer_state, messages or None)
        reward = self.rewards(self.prompts, completions, columns).total
        if held.episodes is not None:  # and each episode's reward from its environment
            reward = reward + torch.cat([out.scores for out in outputs])  # type: ignore[attr-defined]
        score = reward if self.metric is None else self.metric(self.prompts, completions, columns)
        return {
            "eval/score": score.mean().item(),
            "eval/reward": reward.mean().item(),
            "eval/length_mean": sum(lengths) / len(lengths),
        }

    def step(self, done: int, row: dict[str, float], models: Any) -> bool:
        """After iteration ``done``: evaluate when due (the metrics go into ``row``), keep a new
        best in ``best/``, and return whether the run stops here."""
        if not self.due(done):
            return False
        metrics = self.evaluate(models, done)
        row.update(metrics)
        state = self.state
        state.steps.append(done)
        state.scores.append(metrics["eval/score"])
        state.rewards.append(row["objective/scores"])
        if metrics["eval/score"] > state.best_score:
            state.best_step, state.best_score = done, metrics["eval/score"]
            gathered = dist.full_state(models.actor.state_dict()) if dist.is_sharded() else None
            if dist.is_main():
                self.save_best(models, done, metrics["eval/score"], gathered)
        reason = stop_reason(
            state, self.settings.early_stopping_patience, self.settings.stop_on_reward_hacking
        )
        if reason and done < self.settings.iterations:
            state.stopped_at, state.reason = done, reason
            log.warning("early stop after iteration %d: %s", done, reason)
        return bool(state.stopped_at)

    def save_best(
        self, models: Any, done: int, score: float, state_dict: dict[str, Any] | None = None
    ) -> None:
        """``best/``: written beside, then swapped in, so a kill never leaves half a model
        (``state_dict``: the actor's weights gathered by FSDP, else its own)."""
        staging = self.best_dir.with_name(BEST_DIR + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        models.actor.save_pretrained(staging, state_dict=state_dict)
        models.tokenizer.save_pretrained(staging)
        (staging / BEST_INFO).write_text(
            json.dumps({"iteration": done, "eval/score": score}) + "\n", encoding="utf-8"
        )
        old = self.best_dir.with_name(BEST_DIR + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if self.best_dir.exists():
            self.best_dir.rename(old)
        staging.rename(self.best_dir)
        shutil.rmtree(old, ignore_errors=True)

    def finish(self, output_dir: Path) -> None:
        """``final_model: best``: the output directory's policy becomes best/'s."""
        best = FINAL_MODELS.trait(self.settings.final_model, "best")
        if not best or not dist.is_main() or not self.best_dir.is_dir():
            return
        for path in self.best_dir.iterdir():
            if path.name != BEST_INFO and path.is_file():
                shutil.copy2(path, output_dir / path.name)
        log.info(
            "final_model best: %s holds the policy of iteration %d (eval/score %.4g)",
            output_dir,
            self.state.best_step,
            self.state.best_score,
        )
