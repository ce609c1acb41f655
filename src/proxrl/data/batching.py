"""Padding, collation and length-bucketed batch order.

Batches are drawn from buckets of similar length so little compute goes to padding: the data
is shuffled, cut into chunks of ``batch_size * bucket_factor`` examples, each chunk is sorted
by length and split into batches, and the batch order is shuffled again. Every batch reports
its share of non-pad tokens (``Batch.nonpad_share``), logged as ``perf/nonpad_share``.
Packing several sequences into one row is not done: it needs an attention implementation
that honours sequence boundaries (flash-attention with position ids), which CPU runs lack.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from proxrl.data.encoding import EncodedPair, EncodedRanking, EncodedSequence


@dataclass(frozen=True)
class Batch:
    input_ids: Tensor  # (B, T) token ids, padded with the pad id
    attention_mask: Tensor  # (B, T) 1 on real tokens, 0 on padding
    loss_mask: Tensor  # (B, T) 1 on tokens a loss reads (the response), 0 on prompt and padding

    @property
    def nonpad_share(self) -> float:
        """Real tokens / all positions in the batch."""
        return float(self.attention_mask.float().mean())

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.input_ids.to(device), self.attention_mask.to(device), self.loss_mask.to(device))


def pad_right(rows: Sequence[Sequence[int]], value: int) -> Tensor:
    """(B, T) long tensor, each row followed by ``value``s (training layout)."""
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [value] * (width - len(r)) for r in rows], dtype=torch.long)


def pad_left(rows: Sequence[Sequence[int]], value: int) -> Tensor:
    """(B, T) long tensor, each row preceded by ``value``s (generation layout: every prompt
    ends at the last column, where generation continues)."""
    width = max(len(r) for r in rows)
    return torch.tensor([[value] * (width - len(r)) + list(r) for r in rows], dtype=torch.long)


def collate(sequences: Sequence[EncodedSequence], pad_id: int) -> Batch:
    """Right-pad encoded sequences into a ``Batch``."""
    return Batch(
        input_ids=pad_right([s.input_ids for s in sequences], pad_id),
        attention_mask=pad_right([[1] * len(s) for s in sequences], 0),
        loss_mask=pad_right([s.loss_mask for s in sequences], 0),
    )


def bucket_batches(
    lengths: Sequence[int],
    batch_size: int,
    *,
    seed: int,
    epoch: int = 0,
    shuffle: bool = True,
    bucket_factor: int = 50,
) -> list[list[int]]:
    """Indices grouped into batches of similar length; the order depends only on
    ``(seed, epoch)`` so a resumed run sees the same batches. The last batch may be smaller."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = list(range(len(lengths)))
    if not order:
        return []
    rng = random.Random(f"{seed}:{epoch}")
    if shuffle:
        rng.shuffle(order)
    chunk = batch_size * bucket_factor if shuffle else len(order)
    batches: list[list[int]] = []
    for start in range(0, len(order), chunk):
        part = sorted(order[start : start + chunk], key=lambda i: lengths[i])
        batches.extend(part[i : i + batch_size] for i in range(0, len(part), batch_size))
    if shuffle:
        rng.shuffle(batches)
    return batches


@dataclass(frozen=True)
class PairBatch:
    """B preference pairs in one forward pass: rows 0..B-1 are the chosen responses, rows
    B..2B-1 the rejected ones, in the same order."""

    sequences: Batch  # (2B, T)
    margin: Tensor | None  # (B,) from the data, None when no pair in the batch has one

    @property
    def num_pairs(self) -> int:
        return self.sequences.input_ids.shape[0] // 2

    def to(self, device: torch.device | str) -> PairBatch:
        margin = None if self.margin is None else self.margin.to(device)
        return PairBatch(self.sequences.to(device), margin)


@dataclass(frozen=True)
class RankingBatch:
    """B rankings of K responses each: row b·K + k is response k of ranking b."""

    sequences: Batch  # (B·K, T)
    ranking: Tensor  # (B, K) rank of each response, 0 the best

    @property
    def num_ordered_pairs(self) -> int:
        return int((self.ranking.unsqueeze(2) < self.ranking.unsqueeze(1)).sum())

    def to(self, device: torch.device | str) -> RankingBatch:
        return RankingBatch(self.sequences.to(device), self.ranking.to(device))


def collate_pairs(pairs: Sequence[EncodedPair], pad_id: int) -> PairBatch:
    """Chosen then rejected, right-padded to one width. A pair without a margin gets 0 when
    others in the batch have one."""
    sequences = collate([p.chosen for p in pairs] + [p.rejected for p in pairs], pad_id)
    margins = [p.margin for p in pairs]
    margin = (
        None
        if all(m is None for m in margins)
        else torch.tensor([0.0 if m is None else m for m in margins])
    )
    return PairBatch(sequences, margin)


def collate_rankings(rankings: Sequence[EncodedRanking], pad_id: int) -> RankingBatch:
    """Every ranking must hold the same number K of responses."""
    sizes = {len(r.responses) for r in rankings}
    if len(sizes) != 1:
        raise ValueError(f"rankings of different sizes {sorted(sizes)} in one batch")
    sequences = collate([s for r in rankings for s in r.responses], pad_id)
    return RankingBatch(sequences, torch.tensor([r.ranking for r in rankings], dtype=torch.long))
