"""A reward-model ensemble as one reward source (``reward_model`` with several models).

Each member scores every response as a single reward model does (its training mean subtracted:
``RewardModelReward``, ``normalize=True``), is divided by the standard deviation of its own
training scores (``reward_std`` in its config, which ``proxrl rm`` stores), and the standardised
scores combine per response as ``reward_ensemble`` says: their mean, their minimum, or mean − k
· std (``core.ensemble``). The ensemble is one source: it takes one of ``reward_weights`` and
logs its combined score as ``reward/reward_model``, each member's standardised mean as
``reward/reward_model_<i>`` and the members' disagreement (their std, averaged over responses)
as ``reward/reward_model_spread``.

A member trained elsewhere has no ``reward_std``: it is calibrated on the first batch it scores
(the first rollout's): that batch's mean and std of its scores become its centre and scale
(``core.calibration_statistics``), logged as ``reward/reward_model_<i>_calibrated_mean`` and
``_calibrated_std`` and kept in the checkpoint (``state_dict``), so a resumed run scores as the
uninterrupted one. Each process calibrates on the rows it scores. To fix the scale instead, add
``"reward_std": <std of its scores>`` (and ``"reward_mean"``) to the member's ``config.json``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from proxrl.core import ENSEMBLE_COMBINATIONS, ensemble_spread, standardised_scores
from proxrl.core.ensemble import calibration_statistics
from proxrl.data.formats import PromptExample
from proxrl.models.scalar_head import unwrap_peft
from proxrl.rollout.rewards import RewardModelReward
from proxrl.runtime.errors import ProxrlError

log = logging.getLogger(__name__)


def training_score_std(member: RewardModelReward, where: str) -> float | None:
    """The std of a member's training scores, from its config (``proxrl rm`` stores it); None
    when the config has none (a model trained elsewhere: calibrated on its first batch)."""
    std = getattr(unwrap_peft(member.model).config, "reward_std", None)
    if std is None:
        return None
    if isinstance(std, bool) or not isinstance(std, (int, float)) or not std > 0:
        raise ProxrlError(
            f"reward_model: {where} has reward_std {std!r} in its config; expected the std of "
            "its training scores, a number > 0"
        )
    return float(std)


@dataclass
class EnsembleReward:
    """Several reward models scored as one source (see the module docstring)."""

    members: list[RewardModelReward]
    scales: list[float | None]  # each member's training-score std (None: calibrated)
    combination: str = "mean"
    std_coef: float = 1.0
    paths: list[str] = field(default_factory=list)  # each member's, for messages
    last_parts: dict[str, float] = field(default_factory=dict)
    calibration: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Member index → (mean, std) of its scores on the first batch, for members without a
    training scale."""

    name = "reward_model"

    @property
    def models(self) -> list[Any]:
        return [m.model for m in self.members]

    @property
    def calibrates(self) -> bool:
        """Some member is calibrated on its first batch (its centre and scale are state)."""
        return any(scale is None for scale in self.scales)

    def state_dict(self) -> dict[str, Any]:
        return {"calibration": {str(i): list(ms) for i, ms in self.calibration.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.calibration = {
            int(i): (float(m), float(s)) for i, (m, s) in state["calibration"].items()
        }

    def _calibrated(self, i: int, scores: Tensor) -> tuple[float, float]:
        """Member ``i``'s (mean, std): fixed by this batch on first use (see the module doc)."""
        if i not in self.calibration:
            mean, std = calibration_statistics(scores.double())
            if not std > 0:
                where = self.paths[i] if i < len(self.paths) else f"member {i}"
                raise ProxrlError(
                    f"reward_model: {where} has no reward_std in its config and its scores on "
                    f"the first batch have std {std:.3g}, nothing to calibrate it on; add "
                    '"reward_std": <the std of its scores> to its config.json'
                )
            self.calibration[i] = (mean, std)
            log.info("reward_model: member %d calibrated: mean %.6g, std %.6g", i, mean, std)
        return self.calibration[i]

    @torch.no_grad()
    def __call__(
        self, prompts: list[PromptExample], completions: list[str], columns: dict[str, list[Any]]
    ) -> Tensor:
        rows, calibrated = [], {}
        for i, (member, scale) in enumerate(zip(self.members, self.scales, strict=True)):
            scores = member(prompts, completions, columns)  # centred by normalize=True
            if scale is None:
                mean, std = calibrated[i] = self._calibrated(i, scores)
                rows.append(standardised_scores(scores, mean, std))
            else:
                rows.append(standardised_scores(scores, 0.0, scale))
        standardised = torch.stack(rows)  # (K, B)
        self.last_parts = {
            f"reward/{self.name}_{i}": row.mean().item() for i, row in enumerate(standardised)
        }
        self.last_parts[f"reward/{self.name}_spread"] = ensemble_spread(standardised).mean().item()
        for member in self.members:  # a text-reading member's REENCODED_MISMATCH (the same
            self.last_parts.update(member.last_parts)  # for each: the policy's tokenizer's)
        for i, (mean, std) in calibrated.items():
            self.last_parts[f"reward/{self.name}_{i}_calibrated_mean"] = mean
            self.last_parts[f"reward/{self.name}_{i}_calibrated_std"] = std
        return ENSEMBLE_COMBINATIONS[self.combination](standardised, self.std_coef)


def calibrated_ensemble(rewards: Any) -> EnsembleReward | None:
    """The run's ensemble when a member of it is calibrated on its first batch (its state goes
    in the checkpoint), else None. A reward actor's sources (placement ray) are not here."""
    sources = getattr(rewards, "sources", ())
    found = [s for s in sources if isinstance(s, EnsembleReward) and s.calibrates]
    return found[0] if found else None
