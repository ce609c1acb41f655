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
    out_dtype = output_dtype(logits)
    rows = []
    for row_logits, row_tokens in zip(logits, tokens, strict=True):
        row_logits = row_logits.to(out_dtype)
        if temperature != 1.0:
            row_logits = row_logits / temperature
        picked = row_logits.gather(-1, row_tokens.unsqueeze(-1)).squeeze(-1)
        rows.append(picked - torch.logsumexp(row_logits, dim=-1))
    return torch.stack(rows)


class _TokenLogprobs(torch.autograd.Function):
    """``token_logprobs``' forward and its lean backward (one (n, V) gradient buffer, or none:
    ``in_place``)."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        logits: Tensor,
        tokens: Tensor,
        temperature: float,
        chunk: int,
        in_place: bool,
    ) -> Tensor:
        values, sums = [], []
        for s in range(0, max(len(logits), 1), chunk):  # (an empty set: one empty chunk)
            x = _scaled(logits[s : s + chunk], temperature)
            picked = x.gather(-1, tokens[s : s + chunk].unsqueeze(-1)).squeeze(-1)
            sums.append(torch.logsumexp(x, dim=-1))
            values.append(picked - sums[-1])
        ctx.save_for_backward(logits, tokens, torch.cat(sums))
        ctx.temperature, ctx.chunk, ctx.in_place = temperature, chunk, in_place  # type: ignore[attr-defined]
        return torch.cat(values)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: Tensor
    ) -> tuple[Tensor, None, None, None, None]:
        logits, tokens, sums = ctx.saved_tensors  # type: ignore[attr-defined]
        temperature, chunk = ctx.temperature, ctx.chunk  # type: ignore[attr-defined]
        out_dtype = output_dtype(logits)
        # in place: each chunk's gradient over its own logits, read just before (the version
        # counter then refuses a second backward of a retained graph)
        grad_logits = logits if ctx.in_place else torch.empty_like(logits)  # type: ignore[attr-defined]
        for s in range(0, len(logits), chunk):
            x = _scaled(logits[s : s + chunk], temperature)
            g = grad[s : s + chunk].to(out_dtype)
            # autograd's: logsumexp's −g·exp(x − lse), plus gather's zeros with g scattered in
            # (the + 0.0: the zeros' sum turns a −0 into +0, as autograd's does)
            part = (x - sums[s : s + chunk].unsqueeze(-1)).exp_().mul_((-g).unsqueeze(-1))
            part.scatter_add_(-1, tokens[s : s + chunk].unsqueeze(-1), g.unsqueeze(-1))
            part.add_(0.0)
            if temperature != 1.0:
                part.div_(temperature)
            grad_logits[s : s + chunk].copy_(part)
        return grad_logits, None, None, None, None


def _scaled(logits: Tensor, temperature: float) -> Tensor:
    """``logits`` in their output dtype, divided by ``temperature`` (no division at 1)."""
    x = logits.to(output_dtype(logits))
    return x / temperature if temperature != 1.0 else x


def output_dtype(logits: Tensor) -> torch.dtype:
    """The dtype log-probs and entropies of ``logits`` come out in: float32 for half precision,
    else the logits' own."""
    return torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype


def token_logprobs(
    logits: Tensor,
    tokens: Tensor,
    temperature: float = 1.0,
    chunk: int = 1,
    in_place: bool = False,
) -> Tensor:
    """``logprobs_from_logits`` of (n, V) logits at n positions and their (n,) tokens → (n,),
    ``chunk`` positions at a time, with the gradient autograd would give, to the bit, and less
    memory in the backward: one (n, V) buffer for the logits' gradient and one chunk's
    temporaries, where autograd's chunk-by-chunk graph adds a zero-filled (n, V) gradient per
    chunk (its slices' backward) and a copy of it for each view it passes through.

    ``in_place``: the backward writes the gradient over the logits themselves (no (n, V)
    buffer), for a caller whose logits nothing else reads once the forward is done (the passes'
    own head output; autograd refuses, loudly, a graph that saved them elsewhere)."""
    out: Tensor = _TokenLogprobs.apply(  # type: ignore[no-untyped-call]
        logits, tokens, temperature, max(chunk, 1), in_place
    )
    return out


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of softmax(logits / temperature) at every position: (B, T, V) → (B, T).

    Computed one sequence at a time as −Σ p·log p, where p = 0 (a −inf logit, e.g. after
    top-k filtering) contributes 0 rather than 0·(−inf) = NaN.
    """
    out_dtype = output_dtype(logits)
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
