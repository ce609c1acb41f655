"""Reward-model ensembles: each member standardised on its own scale, then mean, minimum or
mean − k·std over the members, on hand-computed float64 cases."""

import pytest

from proxrl.core import (
    ENSEMBLE_COMBINATIONS,
    ensemble_mean,
    ensemble_mean_minus_std,
    ensemble_min,
    ensemble_spread,
    standardised_scores,
)
from proxrl.core.ensemble import calibration_statistics
from tests.core.helpers import close, t

# Three members (rows) × two responses (columns).
SCORES = t([[1.0, 4.0], [2.0, 0.0], [6.0, 2.0]])


def test_standardised_scores_by_hand():
    # a member whose training scores had mean 10, std 4: 14 → 1, 6 → −1, 10 → 0
    close(standardised_scores(t([14.0, 6.0, 10.0]), 10.0, 4.0), [1.0, -1.0, 0.0])
    # two members on different scales agree once standardised
    a = standardised_scores(t([3.0, 5.0]), 4.0, 1.0)
    b = standardised_scores(t([-20.0, 20.0]), 0.0, 20.0)
    close(a, b)


@pytest.mark.parametrize("std", [0.0, -1.0, float("nan")])
def test_standardised_scores_refuse_a_scale_that_is_not_positive(std):
    with pytest.raises(ValueError, match="std must be > 0"):
        standardised_scores(t([1.0]), 0.0, std)


def test_mean_min_and_spread_by_hand():
    # response 0: 1, 2, 6 → mean 3, min 1, population variance ((−2)² + (−1)² + 3²)/3 = 14/3
    # response 1: 4, 0, 2 → mean 2, min 0, variance (2² + (−2)² + 0²)/3 = 8/3
    close(ensemble_mean(SCORES), [3.0, 2.0])
    close(ensemble_min(SCORES), [1.0, 0.0])
    close(ensemble_spread(SCORES), [(14 / 3) ** 0.5, (8 / 3) ** 0.5])
    # mean − 0.5 · std: 3 − 0.5·2.16025 = 1.91987, 2 − 0.5·1.63299 = 1.18350
    close(
        ensemble_mean_minus_std(SCORES, 0.5), [3 - 0.5 * (14 / 3) ** 0.5, 2 - 0.5 * (8 / 3) ** 0.5]
    )
    close(ensemble_spread(t([[5.0, -1.0]])), [0.0, 0.0])  # one member: no disagreement


# Every entry of ENSEMBLE_COMBINATIONS on SCORES with k = 0.5 (k does not apply to mean, min).
COMBINATION_CASES = {
    "mean": [3.0, 2.0],
    "min": [1.0, 0.0],
    "mean_minus_std": [3 - 0.5 * (14 / 3) ** 0.5, 2 - 0.5 * (8 / 3) ** 0.5],
}


def test_every_combination_has_a_case():
    assert set(COMBINATION_CASES) == set(ENSEMBLE_COMBINATIONS)


@pytest.mark.parametrize("name", sorted(COMBINATION_CASES))
def test_the_table_picks_each_combination(name):
    close(ENSEMBLE_COMBINATIONS[name](SCORES, 0.5), COMBINATION_CASES[name])


def test_inputs_are_not_mutated():
    before = SCORES.clone()
    for combine in ENSEMBLE_COMBINATIONS.values():
        combine(SCORES, 1.0)
    close(SCORES, before, rtol=0, atol=0)


def test_calibration_statistics_by_hand():
    # scores 1, 2, 6: mean 3; deviations −2, −1, 3 → population variance 14/3
    mean, std = calibration_statistics(t([1.0, 2.0, 6.0]))
    assert mean == 3.0
    assert std == pytest.approx((14 / 3) ** 0.5, rel=1e-15)
    # standardised by them, that batch has mean 0 and std 1
    z = standardised_scores(t([1.0, 2.0, 6.0]), mean, std)
    assert abs(z.mean().item()) < 1e-15 and z.std(correction=0).item() == pytest.approx(1, 1e-15)
    assert calibration_statistics(t([2.0, 2.0])) == (2.0, 0.0)  # nothing to calibrate on


def test_mean_minus_std_subtracts_one_std_by_default():
    # Coste et al.'s uncertainty-weighted mean at k = 1: 3 − √(14/3), 2 − √(8/3)
    close(ensemble_mean_minus_std(SCORES), [3 - (14 / 3) ** 0.5, 2 - (8 / 3) ** 0.5])
