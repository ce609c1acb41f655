"""The sampler/trainer mismatch: of a rollout whose log π_old is the sampler's (sampler_logprobs,
rollout_correction none), measured by the update's first optimizer step from its own forward
(``algos/online/mismatch.py``); and where π_old is the trainer's (``sampler: vllm``'s defaults),
the log-probs of an engine with kernels of its own measured against the trainer's π_old pass, or
against the update's forward where that pass is skipped (``OldPolicySource.measured``).

The cached sampler's log-probs differ from the trainer's by float32 rounding only, so a
sampler that adds seeded noise to them (σ 0.2, the same numbers in every run) stands in for
an engine whose numbers are not the trainer's. Settings where the first optimizer step is
the whole rollout (8 responses, mini_batch_size 8, one epoch): the update measures every row,
as the rollout correction's π_old pass does, so the two are directly comparable."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from proxrl.algos.online import grpo, ppo
from proxrl.algos.online.advantages import estimate
from proxrl.algos.online.placement import base
from proxrl.algos.online.roles import load_models, load_prompts, load_rewards, role_settings
from proxrl.algos.online.run_settings import run_settings
from proxrl.algos.online.samplers import ENGINES, make_engine
from proxrl.algos.online.update import (
    Losses,
    UpdateStep,
    minibatches,
    policy_output,
    update,
)
from proxrl.core import mismatch_stats
from proxrl.rollout.forward import policy_forward
from proxrl.runtime.guard import NonFiniteGuard
from proxrl.runtime.metrics import read_metrics
from tests.algos.collected import rollout_of

STATS = ["mismatch_kl", "mismatch_kl_k1", "is_ratio_mean", "is_ratio_min", "is_ratio_max"]
WORDS = ["abc", "def", "ghi", "jkl"]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in WORDS))
    return str(path)


@pytest.fixture
def noisy_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run's engine samples as before and adds N(0, 0.2²) (seed 1, float32, as the
    sampler's own numbers) to its log-probs at the valid tokens."""
    make_engine = base.make_engine

    def noisy(settings, tokenizer, engines=None):
        engine = make_engine(settings, tokenizer, engines)
        plain = engine.sampler

        class Noisy:
            def __init__(self, model):
                self.sampler = plain(model)

            def sample(self, *args, **kwargs):
                samples = self.sampler.sample(*args, **kwargs)
                if samples.logprobs is not None:
                    lp = samples.logprobs
                    g = torch.Generator().manual_seed(1)
                    noise = 0.2 * torch.randn(lp.shape, generator=g, dtype=lp.dtype)
                    samples.logprobs = (lp + noise.to(lp.device)).where(
                        samples.response_mask.bool(), 0.0
                    )
                return samples

        engine.sampler = Noisy
        return engine

    monkeypatch.setattr(base, "make_engine", noisy)


@pytest.fixture
def own_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The built-in samplers taken for engines with kernels of their own (``ENGINES``' trait
    ``own_kernels``, vLLM's): the main environment has no vLLM."""
    trait = ENGINES.trait
    monkeypatch.setattr(
        ENGINES,
        "trait",
        lambda name, key, default=False: key == "own_kernels" or trait(name, key, default),
    )


def _run(module, tiny_lm: str, prompts: str, out: Path, **overrides) -> dict[str, float]:
    fields = dict(
        model=tiny_lm,
        prompts=prompts,
        reward_fn=("tests.algos.online_rewards:target_fraction",),
        output_dir=str(out),
        iterations=1,
        rollout_batch_size=2,
        group_size=4,
        max_new_tokens=6,
        mini_batch_size=8,  # the first optimizer step is the whole rollout
        ppo_epochs=1,
        grad_accum=2,  # two micro-batches: the record is filled by both
        dtype="float64",
        temperature=1.0,
        learning_rate=3e-3,
        progress=False,
        seed=3,
    )
    module.train(module.Config(**(fields | overrides)))
    (row,) = read_metrics(out)
    return row


def test_the_update_measures_what_the_pi_old_pass_measures(
    noisy_sampler, tiny_lm, prompts, tmp_path
):
    """sampler_logprobs with rollout_correction none logs rollout/mismatch_kl and the ratio
    stats from the update's forward, equal in float64 (1e-10) to those the rollout correction's
    π_old pass logs over the same 8 rows and the same sampled tokens."""
    update = _run(grpo, tiny_lm, prompts, tmp_path / "update", sampler_logprobs=True)
    corrected = _run(
        grpo,
        tiny_lm,
        prompts,
        tmp_path / "pass",
        sampler_logprobs=True,
        rollout_correction="tis",
    )
    assert update["perf/old_logprobs_pass"] == 0.0  # measured at no forward of its own
    assert corrected["perf/old_logprobs_pass"] == 1.0
    assert update["objective/scores"] == corrected["objective/scores"]  # the same samples
    for stat in STATS:
        key = f"rollout/{stat}"
        print(f"{key}: update {update[key]:.15g}, π_old pass {corrected[key]:.15g}")
        assert abs(update[key] - corrected[key]) <= 1e-10, key
    assert update["rollout/mismatch_kl"] > 1e-3  # the noise is measured, not a 0 against a 0
    assert not {"rollout/masked_share", "rollout/truncated_share"} & update.keys()  # no weights


def test_the_metric_appears_exactly_where_pi_old_is_the_samplers(
    noisy_sampler, tiny_lm, prompts, tmp_path
):
    """sampler_logprobs with rollout_correction none logs the five stats; where π_old is the
    trainer's there is nothing to measure for free and no rollout/ metric, as before: without
    sampler_logprobs (its own pass, or the update's first forward), and under PPO with a value
    head, whose pass runs anyway and gives π_old."""
    measured = _run(grpo, tiny_lm, prompts, tmp_path / "sampler", sampler_logprobs=True)
    assert {key for key in measured if key.startswith("rollout/")} == {
        f"rollout/{stat}" for stat in STATS
    }
    plain = _run(grpo, tiny_lm, prompts, tmp_path / "plain")
    head = _run(ppo, tiny_lm, prompts, tmp_path / "head", sampler_logprobs=True, critic="head")
    for row in (plain, head):
        assert not [key for key in row if key.startswith("rollout/")]


def test_only_the_first_optimizer_step_is_measured(tiny_lm, prompts, tmp_path):
    """Two epochs of two minibatches of 4 (four steps): the update's stats are
    ``core.mismatch_stats`` of log π at the weights it started from against the sampler's
    (here its log-probs + seeded noise) over the rows of the first minibatch it draws, to
    1e-10; the other four rows and the later steps, whose π has moved, are not in them."""
    cfg = grpo.Config(
        model=tiny_lm,
        prompts=prompts,
        reward_fn=("tests.algos.online_rewards:target_fraction",),
        output_dir=str(tmp_path),
        rollout_batch_size=2,
        group_size=4,
        max_new_tokens=6,
        mini_batch_size=4,
        ppo_epochs=2,
        sampler_logprobs=True,
        dtype="float64",
        temperature=1.0,
        learning_rate=3e-3,
        progress=False,
        seed=3,
    )
    algo = grpo.build(cfg)
    torch.manual_seed(0)
    models = load_models(role_settings(cfg).models, algo)
    examples, ids = load_prompts(role_settings(cfg).prompts, models.tokenizer)
    rewards = load_rewards(role_settings(cfg).rewards)
    experience, _, _ = rollout_of(cfg, algo, models, rewards, examples[:2], ids[:2], 0.0, {})
    mask = experience.loss_mask
    noise = 0.2 * torch.randn(mask.shape, generator=torch.Generator().manual_seed(1))
    experience = estimate(algo, experience, 0.0)
    experience = replace(experience, logprobs=experience.logprobs + noise.to(mask.device) * mask)
    first, second = minibatches(
        cfg.responses_per_step, len(experience), torch.Generator().manual_seed(7)
    )
    losses = Losses(
        run_settings(cfg, algo, models.critic).updating,
        algo,
        models,
        experience.prompt_ids.shape[1],
        UpdateStep(0.0, True, 1),
    )
    with torch.no_grad():
        rows = experience.select(first)
        start = policy_output(losses, rows, with_entropy=False).logprobs.double()
        expected = mismatch_stats(start, rows.logprobs.double(), rows.loss_mask)
        rest = experience.select(second)
        other = policy_output(losses, rest, with_entropy=False).logprobs.double()
        elsewhere = mismatch_stats(other, rest.logprobs.double(), rest.loss_mask)
    optimizer = torch.optim.AdamW(models.actor.parameters(), lr=cfg.learning_rate)
    stats = update(
        run_settings(cfg, algo, models.critic).updating,
        algo,
        models,
        experience,
        [optimizer],
        UpdateStep(0.0, True, 1),
        torch.Generator().manual_seed(7),
        NonFiniteGuard(),
    )
    assert stats["steps"] == 4.0
    for stat in STATS:
        got, want = stats[f"rollout/{stat}"], float(expected[stat])
        print(f"{stat}: update {got:.15g}, by hand {want:.15g}, other rows {elsewhere[stat]:.6g}")
        assert abs(got - want) <= 1e-10, stat
        assert abs(got - float(elsewhere[stat])) > 1e-6, stat  # the rows are told apart


class NoisyRecording:
    """``make_engine``'s engine whose sampler adds N(0, 0.2²) (seed 1) to its log-probs at the
    valid tokens, as ``noisy_sampler``, and keeps what it returned."""

    def __init__(self, cfg, tokenizer):
        self.engine, self.samples = make_engine(role_settings(cfg).engine, tokenizer), []

    def sampler(self, model):
        plain, samples = self.engine.sampler(model), self.samples

        class Sampler:
            def sample(self, *args, **kwargs):
                out = plain.sample(*args, **kwargs)
                noise = 0.2 * torch.randn(
                    out.logprobs.shape, generator=torch.Generator().manual_seed(1)
                )
                out.logprobs = (out.logprobs + noise).where(out.response_mask.bool(), 0.0)
                samples.append(out)
                return out

        return Sampler()


def test_an_engine_of_its_own_is_measured_against_the_trainers_pass(
    own_kernels, tiny_lm, prompts, tmp_path
):
    """Without sampler_logprobs, an engine with kernels of its own is asked for the sampled
    tokens' log-probs; the rollout logs ``core.mismatch_stats`` of the trainer's π_old pass
    against them, equal in float64 (1e-10) to those of an independent forward of the policy over
    the same batch against the log-probs the sampler returned. π_old stays the pass's."""
    cfg = grpo.Config(
        model=tiny_lm,
        prompts=prompts,
        reward_fn=("tests.algos.online_rewards:target_fraction",),
        output_dir=str(tmp_path),
        rollout_batch_size=2,
        group_size=4,
        max_new_tokens=6,
        mini_batch_size=4,  # two optimizer steps: the rollout runs the π_old pass
        dtype="float64",
        temperature=1.0,
        progress=False,
        seed=3,
    )
    algo = grpo.build(cfg)
    torch.manual_seed(0)
    models = load_models(role_settings(cfg).models, algo)
    examples, ids = load_prompts(role_settings(cfg).prompts, models.tokenizer)
    engine = NoisyRecording(cfg, models.tokenizer)
    experience, _, metrics = rollout_of(
        cfg,
        algo,
        models,
        load_rewards(role_settings(cfg).rewards),
        examples[:2],
        ids[:2],
        0.0,
        {},
        engine,
    )
    (sampled,) = engine.samples
    assert sampled.logprobs is not None  # asked for, though sampler_logprobs is off
    with torch.no_grad():
        trainer = policy_forward(
            models.actor,
            experience.input_ids,
            experience.attention_mask,
            experience.prompt_ids.shape[1],
            cfg.temperature,
        ).logprobs.double()
    mask = experience.loss_mask
    assert torch.allclose(experience.logprobs * mask, trainer * mask, rtol=0, atol=1e-12)
    expected = mismatch_stats(trainer, sampled.logprobs.double(), mask)
    assert metrics["perf/old_logprobs_pass"] == 1.0
    for stat in STATS:
        got, want = metrics[f"rollout/{stat}"], float(expected[stat])
        print(f"{stat}: logged {got:.15g}, by hand {want:.15g}")
        assert abs(got - want) <= 1e-10, stat
    assert metrics["rollout/mismatch_kl"] > 1e-3  # the noise is measured


def test_a_skipped_pass_measures_in_the_update_what_the_pass_measures(
    noisy_sampler, own_kernels, tiny_lm, prompts, tmp_path
):
    """One optimizer step over the whole rollout with the KL in the loss: the π_old pass is
    skipped and the update's forward, π_old, measures the engine's log-probs, equal in float64
    (1e-10) to what the pass measures when it runs (skip_old_logprobs_pass false) and to what
    the update measures where π_old is the sampler's (sampler_logprobs): the same five stats of
    the same tokens, three ways."""
    skipped = _run(grpo, tiny_lm, prompts, tmp_path / "skipped")
    passed = _run(grpo, tiny_lm, prompts, tmp_path / "pass", skip_old_logprobs_pass=False)
    sampler = _run(grpo, tiny_lm, prompts, tmp_path / "sampler", sampler_logprobs=True)
    assert (skipped["perf/old_logprobs_pass"], passed["perf/old_logprobs_pass"]) == (0.0, 1.0)
    assert skipped["objective/scores"] == passed["objective/scores"] == sampler["objective/scores"]
    for stat in STATS:
        key = f"rollout/{stat}"
        print(f"{key}: update {skipped[key]:.15g}, pass {passed[key]:.15g}")
        assert abs(skipped[key] - passed[key]) <= 1e-10, key
        assert abs(skipped[key] - sampler[key]) <= 1e-10, key
    assert skipped["rollout/mismatch_kl"] > 1e-3


def test_only_an_engine_of_its_own_is_measured_and_never_a_rollouts_file(tiny_lm, prompts):
    """Where π_old is the trainer's, the built-in samplers (the trainer's own module) are not
    asked for log-probs; vLLM is, unless sampler_logprobs already makes them π_old; nothing is
    sampled from a rollouts file."""
    from types import SimpleNamespace

    def source(**fields):
        base = dict(model=tiny_lm, prompts=prompts, output_dir="unused")
        cfg = grpo.Config(reward_fn=("tests.algos.online_rewards:target_fraction",), **base)
        for name, value in fields.items():  # (a vllm config would validate against vllm)
            object.__setattr__(cfg, name, value)
        no_hidden = SimpleNamespace(needs_hidden=False)
        return run_settings(cfg, grpo.build(cfg), no_hidden).collecting.old_policy  # type: ignore[arg-type]

    assert not source().measured and not source().sampler_logprobs  # cached
    assert not source(sampler="hf").measured
    vllm = source(sampler="vllm")
    assert vllm.measured and vllm.sampler_logprobs and not vllm.from_sampler
    assert not source(sampler="vllm", sampler_logprobs=True).measured  # π_old is the sampler's
    assert not source(sampler="vllm", rollouts_file="rollouts.jsonl").measured
