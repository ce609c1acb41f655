import math

import pytest
import torch

from proxrl.core import (
    bradley_terry_loss,
    dpo_loss,
    entropy_bonus,
    ipo_loss,
    policy_gradient_loss,
    ppo_clip_loss,
    ppo_penalty_loss,
    ranking_loss,
    sft_loss,
    simpo_loss,
    value_loss,
)
from proxrl.core.losses import policy_loss_result
from tests.core.helpers import close, t


def softplus(x):
    """−log σ(−x) = log(1 + eˣ)."""
    return math.log1p(math.exp(x))


# ---------------------------------------------------------------- policy losses


@pytest.mark.parametrize(
    ("advantage", "ratio", "expected_loss", "expected_grad", "clipped"),
    [
        # A > 0 — only too large a ratio is clipped.
        (+1.0, 0.5, -0.5, -0.5, False),  # below 1−ε: max(−0.5, −0.8) = −0.5, d/dlogπ = −A·r
        (+1.0, 1.1, -1.1, -1.1, False),  # inside: −A·r
        (+1.0, 1.5, -1.2, 0.0, True),  # above 1+ε: max(−1.5, −1.2) = −1.2, flat
        # A < 0 — only too small a ratio is clipped.
        (-1.0, 0.5, 0.8, 0.0, True),  # below: max(0.5, 0.8) = 0.8, flat
        (-1.0, 1.1, 1.1, 1.1, False),  # inside
        (-1.0, 1.5, 1.5, 1.5, False),  # above: max(1.5, 1.2) = 1.5, still pushed down
    ],
)
def test_ppo_clip_six_cases(advantage, ratio, expected_loss, expected_grad, clipped):
    """The seed's case table, ε = 0.2: the loss is max(−A·r, −A·clip(r, 0.8, 1.2)), and its
    gradient with respect to log π is exactly zero where the clipped term is active."""
    logprobs = t([[math.log(ratio)]]).requires_grad_(True)
    loss, stats = ppo_clip_loss(logprobs, t([[0.0]]), t([[advantage]]), t([[1]]), clip_low=0.2)
    loss.backward()
    close(loss, expected_loss)
    close(logprobs.grad, [[expected_grad]])
    assert (logprobs.grad == 0).item() == clipped
    close(stats["clipfrac"], 1.0 if clipped else 0.0)


def test_ppo_clip_asymmetric_and_dual_clip():
    """ε_high = 0.28 (DAPO): r = 1.25 with A = 1 is inside → loss −1.25, gradient −1.25.
    Dual clip c = 3, A = −1, r = 5: min(max(5, 1.2), 3) = 3, gradient 0; without it, 5."""
    logprobs = t([[math.log(1.25)]]).requires_grad_(True)
    loss, _ = ppo_clip_loss(
        logprobs, t([[0.0]]), t([[1.0]]), t([[1]]), clip_low=0.2, clip_high=0.28
    )
    loss.backward()
    close(loss, -1.25)
    close(logprobs.grad, [[-1.25]])

    logprobs = t([[math.log(5.0)]]).requires_grad_(True)
    loss, stats = ppo_clip_loss(logprobs, t([[0.0]]), t([[-1.0]]), t([[1]]), dual_clip=3.0)
    loss.backward()
    close(loss, 3.0)
    close(logprobs.grad, [[0.0]])
    close(stats["dual_clipfrac"], 1.0)
    close(ppo_clip_loss(logprobs, t([[0.0]]), t([[-1.0]]), t([[1]]))[0], 5.0)


def test_ppo_clip_stats_by_hand():
    """r = (0.5, 2): log r = (−ln 2, ln 2). k3 = (r−1) − log r = (ln 2 − 0.5, 1 − ln 2), mean
    0.25; k1 = mean(−log r) = 0; ratio mean 1.25, max 2. A = (1, 1): only r = 2 is clipped."""
    _, stats = ppo_clip_loss(
        t([[math.log(0.5), math.log(2.0)]]), t([[0.0, 0.0]]), t([[1.0, 1.0]]), t([[1, 1]])
    )
    close(stats["approx_kl"], 0.25)
    close(stats["approx_kl_k1"], 0.0)
    close(stats["ratio_mean"], 1.25)
    close(stats["ratio_max"], 2.0)
    close(stats["clipfrac"], 0.5)


def test_ppo_penalty_by_hand():
    """A = (1, −1), r = (0.5, 2), β = 0.5, k3 = (ln 2 − 0.5, 1 − ln 2):
    tokens −0.5 + 0.5(ln 2 − 0.5) and 2 + 0.5(1 − ln 2); mean = (1.5 + 0.25)/2 = 0.875.
    β = 0 is the plain surrogate −mean(A·r) = −(0.5 − 2)/2 = 0.75."""
    args = (t([[math.log(0.5), math.log(2.0)]]), t([[0.0, 0.0]]), t([[1.0, -1.0]]), t([[1, 1]]))
    loss, stats = ppo_penalty_loss(*args, beta=0.5)
    close(loss, 0.875)
    close(stats["kl"], 0.25)
    close(ppo_penalty_loss(*args, beta=0.0)[0], 0.75)


def test_policy_loss_result_by_hand():
    """r = (1, 2, 0.5) on the valid tokens, the fourth masked: loss token-mean (1 + 2 + 3)/3 = 2,
    gradient 1/3 on each valid token; k3 = (0, 1 − ln 2, ln 2 − 0.5), mean 0.5/3; k1 = mean(−log r)
    = 0; ratio mean 3.5/3, max 2 (the masked r = 8 not counted); then the loss's own stats, then
    policy_loss, every one detached."""
    log_ratio = t([[0.0, math.log(2.0)], [math.log(0.5), math.log(8.0)]])
    per_token = t([[1.0, 2.0], [3.0, 100.0]], requires_grad=True)
    own = {"clipfrac": t(0.25), "seq_ratio_mean": t(1.5)}
    loss, stats = policy_loss_result(per_token, log_ratio, t([[1, 1], [1, 0]]), "token-mean", own)
    close(loss, 2.0)
    loss.backward()
    close(per_token.grad, t([[1 / 3, 1 / 3], [1 / 3, 0.0]]))
    assert list(stats) == [
        *("approx_kl", "approx_kl_k1", "ratio_mean", "ratio_max", "clipfrac", "seq_ratio_mean"),
        "policy_loss",
    ]
    close(stats["approx_kl"], 0.5 / 3)
    close(stats["approx_kl_k1"], 0.0)
    close(stats["ratio_mean"], 3.5 / 3)
    close(stats["ratio_max"], 2.0)
    close(stats["clipfrac"], 0.25)
    close(stats["policy_loss"], 2.0)
    assert not any(value.requires_grad for value in stats.values())


def test_policy_gradient_loss_by_hand():
    """−mean(A·log π) over valid tokens: −(2·(−1) + (−1)·(−0.5))/2 = 0.75; the third is masked."""
    loss, _ = policy_gradient_loss(t([[-1.0, -0.5, -9.0]]), t([[2.0, -1.0, 5.0]]), t([[1, 1, 0]]))
    close(loss, 0.75)


def test_policy_losses_ignore_masked_tokens():
    """Perturb logprobs, old logprobs and advantages at masked positions: same loss, and the
    gradient there is exactly 0."""
    logprobs = torch.randn(3, 4, dtype=torch.float64) * 0.1
    old, advantages = (
        logprobs + 0.05 * torch.randn(3, 4, dtype=torch.float64),
        torch.randn(3, 4, dtype=torch.float64),
    )
    mask = t([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]])
    noise = 3 * torch.randn(3, 4, dtype=torch.float64) * (1 - mask)
    for fn, kwargs in ((ppo_clip_loss, {"dual_clip": 3.0}), (ppo_penalty_loss, {"beta": 0.1})):
        for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
            clean = fn(logprobs, old, advantages, mask, agg=agg, **kwargs)[0]
            perturbed_logprobs = (logprobs + noise).requires_grad_(True)
            perturbed = fn(
                perturbed_logprobs, old - noise, advantages + noise, mask, agg=agg, **kwargs
            )[0]
            perturbed.backward()
            close(perturbed, clean)
            assert (perturbed_logprobs.grad[mask == 0] == 0).all()


# ---------------------------------------------------------------- value and entropy


def test_value_loss_by_hand():
    """V = (1, 2), V_old = (0.5, 2), R = (2, 1), c = 0.2. Unclipped: ½·mean(1, 1) = 0.5.
    Clipped V = (0.5 + 0.2, 2) = (0.7, 2): squares (1.69, 1); max with (1, 1) → (1.69, 1);
    ½·mean = 0.6725. The first token's clipped branch is active, so ∂/∂V₀ = 0."""
    values = t([[1.0, 2.0]]).requires_grad_(True)
    mask = t([[1, 1]])
    close(value_loss(values, t([[0.5, 2.0]]), t([[2.0, 1.0]]), mask)[0], 0.5)
    loss, stats = value_loss(values, t([[0.5, 2.0]]), t([[2.0, 1.0]]), mask, clip=0.2)
    loss.backward()
    close(loss, 0.6725)
    close(stats["value_clipfrac"], 0.5)
    close(values.grad, [[0.0, 0.5]])  # d/dV₁ of ½·½(V₁ − 1)² = ½(V₁ − 1) = 0.5


def test_value_loss_clips_below_by_hand():
    """The lower bound: V = (−1, 0.1), V_old = (0, 0), R = (−2, 0), c = 0.2. Clipped V =
    (max(−1, −0.2), 0.1) = (−0.2, 0.1): squares (3.24, 0.01) against (1, 0.01); the max
    (3.24, 0.01), ½·mean = 0.8125. The first token's clipped branch is active (∂/∂V₀ = 0), the
    second is not clipped (|0.1| < c): ∂/∂V₁ = ½·(V₁ − R₁) = 0.05, and clipfrac ½."""
    values = t([[-1.0, 0.1]]).requires_grad_(True)
    loss, stats = value_loss(values, t([[0.0, 0.0]]), t([[-2.0, 0.0]]), t([[1, 1]]), clip=0.2)
    loss.backward()
    close(loss, 0.8125)
    close(stats["value_clipfrac"], 0.5)
    close(values.grad, [[0.0, 0.05]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_value_clipfrac_counts_no_round_off(dtype):
    """Nothing clipped (|V − V_old| < c everywhere): the clipped fraction is exactly 0, and the
    loss and gradient are bit for bit those of the unclipped loss. The form
    ``V_old + clamp(V − V_old, −c, c)`` differs from V by round-off, which counted ~10% of
    float32 tokens (11% in bf16) as clipped."""
    g = torch.Generator().manual_seed(0)
    old = (0.1 * torch.randn(64, 32, generator=g)).to(dtype)
    moved = old.float() + 0.38 * torch.rand(64, 32, generator=g) - 0.19  # |V − V_old| < c
    values = moved.to(dtype).requires_grad_(True)
    # returns near V (a critic that fits): the comparison that counts a token is sensitive
    returns = (values.detach().float() + 1e-3 * torch.randn(64, 32, generator=g)).to(dtype)
    mask = torch.ones(64, 32, dtype=dtype)
    assert ((values - old).abs() < 0.2).all()
    loss, stats = value_loss(values, old, returns, mask, clip=0.2)
    assert stats["value_clipfrac"].item() == 0.0
    (grad,) = torch.autograd.grad(loss, values)
    plain = value_loss(values, old, returns, mask)[0]
    (plain_grad,) = torch.autograd.grad(plain, values)
    assert torch.equal(loss, plain) and torch.equal(grad, plain_grad)


def test_value_loss_clamp_equals_the_baselines_form():
    """float64, random inputs with clipping on both sides: the loss and gradient of
    ``clamp(V, V_old − c, V_old + c)`` equal those of baselines' ``V_old + clamp(V − V_old, −c,
    c)`` to round-off (the two differ only in how an unclipped V is rounded)."""
    g = torch.Generator().manual_seed(1)
    old = torch.randn(16, 8, generator=g, dtype=torch.float64)
    values = (old + torch.randn(16, 8, generator=g, dtype=torch.float64)).requires_grad_(True)
    returns = torch.randn(16, 8, generator=g, dtype=torch.float64)
    mask = (torch.rand(16, 8, generator=g) < 0.8).double()
    c = 0.3
    loss, stats = value_loss(values, old, returns, mask, clip=c)
    (grad,) = torch.autograd.grad(loss, values)
    baseline_values = old + torch.clamp(values - old, -c, c)
    expected = 0.5 * torch.maximum((values - returns) ** 2, (baseline_values - returns) ** 2)
    expected = (expected * mask).sum() / mask.sum()
    (expected_grad,) = torch.autograd.grad(expected, values)
    close(loss, expected)
    close(grad, expected_grad)
    assert 0.2 < stats["value_clipfrac"].item() < 0.8  # both branches occur


def test_entropy_bonus_by_hand():
    """Mean entropy over valid tokens (1 + 2)/2 = 1.5; the bonus loss is its negative."""
    loss, stats = entropy_bonus(t([[1.0, 2.0, 3.0]]), t([[1, 1, 0]]))
    close(loss, -1.5)
    close(stats["entropy"], 1.5)


# ---------------------------------------------------------------- reward models


def test_bradley_terry_by_hand():
    """r_c = (2, 0), r_r = (1, 1): gaps (1, −1); loss = ½(log(1+e⁻¹) + log(1+e¹)) = 0.81326…;
    accuracy ½, mean margin 0. With margins (0.5, 0.5): ½(softplus(−0.5) + softplus(1.5)).
    Centring 0.1: + 0.1·mean((2+1)², (0+1)²) = 0.1·5 = 0.5."""
    chosen, rejected = t([2.0, 0.0]), t([1.0, 1.0])
    loss, stats = bradley_terry_loss(chosen, rejected)
    close(loss, 0.5 * (softplus(-1) + softplus(1)))
    close(stats["accuracy"], 0.5)
    close(stats["margin_mean"], 0.0)
    close(stats["chosen_mean"], 1.0)
    close(stats["rejected_mean"], 1.0)
    close(
        bradley_terry_loss(chosen, rejected, margin=t([0.5, 0.5]))[0],
        0.5 * (softplus(-0.5) + softplus(1.5)),
    )
    close(
        bradley_terry_loss(chosen, rejected, center_coef=0.1)[0],
        0.5 * (softplus(-1) + softplus(1)) + 0.5,
    )


def test_ranking_loss_by_hand():
    """Scores (3, 1, 2), ranks (0, 2, 1): pairs 0≻1 (gap 2), 0≻2 (gap 1), 2≻1 (gap 1);
    loss = mean(softplus(−2), softplus(−1), softplus(−1)); all three ordered correctly.
    A tie (ranks 0, 0, 1) leaves only the two pairs against response 2."""
    loss, stats = ranking_loss(t([[3.0, 1.0, 2.0]]), torch.tensor([[0, 2, 1]]))
    close(loss, (softplus(-2) + 2 * softplus(-1)) / 3)
    close(stats["accuracy"], 1.0)
    close(stats["pairs"], 3.0)
    loss, stats = ranking_loss(t([[3.0, 1.0, 2.0]]), torch.tensor([[0, 0, 1]]))
    close(loss, (softplus(-1) + softplus(1)) / 2)  # 3 − 2 = 1 and 1 − 2 = −1
    close(stats["pairs"], 2.0)


def test_ranking_loss_of_two_is_bradley_terry():
    chosen, rejected = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    ranks = torch.tensor([[0, 1]] * 5)
    close(
        ranking_loss(torch.stack([chosen, rejected], 1), ranks)[0],
        bradley_terry_loss(chosen, rejected)[0],
    )


# ---------------------------------------------------------------- offline preference losses

POLICY_CHOSEN, POLICY_REJECTED = t([-1.0, -2.0]), t([-2.0, -1.0])
REF = t([-1.5, -1.5])


def test_dpo_by_hand():
    """β = 0.1: chosen rewards 0.1·(0.5, −0.5), rejected 0.1·(−0.5, 0.5), h = (0.1, −0.1);
    loss = ½(softplus(−0.1) + softplus(0.1)); accuracy ½, margins mean 0.
    Label smoothing ε = 0.1: per pair 0.9·softplus(−h) + 0.1·softplus(h)."""
    loss, stats = dpo_loss(POLICY_CHOSEN, POLICY_REJECTED, REF, REF, beta=0.1)
    close(loss, 0.5 * (softplus(-0.1) + softplus(0.1)))
    close(stats["rewards/chosen"], 0.0)
    close(stats["rewards/accuracies"], 0.5)
    close(stats["rewards/margins"], 0.0)
    smoothed, _ = dpo_loss(POLICY_CHOSEN, POLICY_REJECTED, REF, REF, beta=0.1, label_smoothing=0.1)
    per_pair = [0.9 * softplus(-h) + 0.1 * softplus(h) for h in (0.1, -0.1)]
    close(smoothed, sum(per_pair) / 2)


def test_dpo_gradient_pushes_chosen_up():
    chosen = t([-1.0]).requires_grad_(True)
    rejected = t([-1.0]).requires_grad_(True)
    dpo_loss(chosen, rejected, t([-1.0]), t([-1.0]), beta=0.5)[0].backward()
    close(chosen.grad, [-0.25])  # −β·σ(−0) = −0.5·0.5
    close(rejected.grad, [0.25])


def test_ipo_by_hand():
    """h = (0.5 − (−0.5), −0.5 − 0.5) = (1, −1), β = 0.1 → target 1/(2β) = 5:
    ((1 − 5)² + (−1 − 5)²)/2 = (16 + 36)/2 = 26."""
    close(ipo_loss(POLICY_CHOSEN, POLICY_REJECTED, REF, REF, beta=0.1)[0], 26.0)


def test_simpo_by_hand():
    """β = 2, γ/β = 0.5: h = 2·((−1 − (−2)) − 0.5, (−2 − (−1)) − 0.5) = (1, −3);
    loss = ½(softplus(−1) + softplus(3)); rewards β·π̄ = (−2, −4) and (−4, −2)."""
    loss, stats = simpo_loss(POLICY_CHOSEN, POLICY_REJECTED, beta=2.0, gamma_beta_ratio=0.5)
    close(loss, 0.5 * (softplus(-1) + softplus(3)))
    close(stats["rewards/chosen"], -3.0)
    close(stats["rewards/accuracies"], 0.5)


# ---------------------------------------------------------------- SFT


def test_sft_loss_by_hand():
    """Position 0: softmax(0, ln 3) → p(1) = ¾ → NLL = −ln ¾; position 1 is masked (its label
    −100, an ignore index, must not crash): loss = −ln 0.75 over 1 token."""
    logits = t([[[0.0, math.log(3)], [math.log(3), 0.0]]])
    loss, stats = sft_loss(logits, torch.tensor([[1, -100]]), t([[1, 0]]))
    close(loss, -math.log(0.75))
    close(stats["tokens"], 1.0)
