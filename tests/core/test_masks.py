"""The off-policy masks on hand-computed cases (float64): OPSM's per-sequence divergence rule,
M2PO's second-moment trust region, and every entry of OFF_POLICY_MASKS on one case."""

import math

import pytest
import torch

from proxrl.core import OFF_POLICY_MASKS, PolicyLossSettings, m2po_keep, opsm_keep
from tests.core.helpers import close, t

# Ragged rows of 3, 1 and 2 tokens; 9.0 sits in padding (it must not count).
MASK = t([[1, 1, 1], [1, 0, 0], [1, 1, 0]])


def test_opsm_drops_diverged_sequences_with_a_negative_advantage():
    """log μ − log π per token: row 0 (0.3, 0.0, −0.1) mean 0.2/3; row 1 (0.5) mean 0.5; row 2
    (0.05, 0.05) mean 0.05. δ = 0.06: rows 0 and 1 diverged, row 2 did not. A = −1 | −1 | −1:
    rows 0, 1 dropped; with A = +1 on row 0 it is kept however far it diverged."""
    old = t([[-1.0, -1.0, -1.0], [-2.0, 9.0, 9.0], [-0.5, -0.5, 9.0]])
    # log μ − log π is 18 in the padding (π there is −9, not 9): counted, it would drop row 2
    # at δ = 0.06 and rows 1 and 2 at δ = 0.5 (means over all 3 columns: 36.5/3, 18.1/3)
    new = old - t([[0.3, 0.0, -0.1], [0.5, 18.0, 18.0], [0.05, 0.05, 18.0]])
    negative = -MASK
    close(opsm_keep(new, old, negative, MASK, 0.06), [[0, 0, 0], [0, 1, 1], [1, 1, 1]])
    mixed = negative * t([[-1.0], [1.0], [1.0]])  # row 0 positive
    close(opsm_keep(new, old, mixed, MASK, 0.06), [[1, 1, 1], [0, 1, 1], [1, 1, 1]])
    # δ above every divergence keeps all; padding never counts (18 there)
    close(opsm_keep(new, old, negative, MASK, 0.5), torch.ones(3, 3, dtype=torch.float64))


def test_opsm_token_level_advantages_drop_only_the_negative_tokens():
    old, new = t([[0.0, 0.0]]), t([[-1.0, -1.0]])  # mean log(μ/π) = 1 > δ
    close(opsm_keep(new, old, t([[1.0, -1.0]]), t([[1, 1]]), 0.5), [[1, 0]])


def test_m2po_drops_the_largest_second_moments_until_the_rest_is_inside():
    """log r over the 6 valid tokens: 1.0, 0.1, −0.3 | 0.6 | 0.2, 0.0; (log r)² 1, 0.01, 0.09 |
    0.36 | 0.04, 0. All six: mean 1.5/6 = 0.25. τ = 0.11: drop 1 → 0.5/5 = 0.1 ≤ 0.11: stop
    (only the 1.0 token goes). τ = 0.05: drop 1, then 0.36 → 0.14/4 = 0.035 ≤ 0.05: two go. τ = 0.3:
    nothing goes."""
    old = t([[0.0, 0.0, 0.0], [0.0, 9.0, 9.0], [0.0, 0.0, 0.0]])
    new = t([[1.0, 0.1, -0.3], [0.6, 0.0, 0.0], [0.2, 0.0, 7.0]])
    close(m2po_keep(new, old, MASK, 0.11), [[0, 1, 1], [1, 1, 1], [1, 1, 1]])
    close(m2po_keep(new, old, MASK, 0.05), [[0, 1, 1], [0, 1, 1], [1, 1, 1]])
    # τ = 0.09: after the 1.0, 0.1 > 0.09 (the mean of the 5 left, not of all 6: 0.083)
    close(m2po_keep(new, old, MASK, 0.09), [[0, 1, 1], [0, 1, 1], [1, 1, 1]])
    close(m2po_keep(new, old, MASK, 0.3), torch.ones(3, 3, dtype=torch.float64))
    # τ below every (log r)² but the 0: all but that one go
    close(m2po_keep(new, old, MASK, 1e-9), [[0, 0, 0], [0, 1, 1], [0, 1, 1]])


def test_m2po_breaks_ties_by_position():
    """Two equal (log r)² of 1 and a 0: mean 2/3 > τ = 0.6; dropping the first 1 leaves 1/2."""
    keep = m2po_keep(t([[1.0, -1.0, 0.0]]), t([[0.0, 0.0, 0.0]]), t([[1, 1, 1]]), 0.6)
    close(keep, [[0, 1, 1]])


def test_m2po_in_float32_sums_the_rest_without_cancelling():
    """log r = 20 then nine of 0.01: (log r)² 400 and nine of 1e-4 (float32: 0.01² ≈ 9.99999e-5).
    τ = 0.99e-4: after the 400, the rest's mean is 1e-4 > τ, after each further one still 1e-4:
    every token goes, as in float64. Summed as total − prefix in float32, 400.0009 − 400 kept
    ~8.9e-4 of 9e-4 (mean ≈ 0.98e-4 ≤ τ) and the nine tokens stayed (issue 51)."""
    new = torch.tensor([[20.0] + [0.01] * 9])
    old, mask = torch.zeros(1, 10), torch.ones(1, 10)
    assert torch.equal(m2po_keep(new.double(), old.double(), mask.double(), 0.99e-4),
                       torch.zeros(1, 10, dtype=torch.float64))  # fmt: skip
    keep = m2po_keep(new, old, mask, 0.99e-4)
    assert keep.dtype == torch.float32 and torch.equal(keep, torch.zeros(1, 10))


def test_m2po_with_no_valid_token_keeps_everything():
    close(m2po_keep(t([[3.0]]), t([[0.0]]), t([[0]]), 0.1), [[1.0]])


# Every entry of OFF_POLICY_MASKS on one case: two rows of one token, log(μ/π) = 1 and 0.01,
# A = −1; defaults δ = 1e-4 and τ = 0.04: OPSM drops both rows; M2PO drops the first
# ((log r)² 1, 1e-4: mean 0.5 > 0.04, then 1e-4 ≤ 0.04).
MASK_CASES = {"opsm": [[0.0], [0.0]], "m2po": [[0.0], [1.0]]}


def test_every_mask_has_a_case():
    assert set(MASK_CASES) == set(OFF_POLICY_MASKS)


@pytest.mark.parametrize("name", sorted(MASK_CASES))
def test_masks_by_name_by_hand(name):
    old, new = t([[0.0], [0.0]]), t([[-1.0], [-0.01]])
    keep = OFF_POLICY_MASKS[name](
        new, old, t([[-1.0], [-1.0]]), t([[1], [1]]), PolicyLossSettings()
    )
    assert math.isclose(PolicyLossSettings().m2po_tau, 0.04)
    close(keep, MASK_CASES[name])


# Exact boundaries (issue 54's mutation check). Every value below is exact in binary, so the
# comparisons at the boundary are exact too: a ≤ written as < (or > as ≥) fails them.


def test_opsm_keeps_a_divergence_exactly_at_delta_and_a_zero_advantage():
    """log μ − log π = (0.5, 0.25): mean 0.375. δ = 0.375 is not exceeded: kept; δ = 0.25 is:
    dropped. A = 0 is not negative: kept however far the sequence diverged. The keep has the
    dtype of logprobs (float64 here), as the docstring says."""
    old, new, mask = t([[0.0, 0.0]]), t([[-0.5, -0.25]]), t([[1, 1]])
    negative = t([[-1.0, -1.0]])
    at_delta = opsm_keep(new, old, negative, mask, 0.375)
    assert at_delta.dtype == torch.float64
    assert at_delta.tolist() == [[1.0, 1.0]]
    assert opsm_keep(new, old, negative, mask, 0.25).tolist() == [[0.0, 0.0]]
    assert opsm_keep(new, old, t([[0.0, -1.0]]), mask, 0.25).tolist() == [[1.0, 0.0]]


def test_m2po_keeps_the_rest_when_its_mean_is_exactly_tau():
    """log r = (1, 0.5): (log r)² 1, 0.25, mean 0.625 > τ = 0.25; after dropping the 1 the rest's
    mean is 0.25 = τ: it stays. log r = (0.5, −0.5): the mean of all is 0.25 = τ: nothing goes."""
    zeros, mask = t([[0.0, 0.0]]), t([[1, 1]])
    assert m2po_keep(t([[1.0, 0.5]]), zeros, mask, 0.25).tolist() == [[0.0, 1.0]]
    assert m2po_keep(t([[0.5, -0.5]]), zeros, mask, 0.25).tolist() == [[1.0, 1.0]]


def test_m2po_squares_the_log_ratio_not_the_log_probs():
    """log μ = (−1, −2), log π = (−1, −2.5): log r = (0, −0.5), (log r)² = (0, 0.25), mean
    0.125 > τ = 0.1; without the 0.25 the rest is 0: only the second token goes. (log π + log μ)²
    would be (4, 20.25) and drop both."""
    keep = m2po_keep(t([[-1.0, -2.5]]), t([[-1.0, -2.0]]), t([[1, 1]]), 0.1)
    assert keep.tolist() == [[1.0, 0.0]]


def test_m2po_drops_a_single_valid_token_above_tau():
    """One valid token, (log r)² = 1 > τ = 0.5: the rest after it is empty, so it goes (its
    padded neighbour is kept, as padding always is)."""
    keep = m2po_keep(t([[1.0, 7.0]]), t([[0.0, 0.0]]), t([[1, 0]]), 0.5)
    assert keep.tolist() == [[0.0, 1.0]]


def test_m2po_drops_every_valid_token_when_no_rest_is_inside():
    """(log r)² = 1, 1, 0.25 and τ = 0.1: the rests' means 0.75, 0.625, 0.25 all exceed τ, so all
    three go."""
    keep = m2po_keep(t([[1.0, -1.0, 0.5]]), t([[0.0, 0.0, 0.0]]), t([[1, 1, 1]]), 0.1)
    assert keep.tolist() == [[0.0, 0.0, 0.0]]


def test_m2po_breaks_many_ties_by_position():
    """Row 0: 20 tokens of (log r)² = 1; row 1: 20 of 0. τ = 0.25: dropping k of the 1s leaves
    (20 − k)/(40 − k), ≤ 0.25 first at k = 14 (6/26; k = 13 leaves 7/27 > 0.25). The 14 dropped
    are the first 14 by position. (torch's unstable CPU sort orders 17 or more ties otherwise.)"""
    new = t([[1.0, -1.0] * 10, [0.0] * 20])
    keep = m2po_keep(new, torch.zeros_like(new), torch.ones_like(new), 0.25)
    assert keep.tolist() == [[0.0] * 14 + [1.0] * 6, [1.0] * 20]
