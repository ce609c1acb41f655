import math

import pytest
import torch

from proxrl.core import (
    entropy_from_logits,
    logprobs_from_logits,
    processed_entropy,
    processed_logprobs,
    truncate_logits,
    truncates,
)
from tests.core.helpers import close, t

# logits l = (2, 1.5, 1.2, 0.9, 0.5, 0.3, −0.2, −1) at temperature 0.7, s = l / 0.7.
# softmax(s) = (.4389, .2148, .1400, .0912, .0515, .0387, .0189, .0060): mass before each token
# (0, .4389, .6537, .7937, .8848, .9363, .9750, .9940).
# Over the top 5: (.4687, .2295, .1495, .0974, .0550), mass before (0, .4687, .6982, .8476, .9450).
# p_i / p_max = exp(s_i − s_0) = (1, .4895, .3189, .2077, .1173, .0882, .0432, .0138).
LOGITS = [2.0, 1.5, 1.2, 0.9, 0.5, 0.3, -0.2, -1.0]
T = 0.7
KEPT = [
    # (top_k, top_p, min_p) → kept token ids
    ((5, 1.0, 0.0), [0, 1, 2, 3, 4]),
    ((0, 0.9, 0.0), [0, 1, 2, 3, 4]),  # .8848 before token 4 < .9 ≤ .9363 before token 5
    ((5, 0.9, 0.0), [0, 1, 2, 3]),  # over the top 5, .9450 before token 4 ≥ .9
    ((0, 1.0, 0.1), [0, 1, 2, 3, 4]),  # .1173 ≥ .1 > .0882
    ((0, 1.0, 0.05), [0, 1, 2, 3, 4, 5]),
    ((5, 0.9, 0.25), [0, 1, 2]),  # min-p then drops token 3 (.2077 < .25)
    # transformers' order, top-p before min-p: top-p .8 keeps (0..3), min-p .3 drops 3. The other
    # order (vLLM's) would keep (0, 1): min-p first leaves (0, 1, 2), whose softmax (.553, .271,
    # .176) has .824 ≥ .8 before token 2.
    ((0, 0.8, 0.3), [0, 1, 2]),
]


def hand_logprob(token: int, kept: list[int]) -> float:
    s = [v / T for v in LOGITS]
    support = set(kept) | {token}
    return s[token] - math.log(sum(math.exp(s[i]) for i in support))


@pytest.mark.parametrize(("settings", "kept"), KEPT)
def test_truncate_logits_keeps_the_hand_computed_set(settings, kept):
    top_k, top_p, min_p = settings
    out = truncate_logits(t(LOGITS) / T, top_k, top_p, min_p)
    assert torch.isfinite(out).nonzero().flatten().tolist() == kept
    close(out[kept], t([LOGITS[i] / T for i in kept]))


@pytest.mark.parametrize(("settings", "kept"), KEPT)
def test_processed_logprobs_by_hand(settings, kept):
    """Every token of the vocabulary scored: a kept token's log-prob is renormalised over the
    kept set; a token outside it (which no sampler draws) over the kept set plus itself."""
    top_k, top_p, min_p = settings
    logits = t(LOGITS).expand(1, 8, 8)  # one sequence, the same logits at 8 positions
    tokens = torch.arange(8).unsqueeze(0)
    out = processed_logprobs(logits, tokens, T, top_k, top_p, min_p)
    close(out, t([[hand_logprob(i, kept) for i in range(8)]]))


def test_processed_entropy_by_hand():
    """Top-k 5, top-p .9: π̃ over tokens 0..3 ∝ exp(s_i); entropy −Σ π̃ log π̃."""
    s = [v / T for v in LOGITS[:4]]
    z = sum(math.exp(v) for v in s)
    expected = -sum(math.exp(v) / z * (v - math.log(z)) for v in s)
    out = processed_entropy(t(LOGITS).expand(2, 3, 8), T, top_k=5, top_p=0.9)
    close(out, t([[expected] * 3] * 2))


def test_no_truncation_is_bit_identical_to_temperature_only():
    """top_k 0, top_p 1, min_p 0 run logprobs_from_logits / entropy_from_logits themselves."""
    assert not truncates(0, 1.0, 0.0) and truncates(1, 1.0, 0.0) and truncates(0, 1.0, 0.01)
    logits = torch.randn(3, 5, 11)
    tokens = torch.randint(0, 11, (3, 5))
    assert torch.equal(
        processed_logprobs(logits, tokens, 0.7), logprobs_from_logits(logits, tokens, 0.7)
    )
    assert torch.equal(processed_entropy(logits, 0.7), entropy_from_logits(logits, 0.7))


def test_processed_logprobs_rows_and_gradient():
    """Rows are independent (each its own kept set per position), half precision comes back in
    float32, and the gradient reaches only the kept logits plus the scored token's."""
    logits = torch.randn(2, 4, 9, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, 9, (2, 4))
    out = processed_logprobs(logits, tokens, 0.7, top_k=3)
    for b in range(2):
        for i in range(4):
            s = logits[b, i].detach() / 0.7
            kept = set(torch.topk(s, 3).indices.tolist()) | {int(tokens[b, i])}
            z = torch.logsumexp(s[sorted(kept)], 0)
            close(out[b, i], s[tokens[b, i]] - z)
    out.sum().backward()
    top3 = torch.zeros(2, 4, 9, dtype=torch.bool).scatter(-1, torch.topk(logits, 3).indices, True)
    scored = torch.zeros_like(top3).scatter(-1, tokens.unsqueeze(-1), True)
    assert not logits.grad[~(top3 | scored)].any()
    half = processed_logprobs(logits.detach().to(torch.bfloat16), tokens, 0.7, top_p=0.9)
    assert half.dtype == torch.float32
