"""TRL's dataset types, standard and conversational, read into the same examples and the same
tokens as proxrl's own layouts: a conversational row is the chat template's rendering, an
implicit prompt is the shared beginning of chosen and rejected, unpaired preferences become
pairs per prompt. Every refusal names the file, line and field."""

from __future__ import annotations

import json
import logging

import pytest

from proxrl.data.encoding import encode_preferences, encode_prompts, encode_sft
from proxrl.data.formats import (
    load_comparison_examples,
    load_preference_examples,
    load_prompt_examples,
    load_sft_examples,
    shared_text_prefix,
)
from proxrl.models.tiny import build_tiny_tokenizer
from proxrl.runtime.errors import ProxrlError

USER = {"role": "user", "content": "What color is the sky?"}
SYSTEM = {"role": "system", "content": "Be brief."}
BLUE = {"role": "assistant", "content": "It is blue."}
GREEN = {"role": "assistant", "content": "It is green."}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer(["What color is the sky? It is blue green. Be brief."] * 4)


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------- language modelling, SFT


def test_a_text_row_trains_on_every_token(tokenizer, tmp_path):
    (example,) = load_sft_examples(_write(tmp_path / "t.jsonl", [{"text": "The sky is blue."}]))
    assert (example.prompt, example.completion) == ("", "The sky is blue.")
    (encoded,) = encode_sft([example], tokenizer, max_length=64)
    text_ids = _ids(tokenizer, "The sky is blue.") + [tokenizer.eos_token_id]
    assert encoded.input_ids[encoded.prompt_length :] == text_ids
    assert encoded.prompt_length == len(tokenizer("")["input_ids"])  # BOS at most
    assert sum(encoded.loss_mask) == len(text_ids)


def test_conversational_prompt_completion_is_the_messages_row(tokenizer, tmp_path):
    path = _write(
        tmp_path / "c.jsonl",
        [
            {"prompt": [SYSTEM, USER], "completion": [BLUE]},
            {"messages": [SYSTEM, USER, BLUE]},
        ],
    )
    pc, messages = encode_sft(load_sft_examples(path), tokenizer, max_length=128)
    assert pc == messages
    rendered = tokenizer.apply_chat_template(
        [SYSTEM, USER], tokenize=False, add_generation_prompt=True
    )
    assert pc.input_ids[: pc.prompt_length] == _ids(tokenizer, rendered)
    reply = tokenizer.decode(pc.input_ids[pc.prompt_length :], skip_special_tokens=True)
    assert reply == "It is blue.\n"


# ---------------------------------------------------------------- preference


@pytest.mark.parametrize(
    ("chosen", "rejected", "split"),
    [
        ("The sky is blue.", "The sky is green.", ("The sky is", " blue.", " green.")),
        ("The sky is blue.", "The sky is black.", ("The sky is", " blue.", " black.")),  # mid-word
        ("Q: 2+2?\nA: 4", "Q: 2+2?\nA: 5", ("Q: 2+2?\nA:", " 4", " 5")),
        ("blue", "black", ("", "blue", "black")),  # no shared word: no prompt
        ("It is blue.", "It is blue. Really.", ("It is", " blue.", " blue. Really.")),
    ],
)
def test_an_implicit_text_prompt_ends_at_the_word_boundary(chosen, rejected, split):
    assert shared_text_prefix(chosen, rejected) == split
    prompt, chosen_answer, rejected_answer = split
    assert prompt + chosen_answer == chosen and prompt + rejected_answer == rejected


def test_every_preference_layout_gives_the_explicit_rows_tokens(tokenizer, tmp_path):
    explicit = _write(
        tmp_path / "explicit.jsonl",
        [
            {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."},
            {"prompt": [USER], "chosen": [BLUE], "rejected": [GREEN]},
        ],
    )
    implicit = _write(
        tmp_path / "implicit.jsonl",
        [
            {"chosen": "The sky is blue.", "rejected": "The sky is green."},
            {"chosen": [USER, BLUE], "rejected": [USER, GREEN]},
        ],
    )
    # HuggingFaceH4/ultrafeedback_binarized: a prompt string beside two whole conversations.
    h4 = _write(
        tmp_path / "h4.jsonl",
        [
            {"chosen": "The sky is blue.", "rejected": "The sky is green.", "margin": None},
            {"prompt": USER["content"], "chosen": [USER, BLUE], "rejected": [USER, GREEN]},
        ],
    )
    expected = encode_preferences(load_preference_examples(explicit), tokenizer, 128)
    for source in (implicit, h4):
        examples = load_preference_examples(source)
        assert examples[1].prompt == [USER] and examples[1].chosen == [BLUE]
        assert encode_preferences(examples, tokenizer, 128) == expected
    conversational = expected[1].chosen
    rendered = tokenizer.apply_chat_template([USER], tokenize=False, add_generation_prompt=True)
    assert conversational.input_ids[: conversational.prompt_length] == _ids(tokenizer, rendered)
    assert tokenizer.decode(
        conversational.input_ids[conversational.prompt_length :], skip_special_tokens=True
    ) == ("It is blue.\n")


def test_unpaired_rows_pair_every_desirable_with_every_undesirable_answer(tmp_path, caplog):
    rows = [
        {"prompt": "The sky is", "completion": " blue.", "label": True},
        {"prompt": "The sky is", "completion": " green.", "label": False},
        {"prompt": "Grass is", "completion": " green.", "label": True},  # no undesirable one
        {"prompt": "The sky is", "completion": " red.", "label": "false"},  # a CSV cell
        {"prompt": [USER], "completion": [BLUE], "label": True},
        {"prompt": [USER], "completion": [GREEN], "label": False},
    ]
    path = _write(tmp_path / "u.jsonl", rows)
    with caplog.at_level(logging.WARNING):
        pairs = load_preference_examples(path)
    assert [(p.prompt, p.chosen, p.rejected, p.where) for p in pairs] == [
        ("The sky is", " blue.", " green.", f"{path}:1"),
        ("The sky is", " blue.", " red.", f"{path}:1"),
        ([USER], [BLUE], [GREEN], f"{path}:5"),
    ]
    assert "1 of 3 prompts have only desirable or only undesirable completions" in caplog.text
    assert load_comparison_examples(path) == pairs  # the reward model reads them the same way


# ---------------------------------------------------------------- prompts for ppo / grpo


def test_every_row_with_a_prompt_gives_its_prompt(tokenizer, tmp_path):
    path = _write(
        tmp_path / "p.jsonl",
        [
            {"prompt": "The sky is"},
            {"prompt": [USER]},
            {"messages": [USER]},
            {"prompt": "The sky is", "completion": " blue."},
            {"prompt": [USER], "chosen": [BLUE], "rejected": [GREEN]},
            {"chosen": "The sky is blue.", "rejected": "The sky is green."},
            {"chosen": [USER, BLUE], "rejected": [USER, GREEN]},
            {"prompt": "The sky is", "completion": " red.", "label": False},
        ],
    )
    examples = load_prompt_examples(path)
    assert [(e.prompt, e.messages) for e in examples] == [
        ("The sky is", None),
        ("", [USER]),
        ("", [USER]),
        ("The sky is", None),
        ("", [USER]),
        ("The sky is", None),
        ("", [USER]),
        ("The sky is", None),
    ]
    assert examples[3].columns == {"completion": " blue."}  # reaches reward functions
    assert examples[7].columns == {"completion": " red.", "label": False}
    ids = encode_prompts(examples, tokenizer, max_length=64)
    assert ids[0] == ids[3] == ids[5] == ids[7] == tokenizer("The sky is")["input_ids"]
    assert ids[1] == ids[2] == ids[4] == ids[6]


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("loader", "row", "message"),
    [
        (
            load_sft_examples,
            {"prompt": "The sky is", "completion": " blue.", "label": True},
            "field 'label': an unpaired preference row; sft would imitate the completions "
            "labelled false too (keep the rows labelled true, without 'label')",
        ),
        (
            load_sft_examples,
            {"prompt": [USER], "completion": "It is blue."},
            "field 'completion': expected a list of messages like 'prompt'",
        ),
        (
            load_sft_examples,
            {"prompt": [USER, BLUE], "completion": [BLUE]},
            "field 'prompt': a prompt must not end with the assistant's message (the policy "
            "would see its answer)",
        ),
        (
            load_sft_examples,
            {"prompt": [USER], "completion": [USER]},
            "field 'completion': expected the assistant's reply first, got role 'user'",
        ),
        (load_sft_examples, {"text": 5}, "field 'text': expected a string, got int"),
        (
            load_preference_examples,
            {"chosen": [USER, BLUE], "rejected": "It is green."},
            "field 'rejected': expected a list of messages like 'chosen'",
        ),
        (
            load_preference_examples,
            {"prompt": "The sky?", "chosen": [BLUE], "rejected": [GREEN]},
            "field 'prompt': expected a list of messages like 'chosen'",
        ),
        (
            load_preference_examples,
            {"chosen": [BLUE], "rejected": [GREEN]},
            "missing field 'prompt' (chosen and rejected start with the assistant's reply)",
        ),
        (
            load_preference_examples,
            {"chosen": [USER, BLUE], "rejected": [SYSTEM, GREEN]},
            "field 'rejected': chosen and rejected share no leading message (with no 'prompt', "
            "the prompt is the conversations' shared beginning)",
        ),
        (
            load_preference_examples,
            {"chosen": [USER, BLUE], "rejected": [USER, BLUE, USER, GREEN]},
            "field 'chosen': the whole conversation is the beginning of the other one; both must "
            "go on with the assistant's reply after their shared part",
        ),
        (
            load_preference_examples,
            {"chosen": [USER, BLUE, USER, BLUE], "rejected": [USER, BLUE, SYSTEM, GREEN]},
            "field 'chosen': chosen and rejected part at message 2, whose role is 'user'; the "
            "implicit prompt must end where the assistant's replies begin",
        ),
        (
            load_preference_examples,
            {"prompt": "a", "completion": " b", "label": "maybe"},
            "missing field 'chosen'",
        ),
        (
            load_comparison_examples,
            {"prompt": [USER], "completion": [BLUE], "label": True, "chosen": None},
            None,  # a lone desirable answer: no pair, so no usable rows
        ),
        (
            load_prompt_examples,
            {"text": "The sky is blue."},
            "field 'text': a language-modelling row holds no prompt to continue; expected "
            "'prompt' (or 'messages')",
        ),
        (
            load_prompt_examples,
            {"chosen": "blue", "rejected": "black"},
            "field 'chosen': chosen and rejected share no beginning, so the row holds no prompt",
        ),
        (
            load_prompt_examples,
            {"prompt": [USER, BLUE]},
            "field 'prompt': a prompt must not end with the assistant's message (the policy "
            "would see its answer)",
        ),
    ],
)
def test_a_bad_row_of_a_trl_layout_names_file_line_and_field(tmp_path, loader, row, message):
    path = _write(tmp_path / "d.jsonl", [row])
    with pytest.raises(ProxrlError) as info:
        loader(path)
    expected = f"data '{path}' has no usable rows" if message is None else f"{path}:1: {message}"
    assert str(info.value) == expected


def test_an_unpaired_label_that_is_not_true_or_false_is_refused(tmp_path):
    path = _write(
        tmp_path / "u.jsonl",
        [
            {"prompt": "a", "completion": " b", "label": True},
            {"prompt": "a", "completion": " c", "label": 1},
        ],
    )
    with pytest.raises(ProxrlError) as info:
        load_preference_examples(path)
    assert str(info.value) == f"{path}:2: field 'label': expected true or false, got 1"


def test_identical_conversations_are_no_prompt_that_ends_with_an_answer(tmp_path):
    """Found by tests/data/test_properties.py: an implicit-prompt row whose two conversations
    are the same has no shared beginning that stops before the assistant's reply."""
    row = {"chosen": [USER, BLUE, SYSTEM], "rejected": [USER, BLUE, SYSTEM]}
    with pytest.raises(ProxrlError, match=r":1: field 'chosen': a prompt must not end with"):
        load_prompt_examples(_write(tmp_path / "p.jsonl", [row]))
    lone = {"chosen": [SYSTEM], "rejected": [SYSTEM]}
    with pytest.raises(ProxrlError, match=r":1: field 'chosen': chosen and rejected share no"):
        load_prompt_examples(_write(tmp_path / "q.jsonl", [lone]))
