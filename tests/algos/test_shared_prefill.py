"""The built-in sampler prefills each distinct prompt once and expands its KV cache to the
group's rows (issue 50): the same samples as prefilling every row, on one prefill row per
prompt."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from proxrl.algos.online import grpo
from proxrl.algos.online.roles import role_settings
from proxrl.algos.online.samplers import ENGINES
from proxrl.data.batching import pad_left
from proxrl.models.causal_lm import load_causal_lm
from proxrl.models.tokenizer import load_tokenizer
from proxrl.rollout.generation import CachedSampler, SamplingSettings, distinct_rows
from tests.algos.test_stopped_rows import RisingStop

WORDS = ["abc", "de fg", "x", "hij kl mn op", "qrs"]  # ragged: left padding of 0 to 6 tokens
G = 3
STOP = 7  # a token of the vocabulary that is not special: rows stop at many steps
SETTINGS = [
    SamplingSettings(30, temperature=0.7, top_k=20),
    SamplingSettings(40, temperature=0.8, top_p=0.9, min_p=0.02),
    SamplingSettings(30, greedy=True),
]


@pytest.fixture(scope="module")
def model_and_prompts(tiny_lm):
    tokenizer = load_tokenizer(tiny_lm)
    model = load_causal_lm(tiny_lm).double().eval()
    ids = [tokenizer(f"say: {w} ->")["input_ids"] for w in WORDS]
    return model, tokenizer, ids


def batch(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    return pad_left(rows, pad), pad_left([[1] * len(r) for r in rows], 0)


def run(model, tokenizer, prompt_ids, mask, settings, shared):
    """Samples with ``shared_prefill=shared`` at seed 1, and the batch size of every forward."""
    ids_of = SimpleNamespace(eos_token_id=STOP, pad_token_id=tokenizer.pad_token_id)
    sizes: list[tuple[int, int]] = []
    rising = RisingStop(STOP)
    hooks = [
        model.get_input_embeddings().register_forward_hook(
            lambda module, args, output: sizes.append(tuple(args[0].shape))
        ),
        model.get_output_embeddings().register_forward_hook(rising),
    ]
    try:
        torch.manual_seed(1)
        sampler = CachedSampler(model, ids_of, shared_prefill=shared)
        samples = sampler.sample(prompt_ids, mask, settings, with_logprobs=True)
    finally:
        for hook in hooks:
            hook.remove()
    return samples, sizes


def assert_same(a, b) -> None:
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.response_mask, b.response_mask)
    assert bool(torch.isfinite(a.logprobs).all() and torch.isfinite(b.logprobs).all())
    torch.testing.assert_close(a.logprobs, b.logprobs, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(a.entropy, b.entropy, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("order", ["grouped", "shuffled"])
@pytest.mark.parametrize("settings", SETTINGS, ids=["top_k", "top_p", "greedy"])
def test_shared_prefill_gives_the_samples_of_the_repeated_one(model_and_prompts, settings, order):
    """G = 3 copies of 5 ragged prompts (15 rows), as collect lays them out or shuffled: the
    same tokens, masks and log-probs, with the prompt prefilled once per distinct prompt."""
    model, tokenizer, ids = model_and_prompts
    rows = [r for r in ids for _ in range(G)]
    if order == "shuffled":  # groups neither consecutive nor in the sorted order of their ids
        rows = [
            rows[i] for i in torch.randperm(len(rows), generator=torch.Generator().manual_seed(3))
        ]
    prompt_ids, mask = batch(rows, tokenizer.pad_token_id)
    (repeated, repeated_sizes), (shared, shared_sizes) = (
        run(model, tokenizer, prompt_ids, mask, settings, flag) for flag in (False, True)
    )
    assert_same(shared, repeated)
    lengths = repeated.response_mask.sum(-1)
    assert lengths.unique().numel() >= 3  # rows stop at different steps: drop_stopped drops
    # the group's members differ (sampled) and the prefill ran once per distinct prompt
    if not settings.greedy:
        assert len({tuple(r) for r in repeated.response_ids.tolist()}) > len(WORDS)
    assert repeated_sizes[0] == (len(rows), prompt_ids.shape[1])
    assert shared_sizes[0] == (len(WORDS), prompt_ids.shape[1])
    # the decoding steps after it are the same: a row per running response, stopped rows dropped
    assert shared_sizes[1:] == repeated_sizes[1:]
    assert shared_sizes[-1][0] < len(rows)


def test_distinct_rows_are_prefilled_as_before(model_and_prompts):
    """A batch whose rows all differ (an odd 5) shares nothing: every row is prefilled."""
    model, tokenizer, ids = model_and_prompts
    prompt_ids, mask = batch(ids, tokenizer.pad_token_id)
    assert distinct_rows(prompt_ids, mask) is None
    (repeated, repeated_sizes), (shared, shared_sizes) = (
        run(model, tokenizer, prompt_ids, mask, SETTINGS[0], flag) for flag in (False, True)
    )
    assert_same(shared, repeated)
    assert shared_sizes == repeated_sizes and shared_sizes[0][0] == len(WORDS)


def test_same_ids_with_another_mask_are_another_prompt(model_and_prompts):
    """Rows are one prompt only when their ids and masks both agree: a row whose padding the
    mask counts as tokens is prefilled on its own."""
    model, tokenizer, ids = model_and_prompts
    prompt_ids, mask = batch([ids[0], ids[3], ids[0], ids[3], ids[0]], tokenizer.pad_token_id)
    mask[4] = 1  # row 4: ids[0] with its left padding attended
    first, inverse = distinct_rows(prompt_ids, mask)
    assert first.tolist() == [0, 1, 4] and inverse.tolist() == [0, 1, 0, 1, 2]
    (repeated, _), (shared, sizes) = (
        run(model, tokenizer, prompt_ids, mask, SETTINGS[1], flag) for flag in (False, True)
    )
    assert_same(shared, repeated)
    assert sizes[0][0] == 3


def test_the_config_option_reaches_the_cached_sampler(model_and_prompts):
    model, tokenizer, _ = model_and_prompts
    for flag in (False, True):
        settings = role_settings(grpo.Config(model="m", prompts="p", shared_prefix=flag)).engine
        assert ENGINES["cached"](settings, tokenizer, None).sampler(model).shared_prefill is flag
