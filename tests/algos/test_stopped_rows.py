"""The built-in sampler drops stopped rows from its decoding batch: the same tokens and
log-probs as the loop that decodes every row to the end, on fewer rows per step."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from proxrl.data.batching import pad_left
from proxrl.models.causal_lm import load_causal_lm
from proxrl.models.tokenizer import load_tokenizer
from proxrl.rollout.generation import CachedSampler, SamplingSettings


@pytest.fixture(scope="module")
def model_and_prompts(tiny_lm):
    tokenizer = load_tokenizer(tiny_lm)
    model = load_causal_lm(tiny_lm).double().eval()
    words = ["abc", "de fg", "x", "hij kl mn", "op", "qrs tu", "v w", "yz"]
    ids = [tokenizer(f"say: {w} ->")["input_ids"] for w in words] * 2
    prompt_ids = pad_left(ids, tokenizer.pad_token_id)
    return model, tokenizer, prompt_ids, pad_left([[1] * len(r) for r in ids], 0)


class RisingStop:
    """Adds 0.01 × (forward calls so far) to the stop token's logit: rows of one batch stop at
    many different steps, sampled or greedy, and both runs see the same logits."""

    def __init__(self, stop: int) -> None:
        self.stop, self.calls = stop, 0

    def __call__(self, module, args, output):  # type: ignore[no-untyped-def]
        output = output.clone()
        output[..., self.stop] += 0.01 * self.calls
        self.calls += 1
        return output


@pytest.mark.parametrize(
    "settings",
    [SamplingSettings(40, temperature=0.7, top_k=20), SamplingSettings(40, greedy=True)],
    ids=["sampled", "greedy"],
)
def test_dropping_stopped_rows_gives_the_tokens_of_the_full_loop(model_and_prompts, settings):
    model, tokenizer, prompt_ids, mask = model_and_prompts
    stop = 7  # a token of the vocabulary that is not special
    ids_of = SimpleNamespace(eos_token_id=stop, pad_token_id=tokenizer.pad_token_id)
    batch_sizes: list[int] = []
    rising = RisingStop(stop)
    hooks = [
        model.get_input_embeddings().register_forward_hook(
            lambda module, args, output: batch_sizes.append(args[0].shape[0])
        ),
        model.get_output_embeddings().register_forward_hook(rising),
    ]
    try:
        runs = {}
        for drop in (False, True):
            batch_sizes.clear()
            rising.calls = 0
            torch.manual_seed(1)
            runs[drop] = (
                CachedSampler(model, ids_of, drop_stopped=drop, shared_prefill=False).sample(
                    prompt_ids, mask, settings, with_logprobs=True
                ),
                list(batch_sizes),
            )
    finally:
        for hook in hooks:
            hook.remove()
    (full, full_batches), (dropped, dropped_batches) = runs[False], runs[True]
    lengths = full.response_mask.sum(-1)
    assert lengths.unique().numel() >= 3 and int(lengths.min()) < full.response_ids.shape[1] // 2
    assert torch.equal(dropped.response_ids, full.response_ids)
    assert torch.equal(dropped.response_mask, full.response_mask)
    # finite everywhere: 0 after the stop (the pad token outside top-k has log-prob −inf)
    assert bool(torch.isfinite(full.logprobs).all() and torch.isfinite(dropped.logprobs).all())
    torch.testing.assert_close(dropped.logprobs, full.logprobs, rtol=0, atol=1e-12)
    torch.testing.assert_close(dropped.entropy, full.entropy, rtol=0, atol=1e-12)
    # the full loop decodes every row at every step; the other leaves stopped rows behind
    assert set(full_batches) == {len(prompt_ids)} and len(dropped_batches) == len(full_batches)
    assert sum(dropped_batches) < 0.8 * sum(full_batches)
    assert dropped_batches == sorted(dropped_batches, reverse=True)
