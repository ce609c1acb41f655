"""Actor and critic for classic control and MuJoCo: separate 64-64 tanh MLPs (the PPO paper's
MuJoCo networks), orthogonal initialisation as in CleanRL (gain √2 in hidden layers, 0.01 for
the policy head, 1 for the value head, biases 0).

Discrete actions: a Categorical over the actor's logits. Continuous actions: a diagonal Gaussian
whose mean is the actor's output and whose log-std is a state-independent parameter
(initialised to 0). Log-probabilities and entropies are summed over action dimensions.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor, nn
from torch.distributions import Categorical, Distribution, Normal, kl_divergence


def _layer(n_in: int, n_out: int, gain: float) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def _run(net: nn.Sequential, x: Tensor) -> Tensor:
    """``net(x)`` through each layer's ``forward``: at these sizes nn.Module's call machinery
    (hook checks, six calls a network) costs more than the layers' arithmetic."""
    for layer in net:
        x = layer.forward(x)
    return x


def _mlp(n_in: int, hidden: int, n_out: int, head_gain: float) -> nn.Sequential:
    return nn.Sequential(
        _layer(n_in, hidden, math.sqrt(2)),
        nn.Tanh(),
        _layer(hidden, hidden, math.sqrt(2)),
        nn.Tanh(),
        _layer(hidden, n_out, head_gain),
    )


class Agent(nn.Module):
    """Separate actor and critic networks.

    Args:
        obs_dim: size of the (flattened) observation.
        action_dim: number of discrete actions, or the size of a continuous action.
        discrete: Categorical policy if True, diagonal Gaussian if False.
        hidden: width of both hidden layers.
    """

    def __init__(self, obs_dim: int, action_dim: int, discrete: bool, hidden: int = 64):
        super().__init__()
        self.discrete = discrete
        self.critic = _mlp(obs_dim, hidden, 1, head_gain=1.0)
        self.actor = _mlp(obs_dim, hidden, action_dim, head_gain=0.01)
        if not discrete:
            self.actor_logstd = nn.Parameter(torch.zeros(1, action_dim))

    def actor_parameters(self) -> list[nn.Parameter]:
        """The policy's parameters (network and log-std), in a fixed order."""
        params = list(self.actor.parameters())
        if not self.discrete:
            params.append(self.actor_logstd)
        return params

    def value(self, obs: Tensor) -> Tensor:
        """(B, obs_dim) → (B,) V(s)."""
        return _run(self.critic, obs).squeeze(-1)

    def dist(self, obs: Tensor) -> Distribution:
        """(B, obs_dim) → π(·|s), a batch of B distributions."""
        out = _run(self.actor, obs)
        if self.discrete:
            return Categorical(logits=out)
        return Normal(out, self.actor_logstd.expand_as(out).exp())

    def log_prob(self, dist: Distribution, actions: Tensor) -> Tensor:
        """(B,) log π(a|s), summed over action dimensions for a Gaussian."""
        logp = dist.log_prob(actions)
        return logp if self.discrete else logp.sum(-1)

    def entropy(self, dist: Distribution) -> Tensor:
        """(B,) entropy of π(·|s)."""
        ent = dist.entropy()
        return ent if self.discrete else ent.sum(-1)

    def kl(self, old: Distribution, new: Distribution) -> Tensor:
        """(B,) exact KL[π_old(·|s) ‖ π_new(·|s)] (summed over dimensions for a Gaussian)."""
        kl = kl_divergence(old, new)
        return kl if self.discrete else kl.sum(-1)

    def act(self, dist: Distribution, deterministic: bool) -> Tensor:
        """A sampled action, or the mode (argmax / mean) when ``deterministic``."""
        if not deterministic:
            return dist.sample()
        if self.discrete:
            assert isinstance(dist, Categorical)
            return dist.probs.argmax(-1)
        assert isinstance(dist, Normal)
        return dist.mean


def detach_dist(dist: Distribution) -> Distribution:
    """A copy of ``dist`` cut from the graph (the frozen π_old of an update)."""
    if isinstance(dist, Categorical):
        return Categorical(logits=dist.logits.detach())
    assert isinstance(dist, Normal)
    return Normal(dist.loc.detach(), dist.scale.detach())


class RolloutPolicy:
    """π(·|s) drawn in NumPy, for the rollout's one step of N observations at a time: at N = 1 a
    torch call costs more than its arithmetic, a NumPy one a few microseconds.

    It reads the actor's weights in place (views, not copies), so it follows every update. Its
    noise comes from a NumPy generator seeded from torch's stream, so that a run is reproduced
    and resumed from the torch RNG state alone. The log-probabilities of the drawn actions are
    computed afterwards by ``Agent.log_prob`` in torch, so π_old is torch's own numbers; the
    draw's mean or logits differ from torch's by float32 rounding only.

    Args:
        agent: the actor is a stack of ``nn.Linear`` and ``nn.Tanh`` layers.
        seed: the generator's seed (``Collector`` draws one from torch per rollout).
    """

    def __init__(self, agent: Agent, seed: int):
        self.discrete = agent.discrete
        self.layers: list[tuple[np.ndarray, np.ndarray] | None] = []  # (Wᵀ, b), None for tanh
        for layer in agent.actor:
            if isinstance(layer, nn.Linear):
                self.layers.append((layer.weight.detach().numpy().T, layer.bias.detach().numpy()))
            elif isinstance(layer, nn.Tanh):
                self.layers.append(None)
            else:
                raise TypeError(f"RolloutPolicy: no NumPy form for {type(layer).__name__}")
        self.log_std = None if agent.discrete else agent.actor_logstd.detach().numpy()
        self.rng = np.random.default_rng(seed)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """(N, obs_dim) float32 → (N,) int64 action indices, or (N, act_dim) float32 samples
        ``mean + std·ε`` (unclipped)."""
        x = obs
        for layer in self.layers:
            x = np.tanh(x) if layer is None else x @ layer[0] + layer[1]
        if self.discrete:  # inverse CDF of softmax(logits) at one uniform per row
            probs = np.exp(x - x.max(-1, keepdims=True))
            cdf = np.cumsum(probs, -1)
            u = self.rng.random((len(x), 1), dtype=np.float32) * cdf[:, -1:]
            return np.minimum((cdf <= u).sum(-1), x.shape[-1] - 1).astype(np.int64)
        assert self.log_std is not None
        noise = self.rng.standard_normal(x.shape, dtype=np.float32)
        return (x + np.exp(self.log_std) * noise).astype(np.float32)
