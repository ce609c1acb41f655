"""Why ``sampler: vllm`` refuses min_p > 0 with top_p < 1: vLLM applies min-p *before* top-p,
the trainer (``core.truncate_logits``, as transformers' ``generate``) after it, and on this
distribution the two keep different tokens.

A model whose every position predicts the same distribution (all embeddings one vector, the
layers' output projections 0, so the head sees one hidden state): tokens a, b, c, d with
p = 0.4, 0.35, 0.15, 0.1, the rest ~0. With top_p 0.8 and min_p 0.3 (threshold 0.3·0.4 = 0.12):
- generate's order: top-p keeps a, b, c (mass before c is 0.75 < 0.8), min-p keeps all three
  (0.15 ≥ 0.12): c has probability 0.15/0.9 = 1/6;
- vLLM's order: min-p drops d (0.1 < 0.12), leaving a, b, c renormalised over 0.9 (0.444,
  0.389, 0.167); top-p then drops c (mass before it 0.833 ≥ 0.8): c is never drawn.
Either filter alone keeps c in both orders, so c's share tells the orders apart.
"""

from __future__ import annotations

import math

import pytest
import torch

from proxrl.core import truncate_logits
from proxrl.models.tokenizer import load_tokenizer
from proxrl.rollout.generation import SamplingSettings
from proxrl.rollout.vllm_sampler import EngineOptions, VLLMSampler

TOKENS = (10, 11, 12, 13)  # a, b, c, d
PROBS = (0.4, 0.35, 0.15, 0.1)
C = TOKENS[2]


def _logits(vocab: int) -> torch.Tensor:
    logits = torch.full((vocab,), -40.0)
    for token, p in zip(TOKENS, PROBS, strict=True):
        logits[token] = math.log(p)
    return logits


@pytest.fixture(scope="module")
def engine_and_tokenizer(tiny_lm, tmp_path_factory, engines):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_lm, dtype=torch.float32)
    hidden = model.config.hidden_size
    with torch.no_grad():
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[:, 0] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight.zero_()
        # RMSNorm(e_0) = √hidden · e_0 (up to eps): the head's column 0 sets the logits
        model.lm_head.weight[:, 0] = _logits(model.config.vocab_size) / math.sqrt(hidden)
    path = tmp_path_factory.mktemp("fixed") / "lm"
    model.save_pretrained(path)
    load_tokenizer(tiny_lm).save_pretrained(path)
    engine = engines.get(EngineOptions(str(path), gpu_memory_utilization=0.02)).llm
    return engine, load_tokenizer(str(path))


def _share_of_c(engine, tokenizer, **truncation) -> float:
    ids = tokenizer("say: abc ->")["input_ids"]
    prompt_ids = torch.tensor([ids] * 256)
    torch.manual_seed(0)
    samples = VLLMSampler(engine, tokenizer).sample(
        prompt_ids, torch.ones_like(prompt_ids), SamplingSettings(8, **truncation)
    )
    drawn = samples.response_ids[samples.response_mask.bool()]
    assert set(drawn.tolist()) <= set(TOKENS)  # the model predicts the designed distribution
    return float((drawn == C).float().mean())


def test_vllm_applies_min_p_before_top_p(engine_and_tokenizer):
    engine, tokenizer = engine_and_tokenizer
    # one filter at a time: c kept in either order, drawn ~1/6 of the time (2,048 draws)
    for truncation in ({"min_p": 0.3}, {"top_p": 0.8}):
        assert abs(_share_of_c(engine, tokenizer, **truncation) - 1 / 6) < 0.04, truncation
    # both: vLLM never draws c, while the trainer's order keeps it
    assert _share_of_c(engine, tokenizer, min_p=0.3, top_p=0.8) == 0.0
    kept = truncate_logits(_logits(len(tokenizer)), top_p=0.8, min_p=0.3) > -math.inf
    assert kept[C] and kept.sum() == 3
