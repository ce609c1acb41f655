"""Wiring that the formula tests cannot see (issue 54): what the online loop passes along and
where a boundary sits. Each test here failed on a one-line mutation of that wiring that the
rest of the suite let through: the teacher scored at the sampling temperature, λ and the
temperature reaching the gjsd term, Clip-Cov drawing from the run's generator and not torch's
global one, a checkpoint of the last finished iteration when the loop raises (ppo and grpo),
and the context boundary (a prompt plus max_new_tokens that exactly fills the context runs,
one position more is refused; the longest prompt decides)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import GPT2Config

from proxrl.algos.online import grpo, loop, ppo
from proxrl.algos.online.roles import load_models, role_settings
from proxrl.algos.online.run import check_context
from proxrl.algos.online.run_settings import run_settings
from proxrl.algos.online.update import UpdateStep, update
from proxrl.core import chunked_generalized_jsd
from proxrl.models.causal_lm import load_causal_lm
from proxrl.rollout.forward import frozen_pass, policy_forward, response_logits
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.guard import NonFiniteGuard
from proxrl.runtime.metrics import read_metrics
from tests.algos.test_loss_invariance import _config, _experience
from tests.algos.test_online import small

WORDS = ["abc", "def", "ghi", "jkl"]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in WORDS))
    return str(path)


def _spy_estimate(monkeypatch: pytest.MonkeyPatch) -> list:
    """Each iteration's rollout (as the estimate stage gets it), in a list."""
    seen = []
    estimate = loop.estimate

    def spy(algo, experience, *rest):  # type: ignore[no-untyped-def]
        seen.append(experience)
        return estimate(algo, experience, *rest)

    monkeypatch.setattr(loop, "estimate", spy)
    return seen


def _teacher_logprobs(teacher, experience, temperature: float) -> torch.Tensor:
    ids = torch.cat([experience.prompt_ids, experience.response_ids], 1)
    mask = torch.cat([experience.prompt_mask, experience.response_mask], 1)
    truncation = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}
    P = experience.prompt_ids.shape[1]
    with torch.no_grad():
        return frozen_pass(teacher, ids, mask, P, temperature, truncation, packed=False)[0]


# -- 1. the teacher is scored at the sampling temperature ----------------------------------------


def test_the_teacher_scores_samples_at_the_sampling_temperature(
    tiny_lm, tiny_teacher, prompts, tmp_path, monkeypatch
):
    """temperature 0.7 (float64): the rollout's log π_T of every sampled token is the teacher's
    at 0.7, not at 1.0 (which every other in-process distillation test samples at)."""
    seen = _spy_estimate(monkeypatch)
    cfg = small(grpo.Config, tiny_lm, prompts, tmp_path, iterations=1, rollout_batch_size=4,
                group_size=2, temperature=0.7, dtype="float64", reward_fn=(),
                teacher_model=tiny_teacher)  # fmt: skip
    cfg.validate()
    grpo.train(cfg)
    assert len(seen) == 1
    experience = seen[0]
    keep = experience.response_mask.bool()
    assert keep.sum() > 4
    teacher = load_causal_lm(tiny_teacher, dtype="float64").eval()
    at_07 = _teacher_logprobs(teacher, experience, 0.7)
    at_1 = _teacher_logprobs(teacher, experience, 1.0)
    recorded = experience.teacher_logprobs.double()
    torch.testing.assert_close(recorded[keep], at_07[keep], rtol=0, atol=1e-9)
    assert float((at_1[keep] - at_07[keep]).abs().max()) > 1e-2  # the temperature matters here


# -- 2. λ (distill_coef) and the temperature reach the gjsd term ---------------------------------


def _sgd_step(cfg, generator_seed: int = 1, global_seed: int | None = None):
    """−gradient of one SGD step (lr 1, no clipping) on test_loss_invariance's hand-built
    ragged rollout, the models loaded as the loop loads them; and the step's stats."""
    algo = grpo.build(cfg)
    torch.manual_seed(cfg.seed)
    models = load_models(role_settings(cfg).models, algo)
    params = [p for p in models.actor.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    experience = _experience(models.actor, critic_values=False)
    if global_seed is not None:
        torch.manual_seed(global_seed)  # torch's global generator, as the run left it: any state
    stats = update(
        run_settings(cfg, algo, models.critic).updating,
        algo,
        models,
        experience,
        [torch.optim.SGD(params, lr=1.0)],
        UpdateStep(cfg.kl_coef, True, 1),
        torch.Generator().manual_seed(generator_seed),
        NonFiniteGuard(),
    )
    assert stats["steps"] == 1.0
    change = torch.cat([(p.detach() - b).flatten() for p, b in zip(params, before, strict=True)])
    return change, stats, models, experience


@pytest.mark.parametrize("coef", [0.5, 2.0])
def test_the_gjsd_term_is_distill_coef_times_the_divergence_at_the_sampling_temperature(
    coef, tiny_lm, tiny_teacher, prompts, tmp_path
):
    """One step with the teacher's gjsd term minus the same step without a teacher is
    −λ·∇ of the token-mean generalised JSD of the student's and the teacher's logits, both at
    temperature 0.7 (computed here with autograd; float64, no gradient clipping), and the logged
    distill_loss is that divergence."""
    common = dict(temperature=0.7, max_grad_norm=None, entropy_coef=0.0)
    plain = _config(grpo, tiny_lm, prompts, tmp_path, 1, **common)
    taught = _config(grpo, tiny_lm, prompts, tmp_path, 1, **common, teacher_model=tiny_teacher,
                     distill_loss="gjsd", distill_beta=0.3, distill_chunk_size=3,
                     distill_coef=coef)  # fmt: skip
    without, _, _, _ = _sgd_step(plain)
    with_teacher, stats, models, experience = _sgd_step(taught)
    # the divergence by hand, on the student as it was before the step (loaded again)
    torch.manual_seed(taught.seed)
    student = load_models(role_settings(taught).models, grpo.build(taught))
    params = [p for p in student.actor.parameters() if p.requires_grad]
    P = experience.prompt_ids.shape[1]
    out = policy_forward(student.actor, experience.input_ids, experience.attention_mask, P, 0.7,
                         with_logits=True)  # fmt: skip
    with torch.no_grad():
        teacher = response_logits(student.teacher, experience.input_ids,
                                  experience.attention_mask, P)  # fmt: skip
    per_token = chunked_generalized_jsd(out.logits, teacher, 0.3, 0.7, 3)
    mask = experience.loss_mask.double()
    divergence = (per_token * mask).sum() / mask.sum()
    assert stats["distill_loss"] == pytest.approx(float(divergence.detach()), rel=1e-10)
    grads = torch.autograd.grad(coef * divergence, params)
    expected = -torch.cat([g.flatten() for g in grads])
    scale = float(expected.abs().max())
    assert scale > 1e-4
    # (to 1e-5: the chunked divergence's backward rounds at ~3e-6 of the largest change; λ
    # ignored is off by 50% or 100%, the teacher at temperature 1 by far more)
    assert float((with_teacher - without - expected).abs().max()) <= 1e-5 * scale


# -- 3. Clip-Cov draws from the run's generator ---------------------------------------------------

CLIP_COV = dict(policy_loss="clip_cov", clip_cov_lb=-1.0, clip_cov_ratio=0.2, clip_cov_ub=50.0,
                entropy_coef=0.0)  # fmt: skip


def test_clip_cov_draws_from_the_run_generator_not_torchs_global_one(tiny_lm, prompts, tmp_path):
    """One update of the same rollout: torch's global generator in two other states gives the
    same step bit for bit; the run's generator in another state gives another (the draw
    matters: some tokens are dropped, and which ones is the draw's)."""
    cfg = _config(grpo, tiny_lm, prompts, tmp_path, 1, **CLIP_COV)
    first, stats, _, _ = _sgd_step(cfg, generator_seed=1, global_seed=11)
    again, _, _, _ = _sgd_step(cfg, generator_seed=1, global_seed=22)
    other, _, _, _ = _sgd_step(cfg, generator_seed=2, global_seed=11)
    assert 0 < stats["cov_dropped"] < 1
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


# -- 5. a checkpoint of the last finished iteration when the loop raises --------------------------


@pytest.mark.parametrize("command", [grpo, ppo], ids=["grpo", "ppo"])
def test_an_exception_mid_run_saves_the_last_finished_iteration(
    command, tiny_lm, prompts, tmp_path, monkeypatch
):
    """save_every 10 of 4 iterations: the estimate stage raises in iteration 3; iteration 2's
    checkpoint is written (no other), and --resume continues from it to the weights and rows
    of an uninterrupted run, bit for bit."""

    def config(out: Path, **overrides):  # type: ignore[no-untyped-def]
        return small(command.Config, tiny_lm, prompts, out, iterations=4, rollout_batch_size=2,
                     group_size=2, mini_batch_size=4, dtype="float64", save_every=10,
                     **overrides)  # fmt: skip

    whole, broken = tmp_path / "whole", tmp_path / "broken"
    command.train(config(whole))
    estimate, calls = loop.estimate, []

    def fails_third(*args):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom in iteration 3")
        return estimate(*args)

    monkeypatch.setattr(loop, "estimate", fails_third)
    with pytest.raises(RuntimeError, match="boom in iteration 3"):
        command.train(config(broken))
    monkeypatch.setattr(loop, "estimate", estimate)
    saved = sorted(p.name for p in (broken / "checkpoints").glob("step_*"))
    assert saved == ["step_000000002"]
    command.train(config(broken, resume=True))
    rows = read_metrics(whole)
    resumed = read_metrics(broken)
    assert len(rows) == len(resumed) == 4
    drop = ("time/", "perf/")  # wall-clock numbers differ
    same = lambda r: {k: v for k, v in r.items() if not k.startswith(drop)}  # noqa: E731
    assert [same(r) for r in resumed] == [same(r) for r in rows]
    a, b = load_file(whole / "model.safetensors"), load_file(broken / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- 7. the context boundary ----------------------------------------------------------------------


class _Actor:
    """A policy with a GPT-2 config of 24 positions (nothing else is read)."""

    config = GPT2Config(n_positions=24, n_embd=8, n_layer=1, n_head=1)


def test_the_longest_prompt_plus_max_new_tokens_may_exactly_fill_the_context():
    """Prompts of 3 and 10 tokens in a context of 24: max_new_tokens 14 fills it exactly and
    is accepted; 15 is one position over and refused, naming the 10-token prompt (the shortest
    would still fit with 21)."""
    prompt_ids = [[5] * 3, [5] * 10, [5] * 7]

    def checked(max_new_tokens: int) -> None:
        cfg = grpo.Config(model="m", prompts="p", reward_fn=("m:f",), max_new_tokens=max_new_tokens)
        check_context(cfg.max_new_tokens, _Actor(), prompt_ids)  # type: ignore[arg-type]

    checked(14)
    with pytest.raises(ProxrlError) as refused:
        checked(15)
    assert str(refused.value).startswith(
        "max_new_tokens: the longest prompt (10 tokens) + max_new_tokens (15) = 25 tokens is "
        "longer than the model's context (24 positions)"
    )
    checked(1)
    with pytest.raises(ProxrlError):
        checked(21)  # the shortest prompt fits, the longest does not


def test_a_recorded_row_may_exactly_fill_the_context():
    """A rollouts file's row: prompt + response = the context is accepted, one token more is
    refused."""
    from proxrl.algos.online.rollouts_file import _check_context

    _check_context("row 1", 10, 14, 24)
    with pytest.raises(ProxrlError, match=r"= 25 tokens is longer than the model's context \(24"):
        _check_context("row 1", 10, 15, 24)
    _check_context("row 1", 10, 15, None)  # no context known: nothing to hold it to
