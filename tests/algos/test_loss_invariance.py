"""One optimizer step gives the same gradient whether its mini-batch runs in 1, 2 or 4
micro-batches (the bug class of TRL #3021 / ms-swift #10117), for every loss aggregation, every
policy loss and the KL, entropy and value terms, on responses of very unequal length.

The rollout is built by hand: 8 responses of lengths 6, 1, 2, 2, 1, 6, 2, 1 (so micro-batches
trim to different widths), old and reference log-probs perturbed away from the policy's (ratios
≠ 1, some clipped), random advantages. A step is SGD with learning rate 1, so the weight change
is minus the gradient; float64 throughout, compared to 1e-10 of the largest change.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from proxrl.algos.online import grpo, ppo
from proxrl.algos.online.roles import load_models, role_settings
from proxrl.algos.online.run_settings import run_settings
from proxrl.algos.online.update import UpdateStep, update
from proxrl.core import AGGREGATIONS, POLICY_LOSSES
from proxrl.rollout.experience import Experience
from proxrl.rollout.forward import policy_forward
from proxrl.runtime.guard import NonFiniteGuard

LENGTHS = [6, 1, 2, 2, 1, 6, 2, 1]
BATCH_WIDE_LOSSES = ("clip_cov", "kl_cov")  # chosen over the whole step: tested below
REL_TOL = 1e-10


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "say: abc ->"}) + "\n")
    return str(path)


def _config(module, tiny_lm: str, prompts: str, out: Path, grad_accum: int, **overrides):
    fields = dict(
        model=tiny_lm,
        prompts=prompts,
        reward_fn=("tests.algos.online_rewards:target_fraction",),
        output_dir=str(out),
        rollout_batch_size=2,
        group_size=4,
        max_new_tokens=7,  # > the widest response: Dr. GRPO's horizon is the budget, not T
        mini_batch_size=8,
        grad_accum=grad_accum,
        ppo_epochs=1,
        dtype="float64",
        temperature=1.0,
        kl_coef=0.1,
        entropy_coef=0.01,
        progress=False,
        seed=3,
    )
    return module.Config(**(fields | overrides))


def _experience(actor, critic_values: bool) -> Experience:
    g = torch.Generator().manual_seed(0)
    B, P, T = len(LENGTHS), 3, max(LENGTHS)
    vocab = actor.config.vocab_size
    prompt_ids = torch.randint(5, vocab, (B, P), generator=g)
    response_ids = torch.randint(5, vocab, (B, T), generator=g)
    mask = (torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    response_ids = torch.where(mask.bool(), response_ids, 0)
    with torch.no_grad():
        lp = policy_forward(
            actor,
            torch.cat([prompt_ids, response_ids], 1),
            torch.cat([torch.ones_like(prompt_ids), mask], 1),
            P,
            1.0,
        ).logprobs
    noise = lambda s: s * torch.randn(B, T, generator=g, dtype=torch.float64)  # noqa: E731
    fmask = mask.double()
    seq_adv = torch.randn(B, generator=g, dtype=torch.float64)
    token_adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    advantages = (token_adv if critic_values else seq_adv[:, None]) * fmask
    values = noise(1.0) * fmask if critic_values else torch.zeros(B, T, dtype=torch.float64)
    return Experience(
        prompt_ids=prompt_ids,
        prompt_mask=torch.ones_like(prompt_ids),
        response_ids=response_ids,
        response_mask=mask,
        logprobs=(lp + noise(0.3)) * fmask,
        ref_logprobs=(lp + noise(0.5)) * fmask,
        values=values,
        scores=seq_adv,
        rewards=torch.zeros(B, T, dtype=torch.float64),
        advantages=advantages,
        returns=(advantages + values) * fmask,
    )


def _step(module, tiny_lm, prompts, tmp_path, grad_accum, with_stats=False, **overrides):
    """−gradient of one optimizer step over all trained parameters, flattened (and the step's
    stats ``with_stats``)."""
    cfg = _config(module, tiny_lm, prompts, tmp_path, grad_accum, **overrides)
    algo = module.build(cfg)
    torch.manual_seed(cfg.seed)
    models = load_models(role_settings(cfg).models, algo)
    params = [p for p in models.actor.parameters() if p.requires_grad]
    params += list(models.critic.parameters())
    before = [p.detach().clone() for p in params]
    experience = _experience(models.actor, critic_values=module is ppo)
    stats = update(
        run_settings(cfg, algo, models.critic).updating,
        algo,
        models,
        experience,
        [torch.optim.SGD(params, lr=1.0)],
        UpdateStep(cfg.kl_coef, True, 1),
        torch.Generator().manual_seed(1),
        NonFiniteGuard(),
    )
    assert stats["steps"] == 1.0
    change = torch.cat([(p.detach() - b).flatten() for p, b in zip(params, before, strict=True)])
    return (change, stats) if with_stats else change


def _assert_invariant(module, tiny_lm, prompts, tmp_path, **overrides) -> None:
    one = _step(module, tiny_lm, prompts, tmp_path, 1, **overrides)
    scale = float(one.abs().max())
    assert scale > 1e-4  # the step moved the weights
    for grad_accum in (2, 4):
        split = _step(module, tiny_lm, prompts, tmp_path, grad_accum, **overrides)
        diff = float((split - one).abs().max())
        print(f"{overrides} grad_accum {grad_accum}: max |Δ| {diff:.2e} of {scale:.2e}")
        assert diff <= REL_TOL * scale, f"grad_accum {grad_accum}: {diff:.3e} vs {scale:.3e}"


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_grpo_step_is_invariant_to_micro_batching(aggregation, tiny_lm, prompts, tmp_path):
    """GRPO: PPO-Clip surrogate + β·KL in the loss + entropy bonus."""
    _assert_invariant(grpo, tiny_lm, prompts, tmp_path, loss_aggregation=aggregation)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_ppo_step_is_invariant_to_micro_batching(aggregation, tiny_lm, prompts, tmp_path):
    """PPO: token-level advantages, the critic's clipped value loss, the entropy bonus."""
    _assert_invariant(ppo, tiny_lm, prompts, tmp_path, loss_aggregation=aggregation)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize(
    "policy_loss", [name for name in POLICY_LOSSES if name not in ("ppo", *BATCH_WIDE_LOSSES)]
)
def test_new_surrogates_are_invariant_to_micro_batching(
    policy_loss, aggregation, tiny_lm, prompts, tmp_path
):
    """GSPO's sequence ratio, GSPO-token's and CISPO's weights, with the KL and entropy terms."""
    _assert_invariant(
        grpo,
        tiny_lm,
        prompts,
        tmp_path,
        policy_loss=policy_loss,
        loss_aggregation=aggregation,
        clip=0.05,
    )


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("policy_loss", ["dppo_tv", "dppo_kl"])
def test_dppo_masks_are_invariant_to_micro_batching(
    policy_loss, aggregation, tiny_lm, prompts, tmp_path
):
    """DPPO with trust regions small enough that some tokens (of both signs of A) are masked."""
    _assert_invariant(
        grpo,
        tiny_lm,
        prompts,
        tmp_path,
        policy_loss=policy_loss,
        loss_aggregation=aggregation,
        dppo_delta_low=1e-4,
        dppo_delta_high=1e-4,
    )


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("policy_loss", ["ppo", "cispo"])
def test_opsm_is_invariant_to_micro_batching(policy_loss, aggregation, tiny_lm, prompts, tmp_path):
    """OPSM decides per sequence: any split of the rows gives the same mask (δ small enough that
    some sequences with A < 0 are dropped)."""
    _assert_invariant(
        grpo,
        tiny_lm,
        prompts,
        tmp_path,
        policy_loss=policy_loss,
        loss_aggregation=aggregation,
        off_policy_mask="opsm",
        opsm_delta=0.02,
    )


# The choices made over a whole optimizer step (core.BATCH_WIDE_MASKS, core.TOKEN_SELECTIONS):
# each case's options, with the stat that shows it acted, and options under which it is inert.
BATCH_WIDE = {
    "m2po": (
        {"off_policy_mask": "m2po", "m2po_tau": 0.02},
        "off_policy_masked",
        {"m2po_tau": 100.0},
    ),
    "clip_cov": (
        {"policy_loss": "clip_cov", "clip_cov_lb": -1.0, "clip_cov_ratio": 0.2},
        "cov_dropped",
        {"policy_loss": "ppo"},
    ),
    "kl_cov": (
        {"policy_loss": "kl_cov", "kl_cov_ratio": 0.2},
        "kl_cov_selected",
        {"policy_loss": "kl_cov", "kl_cov_coef": 0.0},
    ),
}


@pytest.mark.parametrize("old_is_pi", [False, True])
@pytest.mark.parametrize("case", sorted(BATCH_WIDE))
def test_batch_wide_choices_are_invariant_to_micro_batching(
    case, old_is_pi, tiny_lm, prompts, tmp_path
):
    """M2PO's second moment, Clip-Cov's draw and KL-Cov's top-k are chosen over all of the
    step's rows before its micro-batches: 1, 2 or 4 micro-batches give the same step. π at the
    step comes from a forward without gradient over the step (sampler_logprobs: the rollout's
    π_old is not the trainer's π) or, where π_old is the trainer's own pass and the policy has
    not stepped yet, from π_old itself (no forward: here π_old is the perturbed one, which
    M2PO's moment then reads as π, so it masks nothing). The choice acts: some tokens chosen
    (its stat > 0) and a step other than the inert options'."""
    options, stat, inert = BATCH_WIDE[case]
    source = {} if old_is_pi else {"sampler_logprobs": True}
    common = dict(loss_aggregation="token-mean", **source)
    if case == "m2po" and old_is_pi:
        _, stats = _step(grpo, tiny_lm, prompts, tmp_path, 1, with_stats=True, **common, **options)
        assert stats[stat] == 0.0  # log π = log π_old: every (log r)² is 0
        return
    _assert_invariant(grpo, tiny_lm, prompts, tmp_path, **common, **options)
    one, stats = _step(grpo, tiny_lm, prompts, tmp_path, 4, with_stats=True, **common, **options)
    assert stats[stat] > 0.0
    idle = _step(grpo, tiny_lm, prompts, tmp_path, 1, **(common | options | inert))
    assert float((idle - one).abs().max()) > 1e-3 * float(one.abs().max())


@pytest.mark.parametrize("kl_loss_type", ["k1", "k2", "k3+"])
def test_kl_loss_estimators_are_invariant_to_micro_batching(
    kl_loss_type, tiny_lm, prompts, tmp_path
):
    _assert_invariant(
        grpo,
        tiny_lm,
        prompts,
        tmp_path,
        kl_loss_type=kl_loss_type,
        loss_aggregation="seq-mean-token-sum-norm",
    )


def test_reinforce_policy_gradient_is_invariant_to_micro_batching(tiny_lm, prompts, tmp_path):
    _assert_invariant(grpo, tiny_lm, prompts, tmp_path, estimator="reinforce")
