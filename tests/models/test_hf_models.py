"""Model plumbing: tokenizer pad/round-trip checks, causal-LM options, scalar heads, LoRA."""

from __future__ import annotations

import math

import pytest
import torch
from peft import PeftModel
from tokenizers import Tokenizer, models
from torch import nn
from transformers import (
    AutoModelForSequenceClassification,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from proxrl.data.encoding import check_round_trip
from proxrl.models.causal_lm import disable_dropout, load_causal_lm
from proxrl.models.lora import adapter_disabled, apply_lora, trainable_state_dict
from proxrl.models.scalar_head import (
    init_score_head,
    last_token_index,
    load_score_model,
    score_head,
    token_values,
)
from proxrl.models.tiny import build_tiny_tokenizer
from proxrl.models.tokenizer import (
    load_tokenizer,
    padding_side,
    resize_for_tokenizer,
)
from proxrl.runtime.errors import ProxrlError


def test_tokenizer_without_pad_gets_one_distinct_from_eos_and_the_model_is_resized(
    tmp_path, tiny_lm
):
    tokenizer = build_tiny_tokenizer(["hello world"] * 4)
    tokenizer.pad_token = tokenizer.eos_token  # the common "pad = EOS" shortcut
    tokenizer.save_pretrained(tmp_path)
    n_before = len(tokenizer)

    loaded = load_tokenizer(str(tmp_path))
    assert loaded.pad_token == "<|pad|>" or loaded.pad_token_id != loaded.eos_token_id
    assert loaded.pad_token_id != loaded.eos_token_id
    assert loaded.padding_side == "right"

    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=n_before - 1,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
        )
    )
    resize_for_tokenizer(model, loaded)
    assert model.get_input_embeddings().weight.shape[0] >= len(loaded) > loaded.pad_token_id
    assert model.config.pad_token_id == loaded.pad_token_id
    with padding_side(loaded, "left"):
        batch = loaded(["hello", "hello world hello"], padding=True)["input_ids"]
        assert batch[0][0] == loaded.pad_token_id  # generation layout: pads first
    assert loaded.padding_side == "right"


def test_tokenizer_that_encodes_text_to_nothing_is_a_clear_error(tmp_path):
    empty = Tokenizer(
        models.BPE(vocab={"<|pad|>": 0, "<|eos|>": 1}, merges=[])
    )  # no unk: drops text
    broken = PreTrainedTokenizerFast(
        tokenizer_object=empty, pad_token="<|pad|>", eos_token="<|eos|>"
    )
    assert broken("hello", add_special_tokens=False)["input_ids"] == []
    with pytest.raises(ProxrlError) as info:
        check_round_trip(broken, ["hello there", "", "general kenobi"], source="broken")
    assert str(info.value) == (
        "tokenizer from 'broken' encodes the data's first 2 texts ('hello there', ...) to zero "
        "tokens; it is broken (transformers may have loaded it with the wrong tokenizer class)"
    )
    check_round_trip(broken, ["", "  "])  # no text to judge it on: nothing to say


def test_missing_model_path_is_one_line(tmp_path, monkeypatch):
    for loader in (load_tokenizer, load_causal_lm, load_score_model):
        with pytest.raises(ProxrlError, match="does not exist") as info:
            loader(str(tmp_path / "nope"))
        assert "\n" not in str(info.value)
    # A relative "dir/name" under an existing directory is a local path, not a hub id.
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ProxrlError, match="model path 'runs/sft' does not exist"):
        load_causal_lm("runs/sft")


def test_causal_lm_options_dtype_checkpointing_and_remote_code_off(tiny_lm, monkeypatch):
    seen = {}
    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained

    def spy(path, **kwargs):
        seen.update(kwargs)
        return original(path, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    model = load_causal_lm(
        tiny_lm, dtype="bfloat16", gradient_checkpointing=True, attn_implementation="eager"
    )
    assert (
        seen["trust_remote_code"] is False
        and seen["dtype"] is torch.bfloat16
        and "torch_dtype" not in seen
    )
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    checkpointed = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False)]
    assert checkpointed and model.config.use_cache is False
    assert model.config._attn_implementation == "eager"
    with pytest.raises(ProxrlError, match="dtype: expected one of"):
        load_causal_lm(tiny_lm, dtype="float8")


def test_dropout_is_disabled_everywhere():
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        attention_dropout=0.3,
    )
    model = LlamaForCausalLM(config)
    model.extra = nn.Sequential(nn.Dropout(0.5))
    disable_dropout(model)
    assert model.config.attention_dropout == 0.0
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, nn.Dropout))
    assert all(getattr(m, "attention_dropout", 0.0) == 0.0 for m in model.modules())
    model.train()
    ids = torch.randint(0, 64, (2, 8))
    torch.testing.assert_close(model(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_reward_head_init_has_std_one_over_sqrt_d_plus_one():
    head = nn.Linear(4095, 1, bias=True)
    torch.manual_seed(0)
    init_score_head(head, "reward")
    expected = 1 / math.sqrt(4096)
    # 4095 draws: the sample std is within 5% of sigma with overwhelming probability (≈ 3.2σ).
    assert head.weight.std().item() == pytest.approx(expected, rel=0.05)
    assert head.bias.item() == 0.0
    init_score_head(head, "zero")
    assert torch.count_nonzero(head.weight) == 0


def test_score_model_from_a_causal_lm_gets_a_fresh_head_and_a_saved_one_is_kept(tiny_lm, tmp_path):
    torch.manual_seed(1)
    model = load_score_model(tiny_lm)
    head = score_head(model)
    d = head.in_features
    assert head.bias is None and head.out_features == 1
    # N(0, 1/√33) ≈ 0.174 here, far from transformers' own N(0, 0.02): the sample std of 32
    # seeded draws lands inside ±50%, which 0.02 cannot.
    assert head.weight.std().item() == pytest.approx(1 / math.sqrt(d + 1), rel=0.5)

    model.save_pretrained(tmp_path)
    again = load_score_model(str(tmp_path))
    torch.testing.assert_close(score_head(again).weight, head.weight, rtol=0, atol=0)
    critic = load_score_model(tiny_lm, new_head="zero")
    assert torch.count_nonzero(score_head(critic).weight) == 0
    plain = AutoModelForSequenceClassification.from_pretrained(tmp_path)
    assert plain.config.num_labels == 1


def test_last_token_index_for_left_and_right_padding():
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert last_token_index(mask).tolist() == [2, 4, 4]


def test_token_values_match_the_classifier_at_every_position(tiny_lm):
    model = load_score_model(tiny_lm, dtype="float64").eval()
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        values = token_values(model, ids, torch.ones_like(ids))
        for t in range(1, 5):  # HF reads the last token of each prefix
            prefix = model(input_ids=ids[:, :t]).logits[0, 0]
            assert values[0, t - 1].item() == pytest.approx(prefix.item(), rel=1e-9, abs=1e-12)


def test_lora_trains_only_adapters_and_disabling_it_gives_the_base_model(tiny_lm, tmp_path):
    base = load_causal_lm(tiny_lm, dtype="float64")
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        base_logits = base(ids).logits.clone()
    model = apply_lora(base, r=4)
    trainable = trainable_state_dict(model)
    assert trainable and all("lora_" in name for name in trainable)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.01)
        adapted = model(ids).logits.clone()
        with adapter_disabled(model) as reference:
            torch.testing.assert_close(reference(ids).logits, base_logits, rtol=0, atol=0)
    assert (adapted - base_logits).abs().max() > 1e-4
    model.save_pretrained(tmp_path)
    reloaded = PeftModel.from_pretrained(load_causal_lm(tiny_lm, dtype="float64"), str(tmp_path))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, adapted, rtol=1e-12, atol=1e-12)


def test_lora_on_a_score_model_also_trains_the_head(tiny_lm):
    model = apply_lora(load_score_model(tiny_lm), r=2, task="seq_cls")
    names = list(trainable_state_dict(model))
    assert any("score" in n for n in names) and any("lora_A" in n for n in names)
    assert score_head(model).weight.requires_grad


def test_gradient_checkpointing_gives_the_same_gradients(tiny_lm):
    ids = torch.tensor([[3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]])

    def grads(checkpointing: bool) -> dict[str, torch.Tensor]:
        model = load_causal_lm(tiny_lm, dtype="float64", gradient_checkpointing=checkpointing)
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
        return {n: p.grad for n, p in model.named_parameters()}

    plain, checkpointed = grads(False), grads(True)
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=1e-10, atol=1e-12)


def test_an_uncached_hub_id_without_a_reachable_hub_fails_at_once(monkeypatch):
    """No DNS for the hub and nothing in the cache: one line naming the id and the host, before
    any download is tried (it would retry for ~50 s)."""
    import socket
    import time

    from huggingface_hub import file_download

    from proxrl.models import tokenizer as tokenizer_module

    def no_dns(*args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    def no_download(*args, **kwargs):
        raise AssertionError("a download was tried")

    for name in tokenizer_module.PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tokenizer_module.socket, "getaddrinfo", no_dns)
    monkeypatch.setattr(file_download, "hf_hub_download", no_download)
    started = time.perf_counter()
    with pytest.raises(
        ProxrlError,
        match=r"hub model 'nobody/no-such-model' is neither a local directory nor in the "
        r"Hugging Face cache, and huggingface\.co cannot be reached",
    ):
        load_tokenizer("nobody/no-such-model")
    assert time.perf_counter() - started < 5


def test_a_cached_hub_id_loads_from_the_cache_without_a_network_call(
    tiny_lm, tmp_path, monkeypatch
):
    """No DNS for the hub but the id in the Hugging Face cache: tokenizer and model load from the
    cache in offline mode, and no request is even attempted (it would retry for ~50 s)."""
    import shutil

    from huggingface_hub import constants, file_download

    from proxrl.models import tokenizer as tokenizer_module
    from proxrl.models.causal_lm import load_causal_lm

    commit = "0" * 40
    repo = tmp_path / "hub" / "models--proxrl-test--tiny"
    shutil.copytree(tiny_lm, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    for name in tokenizer_module.PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(
        tokenizer_module.socket,
        "getaddrinfo",
        lambda *a, **k: (_ for _ in ()).throw(OSError("no DNS")),
    )
    monkeypatch.setattr(
        file_download, "get_hf_file_metadata", lambda *a, **k: pytest.fail("a request was made")
    )

    tokenizer = load_tokenizer("proxrl-test/tiny")
    model = load_causal_lm("proxrl-test/tiny")
    assert constants.HF_HUB_OFFLINE and len(tokenizer) > 0 and model.config.vocab_size > 0


def test_a_reachable_hub_or_a_proxy_is_left_to_transformers(monkeypatch):
    """With the hub's host resolving, or a proxy set (which may resolve what this machine
    cannot), the check says nothing and changes nothing."""
    from huggingface_hub import constants

    from proxrl.models import tokenizer as tokenizer_module

    offline = constants.HF_HUB_OFFLINE
    monkeypatch.setattr(tokenizer_module.socket, "getaddrinfo", lambda *a, **k: [])
    tokenizer_module.check_model_source("nobody/no-such-model")
    monkeypatch.setattr(
        tokenizer_module.socket, "getaddrinfo", lambda *a, **k: (_ for _ in ()).throw(OSError())
    )
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    tokenizer_module.check_model_source("nobody/no-such-model")
    assert offline is constants.HF_HUB_OFFLINE
