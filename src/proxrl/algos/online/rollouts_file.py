"""Rollouts produced elsewhere (an agent harness, another engine), read from a JSONL or Parquet
file into the sample stage's record, so the online loop's later stages (forward passes,
advantages, update) train on them as on their own.

One JSONL line or Parquet row per trajectory (README, "Rollouts from elsewhere"; in Parquet a
null is an absent field), read through one schema, ``RolloutRow``; no other column is taken
(a misspelt one is refused with the column it is likely meant to be):

- ``prompt_ids``: the prompt's token ids (as the policy reads them: chat template applied);
- ``response_ids``: the response's token ids (a multi-turn episode: model turns and the
  observations between them); prompt and response together fit the model's context;
- ``logprobs``: the behaviour policy's log-probability of each response token, finite, and
  <= 0 where ``loss_mask`` is 1 (any finite value where it is 0: it is masked by
  multiplication, so an infinity or NaN there would still poison the batch);
- ``reward`` (a number) or ``rewards`` (one per response token, 0 where ``loss_mask`` is 0):
  their sum is the trajectory's score, which the critic-free estimators take; PPO's GAE takes
  each at its token (``Experience.token_rewards``);
- ``group``: a string or integer naming the prompt's group; a group's rows share their
  ``prompt_ids`` and number ``group_size``;
- optional ``loss_mask``: 1 at tokens the policy produced, 0 at observations (default all 1;
  at least one 1: a row with nothing to train on is refused);
- optional ``response``: the response's text, checked against the tokenizer's decoding of
  ``response_ids`` (another tokenizer's ids are refused).

The whole file is checked before a run's output directory is touched (``run.open_run``
reads it through ``iteration_rows``), and again each iteration it is read afresh. A bad line
is refused with one line, ``file:line: field: expected …`` (a Parquet row: ``file:row N``, N
counted from 0 as ``readers`` counts a data file's Parquet rows).
"""

from __future__ import annotations

import difflib
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pydantic
import torch
from torch import Tensor

from proxrl.algos.online.collect import RolloutBatch, Sampled, Scored, evaluate, shaped_scores
from proxrl.algos.online.episodes import responses_stopped
from proxrl.algos.online.roles import Models
from proxrl.algos.online.rollout_settings import RolloutSettings
from proxrl.core import rewards_at_tokens
from proxrl.data.batching import pad_left
from proxrl.data.formats import PromptExample
from proxrl.models.context import model_context
from proxrl.rollout.generation import Samples
from proxrl.runtime import distributed as dist
from proxrl.runtime.errors import ProxrlError

LOGPROB_SLACK = 1e-6
"""A model token's log-probability may read up to this above 0 (an engine's float round-off
on a near-certain token)."""


@dataclass(frozen=True)
class Limits:
    """What a trajectory must fit: the tokenizer's vocabulary, the run's lengths and the
    model's context (None: the model's config records none, and nothing is checked)."""

    vocab_size: int  # len(tokenizer): every id below it
    group_size: int  # rows per group
    max_prompt_length: int
    max_new_tokens: int  # the response budget (Dr. GRPO's horizon is this)
    context: int | None = None  # the model's positions: prompt + response fit in them


@dataclass(frozen=True)
class RolloutsFile:
    """What reading the run's rollouts file takes of its options (the config's of the same
    names), built when the run opens."""

    rollouts_file: str | None  # the file (None: the run samples its own)
    model: str  # whose config gives the context every trajectory fits
    trust_remote_code: bool
    group_size: int  # rows per group
    max_prompt_length: int
    max_new_tokens: int
    responses_per_iteration: int  # rollout_batch_size × group_size: the file's rows


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


@dataclass(frozen=True)
class RowContext:
    """What ``RolloutRow`` checks a row against beyond its own columns (pydantic's
    ``context``): where it is, and (when given) the tokenizer and the run's limits."""

    where: str = "row"
    tokenizer: Any = None
    limits: Limits | None = None


EXPECTED = MappingProxyType(
    {
        "prompt_ids": "a non-empty list of token ids (integers)",
        "response_ids": "a non-empty list of token ids (integers)",
        "logprobs": "a list of numbers (one per response token)",
        "group": "a string or an integer",
        "reward": "a number",
        "rewards": "a list of numbers (one per response token)",
        "loss_mask": "a list of 0s and 1s (one per response token)",
        "response": "the response's text (a string)",
    }
)
"""Each column's type, in words: a row's value of another type is refused with it."""


class RolloutRow(pydantic.BaseModel):
    """One trajectory of a rollouts file, every column named (no other is taken). Validate
    with ``RolloutRow.model_validate(row, context=RowContext(...))``; a bad row raises
    ``ProxrlError`` with one line naming the row and the field (``rollout_row`` turns
    pydantic's type errors into that line too)."""

    model_config = pydantic.ConfigDict(extra="forbid", strict=True)

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    group: str | int
    reward: float | None = None
    rewards: list[float] | None = None
    loss_mask: list[int] | None = None
    response: str | None = None

    @pydantic.model_validator(mode="before")
    @classmethod
    def _known_columns(cls, row: Any, info: pydantic.ValidationInfo) -> Any:
        """A column the schema does not name is refused, not dropped (a misspelt ``loss_mask``
        would train observation tokens as the policy's own)."""
        if isinstance(row, dict):
            unknown = next((k for k in row if k not in cls.model_fields), None)
            if unknown is not None:
                names = list(cls.model_fields)
                close = difflib.get_close_matches(str(unknown), names, n=1)
                hint = f"did you mean {close[0]}?" if close else f"expected {', '.join(names)}"
                raise ProxrlError(f"{_where(info)}: {unknown}: unknown column; {hint}")
        return row

    @pydantic.field_validator("loss_mask", mode="before")
    @classmethod
    def _bools_as_ints(cls, mask: Any) -> Any:
        """A mask of booleans (a Parquet bool column, JSON true/false) reads as 1s and 0s."""
        if isinstance(mask, list):
            return [int(m) if isinstance(m, bool) else m for m in mask]
        return mask

    @pydantic.model_validator(mode="after")
    def _checked(self, info: pydantic.ValidationInfo) -> RolloutRow:
        context = info.context if isinstance(info.context, RowContext) else RowContext()
        where, limits = context.where, context.limits
        _check_ids(where, "prompt_ids", self.prompt_ids, limits)
        _check_ids(where, "response_ids", self.response_ids, limits)
        _check_lengths(where, self)
        _check_mask(where, self.loss_mask)
        _check_logprobs(where, self.logprobs, self.policy_mask)
        _check_rewards(where, self)
        if limits is not None:
            _check_context(where, len(self.prompt_ids), len(self.response_ids), limits.context)
        if context.tokenizer is not None:
            _check_text(where, self.response, self.response_ids, context.tokenizer)
        return self

    @property
    def policy_mask(self) -> list[int]:
        """1 at the tokens the policy produced (``loss_mask``, default all)."""
        return [int(m) for m in self.loss_mask or [1] * len(self.response_ids)]

    @property
    def score(self) -> float:
        """The trajectory's score: its ``reward``, or the sum of its ``rewards``."""
        if self.rewards is not None:
            return math.fsum(self.rewards)
        assert self.reward is not None  # (``_check_rewards``: one of them)
        return float(self.reward)


def rollout_row(
    where: str, record: Any, tokenizer: Any = None, limits: Limits | None = None
) -> RolloutRow:
    """``record`` through ``RolloutRow``: the row, or ``ProxrlError`` in one line."""
    try:
        return RolloutRow.model_validate(record, context=RowContext(where, tokenizer, limits))
    except pydantic.ValidationError as exc:
        raise ProxrlError(_type_error(where, exc)) from None


def _type_error(where: str, exc: pydantic.ValidationError) -> str:
    """Pydantic's first complaint as one line: ``where: field: expected …, got …``."""
    error = exc.errors()[0]
    loc = error["loc"]
    if error["type"] == "model_type":  # the row itself (a JSON line is checked before)
        return f"{where}: expected an object of columns, got {type(error['input']).__name__}"
    if not loc:
        return f"{where}: {error['msg']}"
    field = str(loc[0])
    if error["type"] == "extra_forbidden":
        return f"{where}: {field}: unknown column"
    if error["type"] == "missing":
        return f"{where}: {field}: expected {EXPECTED[field]}; the row has none"
    item = next((f" at position {i}" for i in loc[1:] if isinstance(i, int)), "")
    return f"{where}: {field}: expected {EXPECTED[field]}, got {error['input']!r}{item}"


def _where(info: pydantic.ValidationInfo) -> str:
    return info.context.where if isinstance(info.context, RowContext) else "row"


def _check_ids(where: str, field: str, ids: list[int], limits: Limits | None) -> None:
    if not ids:
        raise ProxrlError(f"{where}: {field}: expected {EXPECTED[field]}, got an empty list")
    if limits is None:
        return
    outside = next((i for i in ids if not 0 <= i < limits.vocab_size), None)
    if outside is not None:
        raise ProxrlError(
            f"{where}: {field}: token id {outside} is outside this tokenizer's vocabulary "
            f"(0..{limits.vocab_size - 1}): ids of another tokenizer?"
        )
    most, limit = (
        (limits.max_prompt_length, "max_prompt_length")
        if field == "prompt_ids"
        else (limits.max_new_tokens, "max_new_tokens")
    )
    if len(ids) > most:
        raise ProxrlError(
            f"{where}: {field}: expected at most {most} tokens ({limit}), got {len(ids)}"
        )


def _check_lengths(where: str, row: RolloutRow) -> None:
    """Every per-token column holds one value per response token."""
    n = len(row.response_ids)
    for field in ("logprobs", "rewards", "loss_mask"):
        values = getattr(row, field)
        if values is not None and len(values) != n:
            noun = "values" if field == "loss_mask" else "numbers"
            raise ProxrlError(
                f"{where}: {field}: expected {n} {noun} (one per response token), got {len(values)}"
            )


def _check_mask(where: str, mask: list[int] | None) -> None:
    """0s and 1s, at least one 1: a row with no model token has nothing to train."""
    if mask is None:
        return
    bad = next((m for m in mask if m not in (0, 1)), None)
    if bad is not None:
        raise ProxrlError(
            f"{where}: loss_mask: expected {len(mask)} values, each 0 or 1, got {bad}"
        )
    if not any(mask):
        raise ProxrlError(
            f"{where}: loss_mask: expected at least one 1 (a token the policy produced), got all "
            f"{len(mask)} 0: the row has nothing to train on"
        )


def _check_logprobs(where: str, logprobs: list[float], model: list[int]) -> None:
    """Finite everywhere (masked by multiplication: an infinity or NaN would poison the batch);
    <= 0 at model tokens (``-inf``: a token the behaviour policy could not have sampled)."""
    for token, (value, m) in enumerate(zip(logprobs, model, strict=True)):
        if m and not (math.isfinite(value) and value <= LOGPROB_SLACK):
            raise ProxrlError(
                f"{where}: logprobs: expected finite log-probabilities <= 0, got {value}"
            )
        if not math.isfinite(value):
            raise ProxrlError(
                f"{where}: logprobs: expected a finite number at token {token} (loss_mask 0: "
                f"any finite value), got {value}"
            )


def _check_rewards(where: str, row: RolloutRow) -> None:
    """One ``reward`` or per-token ``rewards``, finite; ``rewards`` 0 at the tokens
    ``loss_mask`` leaves out (an observation is not an action to credit)."""
    if (row.reward is None) == (row.rewards is None):
        raise ProxrlError(f"{where}: reward: expected reward (a number) or rewards (per token)")
    if row.reward is not None and not math.isfinite(row.reward):
        raise ProxrlError(f"{where}: reward: expected a finite number, got {row.reward}")
    if row.rewards is None:
        return
    for token, (value, m) in enumerate(zip(row.rewards, row.policy_mask, strict=True)):
        if not math.isfinite(value):
            raise ProxrlError(f"{where}: rewards: expected finite numbers, got {value}")
        if value and not m:
            raise ProxrlError(
                f"{where}: rewards: expected 0 at token {token} (loss_mask 0: an observation); "
                "put a turn's reward on its last model token"
            )


def _check_context(where: str, prompt: int, response: int, context: int | None) -> None:
    """Prompt and response together within the model's positions (past them a learned-position
    model fails mid-run, and a rotary one runs past the positions it was trained on)."""
    if context is not None and prompt + response > context:
        raise ProxrlError(
            f"{where}: response_ids: prompt_ids ({prompt} tokens) + response_ids ({response} "
            f"tokens) = {prompt + response} tokens is longer than the model's context "
            f"({context} positions)"
        )


def _check_text(where: str, text: str | None, response: list[int], tokenizer: Any) -> None:
    """A row's ``response`` text, when given, is what this tokenizer decodes its ids to."""
    if text is None:
        return
    decoded = tokenizer.decode(response, skip_special_tokens=True)
    if decoded != text:
        raise ProxrlError(
            f"{where}: response_ids: decode to {decoded[:40]!r} with this model's tokenizer, "
            f"not the row's response {str(text)[:40]!r}: ids of another tokenizer?"
        )


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


def _trajectory(where: str, record: Any, tokenizer: Any, limits: Limits) -> Trajectory:
    row = rollout_row(where, record, tokenizer, limits)
    return Trajectory(
        where, row.prompt_ids, row.response_ids, row.logprobs, row.loss_mask, row.score,
        str(row.group), row.rewards,
    )  # fmt: skip


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


def limits_of(file: RolloutsFile, tokenizer: Any) -> Limits:
    """The run's limits on a trajectory, the model's context read from its config."""
    context = _context(file.model, file.trust_remote_code)
    return Limits(
        len(tokenizer), file.group_size, file.max_prompt_length, file.max_new_tokens, context
    )


@functools.lru_cache(maxsize=8)
def _context(model: str, trust_remote_code: bool) -> int | None:
    """``model_context``, once per model: the file is read each iteration, and a hub id's
    config would be looked up each time."""
    return model_context(model, trust_remote_code)


def validate_rollouts_file(file: RolloutsFile, tokenizer: Any = None) -> list[Trajectory]:
    """The whole of ``file.rollouts_file`` through the schema (``iteration_rows``), against
    ``file.model``'s tokenizer (loaded when not given) and context: for a check before any
    model loads; the run already reads the file so before its output directory is touched."""
    if tokenizer is None:
        from proxrl.models.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(file.model, trust_remote_code=file.trust_remote_code)
    return iteration_rows(file, tokenizer)


def iteration_rows(file: RolloutsFile, tokenizer: Any) -> list[Trajectory]:
    """``file.rollouts_file``'s trajectories, checked, ``rollout_batch_size × group_size`` of
    them (the run's batch); the run reads them once before its output directory is touched,
    then each iteration."""
    assert file.rollouts_file is not None
    rows = read_rollouts(file.rollouts_file, tokenizer, limits_of(file, tokenizer))
    if len(rows) != file.responses_per_iteration:
        raise ProxrlError(
            f"rollouts_file: {file.rollouts_file} holds {len(rows)} trajectories; expected "
            f"rollout_batch_size × group_size = {file.responses_per_iteration}"
        )
    return rows


def recorded_rollout(
    file: RolloutsFile,
    settings: RolloutSettings,
    models: Models,
    kl_coef: float,
    timings: dict[str, float],
) -> RolloutBatch:
    """The iteration's rollout from ``file.rollouts_file``, read afresh (a harness rewrites it
    between iterations), scored by its recorded rewards (then the shaping rules), evaluated
    by the loop's own forward passes; ``rollout_batch_size`` groups of ``group_size``. Several
    processes each evaluate their share of the groups, and the rollout is gathered."""
    tokenizer = models.tokenizer
    rows = iteration_rows(file, tokenizer)
    device = next(models.actor.parameters()).device
    mine = this_ranks_rows(rows, file.group_size)
    sampled, raw, token_rewards = recorded_stage(mine, tokenizer, device)
    samples = sampled.samples
    ended = responses_stopped(samples, tokenizer.eos_token_id, file.max_new_tokens).cpu()
    lengths = samples.response_mask.sum(-1).cpu()
    scores = shaped_scores(settings.scoring.shaping, raw.clone(), ended, lengths)
    if token_rewards is not None:  # the shaping rules' change to the sum: at the last token
        mask = samples.response_mask if samples.action_mask is None else samples.action_mask
        change = (scores - raw).to(device)
        token_rewards = rewards_at_tokens(token_rewards, change, mask)
    scored = Scored(raw, scores, ended, {}, None, token_rewards=token_rewards)
    experience, completions, metrics = evaluate(
        settings.passes, models, sampled, scored, settings.old_policy, kl_coef, timings
    )
    rows_index = list(range(len(rows)))
    prompts = prompt_examples(rows, tokenizer)  # every rank's rows, as gathered
    return RolloutBatch(experience, completions, rows_index, metrics, prompts=prompts)
