"""GSPO, GSPO-token, CISPO and SAPO on hand-computed cases, values and gradients (float64), and
every entry of POLICY_LOSSES on one case."""

import math

import pytest
import torch

from proxrl.core import (
    AGGREGATIONS,
    POLICY_LOSSES,
    TOKEN_SELECTIONS,
    PolicyLossSettings,
    aggregation,
    binary_kl,
    cispo_loss,
    clip_cov_draw,
    clip_cov_loss,
    dppo_kl_loss,
    dppo_tv_loss,
    gspo_loss,
    gspo_token_loss,
    kl_cov_loss,
    kl_cov_select,
    ppo_clip_loss,
    sapo_loss,
    token_covariance,
    unclipped_loss,
)
from tests.core.helpers import close, t

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
    for fn in (gspo_loss, gspo_token_loss, cispo_loss, sapo_loss):
        logprobs = _leaf([[0.2, float("nan")], [0.0, 0.1]])
        loss, _ = fn(logprobs, old, advantages, mask)
        loss.backward()
        assert torch.isfinite(loss)
        assert torch.isfinite(logprobs.grad[mask.bool()]).all()


def _sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_sapo_soft_gate_by_hand():
    """τ_pos = 2, τ_neg = 0.5 (apart, so a swapped τ shows). Row 0: log-ratios ln 1.5, 0 (r =
    1.5, 1), A = +2 → τ = 2: f(r) = σ(τ(r − 1))·4/τ = 2σ(1), 2σ(0) = 1; token losses −f·A =
    −4σ(1), −2; row mean −2σ(1) − 1. Row 1: r = 0.5, A = −1 → τ = 0.5: f = 8σ(−0.25), loss
    8σ(−0.25). seq-mean-token-mean: (−2σ(1) − 1 + 8σ(−0.25))/2.
    Gradient in log π: −A·f′(r)·r with f′(r) = 4σ(1 − σ), times the aggregation's weight (¼ on
    row 0's tokens, ½ on row 1's): −2·4σ(1)(1 − σ(1))·1.5/4 = −3σ(1)(1 − σ(1)); −2·4·¼·1/4 =
    −0.5; +4·s(1 − s)·0.5/2 = s(1 − s) with s = σ(−0.25); padding (A = 0) 0."""
    old = t([[0.0, 0.0], [0.0, 0.0]])
    logprobs = _leaf([[math.log(1.5), 0.0], [math.log(0.5), 7.0]])  # 7.0 sits in padding
    advantages = t([[2.0, 2.0], [-1.0, 0.0]])
    loss, stats = sapo_loss(logprobs, old, advantages, MASK, 2.0, 0.5, "seq-mean-token-mean")
    s1, s = _sigmoid(1.0), _sigmoid(-0.25)
    close(loss, (-2 * s1 - 1 + 8 * s) / 2)
    loss.backward()
    close(logprobs.grad, [[-3 * s1 * (1 - s1), -0.5], [s * (1 - s), 0.0]])
    close(stats["ratio_mean"], (1.5 + 1 + 0.5) / 3)


def test_sapo_on_policy_gradient_is_ppos():
    """At r = 1 the gate's slope is 4σ(0)(1 − σ(0)) = 1 for every τ: SAPO's gradient is PPO's,
    −A per token (here ÷ 3 tokens, token-mean), while its value is −(2/τ)·A."""
    old, mask, advantages = t([[0.3, -0.2, 0.1]]), t([[1, 1, 1]]), t([[1.5, -2.0, 0.5]])
    sapo_logprobs, ppo_logprobs = _leaf([[0.3, -0.2, 0.1]]), _leaf([[0.3, -0.2, 0.1]])
    loss, _ = sapo_loss(sapo_logprobs, old, advantages, mask, 1.0, 1.05, "token-mean")
    close(loss, -(2 / 1.0 * 1.5 + 2 / 1.05 * -2.0 + 2 / 1.0 * 0.5) / 3)
    loss.backward()
    ppo_clip_loss(ppo_logprobs, old, advantages, mask)[0].backward()
    close(sapo_logprobs.grad, ppo_logprobs.grad)
    close(sapo_logprobs.grad, -advantages / 3)


def test_sapo_defaults_are_verl_and_trl():
    """τ_pos 1.0, τ_neg 1.05 (veRL's tau_pos / tau_neg, TRL's sapo_temperature_pos / _neg)."""
    settings = PolicyLossSettings()
    assert (settings.sapo_tau_pos, settings.sapo_tau_neg) == (1.0, 1.05)


def test_sapo_a_huge_ratio_stays_finite():
    """log r = 1000 overflows exp to inf (float64 too): clamped at 20 (as veRL), the gate's
    gradient is ≈ 0, not ∞·0 = NaN."""
    logprobs = _leaf([[1000.0, 0.0]])
    loss, _ = sapo_loss(logprobs, t([[0.0, 0.0]]), t([[1.0, -1.0]]), t([[1, 1]]))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logprobs.grad).all()


# Every entry of POLICY_LOSSES on one row: log-ratios ln 1.5, ln 0.5 (old log-probs 0, so log π
# = log r), A = (1, 1), default settings (ε = 0.2, τ_pos = 1), token-mean over 2 tokens.
POLICY_LOSS_CASES = {
    # max(−A·r, −A·clip(r, 0.8, 1.2)): max(−1.5, −1.2) = −1.2, max(−0.5, −0.8) = −0.5
    "ppo": (-1.2 - 0.5) / 2,
    # sequence ratio s = exp((ln 1.5 + ln 0.5)/2) = √0.75 inside [0.8, 1.2]: −s per token
    "gspo": -math.sqrt(0.75),
    "gspo_token": -math.sqrt(0.75),
    # weights min(r, 1.2) = 1.2, 0.5 (stop-gradient) × A × log π
    "cispo": -(1.2 * math.log(1.5) + 0.5 * math.log(0.5)) / 2,
    # −4σ(r − 1) per token: −4σ(0.5), −4σ(−0.5), mean −2(σ(0.5) + σ(−0.5)) = −2
    "sapo": -2.0,
    # DPPO: μ(a) = 1 for both tokens (old log-probs 0) and A > 0. TV: π − μ = 0.5 > 0.2 drops
    # token 1; token 2 fell, kept: −0.5. KL: token 1 rose by D = −ln 1.5 < 0.2 (not a real
    # probability, but the rule's arithmetic), kept: −1.5; token 2 kept: −0.5.
    "dppo_tv": (0.0 - 0.5) / 2,
    "dppo_kl": (-1.5 - 0.5) / 2,
    # no clip: −r·A per token
    "unclipped": (-1.5 - 0.5) / 2,
    # A constant: every covariance 0. Clip-Cov: none inside (1, 5), PPO-Clip's value; KL-Cov:
    # one token (max(1, ⌊2·2e-4⌋)), the tie to the first: −r·A everywhere + |ln 1.5| there
    "clip_cov": (-1.2 - 0.5) / 2,
    "kl_cov": (-1.5 + math.log(1.5) - 0.5) / 2,
}


def test_every_policy_loss_has_a_case():
    assert set(POLICY_LOSS_CASES) == set(POLICY_LOSSES)


@pytest.mark.parametrize("name", sorted(POLICY_LOSS_CASES))
def test_policy_losses_by_name_by_hand(name):
    logprobs = _leaf([[math.log(1.5), math.log(0.5)]])
    old, advantages, mask = t([[0.0, 0.0]]), t([[1.0, 1.0]]), t([[1, 1]])
    settings, agg = PolicyLossSettings(), aggregation("token-mean")
    selection = None  # the calling convention: a loss with a selection gets it chosen first
    if name in TOKEN_SELECTIONS:
        generator = torch.Generator().manual_seed(0)
        selection = TOKEN_SELECTIONS[name](logprobs, old, advantages, mask, settings, generator)
    loss, stats = POLICY_LOSSES[name](logprobs, old, advantages, mask, settings, agg, selection)
    close(loss, POLICY_LOSS_CASES[name])
    close(stats["policy_loss"], POLICY_LOSS_CASES[name])


@pytest.mark.parametrize("agg", sorted(AGGREGATIONS))
def test_at_a_ratio_of_1_every_policy_loss_but_clip_cov_is_ppos_gradient(agg):
    """One optimizer step per rollout: π = π_old, every ratio 1, and with one advantage per
    response (a group estimator's) each loss's gradient is PPO's −A·∇log π / n (README: "One
    optimizer step per rollout makes most of these losses one"). clip_cov alone may differ: it
    drops the tokens it draws whatever the ratio."""
    old = t([[-0.5, -2.0, -1.0], [-0.3, -1.5, 9.0], [-2.5, 9.0, 9.0]])
    mask, advantages = t([[1, 1, 1], [1, 1, 0], [1, 0, 0]]), t([[1.5], [-0.5], [2.0]]).expand(3, 3)
    settings, aggregate = PolicyLossSettings(), aggregation(agg, 3)
    grads = {}
    for name in set(POLICY_LOSSES) - {"clip_cov"}:
        logprobs = _leaf(old.tolist())
        selection = None
        if name in TOKEN_SELECTIONS:
            generator = torch.Generator().manual_seed(0)
            selection = TOKEN_SELECTIONS[name](logprobs, old, advantages, mask, settings, generator)
        loss, _ = POLICY_LOSSES[name](
            logprobs, old, advantages, mask, settings, aggregate, selection
        )
        loss.backward()
        grads[name] = logprobs.grad
    for name, grad in grads.items():
        torch.testing.assert_close(grad, grads["ppo"], rtol=1e-12, atol=1e-15, msg=name)


# DPPO on ragged rows (3 tokens | 1 token): μ = (0.5, 0.5, 0.2) | 0.5, π = (0.8, 0.6, 0.1) | 0.2,
# A = +1 | −2, token-mean over the 4 valid tokens; a 7.0 in padding.
DPPO_MASK = t([[1, 1, 1], [1, 0, 0]])
DPPO_OLD = t([[0.5, 0.5, 0.2], [0.5, 1.0, 1.0]]).log()
DPPO_NEW = [[math.log(0.8), math.log(0.6), math.log(0.1)], [math.log(0.2), 7.0, 7.0]]
DPPO_ADVANTAGES = t([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])


def test_dppo_tv_masks_by_the_probability_change_by_hand():
    """δ 0.2 | 0.2. Token (0, 0): A > 0 and π − μ = 0.3 > 0.2: dropped. (0, 1): +0.1, kept with
    −r·A = −1.2. (0, 2): A > 0 but π fell (−0.1): kept, −0.5. (1, 0): A < 0 and μ − π = 0.3 >
    0.2: dropped. Loss (−1.2 − 0.5)/4; gradient −r·A/4 at the kept tokens, 0 elsewhere."""
    logprobs = _leaf(DPPO_NEW)
    loss, stats = dppo_tv_loss(logprobs, DPPO_OLD, DPPO_ADVANTAGES, DPPO_MASK, 0.2, 0.2)
    close(loss, (-1.2 - 0.5) / 4)
    loss.backward()
    close(logprobs.grad, [[0.0, -1.2 / 4, -0.5 / 4], [0.0, 0.0, 0.0]])
    close(stats["clipfrac"], 2 / 4)
    # a wider δ_low keeps (1, 0): −r·A = −0.4·(−2) = 0.8
    loss, _ = dppo_tv_loss(_leaf(DPPO_NEW), DPPO_OLD, DPPO_ADVANTAGES, DPPO_MASK, 0.31, 0.2)
    close(loss, (-1.2 - 0.5 + 0.8) / 4)


def _bernoulli_kl(mu, pi):
    return mu * math.log(mu / pi) + (1 - mu) * math.log((1 - mu) / (1 - pi))


def test_binary_kl_by_hand():
    pairs = ((0.5, 0.8), (0.5, 0.6), (0.2, 0.1))
    close(binary_kl(DPPO_OLD, t(DPPO_NEW))[0], [_bernoulli_kl(m, p) for m, p in pairs])
    # μ = 1: the (1 − μ) term is 0 (not 0 · −inf); π = μ: 0
    close(binary_kl(t([0.0, math.log(0.3)]), t([math.log(0.5), math.log(0.3)])), [math.log(2), 0])


def test_dppo_kl_masks_by_the_binary_kl_by_hand():
    """D(0.5‖0.8) = 0.2231 and D(0.5‖0.2) = 0.2231, D(0.5‖0.6) = 0.0204. δ_low 0.2, δ_high 0.25:
    (0, 0) rose with D < 0.25: kept, −1.6; (0, 1) kept, −1.2; (0, 2) fell with A > 0: kept
    whatever D, −0.5; (1, 0) fell with A < 0 and D > 0.2: dropped."""
    assert _bernoulli_kl(0.5, 0.8) > 0.2 and _bernoulli_kl(0.5, 0.2) > 0.2
    assert _bernoulli_kl(0.5, 0.8) < 0.25
    logprobs = _leaf(DPPO_NEW)
    loss, stats = dppo_kl_loss(logprobs, DPPO_OLD, DPPO_ADVANTAGES, DPPO_MASK, 0.2, 0.25)
    close(loss, (-1.6 - 1.2 - 0.5) / 4)
    loss.backward()
    close(logprobs.grad, [[-1.6 / 4, -1.2 / 4, -0.5 / 4], [0.0, 0.0, 0.0]])
    close(stats["clipfrac"], 1 / 4)
    # δ_high 0.2 drops (0, 0) as well
    loss, _ = dppo_kl_loss(_leaf(DPPO_NEW), DPPO_OLD, DPPO_ADVANTAGES, DPPO_MASK, 0.2, 0.2)
    close(loss, (-1.2 - 0.5) / 4)


@pytest.mark.parametrize("loss_fn", [dppo_tv_loss, dppo_kl_loss])
def test_dppo_caps_the_ratio_that_weighs_the_gradient_by_hand(loss_fn):
    """μ = (0.02, 0.4), π = (0.3, 0.2), A = +1: r = 15 and 0.5. δ 0.3 | 0.3 keep both (TV: π − μ
    = 0.28 < 0.3, and the second fell with A > 0; KL: D(0.02‖0.3) ≈ 0.22 < 0.3). Cap 10: the
    first token's −r·A is −min(15, 10) = −10 and its gradient −10/2; the second's −0.5, −0.5/2
    (below the cap, untouched). veRL's 20 and no cap leave −15 (issue 51: no cap applied)."""
    assert _bernoulli_kl(0.02, 0.3) < 0.3
    old = t([[0.02, 0.4]]).log()
    new = [[math.log(0.3), math.log(0.2)]]
    advantages, mask = t([[1.0, 1.0]]), t([[1, 1]])
    for cap, first in ((10.0, 10.0), (20.0, 15.0), (None, 15.0)):
        logprobs = _leaf(new)
        loss, _ = loss_fn(logprobs, old, advantages, mask, 0.3, 0.3, "token-mean", cap)
        close(loss, (-first - 0.5) / 2)
        loss.backward()
        close(logprobs.grad, [[-first / 2, -0.5 / 2]])
    logprobs = _leaf(new)  # the default is the DPPO authors' 10
    close(loss_fn(logprobs, old, advantages, mask, 0.3, 0.3)[0], (-10.0 - 0.5) / 2)
    assert PolicyLossSettings().dppo_ratio_cap == 10.0


@pytest.mark.parametrize("loss_fn", [dppo_tv_loss, dppo_kl_loss])
def test_dppo_on_policy_is_the_policy_gradient(loss_fn):
    """π = μ: nothing masked, the gradient −A/n per token (a length-1 row included)."""
    logprobs = _leaf([[math.log(0.3), math.log(0.9)], [math.log(0.5), 0.0]])
    advantages = t([[2.0, 2.0], [-1.0, -1.0]])
    loss, stats = loss_fn(logprobs, logprobs.detach().clone(), advantages, MASK)
    loss.backward()
    close(logprobs.grad, [[-2 / 3, -2 / 3], [1 / 3, 0.0]])
    close(stats["clipfrac"], 0.0)


# Clip-Cov / KL-Cov on ragged rows (3 tokens | 1): A = +1 | −3 (mean over the 4 valid tokens 0),
# log π = (−0.5, −2, −3.5) | −4 (mean −2.5): centred (2, 0.5, −1) | −1.5, so the covariances
# (A − 0)·(log π + 2.5) are (2, 0.5, −1) | 4.5; 9.0 in padding.
COV_MASK = t([[1, 1, 1], [1, 0, 0]])
COV_LOGPROBS = [[-0.5, -2.0, -3.5], [-4.0, 9.0, 9.0]]
COV_ADVANTAGES = t([[1.0, 1.0, 1.0], [-3.0, -3.0, -3.0]])


def test_token_covariance_by_hand():
    covariance = token_covariance(t(COV_LOGPROBS), COV_ADVANTAGES, COV_MASK)
    close(covariance, [[2.0, 0.5, -1.0], [4.5, 0.0, 0.0]])
    # A = +2 | −2 (mean 1): centred to the same +1 | −3, the same covariances
    shifted = token_covariance(t(COV_LOGPROBS), COV_ADVANTAGES + 1, COV_MASK)
    close(shifted, [[2.0, 0.5, -1.0], [4.5, 0.0, 0.0]])


def test_clip_cov_drops_the_drawn_high_covariance_tokens_by_hand():
    """On-policy (r = 1, −A per token). Inside (1, 5): tokens (0, 0) and (1, 0). ratio 0.5: ⌊2⌋
    of them, both: loss (−1 − 1)/4, no gradient at either."""
    logprobs = _leaf(COV_LOGPROBS)
    old = logprobs.detach().clone()
    drawn = clip_cov_draw(logprobs, old, COV_ADVANTAGES, COV_MASK, ratio=0.5)
    close(drawn, [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    loss, stats = clip_cov_loss(logprobs, old, COV_ADVANTAGES, COV_MASK, drawn)
    close(loss, -2 / 4)
    loss.backward()
    close(logprobs.grad, [[0.0, -0.25, -0.25], [0.0, 0.0, 0.0]])
    close(stats["cov_dropped"], 2 / 4)


def test_clip_cov_draws_one_from_the_generator():
    """ratio 2e-4: one token of the two, the first of randperm(2) on the generator; the same
    seed draws the same (a resumed run's generator)."""
    old = t(COV_LOGPROBS)
    losses = []
    for seed in (0, 1, 2, 3, 0):
        generator = torch.Generator().manual_seed(seed)
        first = int(torch.randperm(2, generator=torch.Generator().manual_seed(seed))[0])
        drawn = clip_cov_draw(old, old, COV_ADVANTAGES, COV_MASK, generator=generator)
        loss, stats = clip_cov_loss(_leaf(COV_LOGPROBS), old, COV_ADVANTAGES, COV_MASK, drawn)
        # dropping (0, 0): (−1 − 1 + 3)/4; dropping (1, 0): (−1 − 1 − 1)/4
        close(loss, [0.25, -0.75][first])
        close(stats["cov_dropped"], 1 / 4)
        losses.append(float(loss.detach()))
    assert losses[0] == losses[-1] and len(set(losses)) == 2


def test_clip_cov_never_draws_a_ratio_clipped_token():
    """(1, 0) at log r = −0.5 with A < 0 is clipped (loss 3·0.8): only (0, 0) may be drawn."""
    logprobs = _leaf(COV_LOGPROBS)
    old = logprobs.detach() + t([[0.0, 0.0, 0.0], [0.5, 0.0, 0.0]])
    drawn = clip_cov_draw(logprobs, old, COV_ADVANTAGES, COV_MASK, ratio=0.5)
    loss, stats = clip_cov_loss(logprobs, old, COV_ADVANTAGES, COV_MASK, drawn)
    close(loss, (0.0 - 1 - 1 + 3 * 0.8) / 4)
    close(stats["cov_dropped"], 1 / 4)
    close(stats["clipfrac"], 1 / 4)


def test_kl_cov_penalises_the_largest_covariances_by_hand():
    """log r = (0.1, 0.2, 0.3) | 0.4, coef 2, ratio 0.5: the ⌊2⌋ largest covariances, (1, 0)
    (4.5) and (0, 0) (2), pay 2·|log r|. Per token −r·A (+ penalty); gradient −r·A + 2·sign."""
    logprobs = _leaf(COV_LOGPROBS)
    log_ratio = t([[0.1, 0.2, 0.3], [0.4, 0.0, 0.0]])
    old = logprobs.detach() - log_ratio
    selected = kl_cov_select(logprobs, COV_ADVANTAGES, COV_MASK, ratio=0.5)
    close(selected, [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    loss, stats = kl_cov_loss(logprobs, old, COV_ADVANTAGES, COV_MASK, selected, coef=2.0)
    e = math.exp
    close(loss, (-e(0.1) + 0.2 - e(0.2) - e(0.3) + 3 * e(0.4) + 0.8) / 4)
    loss.backward()
    close(
        logprobs.grad, [[(-e(0.1) + 2) / 4, -e(0.2) / 4, -e(0.3) / 4], [(3 * e(0.4) + 2) / 4, 0, 0]]
    )
    close(stats["kl_cov_selected"], 2 / 4)
    # the default ratio: one token, the largest covariance (1, 0)
    selected = kl_cov_select(t(COV_LOGPROBS), COV_ADVANTAGES, COV_MASK)
    close(selected, [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    loss, _ = kl_cov_loss(_leaf(COV_LOGPROBS), old, COV_ADVANTAGES, COV_MASK, selected, coef=2.0)
    close(loss, (-e(0.1) - e(0.2) - e(0.3) + 3 * e(0.4) + 0.8) / 4)


def test_unclipped_loss_takes_every_ratio_by_hand():
    """r = 3 | e^−1 | 1/2 (A = +1 | −1 | −2), a length-1 row, a 9.0 in padding: −r·A per token,
    token-mean over 3: (−3 + e^−1 + 1)/3; the gradient −r·A/3 at each, where PPO-Clip's is 0 at
    all three (each ratio outside [0.8, 1.2] on the side the clip cuts)."""
    logprobs = _leaf([[math.log(3.0), -1.0], [math.log(0.5), 9.0]])
    old, mask = t([[0.0, 0.0], [0.0, 0.0]]), t([[1, 1], [1, 0]])
    advantages = t([[1.0, -1.0], [-2.0, -2.0]])
    loss, stats = unclipped_loss(logprobs, old, advantages, mask)
    close(loss, (-3.0 + math.exp(-1.0) + 1.0) / 3)
    loss.backward()
    close(logprobs.grad, [[-3.0 / 3, math.exp(-1.0) / 3], [1.0 / 3, 0.0]])
    close(stats["clipfrac"], 0.0)
    logprobs = _leaf([[math.log(3.0), -1.0], [math.log(0.5), 9.0]])
    ppo_clip_loss(logprobs, old, advantages, mask)[0].backward()
    close(logprobs.grad, [[0.0, 0.0], [0.0, 0.0]])


# Every entry of TOKEN_SELECTIONS on the covariance case above (covariances (2, 0.5, −1) | 4.5,
# on-policy): clip_cov (clip_cov_ratio 0.5: ⌊0.5·4⌋ = 2 of the 2 inside (1, 5)) draws (0, 0) and
# (1, 0); kl_cov (the default ratio: 1 token) the largest covariance, (1, 0).
SELECTION_CASES = {
    "clip_cov": [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]],
    "kl_cov": [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]],
}


def test_every_token_selection_has_a_case():
    assert set(SELECTION_CASES) == set(TOKEN_SELECTIONS)
    assert set(TOKEN_SELECTIONS) <= set(POLICY_LOSSES)  # each is a policy loss's choice


@pytest.mark.parametrize("name", sorted(SELECTION_CASES))
def test_token_selections_by_name_by_hand(name):
    logprobs = t(COV_LOGPROBS)
    settings = PolicyLossSettings(clip_cov_ratio=0.5)
    generator = torch.Generator().manual_seed(0)
    chosen = TOKEN_SELECTIONS[name](
        logprobs, logprobs, COV_ADVANTAGES, COV_MASK, settings, generator
    )
    close(chosen, SELECTION_CASES[name])


# ------------------------------------------------ exact edges (issue 54's mutation check)


def test_dppo_default_deltas_are_0_2():
    """The DPPO_NEW case at the defaults drops (0, 0) (π − μ = 0.3) and (1, 0) (μ − π = 0.3),
    as test_dppo_tv_masks_... and test_dppo_kl_masks_... at δ 0.2 | 0.2 (D = 0.2231 > 0.2 at
    both): (−1.2 − 0.5)/4 for each divergence."""
    for loss_fn in (dppo_tv_loss, dppo_kl_loss):
        loss, _ = loss_fn(_leaf(DPPO_NEW), DPPO_OLD, DPPO_ADVANTAGES, DPPO_MASK)
        close(loss, (-1.2 - 0.5) / 4)


@pytest.mark.parametrize("loss_fn", [dppo_tv_loss, dppo_kl_loss])
def test_dppo_a_token_exactly_at_delta_is_inside(loss_fn):
    """μ 0.5 → π 0.75 with A = +1, μ 0.75 → π 0.5 with A = −1 (each probability's exp(log) is
    exact): δ_high and δ_low set to exactly the divergence each token reached (TV: 0.25;
    KL: binary_kl's value) keep both, as "past δ" means strictly past. Loss −r·A per token:
    (−1.5 + (0.5/0.75))/2, clipfrac 0."""
    old = t([[0.5, 0.75]]).log()
    new = t([[0.75, 0.5]]).log()
    if loss_fn is dppo_tv_loss:
        reached = (torch.exp(new) - torch.exp(old)).abs()[0]
        assert reached.tolist() == [0.25, 0.25]
    else:
        reached = binary_kl(old, new)[0]
    high, low = float(reached[0]), float(reached[1])
    loss, stats = loss_fn(_leaf(new.tolist()), old, t([[1.0, -1.0]]), t([[1, 1]]), low, high)
    close(loss, (-1.5 + 0.5 / 0.75) / 2)
    close(stats["clipfrac"], 0.0)


@pytest.mark.parametrize("loss_fn", [dppo_tv_loss, dppo_kl_loss])
def test_dppo_only_the_advantages_sign_picks_the_side(loss_fn):
    """A = 0 moves nothing, whichever way π went (0.5 → 0.8 and 0.5 → 0.2, past δ 0.2 by TV
    0.3 and KL 0.2231): no token outside, clipfrac 0. A = 0.5 (positive, below 1) with π
    falling 0.5 → 0.2 is kept: −r·A = −0.4·0.5; token-mean over 3."""
    old = t([[0.5, 0.5, 0.5]]).log()
    new = [[math.log(0.8), math.log(0.2), math.log(0.2)]]
    loss, stats = loss_fn(_leaf(new), old, t([[0.0, 0.0, 0.5]]), t([[1, 1, 1]]), 0.2, 0.2)
    close(loss, -0.4 * 0.5 / 3)
    close(stats["clipfrac"], 0.0)


@pytest.mark.parametrize("log_ratio", [30.0, -30.0])
def test_the_log_ratio_is_clamped_to_20_either_way(log_ratio):
    """veRL's guard: exp of a log-ratio past ±20 reads as e^±20 (e^30 would be the value
    otherwise, and e^±21 is not e^±20 to 1e-9). unclipped: −r·A with A = 1; dppo_tv with no
    cap the same (π and μ both below e^−10: the token is inside δ 1)."""
    expected = -math.exp(math.copysign(20.0, log_ratio))
    old = t([[-40.0]])
    logprobs = _leaf([[-40.0 + log_ratio]])
    close(unclipped_loss(logprobs, old, t([[1.0]]), t([[1]]))[0], expected)
    loss, _ = dppo_tv_loss(logprobs, old, t([[1.0]]), t([[1]]), 1.0, 1.0, "token-mean", None)
    close(loss, expected)
    # kl_cov on an unselected token: −r·A alone
    close(kl_cov_loss(logprobs, old, t([[1.0]]), t([[1]]), t([[0.0]]))[0], expected)


def test_dppo_kl_a_negative_advantage_on_a_rising_token_is_kept():
    """The mirror of (0, 2) in test_dppo_kl_masks_...: A = −1 and π rose 0.5 → 0.8 (D = 0.2231
    past δ_low 0.2): the update moves π back towards μ, so the token keeps its −r·A = 1.6."""
    loss, stats = dppo_kl_loss(
        _leaf([[math.log(0.8)]]), t([[0.5]]).log(), t([[-1.0]]), t([[1]]), 0.2, 0.2
    )
    close(loss, 1.6)
    close(stats["clipfrac"], 0.0)


def test_clip_cov_bounds_are_open():
    """The covariances (2, 0.5, −1) | 4.5 of the ragged case are exact in binary: with bounds
    (2, 4.5) neither (0, 0) nor (1, 0) lies strictly inside, and nothing is drawn."""
    old = t(COV_LOGPROBS)
    drawn = clip_cov_draw(old, old, COV_ADVANTAGES, COV_MASK, ratio=0.5, bounds=(2.0, 4.5))
    close(drawn, [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], rtol=0, atol=0)


def test_clip_cov_takes_an_upper_clip_of_its_own():
    """Token (0, 0) at r = 1.25 with A > 0: inside clip_high 0.3 (ratio ≤ 1.3), outside 1 + 0.2.
    The draw may take it (covariance 2 in (1, 5); ratio 0.5 draws ⌊2⌋ = both candidates), and
    the loss reads −r·A = −1.25 there when not drawn (PPO-Clip at 0.3, not 0.2)."""
    logprobs = _leaf(COV_LOGPROBS)
    old = logprobs.detach() - t([[math.log(1.25), 0.0, 0.0], [0.0, 0.0, 0.0]])
    drawn = clip_cov_draw(logprobs, old, COV_ADVANTAGES, COV_MASK, 0.2, 0.3, ratio=0.5)
    close(drawn, [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    nothing = torch.zeros_like(drawn)
    loss, stats = clip_cov_loss(logprobs, old, COV_ADVANTAGES, COV_MASK, nothing, 0.2, 0.3)
    close(loss, (-1.25 - 1 - 1 + 3) / 4)
    close(stats["clipfrac"], 0.0)


def test_kl_cov_ties_go_to_the_earlier_token():
    """A constant advantage makes every covariance 0: 40 tied tokens over 2 rows of 20, ratio
    0.25 selects ⌊10⌋, the first 10 of row 0 (a stable sort; torch's CPU sort is not stable
    once 17 values tie, and picks others)."""
    logprobs = -torch.rand(2, 20, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    selected = kl_cov_select(
        logprobs, torch.ones(2, 20, dtype=torch.float64), torch.ones(2, 20), 0.25
    )
    expected = torch.zeros(2, 20, dtype=torch.float64)
    expected[0, :10] = 1.0
    close(selected, expected, rtol=0, atol=0)


# One row, old log-probs −1 (not 0: the ratio diagnostics must read log π − log π_old), token
# ratios 1.5 and 1, A = +1 | −1 where the sign matters.
OLD_ROW = t([[-1.0, -1.0]])
NEW_ROW = [[-1.0 + math.log(1.5), -1.0]]


def test_gspo_default_clip_and_stats():
    """Sequence ratio s = √1.5 ≈ 1.2247 with A = +1: the paper's ε 3e-4 (the default, both
    sides) clips it to 1.0003, −1.0003 per token; clip_high 0.5 leaves it, −s. Stats: clipfrac,
    seq_ratio_mean s, and the token-ratio diagnostics (ratio_mean (1.5 + 1)/2, approx_kl_k1
    −ln 1.5 / 2)."""
    advantages, mask = t([[1.0, 1.0]]), t([[1, 1]])
    s = math.sqrt(1.5)
    for loss_fn in (gspo_loss, gspo_token_loss):
        loss, stats = loss_fn(_leaf(NEW_ROW), OLD_ROW, advantages, mask)
        close(loss, -1.0003)
        close(stats["clipfrac"], 1.0)
        close(stats["seq_ratio_mean"], s)
        close(stats["ratio_mean"], 1.25)
        close(stats["approx_kl_k1"], -math.log(1.5) / 2)
        loss, stats = loss_fn(_leaf(NEW_ROW), OLD_ROW, advantages, mask, 3e-4, 0.5)
        close(loss, -s)
        close(stats["clipfrac"], 0.0)


def test_cispo_default_upper_clip_is_0_2():
    """Weights min(1.5, 1.2) = 1.2 and 1 (stop-gradient), A = 1: −(1.2·log π₀ + log π₁)/2."""
    logprobs = _leaf(NEW_ROW)
    loss, stats = cispo_loss(logprobs, OLD_ROW, t([[1.0, 1.0]]), t([[1, 1]]))
    close(loss, -(1.2 * NEW_ROW[0][0] + NEW_ROW[0][1]) / 2)
    close(stats["clipfrac"], 0.5)


def _sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_sapo_default_temperatures_and_a_float64_tau():
    """r = 1.5 with A = +1 and r = 1 with A = −1. Defaults τ_pos 1, τ_neg 1.05:
    (−4σ(0.5) + σ(0)·4/1.05)/2. τ_pos 1.05 (not exact in float32) taken in float64:
    (−σ(1.05·0.5)·4/1.05 + 2/1.05)/2."""
    advantages, mask = t([[1.0, -1.0]]), t([[1, 1]])
    loss, _ = sapo_loss(_leaf(NEW_ROW), OLD_ROW, advantages, mask)
    close(loss, (-4 * _sigmoid(0.5) + 2 / 1.05) / 2, rtol=1e-14, atol=0)
    loss, _ = sapo_loss(_leaf(NEW_ROW), OLD_ROW, advantages, mask, 1.05, 1.05)
    close(loss, (-_sigmoid(1.05 * 0.5) * 4 / 1.05 + 2 / 1.05) / 2, rtol=1e-14, atol=0)


def test_sapo_clamps_a_very_negative_log_ratio_at_minus_20():
    """log r = −30 reads as −20: −4σ(e^−20 − 1), A = 1, τ 1 (e^−21 or e^−30 would move it by
    ~1e-9, beyond float64's round-off at rtol 1e-14)."""
    loss, _ = sapo_loss(_leaf([[-40.0]]), t([[-10.0]]), t([[1.0]]), t([[1]]))
    close(loss, -4 * _sigmoid(math.exp(-20.0) - 1), rtol=1e-14, atol=0)


def test_kl_cov_default_coefficient_is_1():
    """The case of test_kl_cov_penalises_..., (0, 0) and (1, 0) selected, at the default coef:
    |log r| = 0.1 and 0.4 added once."""
    logprobs = _leaf(COV_LOGPROBS)
    old = logprobs.detach() - t([[0.1, 0.2, 0.3], [0.4, 0.0, 0.0]])
    selected = t([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    loss, _ = kl_cov_loss(logprobs, old, COV_ADVANTAGES, COV_MASK, selected)
    e = math.exp
    close(loss, (-e(0.1) + 0.1 - e(0.2) - e(0.3) + 3 * e(0.4) + 0.4) / 4)


@pytest.mark.parametrize("name", sorted(TOKEN_SELECTIONS))
def test_a_loss_with_a_selection_refuses_to_run_without_it(name):
    """The update chooses the tokens over the whole step first: called without them, the loss
    says which table's entry it needs, in one line."""
    logprobs, mask = t([[-1.0]]), t([[1]])
    message = rf"^policy loss {name}: the selection of TOKEN_SELECTIONS\['{name}'\]$"
    with pytest.raises(ValueError, match=message):
        POLICY_LOSSES[name](
            logprobs, logprobs, mask, mask, PolicyLossSettings(), aggregation("token-mean")
        )
