"""On-policy distillation under ``placement: ray``: the teacher is an actor of its own (as the
reference), sends back the (B, T) log-probs and argmax of the sampled tokens, and the run equals
the same run with every role in one process."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from proxrl.algos.online import grpo
from proxrl.algos.online.placement.ray_run import role_actors
from proxrl.algos.online.roles import role_settings
from proxrl.runtime.metrics import read_metrics
from tests.algos.conftest import build_sharp_teacher
from tests.ray.test_placement import assert_same_run


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_sharp_teacher(tmp_path_factory.mktemp("teacher") / "lm")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in ["ab", "cd"]))
    return str(path)


def config(tiny_lm: str, teacher: str, prompts: str, out: Path, **overrides) -> grpo.Config:
    fields = dict(
        model=tiny_lm,
        teacher_model=teacher,
        prompts=prompts,
        reward_fn=("tests.algos.online_rewards:target_fraction",),
        output_dir=str(out),
        iterations=2,
        rollout_batch_size=2,
        group_size=2,
        max_new_tokens=5,
        temperature=0.9,
        top_k=20,
        mini_batch_size=4,
        learning_rate=3e-3,
        dtype="float64",
        progress=False,
        seed=5,
    )
    return grpo.Config(**(fields | overrides))


def test_the_teacher_is_a_role_of_its_own_only_for_the_sampled_tokens_form(tiny_lm, teacher):
    sampled = config(tiny_lm, teacher, "p", Path("o"), placement="ray")
    assert dict(role_actors(role_settings(sampled).ray)).get("ray_teacher") == 1
    gjsd = config(tiny_lm, teacher, "p", Path("o"), placement="ray", distill_loss="gjsd")
    # its whole distribution: the trainer's
    assert "ray_teacher" not in dict(role_actors(role_settings(gjsd).ray))


def test_a_distillation_run_on_ray_equals_the_in_process_run(
    local_ray, tiny_lm, teacher, prompts, tmp_path
):
    """Trainer, teacher, reward and engine actors: the same metrics (distill/ ones included) to
    round-off and the same final weights as every role in this process."""
    here, there = tmp_path / "here", tmp_path / "ray"
    grpo.train(config(tiny_lm, teacher, prompts, here))
    grpo.train(config(tiny_lm, teacher, prompts, there, placement="ray"))
    assert all("distill/teacher_logprob" in row for row in read_metrics(there))
    assert_same_run(there, here)


def test_the_teacher_actor_sends_back_log_probs_and_argmax(
    local_ray, tiny_lm, teacher, prompts, tmp_path
):
    """(B, T) float64 log-probs under temperature 0.7 and top-k 5, and the (B, T) argmax, equal
    to the same teacher's in this process, padded and packed."""
    from proxrl.algos.online.placement.ray_roles import FrozenActor, RemoteFrozen
    from proxrl.models.causal_lm import load_causal_lm
    from proxrl.rollout.forward import frozen_pass

    cfg = config(tiny_lm, teacher, prompts, tmp_path, placement="ray")
    actor = local_ray.remote(FrozenActor).options(num_cpus=0.25)
    roles = role_settings(cfg)
    handle = actor.remote(
        list(sys.path), roles.models, roles.engine.shares_prefix, roles.models.teacher_model
    )
    assert local_ray.get(handle.ready.remote(), timeout=120) is None
    remote = RemoteFrozen(handle, str(tmp_path), "teacher")
    local = load_causal_lm(teacher, dtype="float64").eval()
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, 60, (3, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :2] = 0
    attention_mask[1, 7:] = 0
    input_ids = input_ids * attention_mask
    truncation = {"top_k": 5, "top_p": 1.0, "min_p": 0.0}
    for packed in (False, True):
        got = frozen_pass(remote, input_ids, attention_mask, 4, 0.7, truncation, packed, True)
        with torch.no_grad():
            want = frozen_pass(local, input_ids, attention_mask, 4, 0.7, truncation, packed, True)
        assert got[0].shape == (3, 5) and got[0].dtype == torch.float64
        torch.testing.assert_close(got[0], want[0], rtol=1e-12, atol=1e-12)
        assert torch.equal(got[1], want[1])
    local_ray.kill(handle)
