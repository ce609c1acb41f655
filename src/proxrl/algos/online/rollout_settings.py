"""What the rollout's stages read of the run's options, built once when the run opens (by
``run_settings.run_settings``, in ``run.open_run``): each stage of ``collect`` takes its own
record, not the config."""

from __future__ import annotations

from dataclasses import dataclass

from proxrl.algos.online.episodes import EpisodeSettings
from proxrl.algos.online.old_policy import OldPolicySource
from proxrl.rollout.generation import SamplingSettings


@dataclass(frozen=True)
class SampleSettings:
    """What the sample stage reads (``collect.sample``, and ReMax's greedy decode)."""

    group_size: int  # G responses per prompt, consecutive
    distribution: SamplingSettings  # what is sampled, as the trainer's log-probs replay it
    episodes: EpisodeSettings | None  # multi-turn episodes (None: one response per row)


@dataclass(frozen=True)
class ScoreShaping:
    """The score-shaping rules (``collect.shaped_scores``), in the order they apply."""

    no_stop_penalty: float | None  # the score of a response that did not stop (None: off)
    no_stop_mode: str  # how it applies (core.NO_STOP_RULES)
    overlong_buffer: int  # DAPO's soft overlong punishment over the last N tokens (0: off)
    overlong_penalty: float  # the score lost at max_new_tokens under it
    max_new_tokens: int
    reward_clip: float  # clip to ±reward_clip (0: off)


@dataclass(frozen=True)
class ScoreSettings:
    """What the score stage reads (``collect.score``)."""

    max_new_tokens: int  # a response that reaches it without its EOS did not stop
    shaping: ScoreShaping
    greedy: SampleSettings | None  # ReMax's baseline: each prompt's greedy decode, once per
    # group (None: the algorithm needs no baseline)


@dataclass(frozen=True)
class PassSettings:
    """What the forward-pass stage reads (``collect.forward_passes``): the micro-batch plan
    the update's agrees with, and the rollout correction."""

    micro_batch_size: int
    token_budget: int | None  # the micro-batch plan's max_tokens (micro_batches.token_budget)
    shares_prefix: bool  # a group's prompt forwarded once where the plan allows it
    distribution: SamplingSettings  # the distribution sampled from, as the passes replay it
    rollout_correction: str  # core.ROLLOUT_CORRECTIONS' name (applied where π_old's source
    # says ``correct``)
    rollout_correction_low: float
    rollout_correction_cap: float

    @property
    def packed(self) -> bool:
        """Whether the micro-batches are packed (``micro_batches.packs``)."""
        return self.token_budget != 0


@dataclass(frozen=True)
class RolloutSettings:
    """What ``collect.collect_rollout`` hands its stages, and π_old's source (the run's one)."""

    sampling: SampleSettings
    scoring: ScoreSettings
    passes: PassSettings
    old_policy: OldPolicySource
