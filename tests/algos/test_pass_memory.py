"""Memory of the update's passes (issue 50: cached PPO peaked above the repeated-prefix run).
At the output head, the padded and shared-prefix passes score the real response positions'
logits T positions at a time; their log-probs go through ``core.token_logprobs``, whose
backward writes the logits' gradient over the logits themselves, where autograd's graph made a
zero-filled one per chunk, a new sum per chunk after the first and a copy for the head's
(1, N, V) output. Between micro-batches, the freed heap goes back to the system
(``runtime.memory``)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from proxrl.rollout.forward import policy_forward
from tests.core.allocations import LargeAllocations

VOCABULARY = 500  # the logits dwarf every other tensor of this model, as at a real vocabulary
LENGTHS = [9, 5, 8, 2]  # 4 rows of one prompt: 24 scored positions, chunks of T = 9


def _model_and_batch() -> tuple[Qwen2ForCausalLM, torch.Tensor, torch.Tensor, int]:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCABULARY,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    P, T = 6, max(LENGTHS)
    ids = torch.cat(
        [
            torch.randint(3, VOCABULARY, (1, P)).expand(len(LENGTHS), P),
            torch.randint(3, VOCABULARY, (len(LENGTHS), T)),
        ],
        1,
    )
    mask = torch.ones_like(ids)
    for row, length in enumerate(LENGTHS):
        mask[row, P + length :] = 0
    model = Qwen2ForCausalLM(config)
    for frozen in (model.get_input_embeddings(), model.get_output_embeddings()):
        frozen.weight.requires_grad_(False)  # as under LoRA: no vocabulary-sized gradient
    return model, ids, mask, P


@pytest.mark.parametrize("shared", [True, False])
def test_the_backward_makes_no_logits_sized_tensor(shared):
    model, ids, mask, P = _model_and_batch()
    out = policy_forward(model, ids, mask, P, 0.7, shared_prefix=shared)
    # half the scored positions' logits: the responses' call's (all but column 0 with a
    # shared prefix) and every copy of them exceed it
    with LargeAllocations(sum(LENGTHS) * VOCABULARY // 2) as seen:
        (out.logprobs * mask[:, P:]).sum().backward()
    # the gradient over the logits themselves (token_logprobs in place), a view of the head's
    # (1, N, V) output: the head's backward reads it from there
    assert seen.ops == []


def test_the_update_returns_freed_memory_before_every_micro_batch(tiny_lm, tmp_path, monkeypatch):
    """Issue 50: cached PPO's second, larger micro-batch grew the process on top of the first's
    freed activations (glibc keeps them: ``runtime.memory``)."""
    from proxrl.algos.online import ppo, update

    calls: list[int] = []
    monkeypatch.setattr(update, "return_freed_memory", lambda: calls.append(1) or True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in "abcd"))
    config = ppo.Config(
        model=tiny_lm,
        prompts=str(prompts),
        reward_fn=("tests.algos.online_rewards:target_fraction",),
        output_dir=str(tmp_path / "run"),
        iterations=1,
        rollout_batch_size=4,
        group_size=2,
        max_new_tokens=4,
        mini_batch_size=8,
        grad_accum=2,
        ppo_epochs=2,
        progress=False,
        seed=3,
    )
    ppo.train(config)
    assert len(calls) == 2 * 2  # 2 epochs of one step in 2 micro-batches
