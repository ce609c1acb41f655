"""Sequences longer than the model's context are dealt with before training, and the run says
how (issue 40: a raw IndexError mid-run with a GPT-2-style model): offline, ``max_length`` is
held to the context (longer examples follow ``overlong`` there); online, a prompt plus
``max_new_tokens`` that cannot fit is refused in one line."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from proxrl.algos.offline import sft
from proxrl.algos.online import grpo
from proxrl.algos.online.roles import role_settings
from proxrl.models.context import model_context
from proxrl.models.tiny import build_tiny_tokenizer
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.metrics import read_metrics
from tests.algos.test_online import small

CONTEXT = 24
TEXTS = [f"copy the words {w} {w} {w} and then {w} again" for w in ("ab", "cd", "ef", "gh")]


@pytest.fixture(scope="module")
def gpt2_lm(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny GPT-2 (learned positions: an index past n_positions is an IndexError)."""
    path = tmp_path_factory.mktemp("gpt2") / "lm"
    tokenizer = build_tiny_tokenizer(TEXTS * 4)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=CONTEXT,
        n_embd=16,
        n_layer=1,
        n_head=2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        GPT2LMHeadModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_the_context_is_read_from_the_config(gpt2_lm: str, tiny_lm: str) -> None:
    assert model_context(gpt2_lm) == CONTEXT
    assert model_context(tiny_lm) == 256  # Llama: max_position_embeddings


def test_a_missing_model_or_adapter_base_asks_no_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local path that is not there (here, a LoRA adapter's base) has no context to read, and
    the hub is never asked for it: its retries took ~50 s before the loader's one-line error."""
    from huggingface_hub import file_download

    def no_request(*args: object, **kwargs: object) -> None:
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(file_download, "get_hf_file_metadata", no_request)
    monkeypatch.chdir(tmp_path)
    adapter = Path("models") / "orphan_adapter"
    adapter.mkdir(parents=True)
    base = {"peft_type": "LORA", "base_model_name_or_path": "models/gone"}
    (adapter / "adapter_config.json").write_text(json.dumps(base))
    assert model_context(str(adapter)) is None
    assert model_context("models/gone") is None


def test_sft_holds_max_length_to_the_context_and_says_so(
    gpt2_lm: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data.jsonl"
    rows = [{"prompt": t, "completion": " " + t * 2} for t in TEXTS]  # each longer than CONTEXT
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = sft.Config(
        model=gpt2_lm, data=str(data), output_dir=str(tmp_path / "out"), max_steps=2, batch_size=2
    )
    with caplog.at_level(logging.WARNING):
        metrics = sft.train(cfg)
    assert metrics["train/loss"] > 0
    said = [r.getMessage() for r in caplog.records if "context" in r.getMessage()]
    assert said == [
        f"max_length 512 is longer than the model's context ({CONTEXT} positions, its "
        f"config.json): max_length is {CONTEXT} for this run; longer examples are cut at it"
    ]


def test_grpo_refuses_a_prompt_and_response_longer_than_the_context(
    gpt2_lm: str, tmp_path: Path
) -> None:
    """Prompts of unequal length: the longest plus max_new_tokens one position past the
    context is refused in one line before anything is written (the shorter prompts would fit);
    exactly filling it, the run is accepted and trains (a GPT-2: learned positions)."""
    from proxrl.algos.online.roles import load_prompts
    from proxrl.models.tokenizer import load_tokenizer

    prompts = tmp_path / "prompts.jsonl"
    texts = [TEXTS[0], "ab", "copy cd"]  # the longest first: decoding may take any order
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    cfg = small(grpo.Config, gpt2_lm, str(prompts), tmp_path / "out", iterations=1,
                rollout_batch_size=3, mini_batch_size=3)  # fmt: skip
    _, ids = load_prompts(role_settings(cfg).prompts, load_tokenizer(gpt2_lm))
    longest = max(len(i) for i in ids)
    assert min(len(i) for i in ids) < longest < CONTEXT
    over = replace(cfg, max_new_tokens=CONTEXT - longest + 1)
    with pytest.raises(ProxrlError) as e:
        grpo.train(over)
    assert str(e.value) == (
        f"max_new_tokens: the longest prompt ({longest} tokens) + max_new_tokens "
        f"({CONTEXT - longest + 1}) = {CONTEXT + 1} tokens is longer than the model's context "
        f"({CONTEXT} positions): lower max_new_tokens, or max_prompt_length (longer prompts are "
        "dropped)"
    )
    assert not (tmp_path / "out" / "metrics.jsonl").exists()
    exact = replace(cfg, max_new_tokens=CONTEXT - longest)
    grpo.train(exact)
    assert len(read_metrics(tmp_path / "out")) == 1
