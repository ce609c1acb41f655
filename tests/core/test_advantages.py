import math

import pytest
import torch

from proxrl.core import (
    REWARD_SCALES,
    asymre_advantages,
    discounted_returns,
    gae,
    gae_env,
    gdpo_advantages,
    group_centred_advantages,
    group_scaled_advantages,
    length_adaptive_lam,
    maxrl_advantages,
    mixed_group_advantages,
    rank_advantages,
    reinforce_pp_advantages,
    remax_advantages,
    rloo_advantages,
)
from tests.core.helpers import close, prefix_mask, t

# ---------------------------------------------------------------- naive references


def naive_gae(rewards, values, mask, gamma, lam):
    """Row by row over the list of valid tokens only, in plain Python floats."""
    advantages = torch.zeros_like(values)
    for b in range(values.shape[0]):
        idx = [i for i in range(values.shape[1]) if mask[b, i] == 1]
        running = 0.0
        for k in reversed(range(len(idx))):
            next_value = values[b, idx[k + 1]].item() if k + 1 < len(idx) else 0.0
            delta = rewards[b, idx[k]].item() + gamma * next_value - values[b, idx[k]].item()
            running = delta + gamma * lam * running
            advantages[b, idx[k]] = running
    return advantages, (advantages + values) * mask


def naive_returns(rewards, mask, gamma):
    returns = torch.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        for i in range(rewards.shape[1]):
            if mask[b, i]:
                later = [j for j in range(i, rewards.shape[1]) if mask[b, j]]
                returns[b, i] = sum(gamma**k * rewards[b, j].item() for k, j in enumerate(later))
    return returns


# ---------------------------------------------------------------- token level


def test_discounted_returns_by_hand():
    """γ = 0.5, r = (1, 2, 3): G2 = 3, G1 = 2 + 0.5·3 = 3.5, G0 = 1 + 0.5·3.5 = 2.75.
    With the last token masked its reward 3 is ignored: G1 = 2, G0 = 1 + 0.5·2 = 2."""
    rewards = t([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    close(
        discounted_returns(rewards, t([[1, 1, 1], [1, 1, 0]]), 0.5),
        [[2.75, 3.5, 3.0], [2.0, 2.0, 0.0]],
    )


def test_gae_by_hand():
    """r = (0, 0, 1), V = (0.5, 0.6, 0.7), γ = 1, λ = 0.9, the value after the end is 0:
    δ2 = 1 − 0.7 = 0.3, δ1 = 0.7 − 0.6 = 0.1, δ0 = 0.6 − 0.5 = 0.1;
    A2 = 0.3, A1 = 0.1 + 0.9·0.3 = 0.37, A0 = 0.1 + 0.9·0.37 = 0.433; R = A + V."""
    advantages, returns = gae(t([[0.0, 0.0, 1.0]]), t([[0.5, 0.6, 0.7]]), t([[1, 1, 1]]), 1.0, 0.9)
    close(advantages, [[0.433, 0.37, 0.3]])
    close(returns, [[0.933, 0.97, 1.0]])


def test_gae_lambda_zero_is_the_td_residual():
    """λ = 0: A_t = δ_t = r_t + γV_{t+1} − V_t (V after the last valid token is 0)."""
    rewards, values = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    mask = prefix_mask([5, 3, 1], 5)
    next_values = torch.cat([values[:, 1:], torch.zeros(3, 1, dtype=torch.float64)], 1) * torch.cat(
        [mask[:, 1:], torch.zeros(3, 1, dtype=torch.float64)], 1
    )
    advantages, _ = gae(rewards, values, mask, 0.9, 0.0)
    close(advantages, (rewards + 0.9 * next_values - values) * mask)


def test_gae_lambda_one_is_reward_to_go_minus_value():
    """λ = 1 telescopes: Σ_k γ^k δ_{t+k} = Σ_k γ^k r_{t+k} − V_t."""
    rewards, values = torch.randn(3, 6, dtype=torch.float64), torch.randn(3, 6, dtype=torch.float64)
    mask = prefix_mask([6, 4, 2], 6)
    advantages, returns = gae(rewards, values, mask, 0.95, 1.0)
    close(advantages, (discounted_returns(rewards, mask, 0.95) - values) * mask)
    close(returns, discounted_returns(rewards, mask, 0.95))


@pytest.mark.parametrize("holes", [False, True])
def test_gae_and_returns_match_naive_loops(holes):
    rewards, values = torch.randn(5, 7, dtype=torch.float64), torch.randn(5, 7, dtype=torch.float64)
    mask = prefix_mask([7, 5, 3, 1, 6], 7)
    if holes:  # e.g. tool output inside a response: skipped, not a boundary
        mask[0, 2] = mask[4, 1] = mask[1, 3] = 0
    for gamma, lam in [(1.0, 0.95), (0.9, 0.7), (0.5, 1.0)]:
        advantages, returns = gae(rewards, values, mask, gamma, lam)
        expected_a, expected_r = naive_gae(rewards, values, mask, gamma, lam)
        close(advantages, expected_a)
        close(returns, expected_r)
        close(discounted_returns(rewards, mask, gamma), naive_returns(rewards, mask, gamma))


def test_gae_ignores_masked_positions():
    rewards, values = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    mask = prefix_mask([5, 2, 3], 5)
    mask[0, 1] = 0
    clean = gae(rewards, values, mask, 1.0, 0.95)
    poisoned = gae(
        torch.where(mask.bool(), rewards, torch.nan),
        torch.where(mask.bool(), values, 1e9),
        mask,
        1.0,
        0.95,
    )
    assert torch.equal(clean[0], poisoned[0]) and torch.equal(clean[1], poisoned[1])


# ---------------------------------------------------------------- environments


def naive_gae_env(rewards, values, dones, next_value, gamma, lam):
    T, N = values.shape
    advantages = torch.zeros_like(values)
    for n in range(N):
        running = 0.0
        for step in reversed(range(T)):
            following = next_value[n] if step == T - 1 else values[step + 1, n]
            alive = 1.0 - dones[step, n].item()
            delta = rewards[step, n] + gamma * following * alive - values[step, n]
            running = delta + gamma * lam * alive * running
            advantages[step, n] = running
    return advantages


def test_gae_env_oracle_reward_at_the_end():
    """One episode of 4 steps, reward 1 only at the last (terminal) step, V ≡ 0.5, γ = λ = 0.5:
    δ3 = 1 − 0.5 = 0.5 (terminal: no bootstrap); δ0..2 = 0.5·0.5 − 0.5 = −0.25;
    A3 = 0.5, A2 = −0.25 + 0.25·0.5 = −0.125, A1 = −0.25 + 0.25·(−0.125) = −0.28125,
    A0 = −0.25 + 0.25·(−0.28125) = −0.3203125."""
    advantages, returns = gae_env(
        t([[0.0], [0.0], [0.0], [1.0]]),
        torch.full((4, 1), 0.5, dtype=torch.float64),
        t([[0], [0], [0], [1]]),
        t([0.5]),
        0.5,
        0.5,
    )
    close(advantages, [[-0.3203125], [-0.28125], [-0.125], [0.5]])
    close(returns, advantages + 0.5)


def test_gae_env_done_in_the_middle_and_bootstrap_at_the_end():
    """r ≡ 1, V ≡ 0, the episode ends at step 1, V(s_4) = 2, γ = 0.5, λ = 1:
    A3 = 1 + 0.5·2 = 2, A2 = 1 + 0.5·A3 = 2, A1 = 1 (ended: nothing after), A0 = 1 + 0.5·1 = 1.5."""
    advantages, _ = gae_env(
        torch.ones(4, 1, dtype=torch.float64),
        torch.zeros(4, 1, dtype=torch.float64),
        t([[0], [1], [0], [0]]),
        t([2.0]),
        0.5,
        1.0,
    )
    close(advantages, [[1.5], [1.0], [2.0], [2.0]])


def test_gae_env_matches_naive_loop():
    rewards, values = torch.randn(9, 4, dtype=torch.float64), torch.randn(9, 4, dtype=torch.float64)
    dones = (torch.rand(9, 4) < 0.25).to(torch.float64)
    next_value = torch.randn(4, dtype=torch.float64)
    advantages, returns = gae_env(rewards, values, dones, next_value, 0.99, 0.95)
    close(advantages, naive_gae_env(rewards, values, dones, next_value, 0.99, 0.95))
    close(returns, advantages + values)


def test_gae_env_in_float32_equals_the_step_by_step_recursion_to_the_bit():
    """δ and the decay computed for all steps at once are the same float32 operations in the
    same order as the textbook per-step loop, so a classic run's numbers do not move."""
    g = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(300, 3, generator=g), torch.randn(300, 3, generator=g)
    dones = (torch.rand(300, 3, generator=g) < 0.05).float()
    next_value = torch.randn(3, generator=g)
    not_done = 1.0 - dones
    running, expected = torch.zeros(3), torch.zeros(300, 3)
    for step in reversed(range(300)):
        following = next_value if step == 299 else values[step + 1]
        delta = rewards[step] + 0.99 * following * not_done[step] - values[step]
        running = delta + 0.99 * 0.95 * not_done[step] * running
        expected[step] = running
    advantages, _ = gae_env(rewards, values, dones, next_value, 0.99, 0.95)
    assert torch.equal(advantages, expected)


# ---------------------------------------------------------------- group baselines


def test_group_scaled_advantages_by_hand():
    """Groups (1, 2, 3): mean 2, unbiased std 1 → (−1, 0, 1).
    (0, 0, 4): mean 4/3, deviations (−4/3, −4/3, 8/3), unbiased var (16+16+64)/9/2 = 16/3,
    std 4/√3 → (−1/√3, −1/√3, 2/√3). Scale "none" keeps the deviations."""
    scores = t([1.0, 2.0, 3.0, 0.0, 0.0, 4.0])
    r3 = 3**0.5
    close(group_scaled_advantages(scores, 3, 0.0), [-1.0, 0.0, 1.0, -1 / r3, -1 / r3, 2 / r3])
    close(group_centred_advantages(scores, 3), [-1.0, 0.0, 1.0, -4 / 3, -4 / 3, 8 / 3])


def test_group_scaled_advantages_of_a_uniform_group_are_zero():
    close(group_scaled_advantages(t([1.0, 1.0, 1.0, 1.0]), 2), [0.0, 0.0, 0.0, 0.0])


def test_group_functions_match_naive_loops():
    scores = torch.randn(12, dtype=torch.float64)
    expected_grpo, expected_rloo = [], []
    for g in range(3):
        group = scores[4 * g : 4 * g + 4].tolist()
        mean = sum(group) / 4
        std = (sum((s - mean) ** 2 for s in group) / 3) ** 0.5
        expected_grpo += [(s - mean) / (std + 1e-6) for s in group]
        expected_rloo += [s - (sum(group) - s) / 3 for s in group]
    close(group_scaled_advantages(scores, 4), expected_grpo)
    close(rloo_advantages(scores, 4), expected_rloo)


def test_rank_advantages_by_hand():
    """(3, 1, 2): ranks (2, 0, 1) → 2r/(G−1) − 1 = (1, −1, 0).
    (5, 5, 0): the fives tie for ranks 1 and 2 → 1.5 each; the zero has rank 0 →
    (0.5, 0.5, −1). Every group sums to 0."""
    advantages = rank_advantages(t([3.0, 1.0, 2.0, 5.0, 5.0, 0.0]), 3)
    close(advantages, [1.0, -1.0, 0.0, 0.5, 0.5, -1.0])


def test_rank_advantages_ignore_scale():
    scores = torch.randn(8, dtype=torch.float64)
    close(rank_advantages(scores, 4), rank_advantages(100 * scores.exp(), 4))


def test_mixed_group_advantages_by_hand():
    """(0, 0, 4): GRPO (eps 0) gives (−1/√3, −1/√3, 2/√3); ranks: the zeros tie for 0 and 1
    → 0.5 → 2·0.5/2 − 1 = −0.5, the four → 1. w = 0.5 averages the two; w = 1 is the rank."""
    r3 = 3**0.5
    scores = t([0.0, 0.0, 4.0])
    expected = [0.5 * (-1 / r3) + 0.5 * -0.5, 0.5 * (-1 / r3) + 0.5 * -0.5, 0.5 * (2 / r3) + 0.5]
    close(mixed_group_advantages(scores, 3, 0.5, eps=0.0), expected)
    close(mixed_group_advantages(scores, 3, 1.0), [-0.5, -0.5, 1.0])


def test_rloo_advantages_by_hand():
    """(1, 2, 3): 1 − (2+3)/2 = −1.5, 2 − (1+3)/2 = 0, 3 − (1+2)/2 = 1.5."""
    close(rloo_advantages(t([1.0, 2.0, 3.0]), 3), [-1.5, 0.0, 1.5])


def test_remax_advantages_by_hand():
    """Two prompts × two samples, greedy scores (1.5, 2): (1−1.5, 2−1.5, 3−2, 4−2)."""
    close(remax_advantages(t([1.0, 2.0, 3.0, 4.0]), t([1.5, 2.0])), [-0.5, 0.5, 1.0, 2.0])
    close(remax_advantages(t([1.0, 2.0]), t([0.5, 3.0])), [0.5, -1.0])


def test_reinforce_pp_advantages_by_hand():
    """γ = 0.5. Row 1 rewards (0, 0, 1) → returns (0.25, 0.5, 1); row 2 (0, 1, ·) with its last
    token masked → (0.5, 1). Valid returns 0.25, 0.5, 1, 0.5, 1: mean 0.65, squared deviations
    .16 + .0225 + .1225 + .0225 + .1225 = .45, unbiased var .1125; A = (G − .65)/√(.1125 + 1e-8)."""
    mask = t([[1, 1, 1], [1, 1, 0]])
    advantages = reinforce_pp_advantages(t([[0.0, 0.0, 1.0], [0.0, 1.0, 9.0]]), mask, 0.5)
    expected = (t([[0.25, 0.5, 1.0], [0.5, 1.0, 0.65]]) - 0.65) / (0.1125 + 1e-8) ** 0.5
    close(advantages, expected * mask)


@pytest.mark.parametrize("fn", [group_scaled_advantages, rank_advantages, rloo_advantages])
def test_group_functions_reject_bad_groups(fn):
    with pytest.raises(ValueError, match="at least 2"):
        fn(t([1.0, 2.0]), 1)
    with pytest.raises(ValueError, match="do not split into groups of 2"):
        fn(t([1.0, 2.0, 3.0]), 2)


def test_batch_scaled_advantages_by_hand():
    """Scores 1, 2, 3 | 0, 0, 4: group means 2 and 4/3, so centred −1, 0, 1 | −4/3, −4/3, 8/3;
    batch mean 5/3, squared deviations (4 + 1 + 16 + 25 + 25 + 49)/9 = 40/3, unbiased variance
    8/3: every centred score ÷ (√(8/3) + 1e-6) — one divisor for the whole batch."""
    from proxrl.core import batch_scaled_advantages

    scores = t([1.0, 2.0, 3.0, 0.0, 0.0, 4.0])
    centred = t([-1.0, 0.0, 1.0, -4 / 3, -4 / 3, 8 / 3])
    close(batch_scaled_advantages(scores, 3), centred / (math.sqrt(8 / 3) + 1e-6))


SCORES = t([1.0, 2.0, 3.0, 0.0, 0.0, 4.0])
R3 = 3**0.5
REWARD_SCALE_CASES = {
    # (1, 2, 3) | (0, 0, 4): group stds 1 and 4/√3 (see test_group_scaled_advantages_by_hand)
    "group": [-1 / (1 + 1e-6), 0.0, 1 / (1 + 1e-6)]
    + [-4 / 3 / (4 / R3 + 1e-6), -4 / 3 / (4 / R3 + 1e-6), 8 / 3 / (4 / R3 + 1e-6)],
    # one batch std √(8/3) (see test_batch_scaled_advantages_by_hand)
    "batch": [c / (math.sqrt(8 / 3) + 1e-6) for c in (-1.0, 0.0, 1.0, -4 / 3, -4 / 3, 8 / 3)],
    "none": [-1.0, 0.0, 1.0, -4 / 3, -4 / 3, 8 / 3],
}


def test_every_reward_scale_has_a_case():
    from proxrl.core import REWARD_SCALES

    assert set(REWARD_SCALE_CASES) == set(REWARD_SCALES)


@pytest.mark.parametrize("scale", sorted(REWARD_SCALE_CASES))
def test_reward_scales_by_hand(scale):
    """Each entry of REWARD_SCALES on scores 1, 2, 3 | 0, 0, 4 in groups of 3, eps 1e-6."""
    from proxrl.core import REWARD_SCALES

    close(REWARD_SCALES[scale](SCORES, 3, 1e-6), REWARD_SCALE_CASES[scale])


def test_an_unknown_scale_names_the_closest():
    from proxrl.core import REWARD_SCALES

    with pytest.raises(ValueError, match="unknown reward scale 'grop'.*did you mean group"):
        REWARD_SCALES["grop"]


def test_reinforce_pp_baseline_by_hand():
    """Scores 1, 3 (one group of 2) → centred −1, +1. Lengths 2 and 1, KL rewards −0.1, −0.2 |
    −0.3. Token rewards −0.1, −1.2 | 0.7; reward-to-go −1.3, −1.2 | 0.7; their mean −0.6,
    squared deviations 0.49 + 0.36 + 1.69 = 2.54, unbiased variance 1.27: whitened
    (−0.7, −0.6 | 1.3)/√(1.27 + 1e-8), 0 at the masked position."""
    from proxrl.core import reinforce_pp_baseline_advantages

    mask = t([[1, 1], [1, 0]])
    kl_rewards = t([[-0.1, -0.2], [-0.3, 0.0]])
    expected = t([[-0.7, -0.6], [1.3, 0.0]]) / math.sqrt(1.27 + 1e-8)
    close(reinforce_pp_baseline_advantages(t([1.0, 3.0]), 2, kl_rewards, mask), expected)


def test_gae_flows_across_observation_tokens_by_hand():
    """A two-turn episode: model tokens at t = 0, 1 and 4, an observation at t = 2, 3 (its
    reward 7 and value 9 must never be read). γ = 0.9, λ = 0.8, γλ = 0.72; as veRL checks its
    multi-turn GAE, the advantages are those of the three model tokens alone, side by side:

    δ_4 = r_4 − V_4 = 1 − 0.6 = 0.4;                      A_4 = 0.4
    δ_1 = r_1 + γ·V_4 − V_1 = 0.5 + 0.54 − 0.4 = 0.64;    A_1 = 0.64 + 0.72·0.4 = 0.928
    δ_0 = r_0 + γ·V_1 − V_0 = 0 + 0.36 − 0.2 = 0.16;      A_0 = 0.16 + 0.72·0.928 = 0.82816
    returns = A + V: 1.02816, 1.328, 1.0; 0 at the observation. Row 2 is the same episode with
    the observation removed (its three model tokens first, then padding)."""
    rewards = t([[0.0, 0.5, 7.0, 7.0, 1.0], [0.0, 0.5, 1.0, 0.0, 0.0]])
    values = t([[0.2, 0.4, 9.0, 9.0, 0.6], [0.2, 0.4, 0.6, 0.0, 0.0]])
    mask = t([[1, 1, 0, 0, 1], [1, 1, 1, 0, 0]])
    advantages, returns = gae(rewards, values, mask, 0.9, 0.8)
    close(advantages, t([[0.82816, 0.928, 0, 0, 0.4], [0.82816, 0.928, 0.4, 0, 0]]))
    close(returns, t([[1.02816, 1.328, 0, 0, 1.0], [1.02816, 1.328, 1.0, 0, 0]]))


@pytest.mark.parametrize(
    ("dtype", "group_size", "value"),
    [(torch.float32, 7, 0.7), (torch.float32, 6, 0.3), (torch.float64, 3, 0.1)],
)
@pytest.mark.parametrize("baseline", [*REWARD_SCALES, "rloo"])
def test_a_constant_group_has_exactly_zero_advantage(baseline, dtype, group_size, value):
    """G equal scores carry no signal: every group baseline gives exactly 0, not the round-off of
    their mean (in float32, 7 × 0.7 gives s − mean = 6e-8, which ÷ a std of ~0 made an advantage
    of 0.056 and a full Adam step on nothing). A second, informative group keeps the batch std
    (Lite PPO) away from 0."""
    constant = torch.full((group_size,), value, dtype=dtype)
    informative = torch.linspace(0, 1, group_size, dtype=dtype)
    scores = torch.cat([constant, informative])
    estimate = rloo_advantages if baseline == "rloo" else REWARD_SCALES[baseline]
    advantages = estimate(scores, group_size)
    assert torch.equal(advantages[:group_size], torch.zeros_like(constant))
    assert advantages[group_size:].abs().sum() > 0


# ---------------------------------------------------------------- MaxRL, AsymRE


def test_maxrl_divides_the_centred_score_by_the_group_mean():
    """Groups (1, 0, 0, 0) | (1, 1, 0, 1) | (0, 0, 0, 0) | (1, 1, 1, 1) | (0.5, 0.25, 0, 0.25):
    means 1/4, 3/4, 0, 1, 1/4. A = (r − r̄)/(r̄ + ε): 3/4 ÷ 1/4 = 3 for the one success of a hard
    prompt, 1/4 ÷ 3/4 = 1/3 for a success of an easy one; the constant groups (all 0, all 1)
    exactly 0 (not 0/ε)."""
    eps = 1e-6
    scores = t([1, 0, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0.5, 0.25, 0, 0.25])
    q, h = 0.25 + eps, 0.75 + eps
    expected = [0.75 / q, -0.25 / q, -0.25 / q, -0.25 / q]
    expected += [0.25 / h, 0.25 / h, -0.75 / h, 0.25 / h]
    expected += [0.0] * 8
    expected += [0.25 / q, 0.0, -0.25 / q, 0.0]
    close(maxrl_advantages(scores, 4, eps), expected)


def test_maxrl_refuses_a_negative_reward_in_one_line():
    with pytest.raises(ValueError, match=r"^maxrl takes rewards in \[0, 1\]; got -0.5$"):
        maxrl_advantages(t([1.0, -0.5, 0.0, 1.0]), 2)


def test_asymre_shifts_the_group_mean_baseline():
    """Groups (1, 3) | (2, 2, ...): means 2 | 2; δ = −0.1: A = r − 2 + 0.1; the constant group
    gets exactly −δ = 0.1 at each sample (its centred score is exactly 0)."""
    close(asymre_advantages(t([1.0, 3.0, 2.0, 2.0]), 2, -0.1), [-0.9, 1.1, 0.1, 0.1])
    # a constant group of three 0.1s: the mean 0.1 need not round back to 0.1
    close(asymre_advantages(t([0.1, 0.1, 0.1]), 3, 0.25), [-0.25] * 3, rtol=0, atol=0)


def test_maxrl_a_constant_group_is_exactly_zero():
    """Three 0.1s: their mean need not round back to 0.1, and ÷ (0.1 + ε) would blow that up."""
    close(maxrl_advantages(t([0.1, 0.1, 0.1]), 3), [0.0] * 3, rtol=0, atol=0)


# ------------------------------------------------ GAE with a λ per response (issue 35)


def test_gae_with_a_lambda_per_response_on_a_ragged_batch_by_hand():
    """Two responses of 3 and 2 tokens, the reward at the end, γ = 1:
    row 0: r = (0, 0, 1), V = (0.5, 0.6, 0.7), λ = 0.5: δ = (0.1, 0.1, 0.3),
           A2 = 0.3, A1 = 0.1 + 0.5·0.3 = 0.25, A0 = 0.1 + 0.5·0.25 = 0.225;
    row 1: r = (0, 2), V = (1.0, 0.5), λ = 1: δ = (−0.5, 1.5), A1 = 1.5, A0 = −0.5 + 1.5 = 1
           (= 2 − 1: λ = 1 is the reward-to-go minus V). Returns A + V, 0 at the pad."""
    rewards = t([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    values = t([[0.5, 0.6, 0.7], [1.0, 0.5, 9.0]])
    mask = prefix_mask([3, 2], 3)
    advantages, returns = gae(rewards, values, mask, 1.0, t([0.5, 1.0]))
    close(advantages, [[0.225, 0.25, 0.3], [1.0, 1.5, 0.0]])
    close(returns, [[0.725, 0.85, 1.0], [2.0, 2.0, 0.0]])


def test_gae_with_two_lambdas_is_two_runs_each_of_its_own_lambda():
    """Policy advantages with λ = 0.95, value targets with λ = 1 (VC-PPO's decoupled λ): each is
    what one GAE at that λ gives; a (B,) λ equal in every row is the float's result exactly."""
    rewards, values = torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64)
    mask = prefix_mask([6, 4, 2, 5], 6)
    per_row, _ = gae(rewards, values, mask, 1.0, t([0.95] * 4))
    same, _ = gae(rewards, values, mask, 1.0, 0.95)
    assert torch.equal(per_row, same)
    _, value_targets = gae(rewards, values, mask, 1.0, 1.0)
    close(value_targets, discounted_returns(rewards, mask, 1.0))
    mixed, _ = gae(rewards, values, mask, 1.0, t([0.95, 1.0, 0.0, 0.5]))
    for row, lam in enumerate([0.95, 1.0, 0.0, 0.5]):
        expected, _ = naive_gae(
            rewards[row : row + 1], values[row : row + 1], mask[row : row + 1], 1.0, lam
        )
        close(mixed[row : row + 1], expected)


def test_gae_refuses_a_lambda_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"lam must be a float or \(2,\), got \(3,\)"):
        gae(t([[0.0], [1.0]]), t([[0.0], [0.0]]), t([[1], [1]]), 1.0, t([0.9, 0.9, 0.9]))


def test_length_adaptive_lam_by_hand():
    """VAPO eq. 8, α = 0.05: l = 40 → 1 − 1/2 = 0.5; l = 100 → 1 − 1/5 = 0.8; l = 10 → 1 − 2 < 0
    → 0; l = 0 → 0; holes (an episode's observations) do not count: 40 model tokens of 50."""
    lengths = [40, 100, 10, 0]
    mask = prefix_mask(lengths, 100)
    close(length_adaptive_lam(mask, 0.05), [0.5, 0.8, 0.0, 0.0])
    holes = prefix_mask([50], 100)
    holes[0, 5:15] = 0
    close(length_adaptive_lam(holes, 0.05), [0.5])
    with pytest.raises(ValueError, match="alpha must be > 0, got 0"):
        length_adaptive_lam(mask, 0.0)


def test_gdpo_normalises_each_reward_in_its_group_then_whitens_the_sum():
    """K = 2 rewards, groups of 2, weights (1, 0.5). Reward 1: (1, 0 | 1, 1): ±0.5/(√½ + ε) and
    the constant group 0. Reward 2: (0, 2 | 4, 0): ∓1/(√2 + ε) | ±2/(2√2 + ε). Weighted sums
    ≈ ±0.3536 (a, −a, b, −b), whitened over the 4: mean 0, unbiased std √((2a² + 2b²)/3)."""
    eps = 1e-6
    scores = t([[1.0, 0.0], [0.0, 2.0], [1.0, 4.0], [1.0, 0.0]])
    a = 0.5 / (math.sqrt(0.5) + eps) - 0.5 / (math.sqrt(2) + eps)
    b = 0.5 * 2 / (2 * math.sqrt(2) + eps)
    std = math.sqrt((2 * a * a + 2 * b * b) / 3)
    close(gdpo_advantages(scores, 2, (1.0, 0.5), eps), [v / (std + eps) for v in (a, -a, b, -b)])


def test_gdpo_a_batch_of_constant_groups_is_exactly_zero():
    scores = t([[0.1, 1.0], [0.1, 1.0], [0.1, 1.0], [0.3, 0.0], [0.3, 0.0], [0.3, 0.0]])
    close(gdpo_advantages(scores, 3, (1.0, 2.0)), [0.0] * 6, rtol=0, atol=0)


def test_gdpo_one_weight_per_reward():
    with pytest.raises(ValueError, match=r"^source_scores must be \(N, 3\), got \(4, 2\)$"):
        gdpo_advantages(t([[0.0, 1.0]] * 4), 2, (1.0, 1.0, 1.0))


# ------------------------------------------------ exact edges (issue 54's mutation check)


def test_a_one_token_wide_batch():
    """T = 1 (every response a single token): returns and GAE read column 0 only.
    Returns γ = 0.9: 2 | 0 (masked). GAE: δ = r − V = 1 − 0.25 = 0.75, A = 0.75, R = 1."""
    close(discounted_returns(t([[2.0], [3.0]]), t([[1], [0]]), 0.9), [[2.0], [0.0]])
    advantages, returns = gae(t([[1.0]]), t([[0.25]]), t([[1]]), 0.9, 0.5)
    close(advantages, [[0.75]])
    close(returns, [[1.0]])


def test_gae_takes_a_float32_lambda_in_the_values_dtype():
    """length_adaptive_lam of an integer mask is float32; with float64 values the decay γλ is
    taken in float64 from λ's float32 value, so each row equals a run with that λ as a Python
    float to the bit (γλ rounded to float32 would not)."""
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(2, 5, dtype=torch.float64, generator=g)
    values = torch.randn(2, 5, dtype=torch.float64, generator=g)
    mask = prefix_mask([5, 3], 5)
    lam = torch.tensor([0.95, 0.7], dtype=torch.float32)
    advantages, _ = gae(rewards, values, mask, 0.9, lam)
    assert advantages.dtype == torch.float64
    for row in range(2):
        one = slice(row, row + 1)
        expected, _ = gae(rewards[one], values[one], mask[one], 0.9, float(lam[row]))
        assert torch.equal(advantages[one], expected)


def test_length_adaptive_lam_dtype():
    """A floating mask's dtype, float32 for an integer or bool mask (torch.finfo needs a float
    dtype); l = 40, α = 0.05: λ = 0.5 in each."""
    mask = prefix_mask([40], 50)
    assert length_adaptive_lam(mask, 0.05).dtype == torch.float64
    for integer in (mask.long(), mask.bool()):
        lam = length_adaptive_lam(integer, 0.05)
        assert lam.dtype == torch.float32
        assert lam.tolist() == [0.5]


def test_gae_env_takes_a_bool_done_mask():
    """gymnasium's terminated | truncated is bool: the same advantages as the 0/1 floats of
    test_gae_env_done_in_the_middle_and_bootstrap_at_the_end."""
    advantages, _ = gae_env(
        torch.ones(4, 1, dtype=torch.float64),
        torch.zeros(4, 1, dtype=torch.float64),
        torch.tensor([[False], [True], [False], [False]]),
        t([2.0]),
        0.5,
        1.0,
    )
    close(advantages, [[1.5], [1.0], [2.0], [2.0]])


@pytest.mark.parametrize("fn", [group_scaled_advantages, rank_advantages, rloo_advantages])
def test_group_functions_refuse_scores_that_are_not_a_vector(fn):
    with pytest.raises(ValueError, match=r"^scores must be \(N,\), got shape \(1, 2\)$"):
        fn(t([[1.0, 2.0]]), 2)


def test_mixed_group_advantages_edges():
    """(0, 0, 4) as test_mixed_group_advantages_by_hand. w = 0 (allowed) is GRPO alone; the
    default eps is 1e-6: the std 4/√3 + 1e-6; w outside [0, 1] is refused in one line."""
    r3 = 3**0.5
    scores = t([0.0, 0.0, 4.0])
    close(mixed_group_advantages(scores, 3, 0.0, eps=0.0), [-1 / r3, -1 / r3, 2 / r3])
    std = 4 / r3 + 1e-6
    expected = [0.5 * (-4 / 3) / std - 0.25, 0.5 * (-4 / 3) / std - 0.25, 0.5 * (8 / 3) / std + 0.5]
    close(mixed_group_advantages(scores, 3, 0.5), expected)
    with pytest.raises(ValueError, match=r"^rank_weight must lie in \[0, 1\], got 1.5$"):
        mixed_group_advantages(scores, 3, 1.5)


def test_remax_refuses_greedy_scores_that_do_not_divide_the_samples():
    with pytest.raises(ValueError, match=r"^2 greedy scores do not divide 3 samples$"):
        remax_advantages(t([1.0, 2.0, 3.0]), t([1.0, 2.0]))


def test_reinforce_pp_baseline_takes_float32_scores_into_float64_rewards():
    """The case of test_reinforce_pp_baseline_by_hand with the scores in float32 (a reward
    model's): the centred scores (−1, +1, exact) join the float64 KL rewards."""
    from proxrl.core import reinforce_pp_baseline_advantages

    mask = t([[1, 1], [1, 0]])
    kl_rewards = t([[-0.1, -0.2], [-0.3, 0.0]])
    scores = torch.tensor([1.0, 3.0], dtype=torch.float32)
    expected = t([[-0.7, -0.6], [1.3, 0.0]]) / math.sqrt(1.27 + 1e-8)
    close(reinforce_pp_baseline_advantages(scores, 2, kl_rewards, mask), expected)


def test_maxrl_default_eps():
    """(1, 0, 0, 0): r̄ = 1/4, A = (r − 1/4)/(1/4 + 1e-6)."""
    q = 0.25 + 1e-6
    close(maxrl_advantages(t([1.0, 0.0, 0.0, 0.0]), 4), [0.75 / q, -0.25 / q, -0.25 / q, -0.25 / q])


GDPO_SCORES = t([[1.0, 0.0], [0.0, 2.0], [1.0, 4.0], [1.0, 0.0]])


def _gdpo_sum(eps):
    """The weighted sums a, −a, b, −b of test_gdpo_normalises_each_reward_..., at eps."""
    a = 0.5 / (math.sqrt(0.5) + eps) - 0.5 / (math.sqrt(2) + eps)
    b = 0.5 * 2 / (2 * math.sqrt(2) + eps)
    return [a, -a, b, -b]


@pytest.mark.parametrize("eps", [0.25, None])
def test_gdpo_uses_its_eps_in_both_stages(eps):
    """eps 0.25 (large enough to show where it is used) in each group's std and in the batch
    whitening; None: the default 1e-6 (grpo calls the two stages with it)."""
    from proxrl.core import batch_whitened, gdpo_normalised_sum

    e = 1e-6 if eps is None else eps
    sums = _gdpo_sum(e)
    std = math.sqrt(sum(v * v for v in sums) / 3)
    whitened = [v / (std + e) for v in sums]
    kwargs = {} if eps is None else {"eps": eps}
    close(gdpo_advantages(GDPO_SCORES, 2, (1.0, 0.5), **kwargs), whitened)
    close(gdpo_normalised_sum(GDPO_SCORES, 2, (1.0, 0.5), **kwargs), sums)
    # batch_whitened alone: 1, 2, 3: mean 2, unbiased std 1
    close(batch_whitened(t([1.0, 2.0, 3.0]), **kwargs), [-1 / (1 + e), 0.0, 1 / (1 + e)])
