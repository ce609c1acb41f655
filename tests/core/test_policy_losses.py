"""GSPO, GSPO-token and CISPO on hand-computed cases, values and gradients (float64)."""

import math

import torch
from helpers import close, t

from proxrl.core import cispo_loss, gspo_loss, gspo_token_loss, ppo_clip_loss

MASK = t([[1, 1], [1, 0]])


def _leaf(values):
    return t(values).requires_grad_(True)


def test_gspo_clips_whole_sequences_by_hand():
    """Log-ratios 0.1, 0.3 | −0.05: sequence ratios s₀ = e^0.2, s₁ = e^−0.05. With ε = 0.1 and
    A = +1 | −2: row 0 is clipped at 1.1 (loss −1.1, no gradient on either token), row 1 is not
    (loss 2·e^−0.05). seq-mean-token-mean: (−1.1 + 2e^−0.05)/2; the gradient on row 1's token
    is ½·2·s₁ = e^−0.05 (d s₁/d log π = s₁, the mean being over one token)."""
    old = t([[0.0, 0.0], [0.0, 0.0]])
    logprobs = _leaf([[0.1, 0.3], [-0.05, 7.0]])  # 7.0 sits in padding
    advantages = t([[1.0, 1.0], [-2.0, 0.0]])
    loss, stats = gspo_loss(logprobs, old, advantages, MASK, 0.1, 0.1, "seq-mean-token-mean")
    close(loss, (-1.1 + 2 * math.exp(-0.05)) / 2)
    loss.backward()
    close(logprobs.grad, [[0.0, 0.0], [math.exp(-0.05), 0.0]])
    close(stats["clipfrac"], 2 / 3)  # row 0's two tokens of three


def test_gspo_token_mean_weighs_tokens():
    """The same case under token-mean: tokens −1.1, −1.1 | 2e^−0.05, over 3 tokens."""
    old = t([[0.0, 0.0], [0.0, 0.0]])
    logprobs = _leaf([[0.1, 0.3], [-0.05, 0.0]])
    advantages = t([[1.0, 1.0], [-2.0, 0.0]])
    loss, _ = gspo_loss(logprobs, old, advantages, MASK, 0.1, 0.1, "token-mean")
    close(loss, (-2.2 + 2 * math.exp(-0.05)) / 3)


def test_gspo_token_equals_gspo_for_sequence_advantages():
    """One advantage per sequence, seq-mean-token-mean: same value and same gradient."""
    old = t([[0.2, -0.1], [0.3, 0.0]])
    advantages = t([[0.7, 0.7], [-1.3, 0.0]])
    results = []
    for fn in (gspo_loss, gspo_token_loss):
        logprobs = _leaf([[0.1, 0.3], [-0.05, 0.0]])
        loss, _ = fn(logprobs, old, advantages, MASK, 0.2, 0.2, "seq-mean-token-mean")
        loss.backward()
        results.append((loss.detach(), logprobs.grad))
    close(results[0][0], results[1][0])
    close(results[0][1], results[1][1])


def test_gspo_token_gives_each_token_its_own_gradient():
    """One sequence, log-ratios 0.1, 0.3 (s = e^0.2, inside ε = 0.3), token advantages +1, −1.
    GSPO-token: value ½(−s + s) = 0, gradient ½·(−A_t)·s per token = (−s/2, +s/2). GSPO:
    the sequence ratio's gradient is shared, ½·(−1 + 1)·s/2 = 0 on both tokens."""
    old, mask, advantages = t([[0.0, 0.0]]), t([[1, 1]]), t([[1.0, -1.0]])
    s = math.exp(0.2)
    logprobs = _leaf([[0.1, 0.3]])
    loss, _ = gspo_token_loss(logprobs, old, advantages, mask, 0.3, 0.3, "seq-mean-token-mean")
    loss.backward()
    close(loss, 0.0)
    close(logprobs.grad, [[-s / 2, s / 2]])
    logprobs = _leaf([[0.1, 0.3]])
    loss, _ = gspo_loss(logprobs, old, advantages, mask, 0.3, 0.3, "seq-mean-token-mean")
    loss.backward()
    close(logprobs.grad, [[0.0, 0.0]])


def test_cispo_keeps_the_gradient_of_clipped_tokens():
    """Log-ratios 0.5, 0, −0.5, A = 2, ε_hi = 0.2, no lower bound: weights min(e^0.5, 1.2) =
    1.2, 1, e^−0.5. Loss −(1/3)·Σ w·2·log π; gradient −(2/3)·w = (−0.8, −2/3, −(2/3)e^−0.5).
    PPO-Clip on the same tokens gives the first (clipped) token no gradient at all."""
    old, mask, advantages = t([[0.0, 0.0, 0.0]]), t([[1, 1, 1]]), t([[2.0, 2.0, 2.0]])
    logprobs = _leaf([[0.5, 0.0, -0.5]])
    loss, stats = cispo_loss(logprobs, old, advantages, mask, clip_high=0.2)
    close(loss, -(2 / 3) * (1.2 * 0.5 + 0.0 + math.exp(-0.5) * -0.5))
    loss.backward()
    close(logprobs.grad, [[-0.8, -2 / 3, -(2 / 3) * math.exp(-0.5)]])
    close(stats["clipfrac"], 1 / 3)
    ppo_logprobs = _leaf([[0.5, 0.0, -0.5]])
    ppo_loss, _ = ppo_clip_loss(ppo_logprobs, old, advantages, mask, 0.2, 0.2)
    ppo_loss.backward()
    assert ppo_logprobs.grad[0, 0] == 0.0


def test_cispo_lower_bound_when_asked():
    """With ε_lo = 0.2 the third weight becomes 0.8: gradient −(2/3)·0.8."""
    old, mask, advantages = t([[0.0, 0.0, 0.0]]), t([[1, 1, 1]]), t([[2.0, 2.0, 2.0]])
    logprobs = _leaf([[0.5, 0.0, -0.5]])
    loss, _ = cispo_loss(logprobs, old, advantages, mask, clip_high=0.2, clip_low=0.2)
    loss.backward()
    close(logprobs.grad, [[-0.8, -2 / 3, -(2 / 3) * 0.8]])


def test_policy_losses_ignore_padding():
    """NaN in padded positions changes neither the loss nor the valid gradients."""
    old = t([[0.0, float("nan")], [0.1, 0.2]])
    advantages = t([[1.0, float("nan")], [-1.0, -1.0]])
    mask = t([[1, 0], [1, 1]])
    for fn in (gspo_loss, gspo_token_loss, cispo_loss):
        logprobs = _leaf([[0.2, float("nan")], [0.0, 0.1]])
        loss, _ = fn(logprobs, old, advantages, mask)
        loss.backward()
        assert torch.isfinite(loss)
        assert torch.isfinite(logprobs.grad[mask.bool()]).all()
