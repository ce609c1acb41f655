"""update.py's functions called directly (issue 54's mutation check): no trainer, no model loaded.
The policy is ``Table``, one float64 weight per token id whose log π of token v is w[v]
(``policy_forward`` replaced by ``Forward``, which records what it is handed), so every loss,
gradient and step below is computed by hand; the policy loss, the guard, the critic, the
step's selection and the distributed helpers are recorders where what the update hands them is
the point. Each refusal's message is compared whole. Runs in about a second."""

from __future__ import annotations

import contextlib
import math
from dataclasses import replace
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from proxrl.algos.online import update as upd
from proxrl.algos.online.algorithm import Algorithm
from proxrl.algos.online.critic import CriticGradient, NoCritic
from proxrl.algos.online.distill_fields import DistillFields
from proxrl.algos.online.roles import Models
from proxrl.algos.online.rollout_settings import PassSettings
from proxrl.algos.online.update import (
    POLICY_STEPPED,
    Losses,
    OnPolicyRecord,
    Optimization,
    UpdateSettings,
    UpdateStep,
)
from proxrl.core import KL_ESTIMATORS, aggregation
from proxrl.core.distill import DistillLoss
from proxrl.rollout.experience import Experience
from proxrl.rollout.forward import PolicyOutput
from proxrl.rollout.generation import SamplingSettings
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.guard import NonFiniteGuard

F64 = torch.float64
TOKEN_MEAN = aggregation("token-mean")

# ---------------------------------------------------------------------------- the fake world

W = [0.0, 0.5, -0.25, 1.0, 0.75, -1.5, 2.0, 0.125, 0.25]  # w[v]: log π of token v
IDS = [[1, 2, 3], [4, 5, 0], [6, 0, 0], [7, 1, 0]]
MASK = [[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0]]  # 8 tokens: 3, 2, 1, 2
ADVANTAGES = [[1.0, -1.0, 2.0], [0.5, 1.0, 0.0], [-2.0, 0.0, 0.0], [1.0, 3.0, 0.0]]
SHIFT = [0.5, 0.25, 1.0, 0.0]  # log π_old − log π at the start, per row (approx_kl's)
# d/dw of the token-mean of −A·w[id] over the 4 rows (8 tokens): −Σ A at each id / 8
GRAD_ALL = [0.0, -0.5, 0.125, -0.25, -0.0625, -0.125, 0.25, -0.125, 0.0]
LOSS_ALL = 0.09375  # (−2.75 + 1.125 + 4 − 1.625) / 8


class Table(nn.Module):
    """log π(v) = w[v], whatever the context."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(W, dtype=F64))


class Forward:
    """``policy_forward``: log π = w[id] at the response's real tokens (0 at padding), entropy
    w[id]², hidden the ids (B, T, 1), logits [w, −w] (B, T, 2); each call's arguments kept."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, model, input_ids, attention_mask, prompt_length, temperature, **kw):  # type: ignore[no-untyped-def]
        self.calls.append(
            dict(
                model=model,
                input_ids=input_ids,
                attention_mask=attention_mask,
                prompt_length=prompt_length,
                temperature=temperature,
                grad=torch.is_grad_enabled(),
                **kw,
            )
        )
        ids = input_ids[:, prompt_length:]
        mask = attention_mask[:, prompt_length:].to(F64)
        logprobs = model.w[ids] * mask
        entropy = logprobs**2 if kw["with_entropy"] else None
        hidden = ids.to(F64)[..., None] if kw["with_hidden"] else None
        logits = torch.stack([logprobs, -logprobs], -1) if kw["with_logits"] else None
        return PolicyOutput(logprobs, entropy, hidden, None, logits)

    def rows(self) -> list[list[int]]:
        """The first response id of each call's rows (each row's first id is its own)."""
        return [c["input_ids"][:, 2].tolist() for c in self.calls]


@pytest.fixture
def forward(monkeypatch: pytest.MonkeyPatch) -> Forward:
    recorder = Forward()
    monkeypatch.setattr(upd, "policy_forward", recorder)
    return recorder


class PolicyLoss:
    """The token-mean of −A·log π, its stats ``approx_kl`` (of log π_old − log π) and ``adv``;
    each micro-batch it is handed kept."""

    def __init__(self) -> None:
        self.calls: list[tuple[Tensor, Experience]] = []

    def __call__(self, logprobs: Tensor, mb: Experience) -> tuple[Tensor, dict[str, Tensor]]:
        self.calls.append((logprobs, mb))
        mask = mb.loss_mask.to(F64)
        loss = TOKEN_MEAN(-mb.advantages * logprobs, mask)
        kl = TOKEN_MEAN(mb.logprobs - logprobs.detach(), mask)
        return loss, {"approx_kl": kl, "adv": TOKEN_MEAN(mb.advantages, mask)}


def experience(**over: Any) -> Experience:
    """B = 4 rows, P = 2 prompt columns, T = 3 response columns (8 tokens), log π_old = w[id] +
    SHIFT of its row, log π_ref = w[id] − 0.5, float64."""
    ids, mask = torch.tensor(IDS), torch.tensor(MASK)
    logprobs = (torch.tensor(W, dtype=F64)[ids] + torch.tensor(SHIFT, dtype=F64)[:, None]) * mask
    fields: dict[str, Any] = dict(
        prompt_ids=torch.tensor([[1, 2], [0, 3], [4, 5], [0, 6]]),
        prompt_mask=torch.tensor([[1, 1], [0, 1], [1, 1], [0, 1]]),
        response_ids=ids,
        response_mask=mask,
        logprobs=logprobs,
        ref_logprobs=(torch.tensor(W, dtype=F64)[ids] - 0.5) * mask,
        values=torch.zeros(4, 3, dtype=F64),
        scores=torch.tensor([1.0, 0.0, 2.0, -1.0], dtype=F64),
        advantages=torch.tensor(ADVANTAGES, dtype=F64),
    )
    return Experience(**(fields | over))


def passes(**over: Any) -> PassSettings:
    fields: dict[str, Any] = dict(
        micro_batch_size=4,
        token_budget=0,
        shares_prefix=False,
        distribution=SamplingSettings(temperature=1.0),
        rollout_correction="none",
        rollout_correction_low=0.0,
        rollout_correction_cap=2.0,
    )
    return PassSettings(**(fields | over))


def settings(**over: Any) -> UpdateSettings:
    fields: dict[str, Any] = dict(
        ppo_epochs=1,
        responses_per_step=4,
        mini_batch_size=4,
        early_stop_kl=None,
        aggregation=TOKEN_MEAN,
        entropy_coef=0.0,
        max_grad_norm=0.0,
        grad_accum=1,
        max_tokens_per_micro_batch=None,
        passes=passes(),
        mixed_precision="no",
        policy_loss="ppo",
        distill=None,
        old_is_trainers_pass=False,
        measures_mismatch=False,
    )
    return UpdateSettings(**(fields | over))


class Critic(NoCritic):
    """A critic whose value loss is ``weight`` × the token-mean of (hidden − 1)² (no model), or
    one in its own process (``gradient``: what its step reports); its calls kept."""

    def __init__(self, gradient: CriticGradient | None = None, hidden: bool = False) -> None:
        self.gradient, self.needs_hidden = gradient, hidden
        self.module = nn.Linear(1, 1)
        self.calls: list[tuple[Any, ...]] = []

    def loss(self, mb: Experience, hidden: Tensor | None, loss_agg: Any) -> Any:
        self.calls.append(("loss", mb, hidden, loss_agg))
        if hidden is None:
            return super().loss(mb, hidden, loss_agg)
        v_loss = loss_agg((hidden[..., 0] - 1.0) ** 2, mb.loss_mask.to(F64))
        return 0.5 * v_loss, {"value_loss": v_loss}

    def modules(self) -> list[nn.Module]:
        return [self.module]

    def start_step(self, *args: Any) -> None:
        self.calls.append(("start", *args))

    def finish_step(self) -> CriticGradient | None:
        self.calls.append(("finish",))
        return self.gradient

    def clip(self, coefficient: float) -> None:
        self.calls.append(("clip", coefficient))


class Record:
    """A ``ForwardRecord``: each (rows, forward) it is given kept."""

    def __init__(self) -> None:
        self.calls: list[tuple[Tensor, PolicyOutput]] = []

    def add(self, rows: Tensor, out: PolicyOutput) -> None:
        self.calls.append((rows, out))


class Guard(NonFiniteGuard):
    """The run's guard, each check's iteration, parameters and tensors kept."""

    def __init__(self) -> None:
        super().__init__(max_consecutive=100)
        self.calls: list[tuple[int, Any, dict[str, Any]]] = []

    def check(
        self, step: int, loss: Any = None, parameters: Any = None, tensors: Any = None
    ) -> bool:
        self.calls.append((step, parameters, dict(tensors)))
        return super().check(step, loss, parameters, tensors)


def world(algo: Algorithm | None = None, critic: Any = None, **over: Any) -> Losses:
    """Losses over a fresh ``Table``: β 0, the policy trained, iteration 3, prompt width 2."""
    step = over.pop("step", UpdateStep(0.0, True, 3))
    models = Models(Table(), None, critic or NoCritic(), None, teacher=over.pop("teacher", None))
    algo = algo or Algorithm("t", None, PolicyLoss())  # type: ignore[arg-type]
    return Losses(settings(**over), algo, models, 2, step)


def sgd(losses: Losses, lr: float = 1.0) -> list[torch.optim.Optimizer]:
    return [torch.optim.SGD(losses.models.actor.parameters(), lr=lr)]


def grad(losses: Losses) -> list[float]:
    return losses.models.actor.w.grad.tolist()


def refused(error: type[Exception], call: Any, *args: Any) -> str:
    with pytest.raises(error) as info:
        call(*args)
    return str(info.value)


# ---------------------------------------------------------------------------- small pieces


def test_minibatches_split_a_permutation_drawn_from_the_generator():
    generator, twin = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    drawn = upd.minibatches(3, 7, generator)
    order = torch.randperm(7, generator=twin)
    assert [m.tolist() for m in drawn] == [order[:3].tolist(), order[3:6].tolist(), [int(order[6])]]
    assert torch.equal(generator.get_state(), twin.get_state())
    assert sorted(order.tolist()) == list(range(7)) and order.tolist() != list(range(7))


def test_loss_generator_draws_once_for_a_drawing_loss_only():
    generator = torch.Generator().manual_seed(9)
    state = generator.get_state()
    assert upd.loss_generator("ppo", generator) is None
    assert torch.equal(generator.get_state(), state)  # untouched
    drawing = upd.loss_generator("clip_cov", generator)
    twin = torch.Generator().manual_seed(9)
    seed = int(torch.randint(0, 2**62, (), generator=twin))
    assert isinstance(drawing, torch.Generator) and drawing is not generator
    assert drawing.initial_seed() == seed
    assert torch.equal(drawing.get_state(), torch.Generator().manual_seed(seed).get_state())
    assert torch.equal(generator.get_state(), twin.get_state())  # moved by that one draw


def test_check_update_refuses_what_a_sharded_update_cannot_run(monkeypatch):
    plain = experience()
    assert upd.check_update(settings(grad_accum=3, max_tokens_per_micro_batch=64), plain) is None
    monkeypatch.setattr(upd.dist, "world_size", lambda: 2)
    assert upd.check_update(settings(grad_accum=3, max_tokens_per_micro_batch=64), plain) is None
    monkeypatch.setattr(upd.dist, "is_sharded", lambda: True)
    assert upd.check_update(settings(grad_accum=4), plain) is None
    assert upd.check_update(settings(grad_accum=2, max_tokens_per_micro_batch=0), plain) is None
    assert refused(ProxrlError, upd.check_update, settings(grad_accum=3), plain) == (
        "grad_accum: under FSDP/DeepSpeed 3 micro-batches per step must divide across 2 processes"
    )
    packed = settings(grad_accum=2, max_tokens_per_micro_batch=64)
    assert refused(ProxrlError, upd.check_update, packed, plain) == (
        "max_tokens_per_micro_batch: not under FSDP/DeepSpeed (each process must run as many "
        "forwards as the others); use grad_accum"
    )


def test_check_update_gives_a_rollout_without_old_logprobs_one_step_and_its_record():
    fresh = experience(logprobs=None)
    record = upd.check_update(settings(ppo_epochs=1, mini_batch_size=4), fresh)
    assert isinstance(record, OnPolicyRecord) and record.logprobs.shape == (4, 3)
    assert isinstance(upd.check_update(settings(mini_batch_size=5), fresh), OnPolicyRecord)
    message = "a rollout without log π_old takes exactly one optimizer step (π moves after it)"
    assert refused(ValueError, upd.check_update, settings(ppo_epochs=2), fresh) == message
    assert refused(ValueError, upd.check_update, settings(mini_batch_size=3), fresh) == message


def test_nothing_to_train_and_units_count_the_loss_mask():
    action = torch.tensor([[0, 0, 0], [1, 0, 0], [0, 0, 0], [1, 1, 0]])
    rollout = experience(action_mask=action)
    losses = world()
    assert upd.nothing_to_train(losses, rollout, torch.tensor([0, 2]))
    assert not upd.nothing_to_train(losses, rollout, torch.tensor([2, 1]))
    assert upd._units(TOKEN_MEAN, rollout, torch.tensor([3, 1, 0])) == 3.0
    sequences = aggregation("seq-mean-token-sum")
    units = upd._units(sequences, rollout, torch.tensor([0, 2]))
    assert units == 2.0 and type(units) is float
    assert not upd.nothing_to_train(world(aggregation=sequences), rollout, torch.tensor([0, 2]))


def test_optimization_lists_every_optimizers_parameters_and_names_the_critics():
    critic = Critic()
    losses = world(critic=critic)
    actor = losses.models.actor
    extra = nn.Parameter(torch.zeros(2))
    first = torch.optim.SGD([{"params": [actor.w]}, {"params": [extra]}], lr=1.0)
    second = torch.optim.SGD(critic.module.parameters(), lr=1.0)
    optimization = Optimization.of(losses.models, [first, second])
    assert optimization.optimizers == [first, second]
    assert [id(p) for p in optimization.parameters] == [
        id(p) for p in (actor.w, extra, critic.module.weight, critic.module.bias)
    ]
    assert [(n, id(p)) for n, p in optimization.named] == [
        ("w", id(actor.w)),
        ("critic.weight", id(critic.module.weight)),
        ("critic.bias", id(critic.module.bias)),
    ]
    actor.w.grad = torch.ones(9, dtype=F64)
    critic.module.weight.grad = torch.ones(1, 1)
    optimization.zero_grad()
    assert actor.w.grad is None and critic.module.weight.grad is None


# ---------------------------------------------------------------------------- the step


def test_clip_global_norm_clips_by_the_norm_over_here_and_elsewhere():
    a, b, unused = (nn.Parameter(torch.zeros(2, dtype=F64)) for _ in range(3))
    a.grad, b.grad = torch.tensor([3.0, 0.0], dtype=F64), torch.tensor([0.0, 4.0], dtype=F64)
    assert upd.clip_global_norm([a, unused, b], None, math.inf) == (5.0, 1.0)
    assert a.grad.tolist() == [3.0, 0.0] and b.grad.tolist() == [0.0, 4.0]
    norm, coefficient = upd.clip_global_norm([a, unused, b], None, 2.5)
    assert (norm, coefficient) == (5.0, 1.0)  # (the critic is not elsewhere: nothing to scale)
    assert a.grad.tolist() == pytest.approx([1.5, 0.0], abs=1e-6)
    assert b.grad.tolist() == pytest.approx([0.0, 2.0], abs=1e-6)
    a.grad, b.grad = torch.tensor([3.0, 0.0], dtype=F64), torch.tensor([0.0, 4.0], dtype=F64)
    there = CriticGradient(12.0, {})
    norm, coefficient = upd.clip_global_norm([a, unused, b], there, 6.5)  # √(5² + 12²) = 13
    assert norm == 13.0 and coefficient == pytest.approx(6.5 / (13 + 1e-6), rel=1e-15)
    assert coefficient < 0.5
    assert a.grad.tolist() == pytest.approx([3 * coefficient, 0.0], rel=1e-12)
    assert b.grad.tolist() == pytest.approx([0.0, 4 * coefficient], rel=1e-12)
    a.grad, b.grad = torch.tensor([3.0, 0.0], dtype=F64), torch.tensor([0.0, 4.0], dtype=F64)
    assert upd.clip_global_norm([a, b], there, 26.0) == (13.0, 1.0)  # min(…, 1)
    assert a.grad.tolist() == [3.0, 0.0] and b.grad.tolist() == [0.0, 4.0]
    a.grad, b.grad = None, None
    assert upd.clip_global_norm([a, b], CriticGradient(0.1, {}), 1.0) == (0.1, 1.0)  # in float64


def test_has_gradient_is_some_gradient_not_exactly_zero(monkeypatch):
    a, b = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([a, b], lr=1.0)
    assert upd.has_gradient(optimizer, None) is False  # no gradient at all
    a.grad = torch.zeros(2)
    assert upd.has_gradient(optimizer, CriticGradient(3.0, {})) is False  # exactly zero
    b.grad = torch.tensor([-1e-30])
    assert upd.has_gradient(optimizer, None) is True
    remote = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    remote.param_groups[0]["params"] = []  # a critic in its own process's: no parameters here
    assert upd.has_gradient(remote, None) is False
    assert upd.has_gradient(remote, CriticGradient(0.0, {})) is False
    assert upd.has_gradient(remote, CriticGradient(0.5, {})) is True
    asked = []
    monkeypatch.setattr(upd.dist, "any_rank", lambda flag: asked.append(flag) or True)
    b.grad = torch.zeros(1)
    assert upd.has_gradient(optimizer, None) is False and asked == []  # one process: no rank asked
    monkeypatch.setattr(upd.dist, "is_sharded", lambda: True)
    assert upd.has_gradient(optimizer, None) is True and asked == [False]  # another rank's


def test_clipped_step_clips_steps_and_reports_the_norm():
    critic = Critic()
    losses = world(critic=critic, max_grad_norm=2.5)
    actor = losses.models.actor
    frozen = nn.Parameter(torch.ones(1, dtype=F64))  # an optimizer with no gradient: no step
    optimizers = [*sgd(losses), torch.optim.SGD([frozen], lr=1.0, weight_decay=1.0)]
    optimization = Optimization.of(losses.models, optimizers)
    actor.w.grad = torch.zeros(9, dtype=F64)
    actor.w.grad[1], actor.w.grad[2] = 3.0, -4.0
    guard, stats = Guard(), {"loss": 0.25}
    out = upd.clipped_step(losses, stats, None, optimization, guard)
    assert out == {"loss": 0.25, "grad_norm": 5.0, POLICY_STEPPED: 1.0}
    assert actor.w.tolist() == pytest.approx([0.0, -1.0, 1.75, *W[3:]], abs=1e-6)  # by 2.5/5
    assert frozen.tolist() == [1.0]  # weight decay would have moved it
    assert guard.calls == [(3, None, {"loss": 0.25})] and critic.calls == [("clip", 1.0)]
    assert stats["grad_norm"] == 5.0 and out is not stats


def test_clipped_step_without_a_limit_and_a_policy_that_does_not_step():
    critic = Critic()
    losses = world(critic=critic)  # max_grad_norm 0: no clipping
    head = nn.Parameter(torch.zeros(1, dtype=F64))
    optimizers = [*sgd(losses, lr=0.5), torch.optim.SGD([head], lr=0.5)]
    optimization = Optimization.of(losses.models, optimizers)
    losses.models.actor.w.grad = torch.zeros(9, dtype=F64)
    head.grad = torch.tensor([40.0], dtype=F64)
    out = upd.clipped_step(losses, {}, None, optimization, Guard())
    assert out == {"grad_norm": 40.0, POLICY_STEPPED: 0.0} and head.tolist() == [-20.0]
    assert losses.models.actor.w.tolist() == W
    none = Optimization.of(losses.models, [])
    assert upd.clipped_step(losses, {}, None, none, Guard()) == {
        "grad_norm": 0.0,
        POLICY_STEPPED: 0.0,
    }


def test_clipped_step_takes_a_critic_elsewhere_into_the_norm_and_its_step():
    critic = Critic(CriticGradient(12.0, {}))
    losses = world(critic=critic, max_grad_norm=6.5)
    remote = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    remote.param_groups[0]["params"] = []
    optimization = Optimization.of(losses.models, [*sgd(losses), remote])
    losses.models.actor.w.grad = torch.zeros(9, dtype=F64)
    losses.models.actor.w.grad[3] = 5.0
    remote_steps = []
    remote.step = lambda: remote_steps.append(1)  # type: ignore[method-assign]
    out = upd.clipped_step(losses, {}, critic.gradient, optimization, Guard())
    assert out is not None and out["grad_norm"] == 13.0 and out[POLICY_STEPPED] == 1.0
    coefficient = 6.5 / (13 + 1e-6)
    assert critic.calls == [("clip", pytest.approx(coefficient, rel=1e-15))]
    assert losses.models.actor.w[3].item() == pytest.approx(1.0 - 5 * coefficient, rel=1e-12)
    assert remote_steps == [1]


def test_clipped_step_skips_a_non_finite_gradient_and_names_it(caplog):
    losses = world(critic=Critic(), max_grad_norm=1.0)
    optimization = Optimization.of(losses.models, sgd(losses))
    w = losses.models.actor.w
    w.grad = torch.zeros(9, dtype=F64)
    w.grad[4] = math.nan
    guard = Guard()
    assert upd.clipped_step(losses, {"loss": 1.0}, None, optimization, guard) is None
    assert w.grad is None and w.tolist() == W and losses.models.critic.calls == []
    (iteration, parameters, tensors) = guard.calls[0]
    assert iteration == 3 and parameters is optimization.named and tensors == {"loss": 1.0}
    assert "step 3: grad of w holds NaN; update skipped" in caplog.text


def test_clipped_step_names_an_overflowed_norm_and_a_critics_gradient_elsewhere(caplog):
    losses = world(critic=Critic(), max_grad_norm=1.0)
    optimization = Optimization.of(losses.models, sgd(losses))
    w = losses.models.actor.w
    w.grad = torch.zeros(9, dtype=F64)
    w.grad[1] = w.grad[2] = 1e200  # finite, its norm not
    guard = Guard()
    assert upd.clipped_step(losses, {"loss": 1.0}, None, optimization, guard) is None
    assert guard.calls[0][2] == {"loss": 1.0, "gradient norm": math.inf}
    assert "step 3: gradient norm holds Inf; update skipped" in caplog.text
    assert w.grad is None and w.tolist() == W  # (the policy warms up: no gradient of its own)
    there = CriticGradient(math.nan, {}, nonfinite="score.weight")
    assert upd.clipped_step(losses, {}, there, optimization, guard) is None
    assert list(guard.calls[1][2]) == ["grad of critic.score.weight"]
    assert "step 3: grad of critic.score.weight holds NaN" in caplog.text
    w.grad = torch.zeros(9, dtype=F64)
    assert upd.clipped_step(losses, {}, CriticGradient(math.inf, {}), optimization, guard) is None
    assert list(guard.calls[2][2]) == ["gradient norm"] and guard.skipped == 3
    assert w.grad is None and w.tolist() == W


def test_a_nan_gradient_of_a_critic_elsewhere_is_named_beside_a_finite_policy_gradient(caplog):
    losses = world(critic=Critic(), max_grad_norm=1.0)
    optimization = Optimization.of(losses.models, sgd(losses))
    losses.models.actor.w.grad = torch.ones(9, dtype=F64)
    there = CriticGradient(math.nan, {}, nonfinite="score.weight")
    assert upd.clipped_step(losses, {}, there, optimization, Guard()) is None
    assert "grad of critic.score.weight holds NaN" in caplog.text


def test_an_overflowed_norm_without_clipping_is_named_the_gradient_norm(caplog):
    losses = world(max_grad_norm=0.0)
    optimization = Optimization.of(losses.models, sgd(losses))
    w = losses.models.actor.w
    w.grad = torch.zeros(9, dtype=F64)
    w.grad[1] = w.grad[2] = 1e200
    assert upd.clipped_step(losses, {}, None, optimization, Guard()) is None
    assert "gradient norm holds Inf" in caplog.text


def test_optimizer_step_drops_earlier_gradients_and_skips_a_masked_minibatch(forward):
    losses = world()
    optimization = Optimization.of(losses.models, sgd(losses, lr=2.0))
    w = losses.models.actor.w
    w.grad = torch.full((9,), 100.0, dtype=F64)  # a gradient left from before: dropped
    rows = torch.arange(4)
    stats = upd.optimizer_step(losses, experience(), rows, optimization, Guard(), None)
    assert stats is not None and stats["loss"] == pytest.approx(LOSS_ALL, rel=1e-12)
    assert w.tolist() == pytest.approx(
        [v - 2 * g for v, g in zip(W, GRAD_ALL, strict=True)], rel=1e-12
    )
    masked = experience(action_mask=torch.zeros(4, 3, dtype=torch.long))
    w.grad = torch.ones(9, dtype=F64)
    assert upd.optimizer_step(losses, masked, rows, optimization, Guard(), None) is None
    assert w.grad.tolist() == [1.0] * 9 and len(forward.calls) == 1  # no forward, no zero_grad


def test_optimizer_step_hands_on_the_minibatch_the_optimization_and_a_critic_elsewhere(
    monkeypatch, forward
):
    synced: list[Any] = []
    monkeypatch.setattr(upd.dist, "world_size", lambda: 2)
    monkeypatch.setattr(upd.dist, "no_sync", lambda m: contextlib.nullcontext())
    monkeypatch.setattr(upd.dist, "all_reduce_gradients", lambda ps: synced.append(ps))
    monkeypatch.setattr(upd.dist, "all_reduce_sum", lambda d: d)
    critic = Critic(CriticGradient(12.0, {"value_loss": 0.5}))
    losses = world(critic=critic, max_grad_norm=1.0)
    optimization = Optimization.of(losses.models, sgd(losses, lr=0.0))
    action = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0], [1, 1, 0]])  # row 2: masked out
    rollout = experience(action_mask=action)
    assert (
        upd.optimizer_step(losses, rollout, torch.tensor([2]), optimization, Guard(), None) is None
    )
    stats = upd.optimizer_step(losses, rollout, torch.tensor([1]), optimization, Guard(), None)
    assert stats is not None and synced == [optimization.parameters]
    here = math.hypot(0.5 / 2, 1.0 / 2)  # row 1: A 0.5, 1 at ids 4, 5 over 2 tokens
    assert stats["grad_norm"] == pytest.approx(math.hypot(here, 12.0), rel=1e-12)
    assert stats["value_loss"] == 0.5
    assert critic.calls[-1] == ("clip", pytest.approx(1 / (math.hypot(here, 12.0) + 1e-6)))


def test_optimizer_step_and_accumulate_take_pi_as_moved_unless_told(forward):
    """Without ``old_is_current`` the step's selection reads a forward of π, not log π_old."""
    choose = Selection(select=False)
    losses = world(algo=Algorithm("t", None, PolicyLoss(), step_selection=choose))
    optimization = Optimization.of(losses.models, sgd(losses, lr=0.0))
    rows = torch.tensor([0])
    upd.optimizer_step(losses, experience(), rows, optimization, Guard(), None)
    upd.accumulate(losses, experience(), rows, optimization, None)
    assert [c["grad"] for c in forward.calls] == [False, True, False, True]
    upd.accumulate(losses, experience(), rows, optimization, None, True)
    assert [c["grad"] for c in forward.calls[4:]] == [True]


# ---------------------------------------------------------------------------- accumulate


def single_process(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """One process: no_sync, the gradients' all-reduce and the stats' must not be called."""
    called: list[Any] = []
    for name in ("no_sync", "all_reduce_gradients", "all_reduce_sum"):
        monkeypatch.setattr(upd.dist, name, lambda *a, name=name: called.append(name))
    return called


@pytest.mark.parametrize("micro", [1, 4])
def test_accumulate_weighs_micro_batches_by_the_steps_tokens(monkeypatch, forward, micro):
    called = single_process(monkeypatch)
    critic = Critic()
    losses = world(critic=critic, passes=passes(micro_batch_size=micro))
    optimization = Optimization.of(losses.models, sgd(losses))
    rows = torch.tensor([3, 0, 2, 1])
    stats, elsewhere = upd.accumulate(losses, experience(), rows, optimization, None)
    assert elsewhere is None and grad(losses) == pytest.approx(GRAD_ALL, rel=1e-12, abs=1e-15)
    assert stats["loss"] == pytest.approx(LOSS_ALL, rel=1e-12)
    assert stats["adv"] == pytest.approx(5.5 / 8, rel=1e-12)
    assert stats["approx_kl"] == pytest.approx(3 / 8, rel=1e-12)
    assert forward.rows() == ([[7], [1], [6], [4]] if micro == 1 else [[7, 1, 6, 4]])
    kind, got, mine, units, total, agg = critic.calls[0]
    assert kind == "start"
    assert [m.tolist() for m in mine] == ([[3], [0], [2], [1]] if micro == 1 else [[3, 0, 2, 1]])
    assert total == 8.0 and agg is TOKEN_MEAN and units(torch.tensor([0, 2])) == 4.0
    assert torch.equal(got.response_ids, torch.tensor(IDS))
    assert critic.calls[-1] == ("finish",) and called == []


def test_accumulate_packs_micro_batches_by_the_token_budget(forward):
    # rows of 5, 3, 3, 3 real tokens (prompt and response); a budget of 6 tokens packs rows 1, 2
    losses = world(passes=passes(micro_batch_size=1, token_budget=6))
    optimization = Optimization.of(losses.models, sgd(losses))
    upd.accumulate(losses, experience(), torch.arange(4), optimization, None)
    assert forward.rows() == [[1], [4, 6], [7]]
    assert grad(losses) == pytest.approx(GRAD_ALL, rel=1e-12, abs=1e-15)
    forward.calls.clear()
    losses = world(passes=passes(micro_batch_size=2, token_budget=None))  # 2 × the longest: 10
    upd.accumulate(losses, experience(), torch.arange(4), Optimization.of(losses.models, []), None)
    assert forward.rows() == [[1, 4], [6, 7]]


def test_accumulate_adds_the_stats_of_a_critic_elsewhere(forward):
    gradient = CriticGradient(2.0, {"loss": 0.5, "value_loss": 0.25})
    losses = world(critic=Critic(gradient))
    optimization = Optimization.of(losses.models, sgd(losses))
    stats, elsewhere = upd.accumulate(losses, experience(), torch.arange(4), optimization, None)
    assert elsewhere is gradient and stats["value_loss"] == 0.25
    assert stats["loss"] == pytest.approx(LOSS_ALL + 0.5, rel=1e-12)


def two_processes(monkeypatch: pytest.MonkeyPatch, stats_sum: int, **answers: Any) -> list[Any]:
    """``dist`` as one of 2 processes (``answers``: its ``rank``, ``is_sharded``…): what
    ``no_sync`` and the gradients' all-reduce are handed is recorded in the list returned, and
    the stats' all-reduce multiplies each by ``stats_sum`` (the other rank's equal share)."""
    synced: list[Any] = []
    monkeypatch.setattr(upd.dist, "world_size", lambda: 2)
    for name, answer in answers.items():
        monkeypatch.setattr(upd.dist, name, lambda answer=answer: answer)
    monkeypatch.setattr(upd.dist, "no_sync", lambda m: synced.append(m) or contextlib.nullcontext())
    monkeypatch.setattr(upd.dist, "all_reduce_gradients", lambda ps: synced.append(list(ps)))
    monkeypatch.setattr(
        upd.dist, "all_reduce_sum", lambda d: {k: stats_sum * v for k, v in d.items()}
    )
    return synced


def test_accumulate_on_rank_1_of_2(monkeypatch, forward):
    """DDP, rank 1 of 2: the micro-batches 1, 3, … of the plan, weighed by the whole step's
    tokens, no gradient sync until the one all-reduce, the stats summed over the ranks."""
    synced = two_processes(monkeypatch, stats_sum=2, rank=1)
    critic = Critic()
    losses = world(critic=critic, passes=passes(micro_batch_size=1))
    optimization = Optimization.of(losses.models, sgd(losses))
    stats, _ = upd.accumulate(losses, experience(), torch.tensor([3, 0, 2, 1]), optimization, None)
    assert forward.rows() == [[1], [4]]  # rows 0 and 1: micro-batches 1 and 3
    # rows 0 and 1 (5 tokens) of the 8: −Σ A at each id / 8
    assert grad(losses) == pytest.approx([0, -0.125, 0.125, -0.25, -0.0625, -0.125, 0, 0, 0])
    assert synced[:2] == [losses.models.actor, critic.module]
    assert synced[2] == optimization.parameters and len(synced) == 3
    assert stats["adv"] == pytest.approx(2 * (2 + 1.5) / 8, rel=1e-12)
    assert critic.calls[0][4] == 8.0


def test_accumulate_sharded_weighs_by_the_world_and_averages_the_stats(monkeypatch, forward):
    """FSDP, rank 0 of 2: FSDP averages the gradients over the ranks itself (the step's units ÷
    world), no all-reduce of gradients here, the summed stats ÷ world."""
    synced = two_processes(monkeypatch, stats_sum=3, is_sharded=True)
    critic = Critic()
    losses = world(critic=critic, passes=passes(micro_batch_size=1))
    optimization = Optimization.of(losses.models, sgd(losses))
    stats, _ = upd.accumulate(losses, experience(), torch.tensor([3, 0, 2, 1]), optimization, None)
    assert forward.rows() == [[7], [6]]  # rows 3 and 2: micro-batches 0 and 2
    assert grad(losses) == pytest.approx([0, -0.75, 0, 0, 0, 0, 0.5, -0.25, 0])  # ÷ 4 tokens
    assert synced == [losses.models.actor, critic.module]
    assert stats["adv"] == pytest.approx(1.5 * (4 - 2) / 4, rel=1e-12)
    assert critic.calls[0][4] == 4.0


# ---------------------------------------------------------------------------- step selection


class Selection:
    """``Algorithm.step_selection``: chooses advantages 10 × the row's index and, with
    ``select``, the loss selection 1 at the first token; each call's arguments kept."""

    def __init__(self, select: bool = True) -> None:
        self.select, self.calls = select, []

    def __call__(self, logprobs: Tensor, rows: Experience, drawing: Any) -> Any:
        self.calls.append((logprobs, rows, drawing))
        n, width = rows.response_ids.shape
        advantages = 10.0 * torch.arange(1, n + 1, dtype=torch.float32)[:, None].expand(n, width)
        selection = torch.zeros(n, width) if self.select else None
        if selection is not None:
            selection[:, 0] = 1
        return replace(rows, advantages=advantages, loss_selection=selection), {"chosen": 0.5}


def test_select_for_step_writes_the_choice_into_the_steps_rows(forward):
    choose = Selection()
    losses = world(algo=Algorithm("t", None, PolicyLoss(), step_selection=choose))
    losses = replace(losses, drawing=torch.Generator())
    rollout = experience()
    minibatch = torch.tensor([2, 0])
    chosen, stats = upd.select_for_step(losses, rollout, minibatch, [minibatch], True)
    assert stats == {"chosen": 0.5} and forward.calls == []  # π_old is π: no forward
    logprobs, rows, drawing = choose.calls[0]
    assert torch.equal(logprobs, rollout.logprobs[[2, 0]]) and drawing is losses.drawing
    assert torch.equal(rows.response_ids, torch.tensor([[6, 0, 0], [1, 2, 3]]))
    expected = rollout.advantages.clone()
    expected[2], expected[0] = 10.0, 20.0
    assert torch.equal(chosen.advantages, expected) and chosen.advantages.dtype == F64
    selection = torch.zeros(4, 3, dtype=F64)
    selection[[0, 2], 0] = 1.0
    assert torch.equal(chosen.loss_selection, selection)
    assert torch.equal(rollout.advantages, torch.tensor(ADVANTAGES, dtype=F64))  # a copy
    upd.select_for_step(losses, rollout, minibatch, [minibatch], False)  # π has moved
    assert len(forward.calls) == 1 and forward.calls[0]["grad"] is False
    w = torch.tensor(W, dtype=F64)
    assert torch.equal(
        choose.calls[1][0], w[torch.tensor([[6, 0, 0], [1, 2, 3]])] * rows.response_mask
    )
    choose.select = False
    chosen, _ = upd.select_for_step(losses, rollout, minibatch, [minibatch], True)
    assert chosen.loss_selection is None


def test_select_for_step_without_old_logprobs_gives_the_rows_the_forwards(forward):
    choose = Selection()
    losses = world(algo=Algorithm("t", None, PolicyLoss(), step_selection=choose))
    rollout = experience(logprobs=None)
    minibatch = torch.tensor([1, 3])
    upd.select_for_step(losses, rollout, minibatch, [minibatch[:1], minibatch[1:]], True)
    logprobs, rows, _ = choose.calls[0]
    expected = torch.tensor([[0.75, -1.5], [0.125, 0.5]], dtype=F64)
    assert len(forward.calls) == 2 and torch.equal(logprobs, expected)
    assert rows.logprobs is logprobs


def recorded_autocast(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """update's ``autocast`` replaced by a context that records the precision it is given."""
    contexts: list[str] = []

    @contextlib.contextmanager
    def autocast(mixed_precision: str):  # type: ignore[no-untyped-def]
        contexts.append(mixed_precision)
        yield

    monkeypatch.setattr(upd, "autocast", autocast)
    return contexts


def test_step_logprobs_sums_over_ranks_in_the_dtype_of_old_logprobs(monkeypatch, forward):
    reduced: list[Tensor] = []
    monkeypatch.setattr(upd.dist, "all_reduce_sum", lambda x: reduced.append(x) or 2 * x)
    contexts = recorded_autocast(monkeypatch)
    losses = world(
        mixed_precision="bf16", passes=passes(distribution=SamplingSettings(temperature=0.5))
    )
    rollout = experience(logprobs=experience().logprobs.float())
    minibatch = torch.tensor([3, 2, 0])
    got = upd.step_logprobs(losses, rollout, minibatch, [torch.tensor([0, 2]), torch.tensor([3])])
    rows = [[0.125, 0.5, 0.0], [2.0, 0.0, 0.0], [0.5, -0.25, 1.0]]  # rows 3, 2, 0 in that order
    assert got.dtype == torch.float32 and torch.equal(got, 2 * torch.tensor(rows).float())
    assert reduced[0].dtype == F64 and contexts == ["bf16"]
    assert [c["with_entropy"] for c in forward.calls] == [False, False]
    assert forward.calls[0]["temperature"] == 0.5
    narrow = upd.step_logprobs(losses, experience(logprobs=None), minibatch[1:], [minibatch[1:]])
    assert narrow.shape == (2, 3) and narrow.dtype == F64  # the advantages' dtype


# ---------------------------------------------------------------------------- terms


def test_policy_output_hands_the_forward_the_sampled_distribution(forward):
    distribution = SamplingSettings(temperature=0.5, top_k=3, top_p=0.75, min_p=0.125)
    pass_settings = passes(distribution=distribution, token_budget=None, shares_prefix=True)
    losses = world(passes=pass_settings)
    rows = experience().select(torch.tensor([1]))
    out = upd.policy_output(losses, rows, True, True, True)
    call = forward.calls[0]
    assert call.pop("model") is losses.models.actor
    assert torch.equal(call.pop("input_ids"), torch.tensor([[0, 3, 4, 5]]))
    assert torch.equal(call.pop("attention_mask"), torch.tensor([[0, 1, 1, 1]]))
    assert call == dict(
        prompt_length=2,
        temperature=0.5,
        grad=True,
        with_entropy=True,
        with_hidden=True,
        top_k=3,
        top_p=0.75,
        min_p=0.125,
        packed=True,
        with_logits=True,
        shared_prefix=True,
    )
    assert out.logprobs.tolist() == [[0.75, -1.5]]
    upd.policy_output(losses, rows, False)
    assert forward.calls[1]["with_hidden"] is False and forward.calls[1]["with_logits"] is False
    assert forward.calls[1]["with_entropy"] is False
    upd.policy_output(world(), rows, False)
    assert forward.calls[2]["packed"] is False and forward.calls[2]["shared_prefix"] is False


def test_terms_adds_the_kl_and_entropy_terms_with_their_coefficients(forward):
    algo = Algorithm("t", None, PolicyLoss(), kl_loss=KL_ESTIMATORS["k1"])
    losses = world(algo=algo, step=UpdateStep(0.25, True, 1), entropy_coef=0.125)
    rows = experience().select(torch.tensor([0, 2]))  # ids 1 2 3 | 6: w 0.5 −0.25 1 | 2
    loss, stats, out = upd.terms(losses, rows)
    policy = (-0.5 - 0.25 - 2.0 + 4.0) / 4  # −A·w: token-mean
    kl = 0.5  # k1: log π − log π_ref = 0.5 at every token
    entropy = (0.25 + 0.0625 + 1.0 + 4.0) / 4  # w²
    assert loss.item() == pytest.approx(policy + 0.25 * kl - 0.125 * entropy, rel=1e-12)
    assert stats["kl_loss"].item() == pytest.approx(kl, rel=1e-12)
    assert stats["entropy"].item() == pytest.approx(entropy, rel=1e-12)
    assert set(stats) == {"approx_kl", "adv", "kl_loss", "entropy"}
    assert not stats["kl_loss"].requires_grad and loss.requires_grad
    assert forward.calls[0]["with_entropy"] is True and forward.calls[0]["with_hidden"] is False
    assert forward.calls[0]["with_logits"] is False
    logprobs, mb = algo.policy_loss.calls[0]
    assert logprobs is out.logprobs and torch.equal(mb.response_ids, rows.response_ids)
    no_beta = world(algo=algo, step=UpdateStep(0.0, True, 1))
    loss, stats, _ = upd.terms(no_beta, rows)
    assert set(stats) == {"approx_kl", "adv"} and loss.item() == pytest.approx(policy, rel=1e-12)
    assert forward.calls[1]["with_entropy"] is False


def test_terms_reduces_the_entropy_by_the_runs_aggregation(forward):
    losses = world(aggregation=aggregation("seq-mean-token-sum"), entropy_coef=1.0)
    rows = experience().select(torch.tensor([0, 2]))  # ids 1 2 3 | 6: w 0.5 −0.25 1 | 2
    _, stats, _ = upd.terms(losses, rows)
    assert stats["entropy"].item() == pytest.approx((0.25 + 0.0625 + 1.0 + 4.0) / 2, rel=1e-12)


def test_terms_reads_the_loss_mask_and_the_rollout_correction(forward):
    algo = Algorithm("t", None, PolicyLoss(), kl_loss=KL_ESTIMATORS["k1"])
    action = torch.tensor([[1, 0, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0]])
    weights = torch.tensor([[0.5, 1.0, 2.0], [1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    rollout = experience(action_mask=action, rollout_weights=weights.double())
    losses = world(algo=algo, step=UpdateStep(1.0, True, 1), entropy_coef=1.0)
    loss, stats, _ = upd.terms(losses, rollout.select(torch.tensor([0])))
    _, mb = algo.policy_loss.calls[0]
    assert torch.equal(mb.advantages, torch.tensor([[0.5, -1.0, 4.0]], dtype=F64))
    assert stats["entropy"].item() == pytest.approx((0.25 + 1.0) / 2, rel=1e-12)
    assert stats["kl_loss"].item() == pytest.approx(0.5, rel=1e-12)
    assert loss.item() == pytest.approx((-0.25 - 4.0) / 2 + 0.5 - 0.625, rel=1e-12)


def test_terms_without_old_logprobs_or_a_trained_policy(forward):
    critic = Critic(hidden=True)
    algo = Algorithm("t", None, PolicyLoss(), kl_loss=KL_ESTIMATORS["k1"])
    losses = world(algo=algo, critic=critic, step=UpdateStep(1.0, True, 1))
    rows = experience(logprobs=None).select(torch.tensor([1]))  # ids 4 5: w 0.75 −1.5
    loss, stats, out = upd.terms(losses, rows)
    _, mb = algo.policy_loss.calls[0]
    assert torch.equal(mb.logprobs, out.logprobs) and not mb.logprobs.requires_grad
    assert stats["approx_kl"].item() == 0.0 and forward.calls[0]["with_entropy"] is True
    assert forward.calls[0]["with_hidden"] is True
    value = ((4 - 1) ** 2 + (5 - 1) ** 2) / 2  # (id − 1)² of the hidden state
    assert stats["value_loss"].item() == pytest.approx(value)
    assert loss.item() == pytest.approx((-0.375 + 1.5) / 2 + 0.5 + 0.5 * value, rel=1e-12)
    _, vmb, hidden, agg = critic.calls[0]
    assert hidden is out.hidden and agg is TOKEN_MEAN and vmb is mb
    warming = world(algo=algo, critic=critic, step=UpdateStep(1.0, False, 1), entropy_coef=1.0)
    loss, stats, _ = upd.terms(warming, rows)
    assert len(algo.policy_loss.calls) == 1 and set(stats) == {"value_loss"}
    assert loss.item() == pytest.approx(0.5 * value)


def test_distill_loss_term_adds_lambda_times_the_divergence(monkeypatch, forward):
    calls: list[tuple[Any, ...]] = []
    teacher_logits = torch.tensor([[[1.0, 2.0], [0.5, 0.25]]], dtype=F64)

    def response_logits(model, input_ids, attention_mask, prompt_length):  # type: ignore[no-untyped-def]
        calls.append((model, input_ids, attention_mask, prompt_length, torch.is_grad_enabled()))
        return teacher_logits

    def per_token(student, teacher, beta, temperature, chunk):  # type: ignore[no-untyped-def]
        calls.append((student, teacher, beta, temperature, chunk))
        return student[..., 0] * teacher[..., 1]

    monkeypatch.setattr(upd, "response_logits", response_logits)
    monkeypatch.setattr(upd, "DISTILL_LOSSES", {"gjsd": DistillLoss(None, per_token)})
    teacher = object()
    distill = DistillFields(
        teacher_model="t", distill_coef=0.5, distill_loss="gjsd", distill_beta=0.25
    )
    distill = replace(distill, distill_chunk_size=7)
    losses = world(
        teacher=teacher,
        distill=distill,
        passes=passes(distribution=SamplingSettings(temperature=0.75)),
    )
    rows = experience().select(torch.tensor([1]))  # ids 4 5: w 0.75 −1.5
    loss, stats, out = upd.terms(losses, rows)
    assert forward.calls[0]["with_logits"] is True
    model, input_ids, mask, width, grad_on = calls[0]
    assert model is teacher and width == 2 and grad_on is False
    assert torch.equal(input_ids, rows.input_ids) and torch.equal(mask, rows.attention_mask)
    student, teacher_got, beta, temperature, chunk = calls[1]
    assert student is out.logits and teacher_got is teacher_logits
    assert (beta, temperature, chunk) == (0.25, 0.75, 7)
    divergence = (0.75 * 2.0 - 1.5 * 0.25) / 2
    assert stats["distill_loss"].item() == pytest.approx(divergence, rel=1e-12)
    assert loss.item() == pytest.approx((-0.375 + 1.5) / 2 + 0.5 * divergence, rel=1e-12)
    warming = replace(losses, step=UpdateStep(0.0, False, 1))
    _, stats, _ = upd.terms(warming, rows)
    assert forward.calls[1]["with_logits"] is False and "distill_loss" not in stats


def test_rows_loss_keeps_the_forward_in_the_record(monkeypatch, forward):
    contexts = recorded_autocast(monkeypatch)
    losses = world(mixed_precision="bf16")
    rollout = experience()
    record = Record()
    rows = torch.tensor([2, 1])
    loss, stats = upd._rows_loss(losses, rollout, record, losses.models.actor, rows)
    assert loss.item() == pytest.approx((4.0 - 0.375 + 1.5) / 3, rel=1e-12)
    assert set(stats) == {"approx_kl", "adv"} and contexts == ["bf16"]
    ((got, out),) = record.calls
    assert got is rows and out.logprobs.tolist() == [[2.0, 0.0], [0.75, -1.5]]
    loss, _ = upd._rows_loss(losses, rollout, None, losses.models.actor, torch.tensor([3]))
    assert loss.item() == pytest.approx((-0.125 - 1.5) / 2, rel=1e-12)


# ---------------------------------------------------------------------------- OnPolicyRecord


def test_on_policy_record_metrics_by_hand():
    rollout = experience(logprobs=None)
    record = OnPolicyRecord(rollout)
    assert record.logprobs.dtype == F64 and record.entropy.shape == (4, 3)
    message = "every rollout row must reach the update's forward exactly once"
    lp = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]], dtype=torch.float32)
    ent = torch.tensor([[1.0, 3.0], [2.0, 0.0]], dtype=torch.float32)
    record.add(torch.tensor([0, 3]), PolicyOutput(lp.requires_grad_(), ent, None))
    assert refused(ValueError, record.metrics, rollout, 0.5, True) == message
    record.add(torch.tensor([1, 2]), PolicyOutput(lp, ent, None))
    assert record.seen.tolist() == [1.0] * 4 and not record.logprobs.requires_grad
    # log π: rows 0, 1 [−1, −2, 0], rows 2, 3 [−0.5, −0.5, 0]; log π_ref: w[id] − 0.5, so
    # Σ log π − log π_ref over each row's tokens (3, 2, 1, 2 of them):
    kl = [-1.0 - 1.25 - 0.5, -1.25 + 0.0, -2.0, -0.125 - 0.5]
    entropy = (1 + 3 + 0 + 1 + 3 + 2 + 2 + 0) / 8  # the tokens': 0 past each forward's width
    metrics = record.metrics(rollout, 0.5, True)
    scores = [1.0, 0.0, 2.0, -1.0]
    reward = sum(s - 0.5 * k for s, k in zip(scores, kl, strict=True)) / 4
    assert metrics == pytest.approx(
        {
            "objective/rlhf_reward": reward,
            "objective/entropy": entropy,
            "objective/kl": sum(kl) / 4,
        },
        rel=1e-12,
    )
    assert set(record.metrics(rollout, 0.5, False)) == {
        "objective/rlhf_reward",
        "objective/entropy",
    }
    unreferenced = replace(rollout, ref_logprobs=None)
    assert record.metrics(unreferenced, 0.5, True)["objective/kl"] == 0.0
    sampled = replace(rollout, sampler_logprobs=torch.zeros(4, 3, dtype=F64))
    assert set(record.metrics(sampled, 0.5, True)) > {"rollout/mismatch_kl", *metrics}
    record.add(torch.tensor([2]), PolicyOutput(lp[:1], ent[:1], None))
    assert refused(ValueError, record.metrics, rollout, 0.5, True) == message


# ---------------------------------------------------------------------------- epochs and update

FIRST = {1: 0, 4: 1, 6: 2, 7: 3}  # each row's first response id → the row


def by_hand(rows: list[int]) -> dict[str, float]:
    """A step's stats on ``rows`` while w stays as it is (learning rate 0)."""
    tokens = [(r, t) for r in rows for t in range(3) if MASK[r][t]]
    grads = [0.0] * 9
    for r, t in tokens:
        grads[IDS[r][t]] -= ADVANTAGES[r][t] / len(tokens)
    return {
        "loss": sum(-ADVANTAGES[r][t] * W[IDS[r][t]] for r, t in tokens) / len(tokens),
        "approx_kl": sum(SHIFT[r] for r, _ in tokens) / len(tokens),
        "adv": sum(ADVANTAGES[r][t] for r, t in tokens) / len(tokens),
        "grad_norm": math.sqrt(sum(g * g for g in grads)),
    }


def run(losses: Losses, rollout: Experience, generator: torch.Generator, **over: Any) -> Any:
    """``update`` with ``losses``' settings, algorithm, models and step, learning rate 0."""
    return upd.update(
        losses.settings,
        losses.algo,
        losses.models,
        rollout,
        over.get("optimizers", sgd(losses, lr=0.0)),
        losses.step,
        generator,
        over.get("guard", Guard()),
    )


def test_update_runs_epochs_of_shuffled_minibatches_and_averages_their_stats(forward):
    losses = world(ppo_epochs=2, responses_per_step=2, passes=passes(micro_batch_size=1))
    guard = Guard()
    stats = run(losses, experience(), torch.Generator().manual_seed(4), guard=guard)
    twin = torch.Generator().manual_seed(4)
    steps = [m.tolist() for _ in range(2) for m in torch.randperm(4, generator=twin).split(2)]
    assert [[FIRST[i] for i in ids] for ids in forward.rows()] == [[r] for s in steps for r in s]
    assert all(c["prompt_length"] == 2 and c["grad"] for c in forward.calls)
    expected = {k: sum(by_hand(s)[k] for s in steps) / 4 for k in by_hand(steps[0])}
    assert stats == pytest.approx(
        expected | {"early_stopped": 0.0, "masked_steps": 0.0, "steps": 4.0, "skipped_steps": 0.0},
        rel=1e-12,
    )
    assert [c[0] for c in guard.calls] == [3] * 4
    assert "objective/entropy" not in stats and "rollout/mismatch_kl" not in stats


def test_update_counts_masked_skipped_and_zero_gradient_steps(forward):
    action = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0], [1, 1, 0]])  # row 2: masked out
    advantages = torch.tensor(ADVANTAGES, dtype=F64)
    advantages[1] = 0.0  # row 1: an exactly zero gradient, no step
    advantages[3, 0] = math.nan  # row 3: the guard skips it
    rollout = experience(action_mask=action, advantages=advantages)
    losses = world(responses_per_step=1)
    stats = run(losses, rollout, torch.Generator().manual_seed(0))
    assert len(forward.calls) == 3  # the masked row runs no forward
    zero = {"loss": 0.0, "approx_kl": 0.25, "adv": 0.0, "grad_norm": 0.0}
    expected = {k: (by_hand([0])[k] + zero[k]) / 2 for k in zero}  # over the 2 steps measured
    counts = {"early_stopped": 0.0, "masked_steps": 1.0, "steps": 1.0, "skipped_steps": 2.0}
    assert stats == pytest.approx(expected | counts, rel=1e-12)
    warming = world(responses_per_step=1, step=UpdateStep(0.0, False, 1), critic=Critic())
    stats = run(warming, rollout, torch.Generator().manual_seed(0))
    assert stats["skipped_steps"] == 0.0 and stats["masked_steps"] == 1.0
    assert stats["steps"] == 0.0 and stats["grad_norm"] == 0.0


def test_update_with_one_step_divides_by_it_and_none_by_one(forward):
    losses = world()
    stats = run(losses, experience(), torch.Generator().manual_seed(0))
    assert stats["loss"] == pytest.approx(LOSS_ALL, rel=1e-12) and stats["steps"] == 1.0
    masked = experience(action_mask=torch.zeros(4, 3, dtype=torch.long))
    stats = run(world(responses_per_step=2, ppo_epochs=2), masked, torch.Generator())
    assert stats == {"early_stopped": 0.0, "masked_steps": 4.0, "steps": 0.0, "skipped_steps": 4.0}


@pytest.mark.parametrize(
    ("limit", "epochs_run"), [(None, 3), (0.0, 3), (0.4375, 3), (0.4374, 1), (0.1, 1)]
)
def test_update_stops_the_epochs_above_the_approx_kl_limit(forward, limit, epochs_run):
    """Learning rate 0: each row's approx_kl is its SHIFT (0.5, 0.25, 1, 0), the epoch's mean
    over its 4 steps 0.4375 (its sum 1.75)."""
    losses = world(ppo_epochs=3, responses_per_step=1, early_stop_kl=limit)
    stats = run(losses, experience(), torch.Generator().manual_seed(1))
    assert stats["steps"] == 4.0 * epochs_run and len(forward.calls) == 4 * epochs_run
    assert stats["early_stopped"] == (1.0 if epochs_run < 3 else 0.0)
    assert stats["approx_kl"] == pytest.approx(0.4375, rel=1e-12)
    masked = experience(action_mask=torch.zeros(4, 3, dtype=torch.long))
    assert run(losses, masked, torch.Generator())["early_stopped"] == 0.0  # no step: no KL


def test_a_loss_without_approx_kl_never_stops_the_epochs_early(forward):
    def silent(logprobs: Tensor, mb: Experience) -> tuple[Tensor, dict[str, Tensor]]:
        return PolicyLoss()(logprobs, mb)[0], {}  # no approx_kl: counted as 0

    algo = Algorithm("t", None, silent)  # type: ignore[arg-type]
    losses = world(algo=algo, ppo_epochs=2, responses_per_step=2, early_stop_kl=1e-9)
    stats = run(losses, experience(), torch.Generator())
    assert stats["steps"] == 4.0 and stats["early_stopped"] == 0.0


def test_epochs_record_the_first_steps_forward_only(forward):
    losses = world(responses_per_step=2, ppo_epochs=2, passes=passes(micro_batch_size=1))
    record = Record()
    generator = torch.Generator().manual_seed(2)
    optimizers = sgd(losses, lr=0.0)
    totals, measured, taken = upd._epochs(
        losses, experience(), optimizers, generator, Guard(), record
    )
    twin = torch.Generator().manual_seed(2)
    steps = [m.tolist() for _ in range(2) for m in torch.randperm(4, generator=twin).split(2)]
    assert [rows.tolist() for rows, _ in record.calls] == [[steps[0][0]], [steps[0][1]]]
    kl = sum(by_hand(s)["approx_kl"] for s in steps)
    assert (measured, taken) == (4, 4) and totals["approx_kl"] == pytest.approx(kl, rel=1e-12)
    assert set(totals) == {"loss", "approx_kl", "adv", "grad_norm"}


def test_epochs_reuse_old_logprobs_until_the_policy_steps(forward):
    """π_old is the trainer's pass (old_is_trainers_pass): the step selection reads log π_old
    until the policy's optimizer steps, then a forward without gradient."""
    choose = Selection(select=False)
    algo = Algorithm("t", None, PolicyLoss(), step_selection=choose)
    losses = world(algo=algo, responses_per_step=1, old_is_trainers_pass=True)
    zero = experience(advantages=torch.zeros(4, 3, dtype=F64))

    def unchanged(logprobs: Tensor, rows: Experience, drawing: Any) -> Any:
        choose.calls.append((logprobs, rows, drawing))
        return rows, {}

    losses.algo.step_selection = unchanged  # every advantage 0: the policy never steps
    run(losses, zero, torch.Generator().manual_seed(0))
    assert len(choose.calls) == 4 and not any(c["grad"] is False for c in forward.calls)
    choose.calls.clear(), forward.calls.clear()
    losses.algo.step_selection = choose  # advantages 10, 20, …: the first step moves π
    stats = run(losses, experience(), torch.Generator().manual_seed(0))
    assert [c["grad"] for c in forward.calls] == [True, False, True, False, True, False, True]
    assert stats["chosen"] == 0.5 and stats["steps"] == 4.0
    choose.calls.clear(), forward.calls.clear()
    passed = world(algo=algo, responses_per_step=1)  # π_old from elsewhere: always a forward
    run(passed, experience(), torch.Generator().manual_seed(0))
    assert [c["grad"] for c in forward.calls] == [False, True] * 4
    warming = world(algo=algo, responses_per_step=1, step=UpdateStep(0.0, False, 1))
    choose.calls.clear()
    run(warming, experience(), torch.Generator().manual_seed(0))
    assert choose.calls == []  # no selection while the policy does not train


def test_update_draws_the_selections_generator_before_the_minibatches(forward):
    choose = Selection(select=False)
    algo = Algorithm("t", None, PolicyLoss(), step_selection=choose)
    losses = world(algo=algo, policy_loss="clip_cov", responses_per_step=2)
    run(losses, experience(), torch.Generator().manual_seed(6))
    twin = torch.Generator().manual_seed(6)
    seed = int(torch.randint(0, 2**62, (), generator=twin))
    order = torch.randperm(4, generator=twin)
    assert [sorted(FIRST[i] for i in ids) for ids in forward.rows()[1::2]] == [
        sorted(m.tolist()) for m in order.split(2)
    ]
    drawing = choose.calls[0][2]
    assert drawing.initial_seed() == seed and choose.calls[1][2] is drawing


def test_update_without_old_logprobs_measures_pi_old_from_its_step(forward):
    losses = world(step=UpdateStep(0.5, True, 1), entropy_coef=0.0)
    rollout = experience(logprobs=None)
    stats = run(losses, rollout, torch.Generator().manual_seed(0))
    assert forward.calls[0]["with_entropy"] is True
    w = torch.tensor(W, dtype=F64)
    lp = w[torch.tensor(IDS)] * torch.tensor(MASK)
    kl = (lp - rollout.ref_logprobs).sum(-1)  # 0.5 at each token: 1.5, 1, 0.5, 1
    assert kl.tolist() == [1.5, 1.0, 0.5, 1.0]
    scores = [1.0, 0.0, 2.0, -1.0]
    assert stats["objective/kl"] == 1.0 and stats["approx_kl"] == 0.0
    assert stats["objective/rlhf_reward"] == pytest.approx(
        sum(s - 0.5 * k for s, k in zip(scores, kl.tolist(), strict=True)) / 4, rel=1e-12
    )
    assert stats["objective/entropy"] == pytest.approx((lp**2).sum().item() / 8, rel=1e-12)
    untracked = replace(losses, models=replace(losses.models, tracks_kl=False))
    assert "objective/kl" not in run(untracked, rollout, torch.Generator())
    message = "a rollout without log π_old takes exactly one optimizer step (π moves after it)"
    assert refused(ValueError, run, world(ppo_epochs=2), rollout, torch.Generator()) == message


def test_update_measures_the_samplers_mismatch_on_its_first_step(forward):
    losses = world(measures_mismatch=True, responses_per_step=2)
    rollout = experience()
    stats = run(losses, rollout, torch.Generator().manual_seed(3))
    first = torch.randperm(4, generator=torch.Generator().manual_seed(3))[:2].tolist()
    # log π_old (the sampler's) − log π = SHIFT at the first step's rows
    from proxrl.algos.online.mismatch import MismatchRecord

    record = MismatchRecord(rollout)
    w = torch.tensor(W, dtype=F64)
    rows = torch.tensor(first)
    record.add(
        rows, PolicyOutput(w[torch.tensor(IDS)[rows]] * torch.tensor(MASK)[rows], None, None)
    )
    expected = record.metrics(rollout)
    assert expected["rollout/mismatch_kl"] > 0
    assert {k: stats[k] for k in expected} == pytest.approx(expected, rel=1e-12)
    second = [r for r in range(4) if r not in first]
    loss = (by_hand(first)["loss"] + by_hand(second)["loss"]) / 2
    assert stats["steps"] == 2.0 and stats["loss"] == pytest.approx(loss, rel=1e-12)
    assert "rollout/mismatch_kl" not in run(world(), rollout, torch.Generator())
