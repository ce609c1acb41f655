"""``roles.role_settings``: the records loading and placing the roles read, built once from the
config (issue 52). Each field is the config's option of the same name (``narrowed``); these
tests pin the derived ones and that the records reach Ray's actors whole (they are pickled)."""

from __future__ import annotations

import pickle

from proxrl.algos.online import grpo, ppo
from proxrl.algos.online.role_settings import LaunchAhead
from proxrl.algos.online.roles import role_settings
from proxrl.rollout.generation import SamplingSettings
from proxrl.runtime.config import narrowed


def test_which_roles_have_an_actor_follows_the_kl_lora_teacher_and_critic_options():
    """A reference of its own only where the KL is measured and the policy is no LoRA (its
    adapters off are the reference); a critic actor only for a separate critic; a teacher
    actor only for the sampled-tokens form of distillation."""
    base = dict(model="m", prompts="p")
    untracked = grpo.Config(**base, track_kl=False, kl_coef=0.0)
    assert not role_settings(untracked).models.tracks_kl
    assert not role_settings(untracked).ray.reference_actor
    tracked = grpo.Config(**base, kl_coef=0.1)
    assert role_settings(tracked).models.tracks_kl and role_settings(tracked).ray.reference_actor
    lora = grpo.Config(**base, kl_coef=0.1, lora_r=4)
    assert role_settings(lora).models.tracks_kl and not role_settings(lora).ray.reference_actor
    reset = grpo.Config(**base, track_kl=False, kl_coef=0.0, ref_reset_every=3)
    assert role_settings(reset).models.tracks_kl  # a moving reference is measured against
    assert role_settings(ppo.Config(**base, critic="separate")).ray.critic_actor
    assert not role_settings(ppo.Config(**base, critic="head")).ray.critic_actor
    assert not role_settings(grpo.Config(**base)).ray.critic_actor
    sampled = grpo.Config(**base, teacher_model="t", distill_loss="reverse_kl_reward")
    assert role_settings(sampled).ray.teacher_actor
    whole = grpo.Config(**base, teacher_model="t", distill_loss="gjsd")
    assert not role_settings(whole).ray.teacher_actor
    assert not role_settings(grpo.Config(**base)).ray.teacher_actor


def test_batches_launched_ahead_read_the_runs_sampling_and_order():
    """Without async_rollout nothing is launched ahead (None); with it, the run's sampling
    distribution and the options that fix each iteration's prompts."""
    base = dict(model="m", prompts="p", temperature=0.7, top_k=5, max_new_tokens=9, seed=11)
    assert role_settings(grpo.Config(**base)).ray.ahead is None
    cfg = grpo.Config(**base, async_rollout=True, max_staleness=2, iterations=7, group_size=3)
    ahead = role_settings(cfg).ray.ahead
    assert ahead == LaunchAhead(
        2, 7, cfg.rollout_batch_size, 3, 11, narrowed(SamplingSettings, cfg)
    )


def test_the_records_travel_to_an_actor_whole():
    """Ray pickles an actor's arguments: every record comes back equal, and frozen."""
    roles = role_settings(ppo.Config(model="m", prompts="p", async_rollout=True))
    assert pickle.loads(pickle.dumps(roles)) == roles
    for record in (roles.models, roles.rewards, roles.engine, roles.prompts, roles.ray):
        assert type(record).__dataclass_params__.frozen, type(record)  # type: ignore[attr-defined]
