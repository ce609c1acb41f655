"""LoRA in and out: a directory that holds a peft adapter loads as its base with the adapter
merged in (as a causal LM, as a reward or value model, and its tokenizer), and a LoRA-trained
model saves as the merged model plus its adapter in ``adapter/``, each reproducing the trained
model when loaded with plain transformers / peft."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
)

from proxrl.models.causal_lm import load_causal_lm
from proxrl.models.lora import apply_lora, save_model
from proxrl.models.scalar_head import backbone, load_score_model, sequence_scores
from proxrl.models.tokenizer import load_tokenizer

IDS = torch.tensor([[3, 4, 5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15, 16]])
MASK = torch.ones_like(IDS)


def _trained_lora(tiny_lm: str, task: str = "causal_lm"):
    """A rank-4 LoRA with non-zero adapters (and head, for ``seq_cls``), as training leaves it."""
    base = load_score_model(tiny_lm) if task == "seq_cls" else load_causal_lm(tiny_lm)
    model = apply_lora(base, r=4, task=task)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.1 * torch.randn(param.shape, generator=generator))
    return model.eval()


def _hidden(model) -> torch.Tensor:
    with torch.no_grad():
        return backbone(model)(input_ids=IDS, attention_mask=MASK).last_hidden_state


def test_an_adapter_directory_loads_as_its_base_with_the_adapter_merged(tiny_lm, tmp_path):
    adapted = _trained_lora(tiny_lm)
    adapted.save_pretrained(tmp_path / "adapter")  # an adapter alone: no weights, no tokenizer
    with torch.no_grad():
        expected = adapted(IDS).logits
        base_logits = load_causal_lm(tiny_lm)(IDS).logits

    loaded = load_causal_lm(str(tmp_path / "adapter"))

    assert type(loaded) is LlamaForCausalLM  # plain transformers, the adapter merged in
    assert not any("lora" in name for name, _ in loaded.named_parameters())
    assert all(p.requires_grad for p in loaded.parameters())  # a full fine-tune can start here
    with torch.no_grad():
        logits = loaded(IDS).logits
    assert (expected - base_logits).abs().max() > 0.05  # the adapter matters
    torch.testing.assert_close(logits, expected, rtol=0, atol=2e-5)
    # As a critic or reward-model start, the body is the adapted one too.
    critic = load_score_model(str(tmp_path / "adapter"), new_head="zero")
    assert type(critic) is LlamaForSequenceClassification
    torch.testing.assert_close(_hidden(critic), _hidden(adapted), rtol=0, atol=2e-5)
    # The adapter was saved without a tokenizer: its base's is used.
    assert load_tokenizer(str(tmp_path / "adapter")).get_vocab() == (
        load_tokenizer(tiny_lm).get_vocab()
    )


def test_a_reward_adapter_brings_its_head(tiny_lm, tmp_path):
    """A LoRA reward model saved as an adapter (the head in ``modules_to_save``) scores as it
    did, and is not refused as a model without a head."""
    adapted = _trained_lora(tiny_lm, task="seq_cls")
    adapted.save_pretrained(tmp_path / "rm")
    with torch.no_grad():
        expected = sequence_scores(adapted, IDS, MASK)

    loaded = load_score_model(str(tmp_path / "rm"), new_head=None)

    with torch.no_grad():
        torch.testing.assert_close(sequence_scores(loaded, IDS, MASK), expected, rtol=0, atol=2e-5)


@pytest.mark.parametrize("task", ["causal_lm", "seq_cls"])
def test_save_model_writes_the_merged_model_and_the_adapter_and_leaves_the_model(
    task, tiny_lm, tmp_path
):
    adapted = _trained_lora(tiny_lm, task)
    before = {k: v.clone() for k, v in adapted.state_dict().items()}
    with torch.no_grad():
        expected = adapted(input_ids=IDS, attention_mask=MASK).logits

    save_model(adapted, tmp_path / "out")

    # The trained model was not merged in place (that would round its weights).
    after = adapted.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    # Top level: a plain model, no LoRA tensors, that gives the trained model's outputs.
    auto = AutoModelForSequenceClassification if task == "seq_cls" else AutoModelForCausalLM
    assert not any("lora" in k for k in load_file(tmp_path / "out" / "model.safetensors"))
    merged = auto.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        torch.testing.assert_close(
            merged(input_ids=IDS, attention_mask=MASK).logits, expected, rtol=0, atol=2e-5
        )
    # adapter/: the adapter alone, on the model the run started from.
    config = json.loads(Path(tmp_path / "out" / "adapter" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == tiny_lm
    kwargs = {"num_labels": 1} if task == "seq_cls" else {}
    stacked = PeftModel.from_pretrained(
        auto.from_pretrained(tiny_lm, **kwargs), str(tmp_path / "out" / "adapter")
    ).eval()
    with torch.no_grad():
        torch.testing.assert_close(
            stacked(input_ids=IDS, attention_mask=MASK).logits, expected, rtol=0, atol=2e-5
        )


def test_save_model_keeps_tied_embeddings_tied(tiny_lm, tmp_path):
    """A model whose output head shares the input embedding saves under LoRA as one that still
    shares it, and gives the trained model's outputs."""
    tied = load_causal_lm(tiny_lm)
    tied.config.tie_word_embeddings = True
    tied.lm_head.weight = tied.model.embed_tokens.weight
    tied.save_pretrained(tmp_path / "tied")
    load_tokenizer(tiny_lm).save_pretrained(tmp_path / "tied")
    adapted = _trained_lora(str(tmp_path / "tied"))
    with torch.no_grad():
        expected = adapted(IDS).logits

    save_model(adapted, tmp_path / "out")

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert merged.lm_head.weight.data_ptr() == merged.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        torch.testing.assert_close(merged(IDS).logits, expected, rtol=0, atol=2e-5)
