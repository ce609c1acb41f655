"""π_old without a pass: where the rollout batch gets one optimizer step and π_old is the
trainer's own, the update's forward gives π_old = π, and the step is the one the separate pass
would have given, to round-off (``old_policy.old_logprobs_pass``).

1. The update, on a hand-built float64 rollout of very unequal lengths, gives the same weight
   change (SGD, learning rate 1: minus the gradient) and, after an AdamW step, the same weights
   with ``Experience.logprobs`` None as with the exact float64 log-probs of the policy, for
   every surrogate and PPO-Penalty's; its ratio is then exactly 1 (approx-KL and clip fraction
   0).
2. Which configurations skip the pass, and which keep it.
3. Whole float64 runs with ``skip_old_logprobs_pass`` on and off end at the same weights and log
   the same π_old metrics; where the pass must stay (several steps, a rollout correction) the
   two runs are bit-identical and both log ``perf/old_logprobs_pass`` 1.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from proxrl.algos.online import grpo, ppo
from proxrl.algos.online.old_policy import OldPolicyOptions, old_logprobs_pass
from proxrl.algos.online.roles import load_models, role_settings
from proxrl.algos.online.run_settings import run_settings
from proxrl.algos.online.update import UpdateStep, update
from proxrl.rollout.experience import Experience
from proxrl.rollout.forward import policy_forward
from proxrl.runtime.config import narrowed
from proxrl.runtime.guard import NonFiniteGuard
from proxrl.runtime.metrics import read_metrics

LENGTHS = [6, 1, 2, 2, 1, 6, 2, 1]
REL_TOL = 1e-10
WORDS = ["abc", "def", "ghi", "jkl", "mno", "pqr", "stu", "vwx"]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in WORDS))
    return str(path)


def _config(module, tiny_lm: str, prompts: str, out: Path, **overrides):
    fields = dict(
        model=tiny_lm,
        prompts=prompts,
        reward_fn=("tests.algos.online_rewards:target_fraction",),
        output_dir=str(out),
        rollout_batch_size=2,
        group_size=4,
        max_new_tokens=7,
        mini_batch_size=8,
        ppo_epochs=1,
        dtype="float64",
        temperature=1.0,
        kl_coef=0.1,
        progress=False,
        seed=3,
    )
    return module.Config(**(fields | overrides))


def _experience(actor, token_advantages: bool) -> Experience:
    """8 responses of LENGTHS, log π_old the policy's own (float64), π_ref perturbed away."""
    g = torch.Generator().manual_seed(0)
    B, P, T = len(LENGTHS), 3, max(LENGTHS)
    vocab = actor.config.vocab_size
    prompt_ids = torch.randint(5, vocab, (B, P), generator=g)
    mask = (torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    response_ids = torch.where(mask.bool(), torch.randint(5, vocab, (B, T), generator=g), 0)
    with torch.no_grad():
        lp = policy_forward(
            actor,
            torch.cat([prompt_ids, response_ids], 1),
            torch.cat([torch.ones_like(prompt_ids), mask], 1),
            P,
            1.0,
        ).logprobs
    fmask = mask.double()
    noise = torch.randn(B, T, generator=g, dtype=torch.float64)
    advantages = (
        torch.randn(B, T, generator=g, dtype=torch.float64)
        if token_advantages
        else torch.randn(B, generator=g, dtype=torch.float64)[:, None]
    ) * fmask
    values = torch.randn(B, T, generator=g, dtype=torch.float64) * fmask
    return Experience(
        prompt_ids=prompt_ids,
        prompt_mask=torch.ones_like(prompt_ids),
        response_ids=response_ids,
        response_mask=mask,
        logprobs=lp * fmask,
        ref_logprobs=(lp + 0.5 * noise) * fmask,
        values=values if token_advantages else torch.zeros_like(values),
        scores=torch.randn(B, generator=g, dtype=torch.float64),
        rewards=torch.zeros(B, T, dtype=torch.float64),
        advantages=advantages,
        returns=(advantages + values) * fmask,
    )


def _step(module, cfg, optimizer: str, without_old: bool):
    """(weights after one step − before, flattened; the update's stats)."""
    algo = module.build(cfg)
    torch.manual_seed(cfg.seed)
    models = load_models(role_settings(cfg).models, algo)
    params = [p for p in models.actor.parameters() if p.requires_grad]
    params += list(models.critic.parameters())
    before = [p.detach().clone() for p in params]
    experience = _experience(models.actor, token_advantages=module is ppo)
    if without_old:
        experience = replace(experience, logprobs=None)
    opt = (
        torch.optim.SGD(params, lr=1.0)
        if optimizer == "sgd"
        else torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
    )
    stats = update(
        run_settings(cfg, algo, models.critic).updating,
        algo,
        models,
        experience,
        [opt],
        UpdateStep(cfg.kl_coef, True, 1),
        torch.Generator().manual_seed(1),
        NonFiniteGuard(),
    )
    assert stats["steps"] == 1.0
    delta = torch.cat([(p.detach() - b).flatten() for p, b in zip(params, before, strict=True)])
    return delta, stats


CASES = [
    (grpo, {"policy_loss": "ppo", "loss_aggregation": "seq-mean-token-mean"}),
    (grpo, {"policy_loss": "ppo", "grad_accum": 4, "entropy_coef": 0.01}),
    (grpo, {"policy_loss": "ppo", "dual_clip": 3.0, "clip_high": 0.28}),
    (grpo, {"policy_loss": "gspo", "clip": 0.05, "grad_accum": 2}),
    (grpo, {"policy_loss": "gspo_token", "clip": 0.05}),
    (grpo, {"policy_loss": "cispo", "loss_aggregation": "seq-mean-token-sum-norm"}),
    (ppo, {"surrogate": "penalty", "grad_accum": 2}),
    (ppo, {"surrogate": "clip+penalty"}),
]


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize(("module", "overrides"), CASES)
def test_update_without_old_logprobs_equals_the_update_with_them(
    module, overrides, optimizer, tiny_lm, prompts, tmp_path
):
    cfg = _config(module, tiny_lm, prompts, tmp_path, **overrides)
    with_pass, stats_pass = _step(module, cfg, optimizer, without_old=False)
    without, stats = _step(module, cfg, optimizer, without_old=True)
    scale = float(with_pass.abs().max())
    diff = float((without - with_pass).abs().max())
    print(f"{module.__name__} {overrides} {optimizer}: max |Δ| {diff:.2e} of {scale:.2e}")
    assert scale > 1e-4  # the step moved the weights
    assert diff <= REL_TOL * scale
    assert stats["approx_kl"] == 0.0 and abs(stats_pass["approx_kl"]) < 1e-14
    if "clipfrac" in stats:
        assert stats["clipfrac"] == 0.0 == stats_pass["clipfrac"]
    for key in ("loss", "policy_loss"):
        if key in stats:
            assert stats[key] == pytest.approx(stats_pass[key], rel=1e-12, abs=1e-14)
    # The π_old metrics come out of the update, computed from its forward.
    assert {"objective/entropy", "objective/rlhf_reward", "objective/kl"} <= stats.keys()
    assert "objective/kl" not in stats_pass


def test_update_refuses_a_second_step_without_old_logprobs(tiny_lm, prompts, tmp_path):
    """π moves after the first step: a rollout without π_old cannot feed a second one."""
    for overrides in ({"ppo_epochs": 2}, {"mini_batch_size": 4}):
        cfg = _config(grpo, tiny_lm, prompts, tmp_path, **overrides)
        with pytest.raises(ValueError, match="exactly one optimizer step"):
            _step(grpo, cfg, "sgd", without_old=True)


# ---------------------------------------------------------------- when the pass is skipped


@pytest.mark.parametrize(
    ("module", "overrides", "skipped"),
    [
        (grpo, {}, True),
        (grpo, {"mixed_precision": "bf16"}, True),
        (grpo, {"kl_coef": 0.0, "track_kl": False}, True),
        (grpo, {"sampler": "hf"}, True),
        (grpo, {"skip_old_logprobs_pass": False}, False),
        (grpo, {"ppo_epochs": 2}, False),
        (grpo, {"mini_batch_size": 4}, False),
        (grpo, {"sampler_logprobs": True}, False),
        (grpo, {"sampler_logprobs": True, "rollout_correction": "tis"}, False),
        (grpo, {"dynamic_sampling": True}, False),
        (grpo, {"mask_truncated": True}, False),
        (grpo, {"estimator": "rloo"}, False),  # the KL in the reward: advantages read π_old
        (grpo, {"estimator": "reinforce_pp"}, False),
        (ppo, {}, False),
        (ppo, {"critic": "head", "kl_coef": 0.0, "track_kl": False}, False),
    ],
)
def test_which_configurations_skip_the_pass(module, overrides, skipped, tiny_lm, prompts, tmp_path):
    cfg = _config(module, tiny_lm, prompts, tmp_path, **overrides)
    cfg.validate()
    algo = module.build(cfg)
    critic = load_models(role_settings(cfg).models, algo).critic
    assert old_logprobs_pass(narrowed(OldPolicyOptions, cfg), algo, critic) is not skipped


# ---------------------------------------------------------------- whole runs


def _run(tmp_path: Path, tiny_lm: str, prompts: str, name: str, **overrides):
    out = tmp_path / name
    fields = dict(
        iterations=2,
        rollout_batch_size=4,
        group_size=2,
        max_new_tokens=6,
        mini_batch_size=8,
        learning_rate=3e-3,
    )
    cfg = _config(grpo, tiny_lm, prompts, out, **(fields | overrides))
    grpo.train(cfg)
    return read_metrics(out), load_file(str(out / "model.safetensors"))


def test_a_run_without_the_pass_equals_a_run_with_it(tiny_lm, prompts, tmp_path):
    """grpo, β = 0.1 in the loss, 2 micro-batches per step, float64: the same weights after two
    iterations and the same π_old metrics; only perf/old_logprobs_pass tells them apart."""
    kw = dict(grad_accum=2, kl_coef=0.1)
    skipped, w_skipped = _run(tmp_path, tiny_lm, prompts, "skip", **kw)
    kept, w_kept = _run(tmp_path, tiny_lm, prompts, "pass", skip_old_logprobs_pass=False, **kw)
    assert [r["perf/old_logprobs_pass"] for r in skipped] == [0.0, 0.0]
    assert [r["perf/old_logprobs_pass"] for r in kept] == [1.0, 1.0]
    base = load_file(str(Path(tiny_lm) / "model.safetensors"))
    moved = max(float((w_kept[k] - base[k].double()).abs().max()) for k in base)
    diff = max(float((w_skipped[k] - w_kept[k]).abs().max()) for k in w_kept)
    print(f"weights: max |Δ| {diff:.2e}, moved {moved:.2e}")
    assert moved > 1e-3 and diff <= 1e-10
    for a, b in zip(skipped, kept, strict=True):
        assert a["objective/scores"] == b["objective/scores"]  # the same samples
        for key in (
            "objective/kl",
            "objective/entropy",
            "objective/rlhf_reward",
            "policy/total_loss",
            "policy/policy_loss",
        ):
            assert a[key] == pytest.approx(b[key], rel=1e-9, abs=1e-12), key
        assert a["policy/approx_kl"] == 0.0 and abs(b["policy/approx_kl"]) < 1e-12
    assert abs(kept[1]["objective/kl"]) > 1e-6  # the KL after a step is measured, not assumed 0


@pytest.mark.parametrize(
    "overrides",
    [
        {"ppo_epochs": 2},
        {"mini_batch_size": 4},
        {"sampler_logprobs": True, "rollout_correction": "tis"},
    ],
)
def test_where_the_pass_must_stay_it_does(overrides, tiny_lm, prompts, tmp_path):
    """The option changes nothing here: the same bits either way, and the pass ran."""
    on, w_on = _run(tmp_path, tiny_lm, prompts, "on", **overrides)
    off, w_off = _run(tmp_path, tiny_lm, prompts, "off", skip_old_logprobs_pass=False, **overrides)
    assert all(r["perf/old_logprobs_pass"] == 1.0 for r in on + off)
    assert all(torch.equal(w_on[k], w_off[k]) for k in w_off)
    assert [r["objective/kl"] for r in on] == [r["objective/kl"] for r in off]
