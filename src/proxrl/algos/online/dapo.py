"""DAPO's sampling-side pieces on the online loop (Yu et al. 2025): dynamic sampling and
truncated responses.

Rollouts of several sampling rounds are joined, their constant groups dropped and the batch cut
to rollout_batch_size groups; the loop then estimates advantages over the batch that is trained
on (whitening and batch baselines see only that batch). ``mask_truncated`` takes the responses
that hit the length cap out of the update's loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from proxrl.algos.online.collect import RolloutBatch
from proxrl.algos.online.prompts import PromptDraw, draw_prompts
from proxrl.core import informative_groups
from proxrl.data.batching import pad_to
from proxrl.rollout.experience import Experience


@dataclass(frozen=True)
class DrawSettings:
    """Which prompts an iteration samples (``prompts.draw_prompts``), and dynamic sampling's
    rounds: the options of the same names, built when the run opens."""

    rollout_batch_size: int  # prompts per draw (global)
    group_size: int  # G responses per prompt
    seed: int  # the schedule's permutations
    dynamic_sampling: bool
    max_sampling_rounds: int  # dynamic sampling's most rounds per iteration

    def draw(self, n_prompts: int, index: int) -> PromptDraw:
        """Batch ``index`` of the run's prompt schedule over ``n_prompts`` prompts."""
        return draw_prompts(n_prompts, self.rollout_batch_size, index, self.seed, self.group_size)


def concat_rollouts(parts: list[Experience], pad_id: int) -> Experience:
    """The rows of ``parts`` one after the other, prompts re-padded on the left and responses on
    the right to the widest part's (B, P) and (B, T)."""
    if len(parts) == 1:
        return parts[0]
    P = max(e.prompt_ids.shape[1] for e in parts)
    T = max(e.response_ids.shape[1] for e in parts)
    columns: dict[str, Any] = {}
    for name, first in parts[0].tensors().items():
        if first is None:
            columns[name] = None
            continue
        rows = []
        for e in parts:
            x = getattr(e, name)
            if name in ("prompt_ids", "prompt_mask"):
                x = pad_to(x, P, pad_id if name == "prompt_ids" else 0, left=True)
            elif x.dim() == 2:
                x = pad_to(x, T, pad_id if name == "response_ids" else 0, left=False)
            rows.append(x)
        columns[name] = torch.cat(rows)
    return replace(parts[0], **columns)


@dataclass
class DynamicBatch:
    """The groups a dynamic-sampling iteration keeps, as they arrive round by round."""

    group_size: int
    groups_wanted: int
    kept: list[Experience] = field(default_factory=list)
    kept_rows: list[list[int]] = field(default_factory=list)
    dropped: list[Experience] = field(default_factory=list)
    dropped_rows: list[list[int]] = field(default_factory=list)
    rounds: int = 0
    dropped_groups: int = 0

    @property
    def groups_kept(self) -> int:
        return sum(len(e) for e in self.kept) // self.group_size

    @property
    def full(self) -> bool:
        return self.groups_kept >= self.groups_wanted

    def add(self, experience: Experience, rows: list[int]) -> None:
        """One round's rollout; ``rows[i]`` labels row i (the caller's prompt index)."""
        self.rounds += 1
        useful = informative_groups(experience.scores, self.group_size)
        self.dropped_groups += int((~useful).sum())
        keep = useful.repeat_interleave(self.group_size).cpu()
        for flag, into, labels in (
            (keep, self.kept, self.kept_rows),
            (~keep, self.dropped, self.dropped_rows),
        ):
            index = flag.nonzero().squeeze(1)
            if len(index):
                into.append(_rows(experience, index))
                labels.append([rows[i] for i in index.tolist()])

    def batch(self, pad_id: int) -> tuple[Experience, list[int], int]:
        """rollout_batch_size groups: the first informative ones, then (after the last round)
        dropped ones to fill what is missing. Returns the batch, its row labels and how many
        groups were filled in."""
        want = self.groups_wanted * self.group_size
        parts, labels = list(self.kept), [r for rows in self.kept_rows for r in rows]
        filled = max(0, want - len(labels)) // self.group_size
        if filled:
            parts += self.dropped
            labels += [r for rows in self.dropped_rows for r in rows]
        joined = concat_rollouts(parts, pad_id)
        return _rows(joined, torch.arange(want)), labels[:want], filled


def _rows(experience: Experience, index: torch.Tensor) -> Experience:
    """Rows ``index`` of every field, untrimmed (``Experience.select`` trims for the update)."""
    return replace(
        experience,
        **{
            name: None if x is None else x[index.to(x.device)]
            for name, x in experience.tensors().items()
        },
    )


def without_truncated(experience: Experience) -> Experience:
    """``mask_truncated``: the responses that hit max_new_tokens lose their response mask, so
    every loss term (and every average in it) leaves them out. Call after the advantages are
    estimated: the estimators read the score at a response's last token."""
    if experience.truncated is None:
        raise ValueError("mask_truncated: the rollout did not record which responses were cut")
    keep = (~experience.truncated).to(experience.response_mask.dtype).unsqueeze(1)
    actions = experience.action_mask
    return replace(
        experience,
        response_mask=experience.response_mask * keep,
        action_mask=None if actions is None else actions * keep,
    )


def dynamic_rollout(
    settings: DrawSettings,
    sample_round: Callable[[PromptDraw, dict[str, float]], tuple[Experience, list[str], dict]],
    n_prompts: int,
    pad_id: int,
    timings: dict[str, float],
    draw: int,
) -> RolloutBatch:
    """DAPO's dynamic sampling: rounds of ``rollout_batch_size`` prompts (the ``draw``-th batch
    of the data order, then the next ones), each sampled by ``sample_round``, until
    ``rollout_batch_size`` groups with unequal scores are kept, or ``max_sampling_rounds``
    rounds ran. Returns the batch, and as metrics those of the rounds averaged, plus
    ``sampling/rounds``, ``sampling/dropped_groups`` and ``sampling/filled_groups``.

    Several processes: each round is gathered before the filter, so every rank drops the same
    groups (a group is whole on the rank that sampled it) and runs the same number of rounds."""
    found = DynamicBatch(settings.group_size, settings.rollout_batch_size)
    completions: list[str] = []
    labels: list[int] = []  # the prompt index of every row sampled this iteration
    round_rows: list[dict[str, float]] = []
    while not found.full and found.rounds < settings.max_sampling_rounds:
        prompts = settings.draw(n_prompts, draw + found.rounds)
        round_timings: dict[str, float] = {}
        experience, texts, metrics = sample_round(prompts, round_timings)
        for key, value in round_timings.items():
            timings[key] = timings.get(key, 0.0) + value
        found.add(experience, list(range(len(labels), len(labels) + len(prompts.rows))))
        completions += texts
        labels += prompts.rows
        round_rows.append(metrics)
    experience, rows, filled = found.batch(pad_id)
    row = {key: sum(r[key] for r in round_rows) / len(round_rows) for key in round_rows[0]}
    row["sampling/rounds"] = float(found.rounds)
    row["sampling/dropped_groups"] = float(found.dropped_groups)
    row["sampling/filled_groups"] = float(filled)
    return RolloutBatch(
        experience,
        [completions[i] for i in rows],
        [labels[i] for i in rows],
        row,
        extra_rounds=found.rounds - 1,
    )
