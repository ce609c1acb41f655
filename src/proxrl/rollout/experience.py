"""The record that carries one rollout from sampling to the update.

B responses (prompts × group size, a prompt's G samples consecutive), P prompt columns (left
padded), T response columns (right padded after the stop token). A multi-turn episode's response
holds the model's turns and the observations between them (``action_mask`` tells them apart).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor


@dataclass
class Experience:
    prompt_ids: Tensor  # (B, P) prompt tokens, left-padded
    prompt_mask: Tensor  # (B, P) 1 at real prompt tokens
    response_ids: Tensor  # (B, T) sampled tokens, pad after the stop
    response_mask: Tensor  # (B, T) 1 at response tokens up to and including the stop token
    logprobs: Tensor | None  # (B, T) log π_old(a_t|s_t) of the processed sampling distribution
    # (temperature, top-k, top-p, min-p; ``core.processed_logprobs``); None where π_old is π at
    # the update's only step and its forward gives them (``old_policy.old_logprobs_pass``)
    ref_logprobs: Tensor | None  # (B, T) log π_ref(a_t|s_t), processed the same way; None
    # only with logprobs None and no KL tracked (nothing reads it then)
    values: Tensor  # (B, T) V_old(s_t) of the critic; zeros without one
    scores: Tensor  # (B,) score of each response, after the no-stop penalty and clipping
    # The three fields an estimator fills (``algos.online.advantages.estimate``), once per
    # iteration over the rows that are trained on; None in a rollout fresh from its stages.
    rewards: Tensor | None = None  # (B, T) per-token rewards the advantages are computed from
    advantages: Tensor | None = None  # (B, T) A_t, 0 where masked
    returns: Tensor | None = None  # (B, T) value targets A_t + V_old(s_t)
    greedy_scores: Tensor | None = None  # (B,) score of the greedy decode of each response's prompt
    # (ReMax's baseline), the same for a prompt's G samples so rows select and gather like any
    # other (B,) field; None unless the algorithm decodes greedily
    rollout_weights: Tensor | None = None  # (B, T) rollout-correction weight w_t ≥ 0 of each
    # token's policy loss (``core.correction``: from π_old/π_sampler, no gradient), 0 at
    # padding; None without a rollout_correction
    truncated: Tensor | None = None  # (B,) bool, True where the response hit max_new_tokens
    # without stopping (an EOS or a stop string); None from a rollout that did not record it
    action_mask: Tensor | None = None  # (B, T) 1 at tokens the model sampled, 0 at observation
    # tokens and padding; None for single-turn (then response_mask)
    combined_scores: Tensor | None = None  # (B,) the reward sources' scores combined by the
    # algorithm at scoring time (GDPO: each normalised in its group, weighted, summed); None
    # unless the algorithm combines them (``Algorithm.combine_sources``)
    token_rewards: Tensor | None = None  # (B, T) task rewards at their tokens: a rollouts
    # file's per-token ``rewards``, the score-shaping rules' change to their sum added at the last
    # valid token (``core.rewards_at_tokens``), so a row sums to its ``scores``; 0 at masked
    # positions and padding; before any KL or teacher shaping. PPO's GAE reads them; the
    # critic-free estimators take ``scores``. None: one score per response
    teacher_logprobs: Tensor | None = None  # (B, T) log π_teacher(a_t|s_t) of the sampled tokens,
    # processed as π_old and π_ref are (temperature, top-k, top-p, min-p); None without a teacher
    teacher_argmax: Tensor | None = None  # (B, T) int64, the teacher's likeliest token at s_t
    # (its agreement with the sampled token is logged); None without a teacher
    sampler_logprobs: Tensor | None = None  # (B, T) the sampler's log-probs of the sampled
    # tokens where π_old is the trainer's and they are kept only to be measured against it
    # (``rollout/mismatch_kl``: an engine with kernels of its own); no loss reads them; else None
    loss_selection: Tensor | None = None  # (B, T) 0/1 the tokens the policy loss chose over
    # its whole optimizer step before the micro-batches (``core.TOKEN_SELECTIONS``: clip_cov's
    # drawn, kl_cov's penalised), set by the update for that step; None otherwise

    @property
    def loss_mask(self) -> Tensor:
        """(B, T) the tokens every loss, KL, entropy, value loss, advantage and token count
        reads: the model's own (``action_mask``), or the response's for a single turn.
        Attention reads ``response_mask``: observation tokens are context, not actions."""
        return self.response_mask if self.action_mask is None else self.action_mask

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
        every selected row, so an update never computes on all-pad columns. A field that is
        None stays None."""
        used = self.response_mask[index].any(0).nonzero()
        width = int(used.max()) + 1 if len(used) else 1
        rows: dict[str, Tensor | None] = {}
        for name, tensor in self.tensors().items():
            if tensor is not None:
                tensor = tensor[index]
                if tensor.dim() == 2 and not name.startswith("prompt_"):  # (B, T) response fields
                    tensor = tensor[:, :width]
            rows[name] = tensor
        return replace(self, **rows)

    def tensors(self) -> dict[str, Tensor | None]:
        """Every field by name (None where an optional field is absent)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
