"""The processed sampling distribution: what a sampler actually draws from, so that the trainer
scores the same distribution.

temperature, then top-k, then top-p, then min-p (transformers' ``generate`` order), −inf outside
the kept set, renormalised. The trainer's π_old, π_θ and π_ref, the samplers' draws and log-probs
and the entropy all go through these functions, so a truncating sampler and the trainer agree
(peers shipped the bug: TRL #4159 scaled by the temperature on one side only; TRL #6789 let the
trainer score the untruncated distribution while vLLM sampled the truncated one).

The reference π_ref is scored through the same function as the policy (its own logits, the
same temperature and truncation). TRL and veRL also put π_ref through the policy's log-prob
function (temperature included); they do not replay truncation on either side. Chosen over the
raw reference because then a policy equal to the reference has a KL of exactly 0, as without
truncation: against a raw π_ref, log π̃(a) − log π_ref(a) ≥ −log(kept mass) > 0 for every
sampled token, so the KL would read positive from the first step and the penalty would push the
policy to spread mass over tokens that are never sampled. π_ref(a) stays finite for any sampled
a (the scored token counts as kept, below).

Like ``core.logprobs`` these work one sequence at a time: the peak extra memory is one (T, V)
slice, never a second (B, T, V) copy. With no truncation (top_k=0, top_p=1, min_p=0) they run the
very operations of ``logprobs_from_logits`` / ``entropy_from_logits``, bit for bit.
"""

from __future__ import annotations

import torch
from torch import Tensor

from proxrl.core.logprobs import (
    entropy_from_logits,
    entropy_from_logprobs,
    logprobs_from_logits,
    output_dtype,
)


def truncates(top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> bool:
    """Whether these settings remove any token at all."""
    return bool(top_k) or top_p < 1.0 or min_p > 0.0


def truncate_logits(
    scaled: Tensor, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> Tensor:
    """(..., V) temperature-scaled logits → (..., V) with −inf outside the kept set.

    - top-k: keep the k largest logits (ties with the k-th kept, as transformers does);
    - top-p (nucleus, Holtzman et al. 2020): over what top-k kept, keep the most probable tokens
      up to and including the one whose cumulative probability reaches p;
    - min-p (Nguyen et al. 2024): over what is left, keep tokens with p_i ≥ min_p · max_j p_j.

    The most probable token is always kept. Not renormalised: a log-softmax of the result is the
    processed log-distribution.
    """
    if top_k:
        kth = torch.topk(scaled, min(top_k, scaled.shape[-1]), dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop_sorted = probs.cumsum(-1) - probs >= top_p  # keep the token that crosses p
        scaled = scaled.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    if min_p > 0.0:
        probs = torch.softmax(scaled, dim=-1)
        scaled = scaled.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), float("-inf"))
    return scaled


def processed_logprobs(
    logits: Tensor,
    tokens: Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> Tensor:
    """log π̃(tokens) of the processed distribution π̃ = softmax(truncate(logits / temperature)).

    Args:
        logits: (B, T, V) unnormalised scores; ``logits[:, t]`` predicts ``tokens[:, t]``.
        tokens: (B, T) token ids (the sampled ones).
        temperature, top_k, top_p, min_p: the sampler's settings (0 / 1 / 0 switch a filter off).
    Returns:
        (B, T) log-probabilities, float32 when the logits are half precision.

    Departure, for finiteness: the scored token always counts as kept. A sampler only draws kept
    tokens, so at sampling time this changes nothing; but a trainer whose logits differ by a
    rounding (another kernel, bf16) or a policy that moved during the update can put a sampled
    token just outside its own kept set, where the exact value is −inf (and the PPO ratio, the
    KL and the gradient NaN). Kept in, its log-prob is renormalised over the kept set plus itself
    (prime-rl does the same). Gradients flow through the kept logits only; the set is a constant.
    """
    if not truncates(top_k, top_p, min_p):
        return logprobs_from_logits(logits, tokens, temperature)
    out_dtype = output_dtype(logits)
    rows = []
    for row_logits, row_tokens in zip(logits, tokens, strict=True):
        scaled = row_logits.to(out_dtype)
        if temperature != 1.0:
            scaled = scaled / temperature
        index = row_tokens.unsqueeze(-1)
        picked = scaled.gather(-1, index)
        kept = truncate_logits(scaled, top_k, top_p, min_p).scatter(-1, index, picked)
        rows.append(picked.squeeze(-1) - torch.logsumexp(kept, dim=-1))
    return torch.stack(rows)


def processed_entropy(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> Tensor:
    """Entropy of the processed distribution at every position: (B, T, V) → (B, T), one
    sequence at a time; removed tokens (p = 0) contribute 0."""
    if not truncates(top_k, top_p, min_p):
        return entropy_from_logits(logits, temperature)
    out_dtype = output_dtype(logits)
    rows = []
    for row_logits in logits:
        scaled = row_logits.to(out_dtype)
        if temperature != 1.0:
            scaled = scaled / temperature
        kept = truncate_logits(scaled, top_k, top_p, min_p)
        rows.append(entropy_from_logprobs(torch.log_softmax(kept, dim=-1)))
    return torch.stack(rows)
