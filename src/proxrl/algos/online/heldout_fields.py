"""The held-out evaluation fields of ``ppo`` / ``grpo`` (``heldout`` runs them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from proxrl.registry import Registry
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.fields import Range

FINAL_MODELS: Registry[None] = Registry("final model")
"""``final_model`` → which policy a run leaves in its output directory."""
FINAL_MODELS.add("last", None, "the policy after the last iteration")
FINAL_MODELS.add("best", None, "the best by eval/score (best/ holds it either way)", best=True)
FinalModelChoice = FINAL_MODELS.choice()


@dataclass
class HeldOutFields:
    """The held-out evaluation, early-stop and best-policy fields of ``ppo`` / ``grpo``."""

    eval_data: str | None = None
    """Held-out prompts ({"prompt"} or {"messages"} rows) scored every eval_every iterations
    (None: no held-out evaluation)."""
    eval_every: Annotated[int, Range(ge=0)] = 10
    """Evaluate on eval_data every this many iterations (0: only at the end)."""
    eval_reward_fn: str | None = None
    """Held-out metric, module:function called like a reward function, higher is better (None:
    the training reward)."""
    eval_greedy: bool = True
    """Answer held-out prompts greedily (false: sampled with the training temperature, top_k,
    top_p, min_p, from a seed of their own)."""
    eval_batch_size: Annotated[int, Range(ge=1)] = 64
    """Held-out prompts per generation batch."""
    early_stopping_patience: Annotated[int | None, Range(ge=1)] = None
    """Stop after this many evaluations without a new best eval/score (None: never)."""
    stop_on_reward_hacking: bool = False
    """Stop when eval/score falls while the training reward rises (runtime.health's
    reward_hacking rule)."""
    final_model: FinalModelChoice = "last"
    """The policy saved in output_dir at the end: the last one, or the best by eval/score (best/
    holds that one either way)."""

    def validate_held_out(self) -> None:
        if self.eval_data is not None:
            return
        for name, on in (
            ("early_stopping_patience", self.early_stopping_patience is not None),
            ("stop_on_reward_hacking", self.stop_on_reward_hacking),
            ("eval_reward_fn", self.eval_reward_fn is not None),
            ("final_model", FINAL_MODELS.trait(self.final_model, "best")),
        ):
            if on:
                raise ProxrlError(f"{name}: needs eval_data (held-out prompts to score)")
