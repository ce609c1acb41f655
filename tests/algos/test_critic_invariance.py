"""Issue 35's terms leave one optimizer step's gradient unchanged whether its mini-batch runs in
1, 2 or 4 micro-batches: the positive-example NLL (its positive rows and scale decided once over
the rollout by the estimate), on value targets of critic_lam and length-adaptive advantages,
for every loss aggregation (tests/algos/test_loss_invariance.py's hand-built rollout)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from proxrl.algos.online import ppo
from proxrl.algos.online.roles import load_models, role_settings
from proxrl.algos.online.run_settings import run_settings
from proxrl.algos.online.update import UpdateStep, update
from proxrl.core import AGGREGATIONS
from proxrl.runtime.guard import NonFiniteGuard
from tests.algos.test_loss_invariance import REL_TOL, _config, _experience


@pytest.fixture(scope="module")
def one_prompt(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "say: abc ->"}) + "\n")
    return str(path)


def _step(tiny_lm: str, prompts: str, out: Path, grad_accum: int, **overrides) -> tuple:
    """−gradient of one SGD step (lr 1) over every trained parameter, and its stats."""
    cfg = _config(ppo, tiny_lm, prompts, out, grad_accum, **overrides)
    algo = ppo.build(cfg)
    torch.manual_seed(cfg.seed)
    models = load_models(role_settings(cfg).models, algo)
    params = [p for p in models.actor.parameters() if p.requires_grad]
    params += list(models.critic.parameters())
    before = [p.detach().clone() for p in params]
    experience = _experience(models.actor, critic_values=True)
    rewards, advantages, returns = algo.estimate(experience, cfg.kl_coef)  # positives observed
    experience = replace(experience, rewards=rewards, advantages=advantages, returns=returns)
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
    return change, stats


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("threshold", [None, 0.0])
def test_positive_nll_and_decoupled_lambdas_are_invariant_to_micro_batching(
    threshold, aggregation, tiny_lm, one_prompt, tmp_path
):
    """VAPO's set: critic_lam 1, length-adaptive λ, positive NLL with weight 1 (large, so that a
    wrong normaliser shows); positive rows: the rollout's best score, or every score ≥ 0."""
    fields = dict(
        loss_aggregation=aggregation,
        critic_lam=1.0,
        length_adaptive_alpha=0.5,
        positive_nll_coef=1.0,
        positive_threshold=threshold,
    )
    one, stats = _step(tiny_lm, one_prompt, tmp_path, 1, **fields)
    assert stats["positive_nll"] > 0  # the term is there
    without, _ = _step(tiny_lm, one_prompt, tmp_path, 1, **(fields | {"positive_nll_coef": 0.0}))
    scale = float(one.abs().max())
    assert float((one - without).abs().max()) > 1e-3 * scale  # and moves the weights
    for grad_accum in (2, 4):
        split, split_stats = _step(tiny_lm, one_prompt, tmp_path, grad_accum, **fields)
        diff = float((split - one).abs().max())
        assert diff <= REL_TOL * scale, f"grad_accum {grad_accum}: {diff:.3e} vs {scale:.3e}"
        torch.testing.assert_close(split_stats["positive_nll"], stats["positive_nll"])
