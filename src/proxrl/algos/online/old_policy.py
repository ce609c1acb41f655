"""Where a rollout's log π_old comes from, decided once when the run opens
(``OldPolicySource.decided``) and read by the rollout (which pass runs, what the sampler is
asked for) and by the update (whether π_old is π at its start, whether it measures the
sampler's mismatch)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from proxrl.algos.online.algorithm import Algorithm
from proxrl.algos.online.critic import Critic
from proxrl.algos.online.samplers import ENGINES


@dataclass(frozen=True)
class OldPolicyOptions:
    """The options π_old's source is decided from (``OldPolicySource.decided``), the config's
    of the same names, built when the run opens."""

    sampler_logprobs: bool  # the sampler's log-probs are asked for
    rollout_correction: str  # core.ROLLOUT_CORRECTIONS' name ("none": off)
    rollouts_file: str | None  # trajectories produced elsewhere
    async_rollout: bool  # the samples may lag the policy they train
    sampler: str  # the engine (``samplers.ENGINES``)
    skip_old_logprobs_pass: bool
    ppo_epochs: int
    mini_batch_size: int | None
    responses_per_iteration: int
    teacher_model: str | None
    dynamic_sampling: bool
    mask_truncated: bool


@dataclass(frozen=True)
class OldPolicySource:
    """Where the rollout's log π_old comes from."""

    from_sampler: bool  # the sampler's log-probs stand in for π_old (no pass for them)
    correct: bool  # a rollout correction: the pass gives π_old, the sampler's give the weights
    forward_pass: bool  # the rollout runs its own pass (else, without from_sampler, the update)
    measured: bool = False  # π_old is the trainer's, and the sampler's log-probs are asked for
    # only to measure them against it (``Experience.sampler_logprobs``)
    recorded: bool = False  # the sampler's log-probs are a rollouts file's recorded numbers
    reused_by_update: bool = True  # the update's first step takes log π_old as π at its start
    # (``update.UpdateSettings.old_is_trainers_pass``): see ``decided`` for where this is
    # narrower than ``not from_sampler``

    @classmethod
    def decided(cls, options: OldPolicyOptions, algo: Algorithm, critic: Critic) -> OldPolicySource:
        """A value head reads the pass's hidden state, so the pass runs anyway, and with
        sampler_logprobs alone its log-probs are π_old: the same weights sampled. Not under
        async_rollout: the batch was sampled by the policy one or more versions back, and the
        pass would give the current policy's, leaving the lag uncorrected. π_old is then the
        engine's (the behaviour policy's), as without a value head; the pass gives V_old.

        Without sampler_logprobs an engine with kernels of its own (vLLM: ``ENGINES``' trait
        ``own_kernels``) is still asked for its log-probs, which it computes as it samples, so
        the mismatch the trainer's π_old leaves unmeasured is logged; the built-in samplers run
        the trainer's own module, whose numbers the pass repeats to round-off.

        A rollouts file's log-probs are π_old, or with a rollout correction the trainer's pass
        gives π_old and the recorded ones the weights.

        ``reused_by_update`` is false wherever sampler_logprobs is set without a correction, or
        a rollouts file is read: also where π_old is nevertheless the trainer's pass over the
        weights the update starts from (a value head's pass without async_rollout; a rollouts
        file's with a correction). There a step selection (``Algorithm.step_selection``) runs a
        forward of its own for log π instead of reading log π_old; both are π at the update's
        start, their numbers equal to the forwards' round-off. Kept as it was: making it
        ``not from_sampler`` could move a selection's numbers in those two cases."""
        o = options
        correct = o.sampler_logprobs and o.rollout_correction != "none"
        reused = not (o.sampler_logprobs and not correct) and o.rollouts_file is None
        if o.rollouts_file is not None:
            return replace(cls.of_recorded(o.rollout_correction != "none"), reused_by_update=reused)
        behind = o.async_rollout  # the samples may lag the policy they train
        own_kernels = ENGINES.trait(o.sampler, "own_kernels")
        return cls(
            from_sampler=o.sampler_logprobs and (behind or not critic.needs_hidden) and not correct,
            correct=correct,
            forward_pass=old_logprobs_pass(o, algo, critic),
            measured=own_kernels and not o.sampler_logprobs,
            reused_by_update=reused,
        )

    @classmethod
    def of_recorded(cls, correct: bool) -> OldPolicySource:
        """π_old from recorded log-probs (a rollouts file's, a client's rollout); with a rollout
        correction (``correct``) the trainer's pass gives π_old and the recorded ones the
        weights."""
        return cls(from_sampler=not correct, correct=correct, forward_pass=True, recorded=True)

    @property
    def sampler_logprobs(self) -> bool:
        return self.from_sampler or self.correct or self.measured

    @property
    def measures_mismatch(self) -> bool:
        """Whether the update measures the sampler's mismatch (``mismatch.MismatchRecord``):
        log π_old is the sampler's, no pass of the trainer's gave it (a rollout correction's
        or a value head's pass does, and then π_old is the trainer's), and it is not a rollouts
        file's recorded numbers. Under async_rollout the engine sampled with weights up to
        ``max_staleness`` updates behind, and the measure holds that lag too, as a rollout
        correction's pass then does."""
        return self.from_sampler and not self.recorded


def old_logprobs_pass(options: OldPolicyOptions, algo: Algorithm, critic: Critic) -> bool:
    """Whether the rollout runs a forward pass of its own for log π_old. Without it the update
    takes π_old = π from its forward (detached: the ratio is exactly 1, approx-KL and clip
    fractions 0), which is the same update and the same logged numbers to round-off only where:

    - the rollout batch gets one optimizer step (ppo_epochs 1, one mini-batch), so π has not
      moved since the rollout when that step's forward runs;
    - π_old is the trainer's own (sampler_logprobs false, hence no rollout_correction): the
      sampler's log-probs differ from the trainer's by the engine's rounding;
    - nothing before the update reads π_old: the KL is paid in the loss (``Algorithm.kl_loss``,
      grpo), not in the reward (ppo, rloo, remax, reinforce, reinforce_pp*, whose advantages are
      KL-shaped), no teacher's term joins the advantages (on-policy distillation), and no value
      head reads the pass's hidden state for V_old;
    - every rollout row reaches the update's forward, where the rollout metrics that read π_old
      (objective/kl, objective/entropy, objective/rlhf_reward) are then computed: not
      dynamic_sampling (those metrics cover the dropped groups too) nor mask_truncated (a
      micro-batch of truncated rows runs no forward).

    The two forwards compute the same function of the weights: dropout is off in every model
    the loop loads (``models.causal_lm.disable_dropout``, LoRA dropout 0), so train() and eval()
    agree, and both run under the same autocast (``mixed_precision``) (under bf16 they agree to its
    rounding, as the pass itself would)."""
    o = options
    one_step = o.ppo_epochs == 1 and o.mini_batch_size == o.responses_per_iteration
    return not (
        o.skip_old_logprobs_pass
        and one_step
        and not o.sampler_logprobs
        and algo.kl_loss is not None
        and o.teacher_model is None
        and not critic.needs_hidden
        and not o.dynamic_sampling
        and not o.mask_truncated
    )
