"""Log-probabilities and entropies of tokens under a model's logits.

A (B, T, V) log-softmax of a language model's logits is the largest tensor of an RLHF step
(B=64, T=1024, V=150k is 40 GB in float32). These functions work one sequence at a time so the
peak extra memory is one (T, V) slice, never a second copy of the whole batch.
"""

from __future__ import annotations

import torch
from torch import Tensor


def logprobs_from_logits(logits: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
    """log softmax(logits / temperature)[tokens].

    Args:
        logits: (B, T, V) unnormalised scores; ``logits[:, t]`` predicts ``tokens[:, t]``.
        tokens: (B, T) token ids.
        temperature: divide the logits first, so the result matches a sampler that used it.
    Returns:
        (B, T) log-probabilities, in float32 when the logits are half precision.
    """
    out_dtype = torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype
    rows = []
    for row_logits, row_tokens in zip(logits, tokens, strict=True):
        row_logits = row_logits.to(out_dtype)
        if temperature != 1.0:
            row_logits = row_logits / temperature
        picked = row_logits.gather(-1, row_tokens.unsqueeze(-1)).squeeze(-1)
        rows.append(picked - torch.logsumexp(row_logits, dim=-1))
    return torch.stack(rows)


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of softmax(logits / temperature) at every position: (B, T, V) → (B, T).

    Computed one sequence at a time as −Σ p·log p, where p = 0 (a −inf logit, e.g. after
    top-k filtering) contributes 0 rather than 0·(−inf) = NaN.
    """
    out_dtype = torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype
    rows = []
    for row_logits in logits:
        z = row_logits.to(out_dtype)
        if temperature != 1.0:
            z = z / temperature
        rows.append(entropy_from_logprobs(torch.log_softmax(z, dim=-1)))
    return torch.stack(rows)


def entropy_from_logprobs(log_p: Tensor) -> Tensor:
    """Entropy −Σ p·log p of a distribution given as log-probabilities over the last dim:
    (..., V) → (...). p = 0 (log p = −inf) contributes 0 rather than 0·(−inf) = NaN. The
    samplers call it on the log-softmax they already hold for each decoding step."""
    p = log_p.exp()
    return -torch.where(p > 0, p * log_p, 0.0).sum(-1)
