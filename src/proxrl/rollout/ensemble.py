"""A reward-model ensemble as one reward source (``reward_model`` with several models).

Each member scores every response as a single reward model does (its training mean subtracted:
``RewardModelReward``, ``normalize=True``), is divided by the standard deviation of its own
training scores (``reward_std`` in its config, which ``proxrl rm`` stores), and the standardised
scores combine per response as ``reward_ensemble`` says: their mean, their minimum, or mean − k
· std (``core.ensemble``). The ensemble is one source: it takes one of ``reward_weights`` and
logs its combined score as ``reward/reward_model``, each member's standardised mean as
``reward/reward_model_<i>`` and the members' disagreement (their std, averaged over responses)
as ``reward/reward_model_spread``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from proxrl.core import ENSEMBLE_COMBINATIONS, ensemble_spread, standardised_scores
from proxrl.data.formats import PromptExample
from proxrl.models.scalar_head import unwrap_peft
from proxrl.rollout.rewards import RewardModelReward
from proxrl.runtime.errors import ProxrlError


def training_score_std(member: RewardModelReward, where: str) -> float:
    """The std of a member's training scores, from its config; a one-line error without it."""
    std = getattr(unwrap_peft(member.model).config, "reward_std", None)
    if not isinstance(std, (int, float)) or not std > 0:
        raise ProxrlError(
            f"reward_model: {where} has no reward_std in its config (proxrl rm stores it); an "
            "ensemble puts each member on the scale of its own training scores"
        )
    return float(std)


@dataclass
class EnsembleReward:
    """Several reward models scored as one source (see the module docstring)."""

    members: list[RewardModelReward]
    scales: list[float]  # each member's training-score std
    combination: str = "mean"
    std_coef: float = 1.0
    last_parts: dict[str, float] = field(default_factory=dict)

    name = "reward_model"

    @property
    def models(self) -> list[Any]:
        return [m.model for m in self.members]

    @torch.no_grad()
    def __call__(
        self, prompts: list[PromptExample], completions: list[str], columns: dict[str, list[Any]]
    ) -> Tensor:
        standardised = torch.stack(
            [
                standardised_scores(member(prompts, completions, columns), 0.0, scale)
                for member, scale in zip(self.members, self.scales, strict=True)
            ]
        )  # (K, B); centred by each member's normalize=True already
        self.last_parts = {
            f"reward/{self.name}_{i}": row.mean().item() for i, row in enumerate(standardised)
        }
        self.last_parts[f"reward/{self.name}_spread"] = ensemble_spread(standardised).mean().item()
        return ENSEMBLE_COMBINATIONS[self.combination](standardised, self.std_coef)
