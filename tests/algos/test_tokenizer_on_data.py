"""The tokenizer is judged on the run's own data, not on a fixed English sentence: a domain
tokenizer that knows only digits (every English word is unknown to it) trains, while a
tokenizer that encodes text to nothing still fails in one line, before any model loads."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from proxrl.cli import main
from proxrl.models.tokenizer import load_tokenizer
from proxrl.runtime.errors import ProxrlError

ROWS = [
    {"prompt": f"max {a} {b} =", "completion": f" {max(a, b)}"} for a in range(4) for b in (5, 2)
]


def _save_with_model(tokenizer: PreTrainedTokenizerFast, path) -> str:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=64,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def digits_tokenizer() -> PreTrainedTokenizerFast:
    """Knows the digits, ``max`` and ``=``; anything else is ``<unk>``."""
    specials = ["<|pad|>", "<|eos|>", "<unk>"]
    vocab = {t: i for i, t in enumerate([*specials, "max", "=", *"0123456789"])}
    word_level = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=word_level, pad_token="<|pad|>", eos_token="<|eos|>", unk_token="<unk>"
    )


def empty_tokenizer() -> PreTrainedTokenizerFast:
    """Encodes any text to no tokens (a BPE with no merges and no unk)."""
    bpe = Tokenizer(models.BPE(vocab={"<|pad|>": 0, "<|eos|>": 1}, merges=[]))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<|pad|>", eos_token="<|eos|>")


def _sft(model: str, tmp_path) -> list[str]:
    data = tmp_path / "digits.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return [
        "sft",
        "--model",
        model,
        "--data",
        str(data),
        "--output-dir",
        str(tmp_path / "run"),
        "--batch-size",
        "4",
        "--max-steps",
        "1",
        "--progress",
        "false",
    ]


def test_a_domain_tokenizer_that_works_on_the_data_trains(tmp_path, capsys):
    model = _save_with_model(digits_tokenizer(), tmp_path / "digits")
    tokenizer = load_tokenizer(model)
    english = tokenizer("The quick brown fox", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(english, skip_special_tokens=True) == ""  # the old check's verdict
    assert main(_sft(model, tmp_path)) == 0, capsys.readouterr().err
    assert (tmp_path / "run" / "model.safetensors").exists()


def test_a_tokenizer_that_encodes_the_data_to_nothing_fails_in_one_line(tmp_path, capsys):
    model = _save_with_model(empty_tokenizer(), tmp_path / "empty")
    assert main(_sft(model, tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines()[-1] == (
        f"proxrl sft: error: tokenizer from '{model}' encodes the data's first 16 texts "
        "('max 0 5 =', ...) to zero tokens; it is broken (transformers may have loaded it with "
        "the wrong tokenizer class)"
    )
    assert "Traceback" not in err and not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["rm", "dpo"])
def test_preference_commands_judge_the_tokenizer_on_their_pairs(command, tmp_path, capsys):
    model = _save_with_model(empty_tokenizer(), tmp_path / "empty")
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"prompt": "max 1 5 =", "chosen": " 5", "rejected": " 1"}) + "\n")
    argv = [command, "--model", model, "--data", str(data), "--output-dir", str(tmp_path / "r")]
    assert main(argv) == 2
    assert "('max 1 5 =', ...) to zero tokens" in capsys.readouterr().err.splitlines()[-1]


def test_a_reward_models_tokenizer_is_judged_on_the_first_prompts():
    """ppo/grpo's reward model brings its own tokenizer: it is checked on the run's first
    prompts, once, before it scores anything."""
    from torch import nn

    from proxrl.data.formats import PromptExample
    from proxrl.rollout.rewards import RewardModelReward

    source = RewardModelReward(nn.Linear(1, 1), empty_tokenizer())
    prompts = [PromptExample("max 1 5 =", None, "p.jsonl:1")]
    with pytest.raises(
        ProxrlError, match=r"encodes the data's first 1 texts \('max 1 5 =', \.\.\.\)"
    ):
        source(prompts, [" 5"], {})
    assert not source.checked
