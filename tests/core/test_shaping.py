"""DAPO's overlong shaping and dynamic-sampling filter, and GAE's zero value after the last
token, on hand-computed float64 cases."""

import pytest
import torch

from proxrl.core import gae, informative_groups, overlong_penalty
from tests.core.helpers import close, prefix_mask, t


def test_overlong_penalty_is_zero_before_the_buffer_then_linear_to_the_factor():
    # L_max 10, L_cache 4: free up to 6 tokens, then -0.5 * (|y| - 6) / 4.
    lengths = t([3.0, 6.0, 7.0, 8.0, 9.0, 10.0])
    close(overlong_penalty(lengths, 10, 4, 0.5), [0.0, 0.0, -0.125, -0.25, -0.375, -0.5])


def test_overlong_penalty_takes_integer_lengths_and_a_whole_length_buffer():
    penalty = overlong_penalty(torch.tensor([0, 1, 2, 4]), 4, 4, 1.0)
    assert penalty.dtype == torch.float32
    close(penalty, [0.0, -0.25, -0.5, -1.0], rtol=0, atol=0)


@pytest.mark.parametrize("buffer", [0, 11])
def test_overlong_penalty_rejects_a_buffer_outside_the_cap(buffer):
    with pytest.raises(ValueError, match="buffer must lie in"):
        overlong_penalty(t([1.0]), 10, buffer, 1.0)


def test_informative_groups_drops_exactly_the_constant_groups():
    scores = t([1, 1, 1, 0, 0, 0, 0, 1, 0.5, 0.5, 0.5, 0.5000001])
    assert informative_groups(scores, 3).tolist() == [False, False, True, True]
    assert informative_groups(scores, 4).tolist() == [True, True, True]
    assert informative_groups(t([2.0, 2.0]), 1).tolist() == [False, False]


def test_informative_groups_rejects_a_ragged_batch():
    with pytest.raises(ValueError, match="in groups of 4"):
        informative_groups(t([1.0, 2.0, 3.0]), 4)


# ------------------------------------------- GAE: the value after the last token is zero
# veRL #1960: bootstrapping the last response token from whatever value sits in the next
# column (padding, or the critic's value at EOS) biases every advantage of the response when
# λ < 1. Here the padding column holds a large value that must never be read.


def test_gae_hand_computed_with_garbage_values_after_the_last_token():
    rewards = t([[0.0, 0.0, 1.0, 0.0]])
    values = t([[0.5, 0.6, 0.7, 9.0]])  # column 3 is padding
    mask = prefix_mask([3], 4)
    advantages, returns = gae(rewards, values, mask, gamma=1.0, lam=0.5)
    # δ2 = 1 + 0 − 0.7 = 0.3; δ1 = 0.7 − 0.6 = 0.1; δ0 = 0.6 − 0.5 = 0.1
    # A2 = 0.3; A1 = 0.1 + 0.5·0.3 = 0.25; A0 = 0.1 + 0.5·0.25 = 0.225
    close(advantages, [[0.225, 0.25, 0.3, 0.0]], rtol=1e-12)
    close(returns, [[0.725, 0.85, 1.0, 0.0]], rtol=1e-12)


@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95, 1.0])
def test_gae_with_a_perfect_critic_gives_zero_advantages_for_every_lambda(lam):
    """A critic equal to the true return (1 from every state: the score 1 is paid at the last
    token, γ = 1) leaves nothing to explain, whatever λ; one that bootstrapped the last token
    from the padding value (5.0) would give A_last = 1 + 5 − 1 = 5 and, for λ < 1, shift every
    earlier advantage too."""
    rewards = t([[0.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    values = t([[1.0, 1.0, 1.0, 5.0], [1.0, 1.0, 5.0, 5.0]])
    mask = prefix_mask([3, 2], 4)
    advantages, returns = gae(rewards, values, mask, gamma=1.0, lam=lam)
    close(advantages, torch.zeros(2, 4, dtype=torch.float64), rtol=0, atol=1e-15)
    close(returns, mask, rtol=0, atol=1e-15)
