"""The update's seam for a critic in another process, without Ray's transport: ``RemoteCritic``
driving a ``CriticActor`` held in this process (each call run at once), so that these checks
take seconds. The same optimizer steps as the critic in the trainer's own process, one clip norm
over both, and a non-finite critic gradient that skips the whole step by its name."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from proxrl.algos.online import ppo
from proxrl.algos.online.advantages import estimate
from proxrl.algos.online.placement import ray_critic
from proxrl.algos.online.placement.ray_critic import CriticActor, remote_loader
from proxrl.algos.online.role_settings import ModelSettings
from proxrl.algos.online.roles import load_models, load_prompts, load_rewards, role_settings
from proxrl.algos.online.run_settings import run_settings
from proxrl.algos.online.update import UpdateStep, update
from proxrl.runtime.guard import NonFiniteGuard
from proxrl.runtime.seeding import capture_rng_state, restore_rng_state
from tests.algos.collected import rollout_of

WORDS = ["abc", "def", "ghi", "jkl", "mno", "pqr", "stu", "vwx"]


class Direct:
    """An actor handle whose ``method.remote(...)`` runs the call at once and gives its result
    (``ray_critic.answer`` then takes it as it is)."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def __getattr__(self, name: str) -> Any:
        return SimpleNamespace(remote=getattr(self.actor, name))


def starter(actors: list[CriticActor]) -> Any:
    """Start a critic actor in this process, as if in another: its load leaves this process's
    random state where it was (the hand-back has to move it)."""

    def start(model_settings: ModelSettings, loader: Any, rng: dict[str, Any]) -> Direct:
        untouched = capture_rng_state()
        actors.append(CriticActor([], model_settings, loader, rng))
        restore_rng_state(untouched)
        return Direct(actors[-1])

    return start


@pytest.fixture
def setup(tiny_lm, tmp_path, monkeypatch):
    """A float64 PPO config whose clip binds, a rollout of it, and the models twice from the
    same seed: the critic in this process, and the critic in a (direct) critic actor."""
    monkeypatch.setattr(ray_critic, "answer", lambda refs: refs)
    monkeypatch.setattr(ray_critic, "ready_within", lambda refs, what: refs)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in WORDS))
    cfg = ppo.Config(
        model=tiny_lm,
        prompts=str(prompts),
        reward_fn=("tests.algos.online_rewards:target_fraction",),
        output_dir=str(tmp_path / "run"),
        rollout_batch_size=4,
        group_size=2,
        max_new_tokens=6,
        mini_batch_size=4,
        grad_accum=2,
        ppo_epochs=2,
        learning_rate=3e-3,
        critic_learning_rate=3e-3,
        vf_coef=0.5,
        max_grad_norm=0.05,
        dtype="float64",
        seed=5,
    )
    algo = ppo.build(cfg)
    torch.manual_seed(0)
    roles = role_settings(cfg)
    here = load_models(roles.models, algo)
    actors: list[CriticActor] = []
    torch.manual_seed(0)
    remote = remote_loader(starter(actors), algo.critic, cfg.output_dir)
    elsewhere = load_models(roles.models, replace(algo, critic=remote))
    rewards = load_rewards(roles.rewards)
    examples, ids = load_prompts(roles.prompts, here.tokenizer)
    experience, _, _ = rollout_of(cfg, algo, here, rewards, examples[:4], ids[:4], 0.05, {})
    experience = estimate(algo, experience, 0.05)
    return SimpleNamespace(
        cfg=cfg, algo=algo, here=here, elsewhere=elsewhere, actor=actors[0], exp=experience
    )


def run_update(
    s: SimpleNamespace, models: Any, guard: NonFiniteGuard, train_policy: bool = True
) -> dict[str, float]:
    optimizers = [
        torch.optim.AdamW(models.actor.parameters(), lr=s.cfg.learning_rate, weight_decay=0.0),
        *models.critic.optimizers(),
    ]
    generator = torch.Generator().manual_seed(0)
    step = UpdateStep(0.05, train_policy, 1)
    settings = run_settings(s.cfg, s.algo, models.critic).updating
    return update(settings, s.algo, models, s.exp, optimizers, step, generator, guard)


def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_a_critic_elsewhere_takes_the_steps_the_critic_here_takes(setup):
    """Two epochs of two steps of two micro-batches each, every step clipped (norm ≫ 0.05): the
    same stats (value loss, total loss, the global gradient norm), the same policy and the
    same critic to round-off."""
    s = setup
    want = run_update(s, s.here, NonFiniteGuard())
    got = run_update(s, s.elsewhere, NonFiniteGuard())
    assert want["steps"] == got["steps"] == 4.0
    assert want["grad_norm"] > 10 * s.cfg.max_grad_norm
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-12, abs=1e-15), key
    for name, a, b in (
        ("actor", s.here.actor, s.elsewhere.actor),
        ("critic", s.here.critic.module, s.actor.critic.modules()[0]),
    ):
        for key, value in weights(a).items():
            torch.testing.assert_close(weights(b)[key], value, rtol=1e-12, atol=1e-15, msg=name)


@pytest.mark.parametrize("train_policy", [True, False], ids=["policy and critic", "warm-up"])
def test_a_non_finite_critic_gradient_skips_the_whole_step_as_in_one_process(
    setup, caplog, train_policy
):
    """A NaN in one critic gradient, the critic here and elsewhere: every step is skipped,
    policy and critic alike (the policy's own gradients were finite), with the warnings the
    guard gives in one process, which name the critic's parameter whether or not the policy
    has a gradient (before 2b7d966 the clip's NaN coefficient made the policy's first
    parameter look guilty beside a policy gradient)."""
    s = setup
    messages = []
    for models, critic in (
        (s.here, s.here.critic.module),
        (s.elsewhere, s.actor.critic.modules()[0]),
    ):
        next(iter(critic.parameters())).register_hook(lambda grad: grad * math.nan)
        before = weights(models.actor), weights(critic)
        guard = NonFiniteGuard(max_consecutive=10)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="proxrl.runtime.guard"):
            stats = run_update(s, models, guard, train_policy)
        assert stats["steps"] == 0.0 and guard.skipped == 4
        messages.append([record.getMessage() for record in caplog.records])
        for old, module in zip(before, (models.actor, critic), strict=True):
            assert all(torch.equal(old[k], v) for k, v in weights(module).items())
    assert messages[1] == messages[0] and len(messages[0]) == 4
    critic_named = "grad of critic.model.embed_tokens.weight holds NaN; update skipped"
    assert critic_named in messages[0][0], messages[0][0]


def test_the_critic_actor_keeps_the_random_stream_and_saves_the_critic(setup, tmp_path):
    """Loaded in its actor, the critic leaves this process's random state where loading it here
    leaves it; ``save_pretrained`` writes its files under critic/ as the critic here does."""
    s = setup
    torch.manual_seed(1)
    models = role_settings(s.cfg).models
    s.algo.critic(models, s.here.actor, s.here.tokenizer)
    want = torch.rand(3)
    torch.manual_seed(1)
    remote = remote_loader(starter([]), s.algo.critic, s.cfg.output_dir)
    remote(models, s.here.actor, s.here.tokenizer)
    assert torch.equal(torch.rand(3), want)
    s.here.critic.save_pretrained(tmp_path / "here")
    s.elsewhere.critic.save_pretrained(tmp_path / "elsewhere")
    files = sorted(p.relative_to(tmp_path / "here") for p in (tmp_path / "here").rglob("*"))
    assert files and files == sorted(
        p.relative_to(tmp_path / "elsewhere") for p in (tmp_path / "elsewhere").rglob("*")
    )
    for path in files:
        if (tmp_path / "here" / path).is_file():
            assert (tmp_path / "elsewhere" / path).read_bytes() == (
                tmp_path / "here" / path
            ).read_bytes(), path
