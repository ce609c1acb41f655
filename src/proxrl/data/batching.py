"""Padding, collation and length-bucketed batch order.

Batches are drawn from buckets of similar length so little compute goes to padding: the data
is shuffled, cut into chunks of ``batch_size * bucket_factor`` examples, each chunk is sorted
by length and split into batches, and the batch order is shuffled again. Every batch reports
its share of non-pad tokens (``Batch.nonpad_share``), logged as ``perf/nonpad_share``.
SFT can also pack several sequences into each row (``pack_sequences``, ``collate_packed``):
no padding at all inside a row, and attention kept within each sequence by position ids.
"""

from __future__ import annotations

import bisect
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
    position_ids: Tensor | None = None  # (B, T) packed rows only: restarts at 0 for each sequence

    @property
    def nonpad_share(self) -> float:
        """Real tokens / all positions in the batch."""
        return float(self.attention_mask.float().mean())

    @property
    def packed(self) -> bool:
        return self.position_ids is not None

    def to(self, device: torch.device | str) -> Batch:
        position_ids = None if self.position_ids is None else self.position_ids.to(device)
        return Batch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.loss_mask.to(device),
            position_ids,
        )

    def model_inputs(self) -> dict[str, Tensor | bool | None]:
        """Keyword arguments for a transformers forward pass. A packed row passes position ids
        and no attention mask: transformers 5 then builds a block-diagonal causal mask from
        where the positions restart (for every attention implementation of models built on
        its masking utilities: Llama, Qwen2, Mistral, Gemma…); the KV cache must be off."""
        if self.packed:
            return {
                "input_ids": self.input_ids,
                "position_ids": self.position_ids,
                "use_cache": False,
            }
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "use_cache": False,
        }


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


@dataclass(frozen=True)
class PackedRow:
    """Several encoded sequences laid end to end in one row."""

    sequences: list[EncodedSequence]

    def __len__(self) -> int:
        return sum(len(s) for s in self.sequences)


def pack_lengths(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Best-fit-decreasing bin packing: the indices of ``lengths`` in bins whose lengths sum to
    at most ``capacity`` (an item longer than that gets a bin of its own). Each bin's indices
    ascending, bins in the order they were opened. Deterministic: same input, same bins."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (free room, bin index), sorted
    for i in order:
        n = lengths[i]
        slot = bisect.bisect_left(free, (n, -1))
        if slot < len(free):
            room, index = free.pop(slot)
            bins[index].append(i)
            room -= n
        else:
            bins.append([i])
            index, room = len(bins) - 1, capacity - n
        if room > 0:
            bisect.insort(free, (room, index))
    return [sorted(b) for b in bins]


def pack_sequences(sequences: Sequence[EncodedSequence], max_length: int) -> list[PackedRow]:
    """``pack_lengths`` of the sequences into rows of at most ``max_length`` tokens."""
    bins = pack_lengths([len(s) for s in sequences], max_length)
    return [PackedRow([sequences[i] for i in row]) for row in bins]


def collate_packed(rows: Sequence[PackedRow], pad_id: int) -> Batch:
    """Packed rows into a ``Batch`` with ``position_ids``. The first token of every sequence is
    kept out of ``loss_mask``: the token before it belongs to another sequence, so predicting
    it would cross a boundary (unpacked, position 0 is never a target either). Trailing
    padding is a block of its own (positions restart at 0) and is never attended to."""
    ids, positions, losses, real = [], [], [], []
    for row in rows:
        ids.append([t for s in row.sequences for t in s.input_ids])
        positions.append([p for s in row.sequences for p in range(len(s))])
        losses.append([m if p else 0 for s in row.sequences for p, m in enumerate(s.loss_mask)])
        real.append([1] * len(row))
    width = max(len(r) for r in ids)
    position_ids = [p + list(range(width - len(p))) for p in positions]
    return Batch(
        input_ids=pad_right(ids, pad_id),
        attention_mask=pad_right(real, 0),
        loss_mask=pad_right(losses, 0),
        position_ids=torch.tensor(position_ids, dtype=torch.long),
    )


def pad_to(x: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
    """(B, N) ``x`` padded with ``value`` to (B, ``width``), on the left or the right."""
    extra = width - x.shape[1]
    if extra == 0:
        return x
    pad = torch.full((x.shape[0], extra), value, dtype=x.dtype, device=x.device)
    return torch.cat([pad, x] if left else [x, pad], dim=1)
