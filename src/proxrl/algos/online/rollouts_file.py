"""Rollouts produced elsewhere (an agent harness, another engine), read from a JSONL or Parquet
file into the sample stage's record, so the online loop's later stages (forward passes,
advantages, update) train on them as on their own.

One JSONL line or Parquet row per trajectory (README, "Rollouts from elsewhere"; in Parquet a
null is an absent field):

- ``prompt_ids``: the prompt's token ids (as the policy reads them: chat template applied);
- ``response_ids``: the response's token ids (a multi-turn episode: model turns and the
  observations between them);
- ``logprobs``: the behaviour policy's log-probability of each response token (any value where
  ``loss_mask`` is 0);
- ``reward`` (a number) or ``rewards`` (one per response token, 0 where ``loss_mask`` is 0):
  their sum is the trajectory's score, which the critic-free estimators take; PPO's GAE takes
  each at its token (``Experience.token_rewards``);
- ``group``: a string or integer naming the prompt's group; a group's rows share their
  ``prompt_ids`` and number ``group_size``;
- optional ``loss_mask``: 1 at tokens the policy produced, 0 at observations (default all 1);
- optional ``response``: the response's text, checked against the tokenizer's decoding of
  ``response_ids`` (another tokenizer's ids are refused).

A bad line is refused with ``file:line: field: expected …`` (a Parquet row: ``file:row N``, N
counted from 0 as ``readers`` counts a data file's Parquet rows).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from proxrl.algos.online.collect import (
    OldPolicySource,
    RolloutBatch,
    Sampled,
    Scored,
    evaluate,
    shaped_scores,
)
from proxrl.algos.online.config import OnlineConfig
from proxrl.algos.online.episodes import responses_stopped
from proxrl.algos.online.roles import Models
from proxrl.core import rewards_at_tokens
from proxrl.data.batching import pad_left
from proxrl.data.formats import PromptExample
from proxrl.rollout.generation import Samples
from proxrl.runtime import distributed as dist
from proxrl.runtime.errors import ProxrlError


@dataclass(frozen=True)
class Limits:
    """What a trajectory must fit: the tokenizer's vocabulary and the run's lengths."""

    vocab_size: int  # len(tokenizer): every id below it
    group_size: int  # rows per group
    max_prompt_length: int
    max_new_tokens: int  # the response budget (Dr. GRPO's horizon is this)


@dataclass
class Trajectory:
    """One checked line of a rollouts file."""

    where: str  # file:line (Parquet: file:row N)
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    loss_mask: list[int] | None
    score: float
    group: str
    rewards: list[float] | None = None  # one per response token (the row's ``rewards``)


def read_rollouts(path: str | Path, tokenizer: Any, limits: Limits) -> list[Trajectory]:
    """Every trajectory of ``path`` (``.parquet``: Parquet, else JSONL), checked, a group's rows
    consecutive (groups in the order of their first row, rows in file order)."""
    groups: dict[str, list[Trajectory]] = {}
    records = _parquet_rows if str(path).lower().endswith(".parquet") else _jsonl_rows
    for where, record in records(path):
        row = _trajectory(where, record, tokenizer, limits)
        groups.setdefault(row.group, []).append(row)
    if not groups:
        raise ProxrlError(f"rollouts_file: {path} holds no trajectory")
    for rows in groups.values():
        if len(rows) != limits.group_size:
            raise ProxrlError(
                f"{rows[-1].where}: group: expected {limits.group_size} rows (group_size) in "
                f"group {rows[0].group!r}, got {len(rows)}"
            )
        other = next((r for r in rows if r.prompt_ids != rows[0].prompt_ids), None)
        if other is not None:
            raise ProxrlError(
                f"{other.where}: prompt_ids: expected those of the group's first row "
                f"({rows[0].where}): a group shares one prompt"
            )
    return [row for rows in groups.values() for row in rows]


def _jsonl_rows(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """Each non-blank line's object and its ``file:line``."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ProxrlError(f"rollouts_file: cannot read {path}: {exc.strerror}") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ProxrlError(f"{where}: expected a JSON object ({exc.msg})") from None
        if not isinstance(row, dict):
            raise ProxrlError(f"{where}: expected a JSON object, got {type(row).__name__}")
        rows.append((where, row))
    return rows


def _parquet_rows(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """Each row's fields (a null one left out: a column another row needs) and its
    ``file:row N``."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a missing or damaged file
        raise ProxrlError(f"rollouts_file: cannot read {path} as Parquet ({exc})") from None
    return [
        (f"{path}:row {i}", {k: v for k, v in record.items() if v is not None})
        for i, record in enumerate(table.to_pylist())
    ]


def _trajectory(where: str, row: dict[str, Any], tokenizer: Any, limits: Limits) -> Trajectory:
    prompt = _ids(where, row, "prompt_ids", limits.vocab_size, limits.max_prompt_length)
    response = _ids(where, row, "response_ids", limits.vocab_size, limits.max_new_tokens)
    n = len(response)
    mask = row.get("loss_mask")
    if mask is not None and (
        not isinstance(mask, list) or len(mask) != n or any(m not in (0, 1) for m in mask)
    ):
        raise ProxrlError(f"{where}: loss_mask: expected {n} values, each 0 or 1")
    logprobs = _numbers(where, row, "logprobs", n)
    scored = mask or [1] * n
    bad = next((v for v, m in zip(logprobs, scored, strict=True) if m and not v <= 1e-6), None)
    if bad is not None:
        raise ProxrlError(f"{where}: logprobs: expected finite log-probabilities <= 0, got {bad}")
    _check_text(where, row, response, tokenizer)
    group = row.get("group")
    if not isinstance(group, (str, int)) or isinstance(group, bool):
        raise ProxrlError(f"{where}: group: expected a string or an integer, got {group!r}")
    rewards = _token_rewards(where, row, scored)
    score = _score(where, row) if rewards is None else math.fsum(rewards)
    return Trajectory(where, prompt, response, logprobs, mask, score, str(group), rewards)


def _ids(where: str, row: dict[str, Any], field: str, vocab: int, most: int) -> list[int]:
    ids = row.get(field)
    if not isinstance(ids, list) or not ids:
        raise ProxrlError(f"{where}: {field}: expected a non-empty list of token ids")
    bad = next((i for i in ids if not isinstance(i, int) or isinstance(i, bool)), None)
    if bad is not None:
        raise ProxrlError(f"{where}: {field}: expected integer token ids, got {bad!r}")
    outside = next((i for i in ids if not 0 <= i < vocab), None)
    if outside is not None:
        raise ProxrlError(
            f"{where}: {field}: token id {outside} is outside this tokenizer's vocabulary "
            f"(0..{vocab - 1}): ids of another tokenizer?"
        )
    if len(ids) > most:
        limit = "max_prompt_length" if field == "prompt_ids" else "max_new_tokens"
        raise ProxrlError(
            f"{where}: {field}: expected at most {most} tokens ({limit}), got {len(ids)}"
        )
    return ids


def _numbers(where: str, row: dict[str, Any], field: str, n: int) -> list[float]:
    values = row.get(field)
    if (
        not isinstance(values, list)
        or len(values) != n
        or any(not isinstance(v, (int, float)) or isinstance(v, bool) for v in values)
    ):
        raise ProxrlError(f"{where}: {field}: expected {n} numbers (one per response token)")
    return [float(v) for v in values]


def _token_rewards(where: str, row: dict[str, Any], scored: list[int]) -> list[float] | None:
    """The per-token ``rewards`` (None: the row gives one ``reward``): finite, and 0 at the
    tokens ``loss_mask`` leaves out (an observation is not an action to credit)."""
    if ("reward" in row) == ("rewards" in row):
        raise ProxrlError(f"{where}: reward: expected reward (a number) or rewards (per token)")
    if "rewards" not in row:
        return None
    rewards = _numbers(where, row, "rewards", len(scored))
    for token, (value, model) in enumerate(zip(rewards, scored, strict=True)):
        if not math.isfinite(value):
            raise ProxrlError(f"{where}: rewards: expected finite numbers, got {value}")
        if value and not model:
            raise ProxrlError(
                f"{where}: rewards: expected 0 at token {token} (loss_mask 0: an observation); "
                "put a turn's reward on its last model token"
            )
    return rewards


def _score(where: str, row: dict[str, Any]) -> float:
    """The row's one ``reward``."""
    score = row["reward"]
    if not isinstance(score, (int, float)) or isinstance(score, bool):
        raise ProxrlError(f"{where}: reward: expected a number, got {score!r}")
    if not math.isfinite(score):
        raise ProxrlError(f"{where}: reward: expected a finite number, got {score}")
    return float(score)


def _check_text(where: str, row: dict[str, Any], response: list[int], tokenizer: Any) -> None:
    """A row's ``response`` text, when given, is what this tokenizer decodes its ids to."""
    text = row.get("response")
    if text is None:
        return
    decoded = tokenizer.decode(response, skip_special_tokens=True)
    if decoded != text:
        raise ProxrlError(
            f"{where}: response_ids: decode to {decoded[:40]!r} with this model's tokenizer, "
            f"not the row's response {str(text)[:40]!r}: ids of another tokenizer?"
        )


def recorded_stage(
    rows: list[Trajectory], tokenizer: Any, device: torch.device
) -> tuple[Sampled, Tensor, Tensor | None]:
    """The sample stage's record of ``rows`` (the recorded log-probs as the sampler's), their
    (B,) scores and (B, T) per-token rewards (float64, 0 at padding; a row with one ``reward``
    has it at its last model token; None when no row has per-token rewards)."""
    pad = tokenizer.pad_token_id
    width = max(len(r.response_ids) for r in rows)

    def right(values: list[Any], fill: Any) -> list[Any]:
        return values + [fill] * (width - len(values))

    response_ids = torch.tensor([right(r.response_ids, pad) for r in rows], device=device)
    response_mask = torch.tensor([right([1] * len(r.response_ids), 0) for r in rows], device=device)
    logprobs = torch.tensor([right(r.logprobs, 0.0) for r in rows], device=device)
    action_mask = None
    if any(r.loss_mask is not None for r in rows):
        masks = [r.loss_mask or [1] * len(r.response_ids) for r in rows]
        action_mask = torch.tensor([right(m, 0) for m in masks], device=device)
    logprobs = logprobs * (response_mask if action_mask is None else action_mask)
    samples = Samples(response_ids, response_mask, logprobs, None, action_mask)
    prompt_ids = pad_left([r.prompt_ids for r in rows], pad).to(device)
    prompt_mask = pad_left([[1] * len(r.prompt_ids) for r in rows], 0).to(device)
    prompts = prompt_examples(rows, tokenizer)
    completions = tokenizer.batch_decode(
        torch.where(response_mask.bool(), response_ids, pad), skip_special_tokens=True
    )
    sampled = Sampled(prompts, prompt_ids, prompt_mask, samples, completions)
    token_rewards = None
    if any(r.rewards is not None for r in rows):
        token_rewards = rewards_at_tokens(
            torch.tensor([right(r.rewards or [], 0.0) for r in rows], dtype=torch.float64),
            torch.tensor([0.0 if r.rewards else r.score for r in rows], dtype=torch.float64),
            samples.response_mask if action_mask is None else action_mask,
        ).to(device)
    return sampled, torch.tensor([r.score for r in rows]), token_rewards


def prompt_examples(rows: list[Trajectory], tokenizer: Any) -> list[PromptExample]:
    """(B,) each row's prompt, decoded, named by its ``file:line``."""
    return [
        PromptExample(tokenizer.decode(r.prompt_ids, skip_special_tokens=True), None, r.where)
        for r in rows
    ]


def this_ranks_rows(rows: list[Trajectory], group_size: int) -> list[Trajectory]:
    """This process's share of ``rows``: a contiguous block of whole groups, rank 0's first,
    so the gathered rollout (``gather.gather_rollout`` joins the ranks in order) is the file's
    rows in the file's order. The world divides the groups (``rollout_batch_size``)."""
    world = dist.world_size()
    per_rank = len(rows) // group_size // world * group_size
    return rows[dist.rank() * per_rank : (dist.rank() + 1) * per_rank]


def limits_of(cfg: OnlineConfig, tokenizer: Any) -> Limits:
    return Limits(len(tokenizer), cfg.group_size, cfg.max_prompt_length, cfg.max_new_tokens)


def recorded_source(cfg: OnlineConfig) -> OldPolicySource:
    """π_old from the recorded log-probs; with a rollout correction the trainer's pass gives
    π_old and the recorded ones the weights."""
    correct = cfg.rollout_correction != "none"
    return OldPolicySource(from_sampler=not correct, correct=correct, forward_pass=True)


def iteration_rows(cfg: OnlineConfig, tokenizer: Any) -> list[Trajectory]:
    """``cfg.rollouts_file``'s trajectories, checked, ``rollout_batch_size × group_size`` of
    them (the run's batch); the run reads them once before its output directory is touched,
    then each iteration."""
    assert cfg.rollouts_file is not None
    rows = read_rollouts(cfg.rollouts_file, tokenizer, limits_of(cfg, tokenizer))
    if len(rows) != cfg.responses_per_iteration:
        raise ProxrlError(
            f"rollouts_file: {cfg.rollouts_file} holds {len(rows)} trajectories; expected "
            f"rollout_batch_size × group_size = {cfg.responses_per_iteration}"
        )
    return rows


def recorded_rollout(
    cfg: OnlineConfig, models: Models, kl_coef: float, timings: dict[str, float]
) -> RolloutBatch:
    """The iteration's rollout from ``cfg.rollouts_file``, read afresh (a harness rewrites it
    between iterations), scored by its recorded rewards (then the shaping rules), evaluated
    by the loop's own forward passes; ``rollout_batch_size`` groups of ``group_size``. Several
    processes each evaluate their share of the groups, and the rollout is gathered."""
    tokenizer = models.tokenizer
    rows = iteration_rows(cfg, tokenizer)
    device = next(models.actor.parameters()).device
    mine = this_ranks_rows(rows, cfg.group_size)
    sampled, raw, token_rewards = recorded_stage(mine, tokenizer, device)
    samples = sampled.samples
    ended = responses_stopped(samples, tokenizer.eos_token_id, cfg.max_new_tokens).cpu()
    scores = shaped_scores(cfg, raw.clone(), ended, samples.response_mask.sum(-1).cpu())
    if token_rewards is not None:  # the shaping rules' change to the sum: at the last token
        mask = samples.response_mask if samples.action_mask is None else samples.action_mask
        change = (scores - raw).to(device)
        token_rewards = rewards_at_tokens(token_rewards, change, mask)
    scored = Scored(raw, scores, ended, {}, None, token_rewards=token_rewards)
    experience, completions, metrics = evaluate(
        cfg, models, sampled, scored, recorded_source(cfg), kl_coef, timings
    )
    rows_index = list(range(len(rows)))
    prompts = prompt_examples(rows, tokenizer)  # every rank's rows, as gathered
    return RolloutBatch(experience, completions, rows_index, metrics, prompts=prompts)
