import math

import torch

from proxrl.core import entropy_from_logits, entropy_from_logprobs, logprobs_from_logits
from tests.core.helpers import close, t


def test_logprobs_by_hand():
    """logits (0, ln 3) → softmax (1/4, 3/4). At temperature 2 the logits are (0, ln 3 / 2)
    → p(1) = √3 / (1 + √3)."""
    logits = t([[[0.0, math.log(3)], [0.0, math.log(3)]]])
    close(logprobs_from_logits(logits, torch.tensor([[1, 0]])), [[math.log(0.75), math.log(0.25)]])
    close(
        logprobs_from_logits(logits, torch.tensor([[1, 1]]), temperature=2.0),
        [[math.log(math.sqrt(3) / (1 + math.sqrt(3)))] * 2],
    )


def test_entropy_by_hand():
    """Uniform over 4 → ln 4; softmax (0, ln 3) = (1/4, 3/4) → −(¼ ln ¼ + ¾ ln ¾) = 0.5623…;
    a −inf logit contributes nothing."""
    close(entropy_from_logits(t([[[1.0, 1.0, 1.0, 1.0]]])), [[math.log(4)]])
    close(
        entropy_from_logits(t([[[0.0, math.log(3), -math.inf]]])),
        [[-(0.25 * math.log(0.25) + 0.75 * math.log(0.75))]],
    )


def test_entropy_from_logprobs_by_hand():
    """log-probs (ln ¼, ln ¾, −inf) → −(¼ ln ¼ + ¾ ln ¾) = 0.5623…, the −inf entry contributing
    0 (not NaN); two rows of a (2, V) step at once, the second uniform over 2 → ln 2."""
    log_p = t(
        [[math.log(0.25), math.log(0.75), -math.inf], [math.log(0.5), math.log(0.5), -math.inf]]
    )
    close(
        entropy_from_logprobs(log_p),
        [-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), math.log(2)],
    )


def test_matches_full_log_softmax_reference():
    logits = torch.randn(3, 5, 11, dtype=torch.float64)
    tokens = torch.randint(0, 11, (3, 5))
    full = torch.log_softmax(logits / 0.7, dim=-1)
    close(
        logprobs_from_logits(logits, tokens, temperature=0.7),
        full.gather(-1, tokens[..., None])[..., 0],
    )
    probs = torch.softmax(logits, -1)
    close(entropy_from_logits(logits), -(probs * torch.log_softmax(logits, -1)).sum(-1))


def test_half_precision_logits_give_float32_results():
    logits = torch.randn(2, 3, 7).to(torch.bfloat16)
    tokens = torch.randint(0, 7, (2, 3))
    out = logprobs_from_logits(logits, tokens)
    assert out.dtype == torch.float32
    reference = torch.log_softmax(logits.float(), -1).gather(-1, tokens[..., None])[..., 0]
    torch.testing.assert_close(out, reference, rtol=1e-6, atol=1e-6)


def test_gradient_flows_to_logits():
    logits = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, 5, (2, 3))
    logprobs_from_logits(logits, tokens).sum().backward()
    reference = logits.detach().clone().requires_grad_(True)
    torch.log_softmax(reference, -1).gather(-1, tokens[..., None]).sum().backward()
    close(logits.grad, reference.grad)
