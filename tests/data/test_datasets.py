"""Data: readers for every file type, per-row validation with file:line:field messages, the
tokenisation boundary and over-length policy, and length-bucketed batches."""

from __future__ import annotations

import json
import logging

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from proxrl.data.batching import (
    bucket_batches,
    collate,
    collate_pairs,
    collate_rankings,
    pad_left,
    pad_right,
)
from proxrl.data.encoding import (
    EncodedSequence,
    encode_preferences,
    encode_prompts,
    encode_rankings,
    encode_sft,
)
from proxrl.data.formats import (
    load_preference_examples,
    load_prompt_examples,
    load_ranking_examples,
    load_sft_examples,
)
from proxrl.data.readers import read_rows
from proxrl.models.tiny import build_tiny_tokenizer
from proxrl.runtime.errors import ProxrlError

ROWS = [
    {"prompt": "p1", "chosen": "good one", "rejected": "bad one", "margin": 1.5},
    {"prompt": "p2", "chosen": "fine", "rejected": "poor", "margin": 0.5},
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer(["abcdefghijklmnopqrstuvwxyz copy: = user assistant"] * 4)


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_every_reader_gives_the_same_rows_with_locations(tmp_path):
    jsonl = _write(tmp_path / "d.jsonl", ROWS)
    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    (tmp_path / "d.csv").write_text(
        "prompt,chosen,rejected,margin\np1,good one,bad one,1.5\np2,fine,poor,0.5\n"
    )
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "d.parquet")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))

    sources = {
        jsonl: [f"{jsonl}:1", f"{jsonl}:2"],
        str(tmp_path / "d.json"): [f"{tmp_path / 'd.json'}:[0]", f"{tmp_path / 'd.json'}:[1]"],
        str(tmp_path / "d.csv"): [f"{tmp_path / 'd.csv'}:2", f"{tmp_path / 'd.csv'}:3"],
        str(tmp_path / "d.parquet"): [
            f"{tmp_path / 'd.parquet'}:row 0",
            f"{tmp_path / 'd.parquet'}:row 1",
        ],
        str(tmp_path / "saved"): [
            f"{tmp_path / 'saved'}[train row 0]",
            f"{tmp_path / 'saved'}[train row 1]",
        ],
    }
    for source, where in sources.items():
        rows = read_rows(source)
        assert [r.where for r in rows] == where
        examples = load_preference_examples(source)
        assert [(e.prompt, e.chosen, e.rejected, e.margin) for e in examples] == [
            ("p1", "good one", "bad one", 1.5),
            ("p2", "fine", "poor", 0.5),
        ], source


def test_malformed_json_line_and_non_object_rows(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": \n')
    with pytest.raises(ProxrlError, match=rf"^{path}:3: malformed JSON"):
        read_rows(str(path))
    path.write_text('{"prompt": "a"}\n[1, 2]\n')
    with pytest.raises(ProxrlError, match=rf"^{path}:2: expected a JSON object, got list"):
        read_rows(str(path))
    (tmp_path / "x.json").write_text('{"rows": 1}')
    with pytest.raises(ProxrlError, match="expected a JSON list"):
        read_rows(str(tmp_path / "x.json"))
    with pytest.raises(ProxrlError, match="does not exist"):
        read_rows(str(tmp_path / "missing.jsonl"))
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ProxrlError, match="unknown format"):
        read_rows(str(tmp_path / "notes.txt"))


@pytest.mark.parametrize(
    ("loader", "row", "message"),
    [
        (load_sft_examples, {"prompt": "a"}, r":1: missing field 'completion'"),
        (
            load_sft_examples,
            {"prompt": "a", "completion": ""},
            r":1: field 'completion': expected a non-empty string",
        ),
        (
            load_sft_examples,
            {"messages": [{"role": "user", "content": "hi"}]},
            r":1: field 'messages': the last message must have role 'assistant'",
        ),
        (load_sft_examples, {"messages": [{"role": "user"}]}, r":1: field 'messages\[0\]'"),
        (load_preference_examples, {"prompt": "a", "chosen": "x"}, r":1: missing field 'rejected'"),
        (
            load_preference_examples,
            {"prompt": "a", "chosen": "x", "rejected": "y", "margin": "big"},
            r":1: field 'margin': expected a finite number",
        ),
        (
            load_preference_examples,
            {"prompt": 3, "chosen": "x", "rejected": "y"},
            r":1: field 'prompt': expected a string or a list of messages, got int",
        ),
        (
            load_ranking_examples,
            {"prompt": "a", "responses": ["x", "y"], "ranking": [0]},
            r":1: field 'ranking': expected 2 non-negative integers",
        ),
        (
            load_ranking_examples,
            {"prompt": "a", "responses": ["x"], "ranking": [0]},
            r":1: field 'responses': expected a list of at least 2",
        ),
        (
            load_ranking_examples,
            {"prompt": "a", "responses": ["x", "y"], "ranking": [1, 1]},
            r":1: field 'ranking': all responses tie",
        ),
        (load_prompt_examples, {"question": "a"}, r":1: missing field 'prompt'"),
    ],
)
def test_a_bad_row_is_reported_with_file_line_and_field(tmp_path, loader, row, message):
    path = _write(tmp_path / "d.jsonl", [row])
    with pytest.raises(ProxrlError, match=message) as info:
        loader(path)
    assert str(info.value).startswith(f"{path}:1: ") and "\n" not in str(info.value)


def test_rankings_must_share_k_and_chosen_equal_rejected_is_dropped(tmp_path, caplog):
    path = _write(
        tmp_path / "r.jsonl",
        [
            {"prompt": "a", "responses": ["x", "y", "z"], "ranking": [0, 2, 1]},
            {"prompt": "a", "responses": ["x", "y"], "ranking": [0, 1]},
        ],
    )
    with pytest.raises(ProxrlError, match=r":2: field 'responses': expected 3 responses"):
        load_ranking_examples(path)
    path = _write(
        tmp_path / "p.jsonl",
        [ROWS[0], {"prompt": "q", "chosen": "same", "rejected": "same"}, ROWS[1]],
    )
    with caplog.at_level(logging.WARNING):
        examples = load_preference_examples(path)
    assert [e.prompt for e in examples] == ["p1", "p2"]
    assert "dropped 1 of 3 rows" in caplog.text and f"{path}:2" in caplog.text
    path = _write(tmp_path / "all_same.jsonl", [{"prompt": "q", "chosen": "s", "rejected": "s"}])
    with pytest.raises(ProxrlError, match="no usable rows"):
        load_preference_examples(path)


def test_sft_encoding_masks_the_prompt_and_ends_with_eos(tokenizer, tmp_path):
    path = _write(
        tmp_path / "s.jsonl",
        [
            {"prompt": "copy: abc =", "completion": " abc"},
            {
                "messages": [
                    {"role": "user", "content": "copy abc"},
                    {"role": "assistant", "content": "abc"},
                ]
            },
        ],
    )
    plain, chat = encode_sft(load_sft_examples(path), tokenizer, max_length=64)
    prompt_ids = tokenizer("copy: abc =")["input_ids"]
    assert plain.input_ids == prompt_ids + tokenizer(" abc", add_special_tokens=False)[
        "input_ids"
    ] + [tokenizer.eos_token_id]
    assert plain.loss_mask == [0] * len(prompt_ids) + [1] * (len(plain) - len(prompt_ids))
    # Chat: the template's generation prompt is masked, the reply (and what the template
    # writes after it) is trained on, then EOS.
    rendered_prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "copy abc"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered_prompt == "<|user|>copy abc\n<|assistant|>"
    chat_prompt = tokenizer(rendered_prompt, add_special_tokens=False)["input_ids"]
    assert chat.input_ids[: chat.prompt_length] == chat_prompt
    assert (
        tokenizer.decode(chat.input_ids[chat.prompt_length :], skip_special_tokens=True) == "abc\n"
    )
    assert chat.input_ids[-1] == tokenizer.eos_token_id and sum(chat.loss_mask) == len(chat) - len(
        chat_prompt
    )


def test_a_row_dropped_under_truncate_says_its_prompt_fills_max_length(tokenizer, tmp_path, caplog):
    """Truncation cuts the response; a prompt that alone reaches max_length leaves nothing to
    cut, so the row is dropped even under ``truncate``: the warning says so and where."""
    long = "abc " * 40
    path = _write(
        tmp_path / "s.jsonl",
        [{"prompt": "q", "completion": long}, {"prompt": long, "completion": "ab"}],
    )
    with caplog.at_level(logging.WARNING):
        kept = encode_sft(load_sft_examples(path), tokenizer, max_length=20, overlong="truncate")
    assert len(kept) == 1
    assert caplog.messages == [
        "sft data: 2 of 2 examples exceed max_length=20: 1 truncated, 1 dropped (1 because the "
        f"prompt alone has 20 tokens or more, leaving no room for a response; first {path}:2)"
    ]


def test_overlong_policy_truncates_or_drops_and_counts(tokenizer, tmp_path, caplog):
    long = "abc " * 40
    path = _write(
        tmp_path / "p.jsonl",
        [
            {"prompt": "q", "chosen": "ab", "rejected": "cd"},
            {"prompt": "q", "chosen": long, "rejected": "cd"},
            {"prompt": long, "chosen": "ab", "rejected": "cd"},
        ],
    )
    examples = load_preference_examples(path)
    with caplog.at_level(logging.WARNING):
        truncated = encode_preferences(examples, tokenizer, max_length=20, overlong="truncate")
    assert len(truncated) == 2 and max(len(p) for p in truncated) == 20
    assert truncated[1].chosen.input_ids[-1] != tokenizer.eos_token_id  # the end was cut
    assert "2 of 3 examples exceed max_length=20: 1 truncated, 1 dropped" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        dropped = encode_preferences(examples, tokenizer, max_length=20, overlong="drop")
    assert len(dropped) == 1 and "0 truncated, 2 dropped" in caplog.text
    with pytest.raises(ProxrlError, match="every example is longer than max_length=2"):
        encode_preferences(examples, tokenizer, max_length=2, overlong="drop")
    prompts = load_prompt_examples(
        _write(tmp_path / "q.jsonl", [{"prompt": long}, {"prompt": "ab"}])
    )
    kept = encode_prompts(prompts, tokenizer, max_length=10, overlong="truncate")
    assert kept[0] == tokenizer(long)["input_ids"][-10:]  # a prompt keeps its end
    assert len(encode_prompts(prompts, tokenizer, max_length=10, overlong="drop")) == 1


def test_ranking_encoding_and_collation(tokenizer, tmp_path):
    path = _write(
        tmp_path / "r.jsonl",
        [
            {"prompt": "q", "responses": ["ab", "abc", "a"], "ranking": [1, 0, 2]},
            {"prompt": "qq", "responses": ["b", "bc", "bcd"], "ranking": [0, 0, 1]},
        ],
    )
    rankings = encode_rankings(load_ranking_examples(path), tokenizer, 64)
    batch = collate_rankings(rankings, tokenizer.pad_token_id)
    assert batch.sequences.input_ids.shape[0] == 6 and batch.ranking.tolist() == [
        [1, 0, 2],
        [0, 0, 1],
    ]
    assert batch.num_ordered_pairs == 3 + 2  # the tie forms no pair


def test_padding_layouts_and_pair_collation():
    assert pad_right([[1, 2, 3], [4]], 0).tolist() == [[1, 2, 3], [4, 0, 0]]
    assert pad_left([[1, 2, 3], [4]], 0).tolist() == [[1, 2, 3], [0, 0, 4]]
    from proxrl.data.encoding import EncodedPair

    a = EncodedSequence([5, 6, 7], [0, 1, 1], 1)
    b = EncodedSequence([5, 8], [0, 1], 1)
    batch = collate_pairs([EncodedPair(a, b, 2.0), EncodedPair(b, a, None)], pad_id=0)
    assert batch.sequences.input_ids.tolist() == [[5, 6, 7], [5, 8, 0], [5, 8, 0], [5, 6, 7]]
    assert batch.sequences.loss_mask.tolist() == [[0, 1, 1], [0, 1, 0], [0, 1, 0], [0, 1, 1]]
    assert batch.margin.tolist() == [2.0, 0.0] and batch.num_pairs == 2
    assert batch.sequences.nonpad_share == pytest.approx(10 / 12)
    assert collate_pairs([EncodedPair(a, b, None)], 0).margin is None


def test_bucketed_batches_cover_every_example_once_and_waste_less_padding():
    lengths = [
        int(x) for x in torch.randint(4, 200, (1000,), generator=torch.Generator().manual_seed(0))
    ]
    batches = bucket_batches(lengths, 16, seed=3, epoch=0)
    assert sorted(i for b in batches for i in b) == list(range(1000))
    assert all(len(b) == 16 for b in batches if len(b) != 1000 % 16)
    assert batches == bucket_batches(
        lengths, 16, seed=3, epoch=0
    )  # resumable: order from (seed, epoch)
    assert batches != bucket_batches(lengths, 16, seed=3, epoch=1)

    def share(groups):
        real = sum(lengths[i] for g in groups for i in g)
        return real / sum(len(g) * max(lengths[i] for i in g) for g in groups)

    unbucketed = [list(range(i, min(i + 16, 1000))) for i in range(0, 1000, 16)]
    assert share(unbucketed) < 0.6 < 0.95 < share(batches)
    batch = collate([EncodedSequence([1] * lengths[i], [1] * lengths[i], 0) for i in batches[0]], 0)
    assert batch.nonpad_share == pytest.approx(share([batches[0]]))
    with pytest.raises(ValueError):
        bucket_batches(lengths, 0, seed=0)
    assert bucket_batches([], 4, seed=0, shuffle=False) == []


def test_packing_fills_rows_and_masks_each_sequence_start():
    from proxrl.data.batching import collate_packed, pack_sequences

    lengths = [
        int(x) for x in torch.randint(3, 30, (200,), generator=torch.Generator().manual_seed(1))
    ]
    sequences = [
        EncodedSequence(list(range(100 + n, 100 + 2 * n)), [0] + [1] * (n - 1), 1) for n in lengths
    ]
    rows = pack_sequences(sequences, max_length=64)
    placed = sorted(id(s) for r in rows for s in r.sequences)
    assert placed == sorted(id(s) for s in sequences)  # each sequence exactly once
    assert all(len(r) <= 64 for r in rows)
    assert sum(lengths) / (64 * len(rows)) > 0.95  # rows are nearly full
    assert rows == pack_sequences(sequences, max_length=64)  # deterministic

    a = EncodedSequence([7, 8, 9], [1, 1, 1], 0)  # no prompt: its first token is a start
    b = EncodedSequence([4, 5], [0, 1], 1)
    batch = collate_packed(rows_of([[a, b], [b]]), pad_id=0)
    assert batch.input_ids.tolist() == [[7, 8, 9, 4, 5], [4, 5, 0, 0, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 0, 1], [0, 1, 0, 1, 2]]
    assert batch.loss_mask.tolist() == [[0, 1, 1, 0, 1], [0, 1, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert batch.model_inputs().keys() == {"input_ids", "position_ids", "use_cache"}


def rows_of(groups):
    from proxrl.data.batching import PackedRow

    return [PackedRow(list(g)) for g in groups]


def test_prompt_rows_render_conversations_with_the_generation_prompt(tokenizer, tmp_path):
    path = _write(
        tmp_path / "p.jsonl",
        [
            {"prompt": "copy: ab ="},
            {"messages": [{"role": "user", "content": "copy ab"}], "answer": "ab"},
        ],
    )
    examples = load_prompt_examples(path)
    assert examples[1].columns == {"answer": "ab"}
    plain, chat = encode_prompts(examples, tokenizer, max_length=64)
    assert plain == tokenizer("copy: ab =")["input_ids"]
    assert tokenizer.decode(chat) == "<|user|>copy ab\n<|assistant|>"
    batch = pad_left([plain, chat], tokenizer.pad_token_id)
    assert batch[:, -1].tolist() == [
        plain[-1],
        chat[-1],
    ]  # every prompt ends where generation starts
