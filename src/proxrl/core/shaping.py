"""DAPO's sampling-side formulas (Yu et al. 2025): the overlong reward shaping and the test of
which groups carry a learning signal.

Group functions take (N,) scores of N/G prompts × G samples, the G samples of a prompt stored
consecutively, as every generator here produces them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from proxrl.registry import Registry


def overlong_penalty(lengths: Tensor, max_length: int, buffer: int, factor: float) -> Tensor:
    """DAPO's soft overlong punishment, added to a response's score.

    With ``L_max = max_length`` and ``L_cache = buffer`` (DAPO eq. 13)::

        R(y) = 0                                   if |y| ≤ L_max − L_cache
             = factor · ((L_max − L_cache) − |y|) / L_cache   if L_max − L_cache < |y| ≤ L_max
             = −factor                             if |y| > L_max

    Departure from the paper: the paper's penalty is 1 at full strength; ``factor`` scales it
    (veRL's ``overlong_buffer.penalty_factor``). Here a response never exceeds the cap
    (``max_new_tokens`` ends it), so the last branch is reached only by ``|y| = L_max``.

    Args:
        lengths: (N,) response lengths in tokens.
        max_length: L_max, the length cap.
        buffer: L_cache ≥ 1, the number of tokens before the cap over which the penalty grows.
        factor: the penalty at the cap.
    Returns:
        (N,) penalties ≤ 0, in the dtype of ``lengths`` if it is floating, else float32.
    """
    if not 1 <= buffer <= max_length:
        raise ValueError(f"buffer must lie in [1, max_length={max_length}], got {buffer}")
    dtype = lengths.dtype if lengths.is_floating_point() else torch.float32
    over = lengths.to(dtype) - (max_length - buffer)
    return -factor * (over / buffer).clamp(0.0, 1.0)


def informative_groups(scores: Tensor, group_size: int) -> Tensor:
    """DAPO's dynamic-sampling filter: a group whose G scores are all equal has zero advantage
    under every group baseline and teaches nothing; keep the others.

    Exact equality, as DAPO (``std == 0``): scores are rewards, not the result of a reduction.
    (N,) → (N / G,) bool, True for a group whose scores are not all equal.
    """
    if scores.dim() != 1 or group_size < 1 or scores.numel() % group_size:
        raise ValueError(
            f"expected (N,) scores in groups of {group_size}, got shape {tuple(scores.shape)}"
        )
    groups = scores.view(-1, group_size)
    return (groups != groups[:, :1]).any(dim=1)


NO_STOP_RULES: Registry[Callable[[Tensor, float], Tensor]] = Registry("no-stop rule")
"""``no_stop_mode`` → (scores (B,), no_stop_penalty) → the score of a response that did not
stop."""
NO_STOP_RULES.add(
    "replace", lambda scores, penalty: torch.full_like(scores, penalty), "the score becomes it"
)
NO_STOP_RULES.add(
    "subtract", lambda scores, penalty: scores - penalty, "it is subtracted from the score"
)
