"""An update without information moves nothing (issue 40): a rollout whose every group's scores
are equal (every advantage 0, so an exactly zero policy gradient) must not step the policy's
AdamW, whose first moment alone would otherwise move every weight by a full-sized step; the
weights AND the optimizer state stay bit-identical (float64), ``policy/skipped_steps`` counts
the step, ``policy/optimizer_steps`` counts only steps taken, and a run where most iterations
are so is warned about once. A step with a gradient still steps; under PPO a zero policy
gradient beside a non-zero value-loss gradient steps the critic alone (the decision is per
optimizer)."""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from proxrl.algos.online import grpo, ppo
from proxrl.algos.online.advantages import estimate
from proxrl.algos.online.roles import load_models, load_prompts, load_rewards, role_settings
from proxrl.algos.online.run_settings import run_settings
from proxrl.algos.online.update import UpdateStep, update
from proxrl.runtime.guard import NonFiniteGuard
from proxrl.runtime.metrics import read_metrics
from tests.algos.collected import rollout_of

WORDS = ["abc", "def", "ghi", "jkl", "mno", "pqr", "stu", "vwx"]
CONSTANT = "tests.algos.test_zero_gradient:constant"
LEARNABLE = "tests.algos.online_rewards:target_fraction"


def constant(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    """The same score for every completion: every group is constant (seed 4 of the calculator
    task after its first iteration)."""
    return [0.0] * len(completions)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in WORDS))
    return str(path)


def _config(module, tiny_lm: str, prompts: str, out: Path, **overrides):
    fields = dict(
        model=tiny_lm,
        prompts=prompts,
        reward_fn=(LEARNABLE,),
        output_dir=str(out),
        iterations=2,
        rollout_batch_size=2,
        group_size=4,
        max_new_tokens=6,
        mini_batch_size=8,
        ppo_epochs=1,
        dtype="float64",
        temperature=1.0,
        learning_rate=1e-2,
        progress=False,
        seed=3,
    )
    return module.Config(**(fields | overrides))


def _snapshot(module: torch.nn.Module, optimizer: torch.optim.Optimizer):
    weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
    return weights, copy.deepcopy(optimizer.state_dict())


def _identical(a, b) -> bool:
    """Bit-identical nested state (tensors by torch.equal, the rest by ==)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_identical(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_identical(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _rollout(cfg, algo, models, examples, ids, reward_fn: str):
    rewards = load_rewards(role_settings(replace(cfg, reward_fn=(reward_fn,))).rewards)
    n = cfg.rollout_batch_size  # the first prompts: one batch
    experience, _, _ = rollout_of(cfg, algo, models, rewards, examples[:n], ids[:n], 0.0, {})
    return estimate(algo, experience, 0.0)


def _update(cfg, algo, models, experience, optimizers):
    return update(
        run_settings(cfg, algo, models.critic).updating,
        algo,
        models,
        experience,
        optimizers,
        UpdateStep(0.0, True, 1),
        torch.Generator().manual_seed(0),
        NonFiniteGuard(),
    )


def test_a_constant_rollout_leaves_weights_and_adam_state_bit_identical(tiny_lm, prompts, tmp_path):
    """A learnable step first (so AdamW holds moments, as mid-run), then a rollout whose every
    group is constant: the second update takes no step, and the weights and the optimizer's
    state (moments, step count) are bit-identical."""
    cfg = _config(grpo, tiny_lm, prompts, tmp_path)
    algo = grpo.build(cfg)
    models = load_models(role_settings(cfg).models, algo)
    examples, ids = load_prompts(role_settings(cfg).prompts, models.tokenizer)
    optimizer = torch.optim.AdamW(models.actor.parameters(), lr=1e-2, weight_decay=0.0)

    before = _snapshot(models.actor, optimizer)
    experience = _rollout(cfg, algo, models, examples, ids, LEARNABLE)
    assert experience.advantages.abs().sum() > 0  # (the tiny model's responses differ)
    stats = _update(cfg, algo, models, experience, [optimizer])
    assert stats["steps"] == 1.0 and stats["skipped_steps"] == 0.0
    after_learning = _snapshot(models.actor, optimizer)
    assert not _identical(before[0], after_learning[0])  # a step with a gradient still steps
    assert optimizer.state  # AdamW now holds moments that would move the weights on their own

    experience = _rollout(cfg, algo, models, examples, ids, CONSTANT)
    assert torch.equal(experience.advantages, torch.zeros_like(experience.advantages))
    stats = _update(cfg, algo, models, experience, [optimizer])
    assert stats["steps"] == 0.0 and stats["skipped_steps"] == 1.0
    assert stats["grad_norm"] == 0.0
    after_constant = _snapshot(models.actor, optimizer)
    assert _identical(after_learning[0], after_constant[0])  # the weights
    assert _identical(after_learning[1], after_constant[1])  # moments, step count, lr


def test_a_zero_policy_gradient_still_steps_the_critic(tiny_lm, prompts, tmp_path):
    """PPO: every advantage 0 (no policy gradient) but returns the critic misses: the critic's
    optimizer steps and its weights move, while the policy's weights and AdamW stay
    bit-identical. The decision is per optimizer."""
    cfg = _config(ppo, tiny_lm, prompts, tmp_path, critic="separate", critic_learning_rate=1e-2)
    algo = ppo.build(cfg)
    models = load_models(role_settings(cfg).models, algo)
    examples, ids = load_prompts(role_settings(cfg).prompts, models.tokenizer)
    actor_opt = torch.optim.AdamW(models.actor.parameters(), lr=1e-2, weight_decay=0.0)
    critic_opt = torch.optim.AdamW(models.critic.parameters(), lr=1e-2, weight_decay=0.0)
    experience = _rollout(cfg, algo, models, examples, ids, LEARNABLE)
    experience = replace(
        experience,
        advantages=torch.zeros_like(experience.advantages),
        returns=experience.returns + 1.0,
    )
    actor_before = _snapshot(models.actor, actor_opt)
    critic_before = {k: v.clone() for k, v in models.critic.state_dict().items()}
    stats = _update(cfg, algo, models, experience, [actor_opt, critic_opt])
    assert stats["steps"] == 0.0 and stats["skipped_steps"] == 1.0
    assert _identical(actor_before, _snapshot(models.actor, actor_opt))
    assert critic_opt.state  # the critic stepped
    critic_after = models.critic.state_dict()
    assert any(not torch.equal(critic_before[k], critic_after[k]) for k in critic_after)


def test_a_run_without_information_keeps_the_policy_logs_and_warns_once(
    tiny_lm, prompts, tmp_path, caplog
):
    """A whole GRPO run whose every group is constant saves the starting weights bit for bit,
    logs policy/optimizer_steps 0 and policy/skipped_steps 1 each iteration, and warns once,
    naming the remedies."""
    cfg = _config(grpo, tiny_lm, prompts, tmp_path, reward_fn=(CONSTANT,), iterations=5)
    start = load_file(Path(tiny_lm) / "model.safetensors")
    with caplog.at_level(logging.WARNING, logger="proxrl.algos.online.loop"):
        grpo.train(cfg)
    rows = read_metrics(tmp_path)
    assert [r["policy/optimizer_steps"] for r in rows] == [0.0] * 5
    assert [r["policy/skipped_steps"] for r in rows] == [1.0] * 5
    saved = load_file(tmp_path / "model.safetensors")
    assert all(torch.equal(saved[k], start[k].to(saved[k].dtype)) for k in saved)
    warnings = [r.getMessage() for r in caplog.records if "took no policy step" in r.getMessage()]
    assert len(warnings) == 1
    assert all(s in warnings[0] for s in ("dynamic_sampling", "group_size", "temperature"))


def test_mask_truncated_that_leaves_nothing_counts_the_steps_and_warns_once(
    tiny_lm, prompts, tmp_path, caplog
):
    """max_new_tokens 1 under mask_truncated: every response that did not stop at once is
    masked out, and a step whose every response is masked takes no step. Each is counted in
    policy/masked_steps and in policy/skipped_steps (issue 51: 0 was counted, and nothing said
    why the policy did not move), and one warning names the cause and the remedies."""
    cfg = _config(
        grpo, tiny_lm, prompts, tmp_path, iterations=3, max_new_tokens=1, mini_batch_size=2,
        mask_truncated=True,
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="proxrl.algos.online.loop"):
        grpo.train(cfg)
    rows = read_metrics(tmp_path)
    masked = [r["policy/masked_steps"] for r in rows]
    assert sum(masked) > 0
    for r in rows:  # 4 steps per iteration: each taken, masked, or of a zero gradient
        assert r["policy/skipped_steps"] >= r["policy/masked_steps"]
        assert r["policy/optimizer_steps"] + r["policy/skipped_steps"] == 4
    warnings = [r.getMessage() for r in caplog.records if "mask_truncated" in r.getMessage()]
    assert len(warnings) == 1
    assert all(s in warnings[0] for s in ("max_new_tokens", "policy/masked_steps"))
    assert not any("scores equal" in r.getMessage() for r in caplog.records)
