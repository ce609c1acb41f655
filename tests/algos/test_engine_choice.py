"""The engine asked for is the engine that runs, and π_old is the policy that sampled (issue 40):

- ``sampler: vllm`` with ``stop_strings`` is refused in one line wherever it enters (the
  module-level ``grpo.train`` validated the config nowhere and ran transformers' generate);
- with ``async_rollout`` a value head's rollout takes π_old from the engine (the behaviour
  policy, a version or more behind), not from the current policy's pass, as the critic-free
  family and the separate critic do.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import pytest
import torch

from proxrl.algos.online import grpo, ppo
from proxrl.algos.online.roles import load_models, load_prompts, load_rewards, role_settings
from proxrl.algos.online.run_settings import run_settings
from proxrl.algos.online.samplers import make_engine
from proxrl.rollout.engines import PolicySampling
from proxrl.rollout.forward import policy_forward
from proxrl.runtime.errors import ProxrlError
from tests.algos.collected import rollout_of

WORDS = ["abc", "def", "ghi", "jkl"]


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
        iterations=1,
        rollout_batch_size=2,
        group_size=2,
        max_new_tokens=5,
        mini_batch_size=4,
        dtype="float64",
        temperature=1.0,
        progress=False,
        seed=3,
    )
    return module.Config(**(fields | overrides))


def test_vllm_with_stop_strings_is_refused_not_replaced(tiny_lm, prompts, tmp_path):
    """The engine table refuses it (a config that skipped validation), and so does the
    module-level train, before the output directory is touched."""
    out = tmp_path / "run"
    cfg = _config(grpo, tiny_lm, prompts, out, sampler="vllm", stop_strings=("\n",))
    with pytest.raises(ProxrlError, match="stop_strings: sampler vllm") as refused:
        make_engine(role_settings(cfg).engine, tokenizer=None)
    assert "\n" not in str(refused.value)
    with pytest.raises(ProxrlError, match="vllm"):
        grpo.train(cfg)
    assert not out.exists()


def test_module_level_train_validates_the_config(tiny_lm, prompts, tmp_path):
    """ppo.train / grpo.train check what the CLI and proxrl.ppo(...) check (here: a rollout
    correction without the sampler's log-probs) before anything runs."""
    out = tmp_path / "run"
    cfg = _config(ppo, tiny_lm, prompts, out, rollout_correction="tis")
    with pytest.raises(ProxrlError, match="rollout_correction: tis corrects"):
        ppo.train(cfg)
    assert not out.exists()


class _Stale:
    """An engine sampling from a copy of the policy taken before it moved: async_rollout's
    one-step-off batch."""

    def __init__(self, tokenizer, stale: torch.nn.Module) -> None:
        self.inner = PolicySampling(tokenizer)
        self.stale = stale

    def sampler(self, policy: torch.nn.Module):
        return self.inner.sampler(self.stale)


def test_async_value_head_takes_pi_old_from_the_engine(tiny_lm, prompts, tmp_path):
    """critic head, async_rollout, sampler_logprobs, no rollout correction: the batch sampled by
    the policy one version back keeps that policy's log-probs as π_old (the update's ratio then
    corrects the lag); V_old still comes from the value head on the current pass."""
    cfg = _config(
        ppo, tiny_lm, prompts, tmp_path, critic="head", sampler_logprobs=True, async_rollout=True
    )
    algo = ppo.build(cfg)
    models = load_models(role_settings(cfg).models, algo)
    source = run_settings(cfg, algo, models.critic).collecting.old_policy
    assert source.from_sampler and not source.correct
    stale = copy.deepcopy(models.actor)
    with torch.no_grad():  # the policy moves on after the batch was launched
        for p in models.actor.parameters():
            p.add_(0.05 * torch.randn_like(p))
    examples, ids = load_prompts(role_settings(cfg).prompts, models.tokenizer)
    n = cfg.rollout_batch_size
    experience, _, _ = rollout_of(
        cfg,
        algo,
        models,
        load_rewards(role_settings(cfg).rewards),
        examples[:n],
        ids[:n],
        0.05,
        {},
        _Stale(models.tokenizer, stale),
    )
    P = experience.prompt_ids.shape[1]
    ids_all = torch.cat([experience.prompt_ids, experience.response_ids], 1)
    mask_all = torch.cat([experience.prompt_mask, experience.response_mask], 1)
    mask = experience.response_mask.bool()
    with torch.no_grad():
        behaviour = policy_forward(stale, ids_all, mask_all, P, cfg.temperature).logprobs
        current = policy_forward(models.actor, ids_all, mask_all, P, cfg.temperature).logprobs
    assert experience.logprobs is not None
    old = experience.logprobs[mask].double()  # (the sampler keeps float32)
    torch.testing.assert_close(old, behaviour[mask], rtol=1e-5, atol=1e-5)
    assert (old - current[mask]).abs().max() > 1e-3
    assert experience.values is not None and experience.values.shape == mask.shape


def test_async_rollout_implies_sampler_logprobs_unless_set_false(
    tiny_lm, prompts, tmp_path, caplog
):
    """async_rollout with sampler_logprobs left unset takes the engine's log-probs, saying so
    in one line (issue 51: it refused to start until the user set it); set explicitly, either
    way, it is taken as given, and false is still refused; without async_rollout the default
    stays false."""
    with caplog.at_level(logging.INFO, logger="proxrl.algos.online.config"):
        implied = _config(grpo, tiny_lm, prompts, tmp_path, placement="ray", async_rollout=True)
    implied.validate()
    assert implied.sampler_logprobs is True
    said = [r.getMessage() for r in caplog.records if "sampler_logprobs" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("async_rollout: sampler_logprobs true"), said
    caplog.clear()
    explicit = _config(
        grpo, tiny_lm, prompts, tmp_path, placement="ray", async_rollout=True,
        sampler_logprobs=False,
    )  # fmt: skip
    assert explicit.sampler_logprobs is False and not caplog.records
    with pytest.raises(ProxrlError, match="leave sampler_logprobs unset"):
        explicit.validate()
    assert _config(grpo, tiny_lm, prompts, tmp_path).sampler_logprobs is False
