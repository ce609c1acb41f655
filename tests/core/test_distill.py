"""On-policy distillation's formulas by hand (float64, a two-token vocabulary), the chunked
generalised JSD against the whole one, and the chunked form's memory: no tensor of the batch's
(B, T, V) size is made besides the one gradient buffer."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from proxrl.core import (
    DISTILL_LOSSES,
    chunked_generalized_jsd,
    distill_advantage,
    generalized_jsd,
)
from tests.core.helpers import close, t

# student π = (0.5, 0.5) from logits (0, 0); teacher π_T = (0.8, 0.2) from logits (ln 4, 0)
STUDENT, TEACHER = t([0.0, 0.0]), t([math.log(4.0), 0.0])
P, Q = (0.5, 0.5), (0.8, 0.2)


def kl(p, q):
    return sum(a * math.log(a / b) for a, b in zip(p, q, strict=True))


def test_distill_advantage_by_hand():
    """π = 0.5, π_T = 0.25, λ = 2: k1 = ln 2 → −2 ln 2; k3 with r = π_T/π = 0.5: (r − 1) − ln r =
    ln 2 − 0.5 → −2(ln 2 − 0.5); a masked token gets 0."""
    logprobs = t([[math.log(0.5), math.log(0.5)]])
    teacher = t([[math.log(0.25), math.log(0.9)]])
    mask = t([[1.0, 0.0]])
    close(distill_advantage(logprobs, teacher, mask, 2.0), [[-2 * math.log(2), 0.0]])
    close(distill_advantage(logprobs, teacher, mask, 2.0, "k3"), [[-2 * (math.log(2) - 0.5), 0.0]])


@pytest.mark.parametrize(
    ("beta", "expected"),
    [
        (0.0, kl(Q, P)),  # forward KL(π_T‖π) = 0.8 ln 1.6 + 0.2 ln 0.4
        (1.0, kl(P, Q)),  # reverse KL(π‖π_T) = ½ ln 1.5625
        # M = ½π_T + ½π = (0.65, 0.35)
        (0.5, 0.5 * kl(Q, (0.65, 0.35)) + 0.5 * kl(P, (0.65, 0.35))),
        # M = ¼π_T + ¾π = (0.575, 0.425)
        (0.25, 0.25 * kl(Q, (0.575, 0.425)) + 0.75 * kl(P, (0.575, 0.425))),
    ],
)
def test_generalized_jsd_by_hand(beta, expected):
    close(generalized_jsd(STUDENT, TEACHER, beta), expected)
    close(chunked_generalized_jsd(STUDENT[None, None], TEACHER[None, None], beta), [[expected]])


def test_the_endpoints_are_the_two_kls_by_hand_values():
    """The β = 0 and β = 1 numbers themselves, written out."""
    close(generalized_jsd(STUDENT, TEACHER, 0.0), 0.8 * math.log(1.6) + 0.2 * math.log(0.4))
    close(generalized_jsd(STUDENT, TEACHER, 1.0), 0.5 * math.log(1.5625))


def test_temperature_divides_both_logits():
    """T = 2 on a non-uniform student and teacher: the student's logits (ln 4, 0) become (ln 2, 0),
    π = (2/3, 1/3); the teacher's (0, ln 4) become (0, ln 2), π_T = (1/3, 2/3). Reverse and
    forward KL are both ⅔ ln 2 − ⅓ ln 2 = ⅓ ln 2; at β = ½, M = (½, ½) and each side's KL is
    ⅓ ln ⅔ + ⅔ ln ⁴⁄₃. (A student multiplied by T, π = (16/17, 1/17), gives other numbers; with
    the uniform student of the cases above, no temperature changes the student.)"""
    student, teacher = t([math.log(4.0), 0.0]), t([0.0, math.log(4.0)])
    pi, pi_t, m = (2 / 3, 1 / 3), (1 / 3, 2 / 3), (0.5, 0.5)
    cases = {0.0: kl(pi_t, pi), 1.0: kl(pi, pi_t), 0.5: 0.5 * kl(pi_t, m) + 0.5 * kl(pi, m)}
    assert math.isclose(cases[1.0], math.log(2) / 3, rel_tol=1e-12)
    assert math.isclose(cases[0.5], math.log(2 / 3) / 3 + 2 * math.log(4 / 3) / 3, rel_tol=1e-12)
    for beta, expected in cases.items():
        close(generalized_jsd(student, teacher, beta, temperature=2.0), expected)
        close(
            chunked_generalized_jsd(student[None, None], teacher[None, None], beta, 2.0),
            [[expected]],
        )
    # the uniform student and the teacher (ln 4, 0) at T = 2: π_T = (2/3, 1/3), ½ ln 1.125
    close(generalized_jsd(STUDENT, TEACHER, 1.0, temperature=2.0), 0.5 * math.log(1.125))


def test_a_zero_probability_contributes_nothing():
    """A −inf logit (a masked vocabulary entry) is a probability of exactly 0, which adds 0 to a
    KL (0·log 0 = 0), not nan. Student (0, 0, −inf): π = (½, ½, 0); teacher (ln 4, 0, ln 5):
    π_T = (0.4, 0.1, 0.5). KL(π‖π_T) = ½ ln 1.25 + ½ ln 5; with the roles swapped (β = 0:
    KL(π_T‖π), the teacher's 0 in the sum) the same number."""
    student = t([0.0, 0.0, -math.inf])
    teacher = t([math.log(4.0), 0.0, math.log(5.0)])
    expected = 0.5 * math.log(1.25) + 0.5 * math.log(5.0)
    close(generalized_jsd(student, teacher, 1.0), expected)
    close(generalized_jsd(teacher, student, 0.0), expected)


def test_low_precision_logits_are_computed_in_float32():
    """bf16 logits (exact: student (2, 0), teacher (0, 0)) give float32 divergences computed in
    float32: KL(π‖uniform) = Σ π ln(2π), π = (e²/(1+e²), 1/(1+e²)), to float32's rounding (a bf16
    log-softmax is off by ~1e-3)."""
    student = torch.tensor([[[2.0, 0.0]]], dtype=torch.bfloat16)
    teacher = torch.zeros(1, 1, 2, dtype=torch.bfloat16)
    high = math.exp(2) / (1 + math.exp(2))
    expected = sum(p * math.log(2 * p) for p in (high, 1 - high))
    for form in (generalized_jsd, chunked_generalized_jsd):
        value = form(student, teacher, 1.0)
        assert value.dtype == torch.float32, form
        assert math.isclose(value.item(), expected, rel_tol=1e-6), form


@pytest.mark.parametrize("beta", [1.0, 0.5])
def test_the_chunked_gradient_by_hand(beta):
    """d/dz_j of the divergence, p = π, s = log π, m = log M: reverse KL (β = 1):
    p_j (s_j − log π_T,j − KL(π‖π_T)); inside: (1 − β) p_j ((s_j − m_j) − KL(π‖M)). Both
    entries sum to 0 (a softmax's logits)."""
    logits = STUDENT[None, None].clone().requires_grad_(True)
    chunked_generalized_jsd(logits, TEACHER[None, None], beta).sum().backward()
    if beta == 1.0:
        reverse = kl(P, Q)
        expected = [0.5 * (math.log(0.5 / 0.8) - reverse), 0.5 * (math.log(0.5 / 0.2) - reverse)]
    else:
        m = (0.65, 0.35)
        inner = kl(P, m)
        expected = [0.5 * 0.5 * (math.log(0.5 / mj) - inner) for mj in m]
    close(logits.grad[0, 0], expected)


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_chunked_equals_whole(beta, chunk):
    """Values and gradients (under a random weighting of the positions) of the chunked form
    equal the whole form's, for chunks that divide T, do not, and exceed it."""
    generator = torch.Generator().manual_seed(0)
    student = torch.randn(3, 7, 11, dtype=torch.float64, generator=generator)
    teacher = torch.randn(3, 7, 11, dtype=torch.float64, generator=generator) * 2
    weights = torch.rand(3, 7, dtype=torch.float64, generator=generator)
    whole_in = student.clone().requires_grad_(True)
    whole = generalized_jsd(whole_in, teacher, beta, temperature=0.7)
    (whole * weights).sum().backward()
    chunked_in = student.clone().requires_grad_(True)
    chunked = chunked_generalized_jsd(chunked_in, teacher, beta, temperature=0.7, chunk_size=chunk)
    (chunked * weights).sum().backward()
    close(chunked, whole)
    close(chunked_in.grad, whole_in.grad)


class LargestOutputs(TorchDispatchMode):
    """Records the operations that allocate a tensor of at least ``limit`` elements (a result in
    new storage: not a view, alias or in-place write of an argument)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.large: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        given = {
            a.untyped_storage().data_ptr()
            for a in (*args, *(kwargs or {}).values())
            if isinstance(a, torch.Tensor)
        }
        results = out if isinstance(out, (tuple, list)) else (out,)
        for result in results:
            if not isinstance(result, torch.Tensor) or result.numel() < self.limit:
                continue
            if result.untyped_storage().data_ptr() not in given:
                self.large.append(str(func))
        return out


def test_the_chunked_form_holds_no_batch_sized_copy():
    """Forward and backward of B = 2, T = 32, V = 50 in chunks of 4: the only operation that
    allocates more than one chunk's working set (the mixture stacks two (B, chunk, V) copies)
    is the one gradient buffer; the whole form allocates many (both log-softmaxes, the
    probabilities, the products), so the count has power."""
    B, T, V, chunk = 2, 32, 50, 4
    student = torch.randn(B, T, V, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(B, T, V, dtype=torch.float64)
    for form, most in ((chunked_generalized_jsd, 1), (generalized_jsd, None)):
        kwargs = {"chunk_size": chunk} if form is chunked_generalized_jsd else {}
        with LargestOutputs(limit=2 * B * chunk * V + 1) as seen:
            form(student, teacher, 0.5, **kwargs).sum().backward()
        if most is None:
            assert len(seen.large) >= 5, seen.large
        else:
            assert len(seen.large) <= most, seen.large


def test_each_distill_loss_acts_in_exactly_one_place():
    for name, entry in DISTILL_LOSSES.items():
        assert (entry.advantage is None) != (entry.per_token_loss is None), name
    assert tuple(DISTILL_LOSSES) == ("reverse_kl_reward", "gjsd")


def test_chunked_refuses_a_beta_outside_the_unit_interval():
    with pytest.raises(ValueError, match="beta must lie in"):
        chunked_generalized_jsd(STUDENT[None, None], TEACHER[None, None], 1.5)


def test_chunked_covers_more_positions_than_vocabulary_entries():
    """T = 3 positions over a V = 2 vocabulary, one position per chunk: each position gets its
    own divergence (β = 1, teacher π_T = (0.8, 0.2)): students (½, ½) → ½ ln 1.5625, (0.8, 0.2)
    → 0, (0.2, 0.8) → 0.2 ln ¼ + 0.8 ln 4 = 0.6 ln 4."""
    student = t([[[0.0, 0.0], [math.log(4.0), 0.0], [0.0, math.log(4.0)]]])
    teacher = TEACHER.expand(1, 3, 2)
    values = chunked_generalized_jsd(student, teacher, 1.0, chunk_size=1)
    close(values, [[0.5 * math.log(1.5625), 0.0, 0.6 * math.log(4.0)]])


def test_chunked_refuses_logits_of_different_shapes_naming_both():
    """A teacher with a larger vocabulary than the student's is refused, with both shapes."""
    with pytest.raises(ValueError) as refused:
        chunked_generalized_jsd(STUDENT[None, None], t([[[0.0, 0.0, 0.0]]]), 1.0)
    assert str(refused.value) == (
        "student and teacher logits differ in shape: (1, 1, 2) vs (1, 1, 3)"
    )


def test_the_chunked_form_without_a_student_gradient_allocates_no_gradient_buffer():
    """A student that needs no gradient (evaluation): nothing larger than a chunk's working set is
    allocated (the gradient buffer of test_the_chunked_form_holds_no_batch_sized_copy is not
    made); the values are the whole form's."""
    B, T, V, chunk = 2, 32, 50, 4
    generator = torch.Generator().manual_seed(0)
    student = torch.randn(B, T, V, dtype=torch.float64, generator=generator)
    teacher = torch.randn(B, T, V, dtype=torch.float64, generator=generator)
    with LargestOutputs(limit=2 * B * chunk * V + 1) as seen:
        values = chunked_generalized_jsd(student, teacher, 0.5, chunk_size=chunk)
    assert seen.large == []
    close(values, generalized_jsd(student, teacher, 0.5))
