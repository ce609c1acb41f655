"""VAPO's positive-example NLL (``core.nll``): the mask of positive responses, the rollout's
scale and the term, by hand in float64."""

import pytest
import torch

from proxrl.core import aggregation, positive_nll, positive_responses, positive_scale
from tests.core.helpers import close, prefix_mask, t


def test_positive_responses_of_a_verifiable_reward_are_the_batch_best():
    """0/1 rewards: the correct ones; all wrong or all right: none (nothing to single out)."""
    assert positive_responses(t([0.0, 1.0, 0.0, 1.0])).tolist() == [False, True, False, True]
    assert positive_responses(t([0.0, 0.0, 0.0])).tolist() == [False, False, False]
    assert positive_responses(t([1.0, 1.0])).tolist() == [False, False]
    assert positive_responses(t([0.2, 0.7, 0.5])).tolist() == [False, True, False]


def test_positive_responses_above_a_threshold():
    """A reward model's scores: at or above the threshold."""
    scores = t([-1.0, 0.5, 2.0, 0.49])
    assert positive_responses(scores, 0.5).tolist() == [False, True, True, False]
    with pytest.raises(ValueError, match=r"scores must be \(B,\), got shape \(2, 2\)"):
        positive_responses(t([[0.0, 1.0], [1.0, 0.0]]))


def test_positive_nll_over_the_whole_rollout_is_the_token_mean_of_the_positive_responses():
    """Rows of 3, 2 and 1 tokens, rows 0 and 2 positive (4 of the 6 tokens):
    log π = (−1, −2, −3 | −0.5, −0.5 | −4): the positive responses' token-mean NLL is
    (1 + 2 + 3 + 4)/4 = 2.5; token-mean over every token gives 10/6, times the scale 6/4 = 2.5."""
    logprobs = t([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0], [-4.0, 0.0, 0.0]])
    mask = prefix_mask([3, 2, 1], 3)
    positive = torch.tensor([True, False, True])
    agg = aggregation("token-mean")
    scale = positive_scale(mask, positive, agg)
    assert scale == 6 / 4
    close(positive_nll(logprobs, mask, positive, scale, agg), 2.5)


def test_positive_nll_in_sequence_units():
    """seq-mean-token-sum: the scale counts rows (3 rows, 2 positive → 3/2); the term is
    3/2 · (6 + 4)/3 = 5 = the mean over the positive rows of their summed NLL, (6 + 4)/2."""
    logprobs = t([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0], [-4.0, 0.0, 0.0]])
    mask = prefix_mask([3, 2, 1], 3)
    positive = torch.tensor([True, False, True])
    agg = aggregation("seq-mean-token-sum")
    scale = positive_scale(mask, positive, agg)
    assert scale == 3 / 2
    close(positive_nll(logprobs, mask, positive, scale, agg), 5.0)


def test_positive_nll_without_a_positive_row_is_zero_and_its_micro_batches_add_up():
    """No positive row: scale 0, term 0. Split in micro-batches, each weighed by its units ÷
    the minibatch's (as the update does), the shares add up to the whole batch's term."""
    mask = prefix_mask([3, 2, 1, 3], 3)
    agg = aggregation("token-mean")
    none = torch.zeros(4, dtype=torch.bool)
    assert positive_scale(mask, none, agg) == 0.0
    logprobs = -torch.rand(4, 3, dtype=torch.float64)
    positive = torch.tensor([True, False, True, True])
    scale = positive_scale(mask, positive, agg)
    whole = positive_nll(logprobs, mask, positive, scale, agg)
    total = float(agg.units(mask))
    shares = sum(
        positive_nll(logprobs[rows], mask[rows], positive[rows], scale, agg)
        * float(agg.units(mask[rows]))
        / total
        for rows in (slice(0, 1), slice(1, 3), slice(3, 4))
    )
    close(shares, whole)


def test_positive_responses_is_a_bool_mask_even_when_none_is_positive():
    """The mask indexes rows (``mask[positive]`` in ``positive_scale``): a float 0/1 tensor of
    the same values would index nothing as meant, so the dtype is part of the answer. An empty
    batch has no maximum to compare with and gives an empty mask; a single response is its own
    maximum and, every score equal, is not singled out."""
    for scores in (t([0.0, 0.0]), t([0.0, 1.0]), t([]), t([3.0])):
        assert positive_responses(scores).dtype == torch.bool
    assert positive_responses(t([])).tolist() == []
    assert positive_responses(t([3.0])).tolist() == [False]
    assert positive_responses(t([0.0, 1.0]), 0.5).dtype == torch.bool
