"""The rollout + GAE pipeline against hand-computed oracles, and the normalisers.

Oracle environment: one observation, reward 1 only at the 5th step the environment ever takes
(the rollout's last step), a constant critic V ≡ 2, γ = λ = 0.5, N = 1, T = 5.

Truncation at step 2 (time limit 3): the reward of step 2 gets γ·V(final obs) = 1, done_2 = 1.
    rewards = [0, 0, 1, 0, 1], next_value = 2
    δ_t = r_t + γ·V·(1 − d_t) − V:  δ = [−1, −1, 1 − 2, −1, 1 + 1 − 2] = [−1, −1, −1, −1, 0]
    A_4 = 0;  A_3 = −1 + ¼·0 = −1;  A_2 = −1 (done: no continuation);
    A_1 = −1 + ¼·(−1) = −1.25;  A_0 = −1 + ¼·(−1.25) = −1.3125
    returns = A + 2 = [0.6875, 0.75, 1, 1, 2]
Termination at step 2 instead: no bootstrap, rewards = [0, 0, 0, 0, 1], δ_2 = −2, so
    A = [−1 − ¼·1.25, −1 − ¼·2, −2, −1, 0] = [−1.375, −1.5, −2, −1, 0].
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from proxrl.classic.agent import Agent, RolloutPolicy
from proxrl.classic.envs import (
    EpisodeTracker,
    ObsNormalizer,
    RewardScaler,
    RunningMeanStd,
    batch_moments,
    make_vec_env,
    restore_env,
    snapshot_env,
)
from proxrl.classic.rollout import Batch, Collector
from proxrl.core import gae_env


class OracleEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, terminate_at: int | None = None):
        self.total = 0
        self.t = 0
        self.terminate_at = terminate_at

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.total += 1
        self.t += 1
        reward = 1.0 if self.total == 5 else 0.0
        terminated = self.terminate_at is not None and self.t == self.terminate_at
        return np.full(1, 0.5, np.float32), reward, terminated, False, {}


gym.register("proxrl-test/OracleTrunc-v0", entry_point=OracleEnv, max_episode_steps=3)
gym.register(
    "proxrl-test/OracleTerm-v0",
    entry_point=lambda: OracleEnv(terminate_at=3),
    max_episode_steps=100,
)


def _collect(env_id: str):
    envs = make_vec_env(env_id, 1)
    agent = Agent(1, 2, discrete=True)
    with torch.no_grad():  # constant critic V ≡ 2
        agent.critic[-1].weight.zero_()
        agent.critic[-1].bias.fill_(2.0)
    collector = Collector(
        envs,
        agent,
        ObsNormalizer((1,), False, 10.0),
        RewardScaler(1, 0.5, False, 10.0),
        gamma=0.5,
        seed=0,
    )
    rollout = collector.collect(5)
    adv, ret = gae_env(
        rollout.rewards, rollout.values, rollout.dones, rollout.next_value, gamma=0.5, lam=0.5
    )
    return rollout, adv[:, 0].double(), ret[:, 0].double()


def test_truncation_in_the_middle_is_bootstrapped():
    rollout, adv, ret = _collect("proxrl-test/OracleTrunc-v0")
    assert rollout.rewards[:, 0].tolist() == [0, 0, 1, 0, 1]
    assert rollout.dones[:, 0].tolist() == [0, 0, 1, 0, 0]
    expected = torch.tensor([-1.3125, -1.25, -1.0, -1.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(ret, expected + 2, rtol=0, atol=1e-6)
    assert rollout.episodes == [(0.0, 3)]


def test_termination_is_not_bootstrapped():
    rollout, adv, _ = _collect("proxrl-test/OracleTerm-v0")
    assert rollout.rewards[:, 0].tolist() == [0, 0, 0, 0, 1]
    expected = torch.tensor([-1.375, -1.5, -2.0, -1.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)


def _collect_step_by_step(collector: Collector, num_steps: int) -> dict[str, torch.Tensor]:
    """The rollout as the textbook loop computes it: π_old(·|s_t) in torch at each step, the
    action drawn from it with the noise ``RolloutPolicy`` draws (the same generator seeded the
    same way), log π_old and V_old of each step (and V of a truncated episode's final
    observation) from single-row forwards at that step."""
    agent, envs = collector.agent, collector.envs
    rng = np.random.default_rng(int(torch.randint(2**62, ())))
    out: dict[str, list] = {k: [] for k in ("obs", "actions", "logprobs", "values", "rewards")}
    for _ in range(num_steps):
        obs = torch.from_numpy(collector.obs)
        with torch.no_grad():
            dist = agent.dist(obs)
            if agent.discrete:  # inverse CDF at one uniform per row
                cdf = dist.probs.cumsum(-1)
                u = torch.from_numpy(rng.random((len(obs), 1), dtype=np.float32))
                action = (cdf <= u * cdf[:, -1:]).sum(-1)
            else:
                noise = rng.standard_normal(tuple(dist.mean.shape), dtype=np.float32)
                action = dist.mean + dist.stddev * torch.from_numpy(noise)
            out["logprobs"].append(agent.log_prob(dist, action))
            out["values"].append(agent.value(obs))
        out["obs"].append(obs)
        out["actions"].append(action)
        env_action = action.numpy()
        if not collector.discrete:
            env_action = np.clip(env_action, collector.low, collector.high)
        raw, reward, terminated, truncated, info = envs.step(env_action)
        collector.obs = collector.obs_norm(raw, update=True)
        scaled = collector.reward_scaler(reward, terminated | truncated)
        for i in np.flatnonzero(truncated & ~terminated):
            final = collector.obs_norm(info["final_obs"][i][None], update=False)
            with torch.no_grad():
                scaled[i] += collector.gamma * agent.value(torch.from_numpy(final))[0].numpy()
        out["rewards"].append(torch.from_numpy(scaled))
    with torch.no_grad():
        next_value = agent.value(torch.from_numpy(collector.obs))
    return {k: torch.stack(v) for k, v in out.items()} | {"next_value": next_value}


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
def test_the_numpy_draw_and_batched_forwards_equal_the_step_by_step_rollout(env_id):
    """The collector draws actions in NumPy and computes log π_old, V_old and the truncation
    bootstraps in batched torch forwards after the T steps; a twin run of the per-step torch
    loop (same seeds, same noise) must see the same actions, observations, rewards, log-probs
    and values up to float32 rounding. Pendulum truncates at 200 steps, so the bootstrap is
    inside the 2 × 150 steps."""
    twins = []
    for _ in range(2):
        envs = make_vec_env(env_id, 2)
        shape = envs.single_observation_space.shape
        discrete = isinstance(envs.single_action_space, gym.spaces.Discrete)
        act = envs.single_action_space.n if discrete else envs.single_action_space.shape[0]
        torch.manual_seed(0)
        agent = Agent(shape[0], act, discrete)
        if not discrete:  # a policy whose mean and spread both matter
            with torch.no_grad():
                agent.actor[-1].weight.mul_(100.0)
                agent.actor_logstd.fill_(-0.5)
        norm, scaler = ObsNormalizer(shape, True, 10.0), RewardScaler(2, 0.99, True, 10.0)
        twins.append(Collector(envs, agent, norm, scaler, gamma=0.99, seed=3))
    torch.manual_seed(1)
    rollouts = [twins[0].collect(150), twins[0].collect(150)]
    torch.manual_seed(1)
    reference = [_collect_step_by_step(twins[1], 150) for _ in range(2)]
    truncated = 0
    for got, want in zip(rollouts, reference, strict=True):
        assert got.actions.dtype == want["actions"].dtype
        for name in ("obs", "actions", "logprobs", "values", "rewards", "next_value"):
            torch.testing.assert_close(getattr(got, name), want[name], rtol=1e-5, atol=1e-5)
        truncated += sum(1 for _, length in got.episodes if length == 200)
    assert truncated == (2 if env_id == "Pendulum-v1" else 0)


def test_the_numpy_draw_follows_the_policy():
    """200,000 draws at one observation: a Categorical's frequencies are its softmax, a
    Gaussian's sample mean and std its mean and exp(log-std) (tolerances ≈ 5 standard
    errors)."""
    torch.manual_seed(0)
    obs = np.random.default_rng(0).normal(size=(1, 4)).astype(np.float32)
    many = np.repeat(obs, 200_000, axis=0)
    agent = Agent(4, 3, discrete=True)
    with torch.no_grad():
        agent.actor[-1].weight.mul_(100.0)  # logits far from uniform
        probs = agent.dist(torch.from_numpy(obs)).probs[0].numpy()
    counts = np.bincount(RolloutPolicy(agent, seed=1)(many), minlength=3) / len(many)
    assert probs.max() - probs.min() > 0.1
    np.testing.assert_allclose(counts, probs, atol=0.005)

    agent = Agent(4, 2, discrete=False)
    with torch.no_grad():
        agent.actor[-1].weight.mul_(100.0)
        agent.actor_logstd.copy_(torch.tensor([[-1.0, 0.5]]))
        mean = agent.dist(torch.from_numpy(obs)).mean[0].numpy()
    draws = RolloutPolicy(agent, seed=1)(many)
    assert draws.dtype == np.float32 and np.abs(mean).max() > 0.3
    np.testing.assert_allclose(draws.mean(0), mean, atol=0.02)
    np.testing.assert_allclose(draws.std(0), np.exp([-1.0, 0.5]), rtol=0.01)


def test_running_mean_std_equals_the_whole_sample():
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.0, size=(50, 4))
    rms = RunningMeanStd((4,))
    rms.count = 0.0  # without the 1e-4 prior the merge must be exact
    rms.mean, rms.var = np.zeros(4), np.zeros(4)
    for chunk in (data[:7], data[7:8], data[8:]):
        rms.update(chunk)
    np.testing.assert_allclose(rms.mean, data.mean(0), rtol=1e-12)
    np.testing.assert_allclose(rms.var, data.var(0), rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [1, 3, 64])
def test_batch_moments_equal_numpys_mean_and_var_to_the_bit(dtype, rows):
    batch = np.random.default_rng(rows).normal(3.0, 2.0, size=(rows, 11)).astype(dtype)
    mean, var = batch_moments(batch)
    assert mean.dtype == batch.mean(0).dtype and var.dtype == batch.var(0).dtype
    assert np.array_equal(mean, batch.mean(0)) and np.array_equal(var, batch.var(0))


def test_reward_scaler_divides_by_return_std_and_resets_at_episode_end():
    """γ = 0.5, one env: R_1 = 2, rms over {2} merged into the prior (count c = 1e-4, mean 0,
    var 1): mean = 2/(c+1), var = (c + 4c/(c+1))/(c+1) ≈ 5e-4, so r/√var ≈ 89.45; with
    clip 10 the same reward comes out as 10."""
    scaler = RewardScaler(1, gamma=0.5, enabled=True, clip=1e6, eps=0.0)
    clipped = RewardScaler(1, gamma=0.5, enabled=True, clip=10.0, eps=0.0)
    assert clipped(np.array([2.0]), np.array([True])).tolist() == [10.0]
    out = scaler(np.array([2.0]), np.array([True]))
    c = 1e-4
    mean = 2 * 1 / (c + 1)
    var = (1 * c + 0 + 4 * c * 1 / (c + 1)) / (c + 1)
    np.testing.assert_allclose(out, [2.0 / np.sqrt(var)], rtol=1e-6)
    assert abs(scaler.rms.mean - mean) < 1e-12
    assert scaler.returns.tolist() == [0.0]  # reset because the episode ended


def test_obs_normalizer_clips():
    norm = ObsNormalizer((1,), enabled=True, clip=1.5)
    out = norm(np.array([[100.0]]), update=False)  # mean 0, var 1 → 100, clipped to 1.5
    assert out.tolist() == [[1.5]] and out.dtype == np.float32


def test_episode_tracker():
    tracker = EpisodeTracker(2)
    assert tracker.step(np.array([1.0, 2.0]), np.array([False, True])) == [(2.0, 1)]
    assert tracker.step(np.array([1.0, 2.0]), np.array([True, False])) == [(2.0, 2)]


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Hopper-v5"])
def test_env_snapshot_restores_the_exact_trajectory(env_id):
    env, other = gym.make(env_id), gym.make(env_id)
    env.reset(seed=1)
    other.reset(seed=99)
    env.action_space.seed(0)
    discrete = isinstance(env.action_space, gym.spaces.Discrete)
    actions = [i % 2 if discrete else env.action_space.sample() for i in range(25)]
    for x in actions[:5]:  # alternating pushes keep the pole up for all 25 steps
        env.step(x)
    restore_env(other, snapshot_env(env))
    actions = actions[5:]
    a = [env.step(x)[:4] for x in actions]
    b = [other.step(x)[:4] for x in actions]
    for (oa, ra, ta, tra), (ob, rb, tb, trb) in zip(a, b, strict=True):
        assert np.array_equal(oa, ob) and ra == rb and ta == tb and tra == trb
    assert env.unwrapped.np_random.random() == other.unwrapped.np_random.random()


def test_minibatches_are_one_permutation_cut_in_order():
    """An epoch's minibatches are the gathers ``field[perm[i·m : (i+1)·m]]`` of one
    ``torch.randperm`` draw: every sample once, the last minibatch shorter."""
    n = 10
    batch = Batch(
        obs=torch.arange(2 * n, dtype=torch.float32).reshape(n, 2),
        actions=torch.arange(n) % 3,
        logprobs=-torch.arange(n, dtype=torch.float32),
        values=torch.arange(n, dtype=torch.float32) / 2,
        advantages=torch.arange(n, dtype=torch.float32) * 3,
        returns=torch.arange(n, dtype=torch.float32) + 7,
    )
    torch.manual_seed(5)
    got = list(batch.minibatches(4))
    torch.manual_seed(5)
    perm = torch.randperm(n)
    assert [len(m.logprobs) for m in got] == [4, 4, 2]
    for i, minibatch in enumerate(got):
        idx = perm[4 * i : 4 * i + 4]
        for name in ("obs", "actions", "logprobs", "values", "advantages", "returns"):
            assert torch.equal(getattr(minibatch, name), getattr(batch, name)[idx])
    assert sorted(torch.cat([m.values for m in got]).tolist()) == batch.values.tolist()
