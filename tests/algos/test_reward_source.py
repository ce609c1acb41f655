"""The model that scores rollouts must bring its score head: a checkpoint without one (a causal LM,
the SFT directory given by mistake) is refused, naming the directory and what it holds, instead
of being scored by a head transformers initialises at random. Whether the head is there is what
the loader reports missing, not what config.json claims."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from proxrl.algos.online import grpo
from proxrl.algos.online.roles import load_rewards, role_settings
from proxrl.models.scalar_head import load_score_model, score_head
from proxrl.models.tokenizer import load_tokenizer
from proxrl.runtime.errors import ProxrlError


@pytest.fixture(scope="module")
def saved_rm(tiny_lm: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("rm") / "rm"
    torch.manual_seed(0)
    load_score_model(tiny_lm, new_head="reward").save_pretrained(out)
    load_tokenizer(tiny_lm).save_pretrained(out)
    return str(out)


def _config(reward_model: str) -> grpo.Config:
    return grpo.Config(model="m", prompts="p", reward_model=reward_model)


def _claim(directory: Path, architecture: str) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config["architectures"] = [architecture]
    path.write_text(json.dumps(config))


def test_a_causal_lm_as_reward_model_is_refused(tiny_lm):
    with pytest.raises(ProxrlError) as e:
        load_rewards(role_settings(_config(tiny_lm)).rewards)
    assert str(e.value) == (
        f"reward_model: {tiny_lm} holds a causal LM (LlamaForCausalLM) without a score head; "
        "train one with `proxrl rm`"
    )


def test_a_saved_reward_model_scores_with_its_own_head(saved_rm):
    rewards = load_rewards(role_settings(_config(saved_rm)).rewards)
    (source,) = rewards.sources
    saved = load_score_model(saved_rm)
    torch.testing.assert_close(
        score_head(source.model).weight, score_head(saved).weight, rtol=0, atol=0
    )


def test_the_head_is_found_by_the_loader_not_by_the_config(tiny_lm, saved_rm, tmp_path):
    """A reward model whose config.json claims a causal LM still loads; a causal LM whose
    config.json claims a classifier is still refused."""
    import shutil

    claims_lm = tmp_path / "claims_lm"
    shutil.copytree(saved_rm, claims_lm)
    _claim(claims_lm, "LlamaForCausalLM")
    load_score_model(str(claims_lm), new_head=None)

    claims_rm = tmp_path / "claims_rm"
    shutil.copytree(tiny_lm, claims_rm)
    _claim(claims_rm, "LlamaForSequenceClassification")
    with pytest.raises(ProxrlError, match=r"holds a model \(LlamaForSequenceClassification\)"):
        load_score_model(str(claims_rm), new_head=None)


def test_where_training_starts_a_missing_head_is_still_built(tiny_lm):
    """proxrl rm (from an SFT model) and the critic (from the policy) build their head."""
    reward = score_head(load_score_model(tiny_lm, new_head="reward")).weight
    assert reward.abs().sum() > 0
    assert score_head(load_score_model(tiny_lm, new_head="zero")).weight.abs().sum() == 0


def test_a_local_module_loads_under_the_console_script_and_a_missing_one_names_the_path(
    tmp_path, monkeypatch
):
    """The ``proxrl`` console script puts its bin directory, not the working directory, first on
    sys.path (``python -m proxrl`` puts the working directory): ``--reward-fn myreward:score``
    from the directory holding myreward.py must load under both."""
    import sys

    from proxrl.rollout.rewards import load_reward_function

    (tmp_path / "myreward_i23.py").write_text(
        "def score(prompts, completions, **columns):\n    return [1.5] * len(completions)\n"
    )
    (tmp_path / "broken_i23.py").write_text("import not_installed_i23\n")
    monkeypatch.chdir(tmp_path)
    console_path = [p for p in sys.path if p not in ("", str(tmp_path))]
    monkeypatch.setattr(sys, "path", console_path)
    for name in ("myreward_i23", "broken_i23"):
        monkeypatch.delitem(sys.modules, name, raising=False)

    assert load_reward_function("myreward_i23:score")(["p"], ["a", "b"]) == [1.5, 1.5]
    with pytest.raises(ProxrlError) as missing:
        load_reward_function("no_such_i23:score")
    assert str(missing.value) == (
        "reward_fn: no module named 'no_such_i23' on the import path (the working directory "
        f"{tmp_path}, PYTHONPATH, the installed packages)"
    )
    with pytest.raises(ProxrlError) as broken:  # found, but its own import fails: said so
        load_reward_function("broken_i23:score")
    assert str(broken.value) == (
        "reward_fn: cannot import module 'broken_i23' (No module named 'not_installed_i23')"
    )
