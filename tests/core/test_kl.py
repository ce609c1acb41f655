import math

import pytest
import torch

from proxrl.core import (
    AdaptiveKL,
    FixedKL,
    ProportionalKL,
    kl_k1,
    kl_k2,
    kl_k3,
    rewards_at_tokens,
    sequence_kl,
    shaped_rewards,
)
from tests.core.helpers import close, t


def test_estimators_by_hand():
    """π = 0.5, π_ref = 0.25: k1 = ln 2; k2 = ½ ln²2;
    log r = ln(0.25/0.5) = −ln 2, r = 0.5 → k3 = (0.5 − 1) + ln 2 = ln 2 − 0.5."""
    logprobs, ref = t([math.log(0.5)]), t([math.log(0.25)])
    close(kl_k1(logprobs, ref), [math.log(2)])
    close(kl_k2(logprobs, ref), [0.5 * math.log(2) ** 2])
    close(kl_k3(logprobs, ref), [math.log(2) - 0.5])


def test_k1_and_k3_are_unbiased_by_monte_carlo():
    """Sample 400k tokens from π, average each estimator, compare with the exact
    KL(π‖π_ref) = Σ π log(π/π_ref) of two categorical distributions. The bound is 4 standard
    errors of the sample mean; k2 is biased and must land outside it."""
    generator = torch.Generator().manual_seed(1)
    pi = t([0.1, 0.2, 0.3, 0.4])
    ref = t([0.4, 0.3, 0.2, 0.1])
    exact = (pi * (pi / ref).log()).sum()
    samples = torch.multinomial(pi, 400_000, replacement=True, generator=generator)
    logprobs, ref_logprobs = pi.log()[samples], ref.log()[samples]
    for estimator, unbiased in ((kl_k1, True), (kl_k3, True), (kl_k2, False)):
        values = estimator(logprobs, ref_logprobs)
        standard_error = values.std() / math.sqrt(values.numel())
        assert standard_error < 0.01 * exact  # the check has power
        assert (abs(values.mean() - exact) < 4 * standard_error) == unbiased, estimator.__name__


def test_k3_is_never_negative():
    logprobs = torch.randn(10_000, dtype=torch.float64) * 5
    ref = logprobs + torch.randn(10_000, dtype=torch.float64) * torch.logspace(
        -12, 1, 10_000, dtype=torch.float64
    )
    assert (kl_k3(logprobs, ref) >= 0).all()
    assert (kl_k3(logprobs.float(), ref.float()) >= 0).all()


def test_shaped_rewards_by_hand():
    """β = 0.1, k1. Row 1: KL = (−1+1.5, 0, −1+0.5) = (0.5, 0, −0.5) → (−0.05, 0, 0.05 + score 1).
    Row 2, last token masked: KL = (0, 1, ·) → (0, −0.1 + score 2, 0)."""
    rewards = shaped_rewards(
        t([1.0, 2.0]),
        t([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]]),
        t([[-1.5, -1.0, -0.5], [-2.0, -3.0, -1.0]]),
        t([[1, 1, 1], [1, 1, 0]]),
        kl_coef=0.1,
    )
    close(rewards, [[-0.05, 0.0, 1.05], [0.0, 1.9, 0.0]])


def test_shaped_rewards_k3_and_sequence_kl():
    """k3 of log r = ln 0.5 is ln 2 − 0.5 per token; two valid tokens sum to 2 ln 2 − 1."""
    logprobs, ref, mask = t([[math.log(0.5)] * 3]), t([[math.log(0.25)] * 3]), t([[1, 1, 0]])
    per_token = math.log(2) - 0.5
    close(shaped_rewards(t([0.0]), logprobs, ref, mask, 1.0, "k3"), [[-per_token, -per_token, 0.0]])
    close(sequence_kl(logprobs, ref, mask, "k3"), [2 * per_token])


def test_shaped_rewards_need_a_valid_token_per_row():
    with pytest.raises(ValueError, match="at least one valid token"):
        shaped_rewards(t([1.0]), t([[0.0]]), t([[0.0]]), t([[0]]), 0.1)


def test_rewards_at_tokens_by_hand():
    """Row 1: rewards (0.25, 0, 0.5), nothing added → as given. Row 2: reward 2 at a masked
    token (dropped), −1 added at the last valid token → (0.5, 1 − 1, 0)."""
    rewards = rewards_at_tokens(
        t([[0.25, 0.0, 0.5], [0.5, 1.0, 2.0]]),
        t([0.0, -1.0]),
        t([[1, 1, 1], [1, 1, 0]]),
    )
    close(rewards, [[0.25, 0.0, 0.5], [0.5, 0.0, 0.0]])


def test_fixed_controller_never_moves():
    controller = FixedKL(0.05)
    for kl in (0.0, 10.0, 1e9):
        controller.update(kl, 64)
    assert controller.value == 0.05


def test_adaptive_controller_sequence():
    """d_targ 0.01, so the band is (0.01/1.5, 0.015) = (0.00667, 0.015):
    0.001 → ÷2 = 0.5; 0.02 → ×2 = 1; 0.01 → stays 1; 0.005 → 0.5; 0.0066 → 0.25; 0.015 → stays."""
    controller = AdaptiveKL(1.0, target=0.01)
    seen = []
    for kl in (0.001, 0.02, 0.01, 0.005, 0.0066, 0.015):
        controller.update(kl)
        seen.append(controller.value)
    assert seen == [0.5, 1.0, 1.0, 0.5, 0.25, 0.25]


def test_proportional_controller_sequence():
    """β0 = 0.2, target 6, horizon 10000, 256 samples per update, so n/H = 0.0256:
    KL 12 → e = clip(1, ±0.2) = 0.2 → β·(1 + 0.00512); KL 6 → e = 0; KL 3 → e = −0.2 →
    β·(1 − 0.00512); KL 6.6 → e = 0.1 → β·(1 + 0.00256)."""
    controller = ProportionalKL(0.2, target=6.0, horizon=10_000)
    beta = 0.2
    for kl, factor in ((12.0, 1.00512), (6.0, 1.0), (3.0, 0.99488), (6.6, 1.00256)):
        controller.update(kl, n_steps=256)
        beta *= factor
        assert controller.value == pytest.approx(beta, rel=1e-12)


def test_controller_state_round_trip():
    controller = AdaptiveKL(1.0, target=0.01)
    controller.update(0.1)
    restored = AdaptiveKL(1.0, target=0.01)
    restored.load_state_dict(controller.state_dict())
    assert restored.value == 2.0


def test_k3_plus_has_k3_value_and_k2_gradient():
    """log π = 0, −1; log π_ref = −0.5, −0.5 → log r = −0.5, 0.5. Value: k3 = e^−0.5 − 0.5,
    e^0.5 − 1.5. Gradient of the sum: k2's, log π − log π_ref = (0.5, −0.5), where k3's would
    be 1 − π_ref/π = (1 − e^−0.5, 1 − e^0.5)."""
    from proxrl.core import kl_k3, kl_k3_plus

    ref = t([-0.5, -0.5])
    logprobs = t([0.0, -1.0]).requires_grad_(True)
    value = kl_k3_plus(logprobs, ref)
    close(value, [math.exp(-0.5) - 0.5, math.exp(0.5) - 1.5])
    value.sum().backward()
    close(logprobs.grad, [0.5, -0.5])
    plain = t([0.0, -1.0]).requires_grad_(True)
    kl_k3(plain, ref).sum().backward()
    close(plain.grad, [1 - math.exp(-0.5), 1 - math.exp(0.5)])


def test_kl_estimators_table_by_name():
    from proxrl.core import kl_per_token

    lp, ref = t([0.0, -1.0]), t([-0.5, -0.5])
    close(kl_per_token(lp, ref, "k1"), [0.5, -0.5])
    close(kl_per_token(lp, ref, "k2"), [0.125, 0.125])
    close(kl_per_token(lp, ref, "k3+"), kl_per_token(lp, ref, "k3"))


# π = 0.5, π_ref = 0.25 (test_estimators_by_hand): every entry of KL_ESTIMATORS by hand.
KL_CASES = {
    "k1": math.log(2),
    "k2": 0.5 * math.log(2) ** 2,
    "k3": math.log(2) - 0.5,
    "k3+": math.log(2) - 0.5,  # k3's value (its gradient: test_k3_plus_...)
}


def test_every_kl_estimator_has_a_case():
    from proxrl.core import KL_ESTIMATORS, REWARD_KL_ESTIMATORS

    assert set(KL_CASES) == set(KL_ESTIMATORS)
    assert set(REWARD_KL_ESTIMATORS) == set(KL_ESTIMATORS) - {"k3+"}


@pytest.mark.parametrize("name", sorted(KL_CASES))
def test_kl_estimators_by_name_by_hand(name):
    from proxrl.core import kl_per_token

    close(kl_per_token(t([math.log(0.5)]), t([math.log(0.25)]), name), [KL_CASES[name]])


def test_an_unknown_kl_estimator_names_the_closest():
    from proxrl.core import kl_per_token

    with pytest.raises(ValueError, match=r"unknown KL estimator 'k4'.*expected one of"):
        kl_per_token(t([0.0]), t([0.0]), "k4")
    with pytest.raises(KeyError, match="did you mean k3"):
        kl_per_token(t([0.0]), t([0.0]), "k3-")


def test_last_valid_index_by_hand():
    """The last 1 of each row, holes before it skipped: a row valid only at its first token ends
    at 0 (a padded position must not win the max), a row with a hole at 1 ends at 2."""
    from proxrl.core import last_valid_index

    mask = t([[1, 0, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1]])
    assert last_valid_index(mask).tolist() == [0, 2, 3]


def test_every_row_needs_a_valid_token_even_beside_valid_rows():
    """The check is per row: one empty row is refused although the batch has valid tokens
    (its score would land at a padded position). The message whole, not only a fragment."""
    message = r"^every sequence needs at least one valid token to carry its score$"
    with pytest.raises(ValueError, match=message):
        shaped_rewards(
            t([1.0, 2.0]), t([[0.0, 0.0]] * 2), t([[0.0, 0.0]] * 2), t([[1, 1], [0, 0]]), 0.1
        )
    with pytest.raises(ValueError, match=message):
        rewards_at_tokens(t([[0.0], [0.0]]), t([1.0, 1.0]), t([[1], [0]]))


def test_a_float32_score_joins_float64_rewards():
    """A reward model's float32 score is paid into float64 rewards (scatter_add needs one
    dtype): β = 0.5, k1 0 and 1 → (0, −0.5 + 0.25)."""
    rewards = shaped_rewards(
        torch.tensor([0.25], dtype=torch.float32),
        t([[-1.0, -1.0]]),
        t([[-1.0, -2.0]]),
        t([[1, 1]]),
        kl_coef=0.5,
    )
    assert rewards.dtype == torch.float64
    close(rewards, [[0.0, -0.25]])


@pytest.mark.parametrize(
    ("tokens", "last"), [(torch.float32, torch.float64), (torch.float64, torch.float32)]
)
def test_rewards_at_tokens_promote_the_two_dtypes(tokens, last):
    """float32 per-token rewards and a float64 change at the last token (or the other way
    round) add in float64: 0.25 + 0.5 at the last token, exact in both."""
    rewards = rewards_at_tokens(
        torch.tensor([[0.5, 0.25]], dtype=tokens), torch.tensor([0.5], dtype=last), t([[1, 1]])
    )
    assert rewards.dtype == torch.float64
    close(rewards, [[0.5, 0.75]], rtol=0, atol=0)


def test_sequence_kl_is_k1_by_default():
    """log π − log π_ref = 0.5 and −1.5 over two valid tokens (the third masked): k1 sums to −1,
    where k2 or k3 would give a positive sum."""
    close(sequence_kl(t([[0.0, -2.0, 5.0]]), t([[-0.5, -0.5, 0.0]]), t([[1, 1, 0]])), [-1.0])


def test_adaptive_controller_keeps_beta_at_the_band_edges():
    """d_targ 3: the band's edges 3/1.5 = 2 and 3·1.5 = 4.5 are exact in binary, and a KL on
    either edge is inside the band (PPO's rule moves β only below d_targ/1.5 or above
    1.5·d_targ)."""
    controller = AdaptiveKL(1.0, target=3.0)
    for kl in (2.0, 4.5):
        controller.update(kl)
        assert controller.value == 1.0


def test_proportional_controller_counts_one_sample_by_default():
    """β0 = 1, target 1, horizon 10: KL 2 → e = 0.2 (clipped from 1); n_steps 1 by default →
    β = 1 + 0.2·1/10 = 1.02."""
    controller = ProportionalKL(1.0, target=1.0, horizon=10)
    controller.update(2.0)
    assert controller.value == pytest.approx(1.02, rel=1e-15)
