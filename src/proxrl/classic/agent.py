"""Actor and critic for classic control and MuJoCo: separate 64-64 tanh MLPs (the PPO paper's
MuJoCo networks), orthogonal initialisation as in CleanRL (gain √2 in hidden layers, 0.01 for
the policy head, 1 for the value head, biases 0).

Discrete actions: a Categorical over the actor's logits. Continuous actions: a diagonal Gaussian
whose mean is the actor's output and whose log-std is a state-independent parameter
(initialised to 0). Log-probabilities and entropies are summed over action dimensions.
"""

from __future__ import annotations

import math

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

    def sample(self, obs: Tensor) -> Tensor:
        """(B, obs_dim) → an action per row drawn from π(·|s): the draw of ``dist(obs).sample()``
        from the same random stream, without building the distribution (the rollout's per-step
        cost)."""
        if self.discrete:
            return self.dist(obs).sample()
        mean = _run(self.actor, obs)
        return torch.normal(mean, self.actor_logstd.expand_as(mean).exp())

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
