"""The record that carries one rollout from sampling to the update.

B responses (prompts × group size, a prompt's G samples consecutive), P prompt columns (left
padded), T response columns (right padded after the stop token).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor


@dataclass
class Experience:
    prompt_ids: Tensor  # (B, P) prompt tokens, left-padded
    prompt_mask: Tensor  # (B, P) 1 at real prompt tokens
    response_ids: Tensor  # (B, T) sampled tokens, pad after the stop
    response_mask: Tensor  # (B, T) 1 at response tokens up to and including the stop token
    logprobs: Tensor  # (B, T) log π_old(a_t|s_t) from temperature-scaled logits
    ref_logprobs: Tensor  # (B, T) log π_ref(a_t|s_t) from temperature-scaled logits
    values: Tensor  # (B, T) V_old(s_t) of the critic; zeros without one
    scores: Tensor  # (B,) score of each response, after the no-stop penalty and clipping
    rewards: Tensor  # (B, T) per-token rewards the advantages are computed from
    advantages: Tensor  # (B, T) A_t, 0 where masked
    returns: Tensor  # (B, T) value targets A_t + V_old(s_t)

    @property
    def input_ids(self) -> Tensor:
        """(B, P+T) prompt and response."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> Tensor:
        """(B, P+T) 1 at real tokens of prompt and response."""
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    def select(self, index: Tensor) -> Experience:
        """The rows ``index`` (a minibatch), trimmed of response columns that are padding in
        every selected row, so an update never computes on all-pad columns."""
        rows = {f.name: getattr(self, f.name)[index] for f in fields(self)}
        used = rows["response_mask"].any(0).nonzero()
        width = int(used.max()) + 1 if len(used) else 1
        for name, tensor in rows.items():
            if tensor.dim() == 2 and not name.startswith("prompt_"):  # (B, T) response fields
                rows[name] = tensor[:, :width]
        return Experience(**rows)
