"""``core.token_logprobs``: ``logprobs_from_logits`` at n positions, chunk by chunk, with a
backward that writes the logits' gradient into one (n, V) buffer. Its values and gradients are
autograd's to the bit (signed zeros included), in a buffer of its own or over the logits
(``in_place``); autograd's graph over the same chunks makes a
zero-filled (n, V) gradient per chunk and a new (n, V) sum per chunk after the first."""

from __future__ import annotations

import pytest
import torch

from proxrl.core import logprobs_from_logits, token_logprobs
from tests.core.allocations import LargeAllocations


def _autograd_chunks(logits: torch.Tensor, tokens: torch.Tensor, temperature: float, chunk: int):
    """What ``rollout.forward`` computed before: the chunks' log-probs through autograd."""
    return torch.cat(
        [
            logprobs_from_logits(
                logits[None, s : s + chunk], tokens[None, s : s + chunk], temperature
            )[0]
            for s in range(0, max(len(logits), 1), chunk)
        ]
    )


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize(("n", "chunk"), [(37, 10), (20, 20), (5, 100), (0, 4)])
def test_values_and_gradients_are_autograds_to_the_bit(in_place, dtype, temperature, n, chunk):
    logits = (torch.randn(n, 300) * 3).to(dtype)
    tokens = torch.randint(0, 300, (n,))
    grad = torch.randn(n, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    if n > 3:  # a clipped token's gradient is exactly 0 (of either sign)
        grad[1], grad[2] = 0.0, -0.0
    ours, theirs = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    # (in place: over a non-leaf's logits, as the head's output is)
    values = token_logprobs(
        ours.view_as(ours) if in_place else ours, tokens, temperature, chunk, in_place
    )
    expected = _autograd_chunks(theirs, tokens, temperature, chunk)
    assert values.dtype == expected.dtype and torch.equal(values, expected)
    values.backward(grad)
    expected.backward(grad)
    assert torch.equal(ours.grad, theirs.grad)
    assert torch.equal(ours.grad.signbit(), theirs.grad.signbit())


def _backward_allocations(compute, *in_place: bool) -> list[str]:  # type: ignore[no-untyped-def]
    """The logits-sized tensors that the backward of ``compute``'s log-probs makes (37
    positions in chunks of 10)."""
    n, vocabulary, chunk = 37, 500, 10
    logits = torch.randn(n, vocabulary, requires_grad=True)
    values = compute(
        logits.view_as(logits), torch.randint(0, vocabulary, (n,)), 0.7, chunk, *in_place
    )
    with LargeAllocations(n * vocabulary) as seen:
        values.sum().backward()
    return seen.ops


def test_its_backward_makes_one_logits_sized_tensor_or_none_in_place():
    assert _backward_allocations(token_logprobs) == ["aten.empty_like.default"]
    assert _backward_allocations(token_logprobs, True) == []  # over the logits themselves
    # what it replaces: a zero-filled gradient per chunk (4), a new sum per chunk after the first
    assert len(_backward_allocations(_autograd_chunks)) == 4 + 3


def test_in_place_refuses_a_second_backward():
    """Its logits hold the gradient after the first backward: autograd's version counter
    refuses a retained graph's second, which would read them as logits."""
    logits = torch.randn(6, 50, requires_grad=True)
    values = token_logprobs(logits.view_as(logits), torch.randint(0, 50, (6,)), 1.0, 4, True)
    values.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        values.sum().backward()
