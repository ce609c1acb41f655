"""DAPO's sampling-side pieces on the online loop (Yu et al. 2025): dynamic sampling drops
constant groups until the batch is full and resumes exactly; overlong shaping is applied at
scoring time; truncated responses take no part in the loss."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from proxrl.algos.online import grpo, ppo
from proxrl.algos.online.advantages import estimate
from proxrl.algos.online.dapo import without_truncated
from proxrl.algos.online.prompts import prompt_order
from proxrl.algos.online.roles import load_models, load_prompts, load_rewards, role_settings
from proxrl.algos.online.run_settings import run_settings
from proxrl.algos.online.update import Losses, UpdateStep, terms
from proxrl.core import overlong_penalty
from proxrl.rollout.generation import stopped
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.metrics import read_metrics
from tests.algos.collected import rollout_of
from tests.algos.dapo_rewards import WORDS, replay_dynamic_sampling
from tests.algos.killed_runs import comparable

GROUP = 4
STOP = ("e", "a")  # stop strings end some responses early: lengths vary


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": f"say: {w} ->", "word": w}) + "\n" for w in WORDS)
    )
    return str(path)


def dynamic(tiny_lm: str, prompts: str, out: Path, **overrides) -> grpo.Config:
    fields = dict(
        model=tiny_lm,
        prompts=prompts,
        reward_fn=("tests.algos.dapo_rewards:constant_for_early_words",),
        output_dir=str(out),
        iterations=5,
        rollout_batch_size=3,
        group_size=GROUP,
        max_new_tokens=6,
        temperature=1.0,
        mini_batch_size=4,
        learning_rate=3e-3,
        progress=False,
        seed=1,
        sample_every=1,
        dynamic_sampling=True,
        max_sampling_rounds=2,
    )
    fields |= overrides
    if not fields["dynamic_sampling"]:  # max_sampling_rounds applies with it only
        del fields["max_sampling_rounds"]
    return grpo.Config(**fields)


def expected_rounds(cfg: grpo.Config) -> list[tuple[int, int, int, list[str]]]:
    return replay_dynamic_sampling(
        cfg.iterations, cfg.rollout_batch_size, cfg.max_sampling_rounds, cfg.seed
    )


def test_dynamic_sampling_drops_constant_groups_until_the_batch_is_full(tiny_lm, prompts, tmp_path):
    cfg = dynamic(tiny_lm, prompts, tmp_path)
    grpo.train(cfg)
    rows = read_metrics(tmp_path)
    samples = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    expected = expected_rounds(cfg)
    assert {rounds for rounds, *_ in expected} == {1, 2}  # the case is not trivial
    assert any(filled for *_, filled, _ in expected)  # nor is the cap never reached
    for iteration, (row, (rounds, dropped, filled, words)) in enumerate(
        zip(rows, expected, strict=True), start=1
    ):
        assert row["sampling/rounds"] == rounds
        assert row["sampling/dropped_groups"] == dropped
        assert row["sampling/filled_groups"] == filled
        assert row["sampling/constant_groups"] == filled  # what was filled in is all that is flat
        trained = [s["prompt"] for s in samples if s["iteration"] == iteration]
        assert trained == [f"say: {w} ->" for w in words for _ in range(GROUP)]  # batch full
        scores = [s["score"] for s in samples if s["iteration"] == iteration]
        assert scores[: (len(words) - filled) * GROUP] == [0.0, 1.0, 2.0, 3.0] * (
            len(words) - filled
        )


def test_without_dynamic_sampling_the_constant_groups_are_trained_on(tiny_lm, prompts, tmp_path):
    cfg = dynamic(tiny_lm, prompts, tmp_path, dynamic_sampling=False, iterations=3)
    grpo.train(cfg)
    for iteration, row in enumerate(read_metrics(tmp_path)):
        order = prompt_order(len(WORDS), cfg.rollout_batch_size, iteration, cfg.seed)
        assert row["sampling/constant_groups"] == sum(WORDS[i] < "m" for i in order)
        assert "sampling/rounds" not in row


def test_resume_after_dynamic_sampling_equals_an_uninterrupted_run(tiny_lm, prompts, tmp_path):
    """The extra rounds move the data position: they are a counter of the checkpoint, so a run
    resumed at iteration 2 draws the same prompts as the run left alone."""
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    grpo.train(dynamic(tiny_lm, prompts, whole, save_every=2))
    rows = read_metrics(whole)
    assert sum(r["sampling/rounds"] - 1 for r in rows[:2]) > 0  # extra rounds before the resume
    shutil.copytree(whole, resumed)
    for path in (resumed / "checkpoints").iterdir():
        if not path.name.endswith("2"):
            shutil.rmtree(path)
    grpo.train(dynamic(tiny_lm, prompts, resumed, save_every=2, resume=True))

    assert comparable(read_metrics(resumed)) == comparable(rows)
    assert (resumed / "samples.jsonl").read_text() == (whole / "samples.jsonl").read_text()
    a, b = load_file(whole / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_dynamic_sampling_needs_groups(tiny_lm, prompts, tmp_path):
    with pytest.raises(ProxrlError, match="dynamic_sampling: needs groups of at least 2"):
        dynamic(
            tiny_lm, prompts, tmp_path, estimator="reinforce", group_size=1, mini_batch_size=3
        ).validate()


# ---------------------------------------------------------------- overlong shaping, truncation


def _rollout(cfg):
    algo = (ppo if isinstance(cfg, ppo.Config) else grpo).build(cfg)
    models = load_models(role_settings(cfg).models, algo)
    examples, ids = load_prompts(role_settings(cfg).prompts, models.tokenizer)
    experience, _, row = rollout_of(
        cfg, algo, models, load_rewards(role_settings(cfg).rewards), examples, ids, cfg.kl_coef, {}
    )
    return cfg, algo, models, estimate(algo, experience, cfg.kl_coef), row


def test_overlong_penalty_is_paid_in_the_score_and_truncation_recorded(tiny_lm, prompts, tmp_path):
    """Same seed, same draws: the shaped scores are the plain ones plus the penalty of each
    response's length (max_new_tokens 6, buffer 4: free up to 2 tokens)."""
    torch.manual_seed(0)
    _, _, models, shaped, row = _rollout(
        dynamic(
            tiny_lm, prompts, tmp_path, dynamic_sampling=False, stop_strings=STOP,
            overlong_buffer=4, overlong_penalty=0.5,
        )
    )  # fmt: skip
    torch.manual_seed(0)
    plain = _rollout(
        dynamic(tiny_lm, prompts, tmp_path, dynamic_sampling=False, stop_strings=STOP)
    )[3]
    assert torch.equal(plain.response_ids, shaped.response_ids)
    lengths = shaped.response_mask.sum(-1).double()
    penalty = overlong_penalty(lengths, 6, 4, 0.5)
    assert len(set(penalty.tolist())) > 1  # several lengths, several penalties
    torch.testing.assert_close(shaped.scores.double(), plain.scores.double() + penalty)
    assert row["objective/scores_after_penalty"] == pytest.approx(shaped.scores.mean().item())
    assert row["objective/scores"] == pytest.approx(plain.scores.mean().item())
    eos = models.tokenizer.eos_token_id
    cut = ~stopped(shaped.response_mask, shaped.response_ids, eos, 6)
    assert shaped.truncated is not None and torch.equal(shaped.truncated, cut)
    assert cut.any()


@pytest.mark.parametrize("command", ["grpo", "ppo"])
def test_truncated_responses_contribute_zero_gradient(command, tiny_lm, prompts, tmp_path):
    """With mask_truncated, a truncated row's tokens, advantages, old and reference log-probs,
    values and returns can be anything: the gradient is the same, and equal to that of the
    batch without those rows (token-mean). Without the mask they do change it."""
    module = grpo if command == "grpo" else ppo
    cfg = module.Config(
        model=tiny_lm, prompts=prompts, reward_fn=("tests.algos.online_rewards:target_fraction",),
        output_dir=str(tmp_path), rollout_batch_size=4, group_size=2, max_new_tokens=6,
        mini_batch_size=8, progress=False, seed=3, kl_coef=0.1, entropy_coef=0.01,
        mask_truncated=True,
    )  # fmt: skip
    cfg, algo, models, experience, _ = _rollout(cfg)
    experience.truncated = torch.arange(len(experience)) % 3 == 0  # a mix, whatever was sampled
    cut = experience.truncated

    def noisy(exp):
        rows = cut.unsqueeze(1)
        out = {}
        for name in ("advantages", "logprobs", "ref_logprobs", "values", "returns"):
            x = getattr(exp, name)
            out[name] = torch.where(rows, torch.randn_like(x) * 3, x)
        noise = torch.randint(3, len(models.tokenizer), exp.response_ids.shape)
        out["response_ids"] = torch.where(rows, noise, exp.response_ids)
        return type(exp)(**{**exp.__dict__, **out})

    def grads(exp):
        models.actor.zero_grad()
        for m in models.critic.modules():
            m.zero_grad()
        P = exp.prompt_ids.shape[1]
        losses = Losses(
            run_settings(cfg, algo, models.critic).updating,
            algo,
            models,
            P,
            UpdateStep(cfg.kl_coef, True, 1),
        )
        loss, _, _ = terms(losses, exp)
        loss.backward()
        params = [*models.actor.parameters(), *models.critic.parameters()]
        return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]

    masked = without_truncated(experience)
    clean = grads(masked)
    for a, b in zip(clean, grads(noisy(masked)), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)
    alone = experience.select(torch.nonzero(~cut).squeeze(1))
    for a, b in zip(clean, grads(alone), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    unmasked = grads(experience)
    assert any(
        not torch.allclose(a, b) for a, b in zip(unmasked, grads(noisy(experience)), strict=True)
    )


@pytest.mark.parametrize("command", ["ppo", "rloo", "remax"])
def test_dynamic_sampling_and_mask_truncated_run_on_other_estimators(
    command, tiny_lm, prompts, tmp_path
):
    """The batch after dynamic sampling is an ordinary rollout: PPO's critic values and GAE,
    RLOO's group baseline and ReMax's greedy scores are re-estimated over it."""
    module = ppo if command == "ppo" else grpo
    extra = {} if command == "ppo" else {"estimator": command}
    cfg = module.Config(
        model=tiny_lm, prompts=prompts,
        reward_fn=("tests.algos.dapo_rewards:constant_for_early_words",),
        output_dir=str(tmp_path), iterations=3, rollout_batch_size=3, group_size=GROUP,
        max_new_tokens=6, mini_batch_size=4, progress=False, seed=1, sample_every=1,
        dynamic_sampling=True, max_sampling_rounds=2, mask_truncated=True,
        **extra,
    )  # fmt: skip
    module.train(cfg)
    rows = read_metrics(tmp_path)
    assert len(rows) == 3
    assert [r["sampling/rounds"] for r in rows] == [
        rounds for rounds, *_ in replay_dynamic_sampling(3, 3, 2, 1)
    ]
    assert all(v == v and abs(v) != float("inf") for r in rows for v in r.values())
