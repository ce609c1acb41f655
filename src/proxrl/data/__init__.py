"""Datasets for the language-model stages: readers (JSONL, JSON, CSV, Parquet, ``datasets``),
validated row formats (SFT, preference, ranking, prompt), tokenisation with an over-length
policy, and length-bucketed batches."""

from proxrl.data.batching import (
    Batch,
    PairBatch,
    RankingBatch,
    bucket_batches,
    collate,
    collate_pairs,
    collate_rankings,
    pad_left,
    pad_right,
)
from proxrl.data.encoding import (
    EncodedPair,
    EncodedRanking,
    EncodedSequence,
    encode_preferences,
    encode_prompts,
    encode_rankings,
    encode_sft,
)
from proxrl.data.formats import (
    PreferenceExample,
    PromptExample,
    RankingExample,
    SFTExample,
    load_preference_examples,
    load_prompt_examples,
    load_ranking_examples,
    load_sft_examples,
)
from proxrl.data.readers import Row, read_rows

__all__ = [
    "Batch",
    "PairBatch",
    "RankingBatch",
    "EncodedPair",
    "EncodedRanking",
    "EncodedSequence",
    "PreferenceExample",
    "PromptExample",
    "RankingExample",
    "Row",
    "SFTExample",
    "bucket_batches",
    "collate",
    "collate_pairs",
    "collate_rankings",
    "encode_preferences",
    "encode_prompts",
    "encode_rankings",
    "encode_sft",
    "load_preference_examples",
    "load_prompt_examples",
    "load_ranking_examples",
    "load_sft_examples",
    "pad_left",
    "pad_right",
    "read_rows",
]
