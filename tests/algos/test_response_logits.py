"""The forwards compute logits only at the positions that predict a response token
(``rollout.forward.logits_at``), and give what the full-logits computation gives.

1. ``policy_forward`` (padded and packed) and ``response_logits`` against the computation that
   projects every position and slices afterwards (the code they replaced, kept here as the
   reference), with every output and sampling filter: float64 to 1e-12, float32 to 1e-6, the
   log-probs' gradients as well; on an untied Llama, a Qwen2 with tied embeddings, a Granite
   with a logit scale (applied after the head), LoRA-wrapped (also LoRA on the head), and a
   model whose head cannot be found (the full logits, then the pick).
2. The output head sees only those positions: (1, N, d) padded (the N real response tokens,
   issue 50), (1, M, d) packed, (B, T, d) for ``response_logits`` (every position's logits).
3. Under LoRA no base weight takes a gradient: the update writes no full-weight gradient.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn
from transformers import (
    GraniteConfig,
    GraniteForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from proxrl.core import processed_entropy, processed_logprobs
from proxrl.models.lora import apply_lora
from proxrl.rollout.forward import PolicyOutput, policy_forward, response_logits
from proxrl.rollout.packing import pack_batch, real_positions, unpack

PROMPT_LENGTHS = [3, 1, 5, 2]
RESPONSE_LENGTHS = [1, 7, 2, 6]
VOCAB = 50
FILTERS = [
    {},
    {"top_k": 5},
    {"top_p": 0.8},
    {"min_p": 0.05},
    {"top_k": 7, "top_p": 0.9, "min_p": 0.02},
]


def _batch(seed: int = 0) -> tuple[Tensor, Tensor, int]:
    """Left-padded prompts, right-padded responses: (B, P + T) ids and mask, and P."""
    g = torch.Generator().manual_seed(seed)
    P, T = max(PROMPT_LENGTHS), max(RESPONSE_LENGTHS)
    ids = torch.randint(3, VOCAB, (len(PROMPT_LENGTHS), P + T), generator=g)
    mask = torch.zeros_like(ids)
    for row, (p, t) in enumerate(zip(PROMPT_LENGTHS, RESPONSE_LENGTHS, strict=True)):
        mask[row, P - p : P + t] = 1
    return ids * mask, mask, P


def _small(kind: str, dtype: torch.dtype) -> nn.Module:
    common = dict(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    if kind == "llama":
        model: nn.Module = LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=False))
    elif kind == "qwen2_tied":
        model = Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=True))
    elif kind == "granite_scaled":
        model = GraniteForCausalLM(GraniteConfig(**common, logits_scaling=0.25))
    else:
        raise ValueError(kind)
    model = model.to(dtype)
    return model


class NoHeadName(nn.Module):
    """A causal LM behind a wrapper that names no output head: the full logits, then the pick."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, **kwargs: Any) -> Any:
        return self.inner(**kwargs)


def _full_padded(model, ids, mask, P, with_logits=False, **filters) -> PolicyOutput:  # type: ignore[no-untyped-def]
    """The reference: every position's logits, then the response slice."""
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=real_positions(mask),
        output_hidden_states=True, use_cache=False,
    )  # fmt: skip
    logits = out.logits[:, P - 1 : -1]
    return PolicyOutput(
        logprobs=processed_logprobs(logits, ids[:, P:], 0.7, **filters),
        entropy=processed_entropy(logits.detach(), 0.7, **filters),
        hidden=out.hidden_states[-1][:, P - 1 : -1],
        argmax=logits.argmax(-1),
        logits=logits if with_logits else None,
    )


def _full_packed(model, ids, mask, P, **filters) -> PolicyOutput:  # type: ignore[no-untyped-def]
    """The reference: every packed position's logits, scored, then picked and unpacked."""
    packed = pack_batch(ids, mask)
    out = model(**packed.model_inputs(), output_hidden_states=True)
    rows, columns, lines, slots = packed.predictions(P)
    shape = (ids.shape[0], ids.shape[1] - P)
    logits = out.logits[:, :-1]
    logprobs = processed_logprobs(logits, packed.input_ids[:, 1:], 0.7, **filters)
    entropy = processed_entropy(logits.detach(), 0.7, **filters)
    return PolicyOutput(
        logprobs=unpack(logprobs[lines, slots], rows, columns, shape),
        entropy=unpack(entropy[lines, slots], rows, columns, shape),
        hidden=unpack(out.hidden_states[-1][lines, slots], rows, columns, shape),
        argmax=unpack(logits[lines, slots].argmax(-1), rows, columns, shape),
    )


def _wrapped(kind: str, dtype: torch.dtype) -> nn.Module:
    if kind == "lora":
        model = apply_lora(_small("llama", dtype), r=4)
    elif kind == "lora_on_head":
        model = apply_lora(_small("llama", dtype), r=4, target_modules=["q_proj", "lm_head"])
    elif kind == "no_head_name":
        model = NoHeadName(_small("llama", dtype))
    else:
        return _small(kind, dtype)
    with torch.no_grad():  # LoRA's B starts at zero: make the adapters count
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.3)
    return model


MODELS = ["llama", "qwen2_tied", "granite_scaled", "lora", "lora_on_head", "no_head_name"]


def _assert_close(mine: Tensor, reference: Tensor, dtype: torch.dtype) -> None:
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(mine, reference, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("packed", [False, True])
def test_policy_forward_equals_full_logits(kind: str, dtype: torch.dtype, packed: bool) -> None:
    model = _wrapped(kind, dtype)
    ids, mask, P = _batch()
    response_mask = mask[:, P:].bool()
    for filters in FILTERS:
        params = [p for p in model.parameters() if p.requires_grad]
        reference = (_full_packed if packed else _full_padded)(model, ids, mask, P, **filters)
        reference_grads = torch.autograd.grad(reference.logprobs[response_mask].sum(), params)
        mine = policy_forward(
            model, ids, mask, P, 0.7, with_entropy=True, with_hidden=True,
            packed=packed, with_argmax=True, **filters,
        )  # fmt: skip
        grads = torch.autograd.grad(mine.logprobs[response_mask].sum(), params)
        for name in ("logprobs", "entropy", "hidden", "argmax"):
            a, b = getattr(mine, name), getattr(reference, name)
            assert a.shape == b.shape, name
            if name == "argmax":
                assert torch.equal(a[response_mask], b[response_mask]), (kind, filters)
            else:
                _assert_close(a[response_mask], b[response_mask], dtype)
        for g, ref_g in zip(grads, reference_grads, strict=True):
            _assert_close(g, ref_g, dtype)


@pytest.mark.parametrize("kind", MODELS)
def test_response_logits_and_with_logits_equal_full_logits(kind: str) -> None:
    model = _wrapped(kind, torch.float64)
    ids, mask, P = _batch(seed=1)
    reference = _full_padded(model, ids, mask, P, with_logits=True)
    assert reference.logits is not None
    mine = policy_forward(model, ids, mask, P, 0.7, with_logits=True)
    assert mine.logits is not None and mine.logits.shape == reference.logits.shape
    _assert_close(mine.logits, reference.logits, torch.float64)
    _assert_close(response_logits(model, ids, mask, P), reference.logits, torch.float64)


@pytest.mark.parametrize("kind", ["llama", "qwen2_tied", "lora_on_head"])
def test_the_head_sees_only_the_predicting_positions(kind: str) -> None:
    """The saving itself: (1, N, d) into the head padded (N real response tokens, no response
    padding), (1, M, d) packed (M real response tokens that follow a real token), (B, T, d) for
    ``response_logits`` (the caller reads every position's logits), never (B, P + T, d) or
    (R, W, d)."""
    model = _wrapped(kind, torch.float64)
    head = model.get_output_embeddings()
    seen: list[tuple[int, ...]] = []
    handle = head.register_forward_hook(lambda _m, args, _out: seen.append(tuple(args[0].shape)))
    ids, mask, P = _batch()
    try:
        policy_forward(model, ids, mask, P, 1.0)
        policy_forward(model, ids, mask, P, 1.0, packed=True)
        response_logits(model, ids, mask, P)
    finally:
        handle.remove()
    B, T = ids.shape[0], ids.shape[1] - P
    N = int(mask[:, P:].sum())
    M = int(pack_batch(ids, mask).predictions(P)[0].numel())
    assert N < B * T
    assert seen == [(1, N, 16), (1, M, 16), (B, T, 16)]


def test_lora_leaves_every_base_weight_without_gradient() -> None:
    """LoRA trains the adapters only: after a backward, no base weight (tied embeddings and
    head included) holds a gradient, so no full-weight gradient is ever materialised."""
    model = apply_lora(_small("qwen2_tied", torch.float32), r=4)
    ids, mask, P = _batch()
    policy_forward(model, ids, mask, P, 1.0).logprobs.sum().backward()
    for name, param in model.named_parameters():
        is_adapter = "lora_" in name
        assert param.requires_grad == is_adapter, name
        assert (param.grad is not None) == is_adapter, name
