"""``placement: ray`` on a tiny float64 model: the same run as in one process, generation one
step ahead within its staleness bound, and faults a run survives or stops from cleanly."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from proxrl.algos.online import ppo
from proxrl.algos.online.roles import role_settings
from proxrl.cli import main
from proxrl.rollout.generation import SamplingSettings
from proxrl.runtime.checkpoint import CheckpointManager
from proxrl.runtime.config import narrowed
from proxrl.runtime.errors import Interrupted, ProxrlError
from proxrl.runtime.metrics import read_metrics

WORDS = ["abc", "def", "ghi", "jkl", "mno", "pqr", "stu", "vwx"]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in WORDS))
    return str(path)


def config(tiny_lm: str, prompts: str, out: Path, **overrides) -> ppo.Config:
    fields = dict(
        model=tiny_lm,
        prompts=prompts,
        reward_fn=("tests.algos.online_rewards:target_fraction",),
        output_dir=str(out),
        iterations=3,
        rollout_batch_size=4,
        group_size=2,
        max_new_tokens=6,
        temperature=1.0,
        mini_batch_size=4,
        ppo_epochs=2,
        learning_rate=3e-3,
        kl_coef=0.05,
        dtype="float64",
        progress=False,
        seed=5,
    )
    return ppo.Config(**(fields | overrides))


def losses(out: Path) -> list[dict[str, float]]:
    """Each row's metrics but timings, the placement's own and the reward's name."""
    skip = ("time/", "perf/", "rollout/", "reward/")
    return [{k: v for k, v in row.items() if not k.startswith(skip)} for row in read_metrics(out)]


def assert_same_run(out: Path, expected: Path) -> None:
    """The same metrics (losses, KL, scores, advantages) to round-off, the same final weights."""
    rows, want = losses(out), losses(expected)
    assert [sorted(r) for r in rows] == [sorted(r) for r in want]
    for a, b in zip(want, rows, strict=True):
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-9, abs=1e-12), (a["step"], key)
    a, b = load_file(expected / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-10, atol=1e-12)


ITERATIONS = 4  # the engine-restart and killed-trainer run: a restart in 3, the kill in 4


@pytest.fixture(scope="module")
def in_process(tiny_lm, prompts, tmp_path_factory) -> Path:
    """The reference run: every role in this process."""
    out = tmp_path_factory.mktemp("in_process") / "run"
    ppo.train(config(tiny_lm, prompts, out, iterations=ITERATIONS))
    first = load_file(Path(tiny_lm) / "model.safetensors")
    final = load_file(out / "model.safetensors")
    assert any(not torch.equal(first[k].double(), final[k]) for k in first), "nothing trained"
    return out


PACKED = {"max_tokens_per_micro_batch": 40}  # micro-batches of several packed rows


@pytest.fixture(scope="module")
def in_process_packed(tiny_lm, prompts, tmp_path_factory) -> Path:
    """The reference run on packed micro-batches."""
    out = tmp_path_factory.mktemp("in_process_packed") / "run"
    ppo.train(config(tiny_lm, prompts, out, **PACKED))
    return out


def test_a_ray_run_through_an_engine_restart_and_a_killed_trainer_resumes_to_the_in_process_run(
    local_ray, tiny_lm, prompts, in_process, tmp_path
):
    """Trainer, reference, reward and engine actors, on the seed of the run in one process.
    Engine 0 is killed after the second batch is sampled: Ray restarts it and it loads the
    latest weights before it samples the third batch, the one the undisturbed engine would
    draw. The trainer actor is killed in the fourth iteration: one-line error, the checkpoint
    of iteration 3 whole; --resume continues from it. The metrics (losses, KL, scores,
    advantages) equal the in-process run's to round-off and so do the final weights.
    (One run for both faults: each Ray run starts four actors.)"""
    reward = ("tests.ray.ray_rewards:kill_engine_at_second_call_then_trainer_at_fourth_call",)
    cfg = config(
        tiny_lm,
        prompts,
        tmp_path,
        placement="ray",
        reward_fn=reward,
        save_every=1,
        iterations=ITERATIONS,
    )
    with pytest.raises(ProxrlError, match="the trainer actor died.*--resume continues"):
        ppo.train(cfg)
    assert not (tmp_path / "model.safetensors").exists()
    rows = read_metrics(tmp_path)
    assert [r["rollout/engine_restarts"] for r in rows] == [0.0, 0.0, 1.0]
    assert [r["rollout/staleness"] for r in rows] == [0.0] * 3
    for a, b in zip(losses(in_process)[:3], losses(tmp_path), strict=True):  # before the resume
        assert b == pytest.approx(a, rel=1e-9, abs=1e-12), a["step"]
    ppo.train(replace(cfg, resume=True))
    rows = read_metrics(tmp_path)
    assert [r["rollout/engine_restarts"] for r in rows] == [0.0, 0.0, 1.0, 0.0]
    assert [r["rollout/staleness"] for r in rows] == [0.0] * 4
    assert_same_run(tmp_path, in_process)


def _wait_gone(pid: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} still alive {timeout_s} s after ray.kill")


def test_an_engine_restarted_under_a_request_loads_the_weights_it_names(
    local_ray, tiny_lm, prompts, tmp_path
):
    """A sampling task that reaches a restarted engine (Ray's retry of a task the dead one was
    given, or one sent while it restarted) loads the weights the request names from the object
    store before sampling: the same tokens and log-probs as before the kill."""
    from proxrl.algos.online.placement.ray_roles import EngineActor, EnginePool
    from proxrl.models.causal_lm import load_causal_lm

    cfg = config(tiny_lm, prompts, tmp_path, placement="ray")
    roles = role_settings(cfg)
    engine = (
        local_ray.remote(EngineActor)
        .options(num_cpus=0.25, max_restarts=1, max_task_retries=1)
        .remote(list(sys.path), roles.models, roles.engine)
    )
    pool = EnginePool([engine], pad_id=0)
    policy = load_causal_lm(tiny_lm, dtype="float64")
    with torch.no_grad():
        for p in policy.parameters():
            p.mul_(1.5)  # weights the engine cannot have read from disk
    pool.publish(policy, version=7)
    prompt_ids = torch.tensor([[5, 6, 7, 8], [0, 9, 10, 11]])
    prompt_mask = (prompt_ids != 0).long()
    settings = narrowed(SamplingSettings, cfg)
    torch.manual_seed(0)
    before = pool.sample(prompt_ids, prompt_mask, settings, with_logprobs=True)
    pid = local_ray.get(engine.__ray_call__.remote(lambda actor: os.getpid()), timeout=60)
    local_ray.kill(engine, no_restart=False)
    _wait_gone(pid)  # (the kill is asynchronous: the old process could serve the next request)
    torch.manual_seed(0)
    after = pool.sample(prompt_ids, prompt_mask, settings, with_logprobs=True)
    assert pool.restarts == 1
    assert torch.equal(after.response_ids, before.response_ids)
    torch.testing.assert_close(after.logprobs, before.logprobs, rtol=0, atol=0)
    local_ray.kill(engine, no_restart=True)


def test_the_reference_actor_sends_back_response_log_probs_not_logits(
    local_ray, tiny_lm, prompts, tmp_path
):
    """A micro-batch of left-padded prompts and right-padded responses, scored by the reference
    actor under temperature 0.7 and top-k 5, padded and packed: (B, T) float64 log-probs of the
    response tokens (not the (B, P + T, V) logits), equal to the same reference's in this
    process to round-off."""
    from proxrl.algos.online.placement.ray_roles import FrozenActor, RemoteFrozen
    from proxrl.models.causal_lm import load_causal_lm
    from proxrl.rollout.forward import policy_forward

    roles = role_settings(config(tiny_lm, prompts, tmp_path, placement="ray"))
    actor = local_ray.remote(FrozenActor).options(num_cpus=0.25)
    handle = actor.remote(list(sys.path), roles.models, roles.engine.shares_prefix)
    assert local_ray.get(handle.ready.remote(), timeout=120) is None
    reference = RemoteFrozen(handle, str(tmp_path), "reference")
    local = load_causal_lm(tiny_lm, dtype="float64").eval()
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, 60, (3, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :2] = 0  # prompts (P = 4) left-padded, responses (T = 5) right-padded
    attention_mask[1, 7:] = 0
    attention_mask[2, 0] = attention_mask[2, 8] = 0
    input_ids = input_ids * attention_mask
    truncation = {"top_k": 5, "top_p": 1.0, "min_p": 0.0}
    for packed in (False, True):
        got, argmax = reference.logprobs(input_ids, attention_mask, 4, 0.7, truncation, packed)
        assert argmax is None
        with torch.no_grad():
            want = policy_forward(
                local, input_ids, attention_mask, 4, 0.7, **truncation, packed=packed
            ).logprobs
        assert got.shape == (3, 5) and got.dtype == torch.float64, packed
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        assert (got[attention_mask[:, 4:].bool()] < 0).all()
    local_ray.kill(handle)
    with pytest.raises(ProxrlError, match="placement: the reference actor died.*--resume"):
        reference.logprobs(input_ids, attention_mask, 4, 0.7, truncation, False)


def test_a_dead_reward_actor_is_named_and_a_dead_callee_is_not_the_trainer(
    local_ray, tiny_lm, prompts, tmp_path
):
    """The reward actor killed: the trainer's call to it fails naming the reward actor. A role
    that died under a call no stand-in names (here: the driver waits on a live actor whose call
    to a killed one failed) is reported as one the trainer called, not as the trainer. Alive,
    it gives the local role's record."""
    from proxrl.algos.online.placement.ray_group import wait_forwarding_signals
    from proxrl.algos.online.placement.ray_roles import RemoteRewards, RewardActor
    from proxrl.algos.online.roles import load_rewards
    from proxrl.data.formats import PromptExample

    sources = (
        "tests.algos.online_rewards:target_fraction",
        "tests.algos.online_rewards:echoes_word",
    )
    cfg = config(
        tiny_lm, prompts, tmp_path, placement="ray", reward_fn=sources, reward_weights=(1.0, 0.5)
    )
    settings = role_settings(cfg).rewards
    handle = local_ray.remote(RewardActor).options(num_cpus=0.25).remote(list(sys.path), settings)
    assert local_ray.get(handle.ready.remote(), timeout=120) is None
    rewards = RemoteRewards(handle, str(tmp_path))
    prompt = [PromptExample("say: abc ->", None, "p:1", {"word": "abc"})] * 2
    columns = {"word": ["abc", "abc"]}
    # the remote role gives the record the local one gives, every source's scores included
    # (an estimator that combines them itself, GDPO, reads them there)
    remote = rewards(prompt, [" abc", " xyz"], columns)
    local = load_rewards(settings)(prompt, [" abc", " xyz"], columns)
    assert remote.per_source.tolist() == local.per_source.tolist() == [[0.75, 1.0], [0.0, 0.0]]
    assert remote.weights == local.weights == (1.0, 0.5)
    assert remote.total.tolist() == local.total.tolist() and remote.parts == local.parts
    local_ray.kill(handle)
    with pytest.raises(ProxrlError, match="placement: the reward actor died.*--resume"):
        rewards(prompt, [" abc"], {})

    @local_ray.remote(num_cpus=0.25)
    class Caller:
        def train(self, callee: object) -> object:
            import ray

            return ray.get(callee.score.remote([], [], {}), timeout=60)  # type: ignore[attr-defined]

    caller = Caller.remote()
    with pytest.raises(ProxrlError, match="placement: an actor trainer rank 0 called") as info:
        wait_forwarding_signals([caller], [caller.train.remote(handle)], str(tmp_path))
    assert "the trainer actor" not in str(info.value)
    local_ray.kill(caller)


@pytest.mark.parametrize(
    ("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"]
)
def test_a_signal_to_the_driver_checkpoints_stops_and_resume_finishes_the_run(
    local_ray, tiny_lm, in_process_packed, tmp_path, signum, code
):
    """SIGINT / SIGTERM reach the driver in the second iteration (after sampling): it forwards
    the signal to the trainer actor, which ends the iteration, saves a checkpoint and stops as
    a run in one process does (exit code 128 + signal, the same one line); the actors are shut
    down, and (after SIGINT) --resume continues to the run an undisturbed one gives. On
    packed micro-batches (max_tokens_per_micro_batch), which the reference actor scores too."""
    prompts = tmp_path / "prompts.jsonl"  # the columns tell the reward whom to signal
    rows = [{"prompt": f"say: {w} ->", "driver": os.getpid(), "signum": signum} for w in WORDS]
    prompts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "run"
    reward = ("tests.ray.ray_rewards:signal_driver_at_second_call",)
    cfg = config(
        tiny_lm,
        str(prompts),
        out,
        placement="ray",
        reward_fn=reward,
        **PACKED,
    )
    with pytest.raises(Interrupted) as info:
        ppo.train(cfg)
    checkpoint = out / "checkpoints" / "step_000000002"
    assert info.value.exit_code == code
    assert str(info.value) == (
        f"received {signal.Signals(signum).name}; checkpoint saved in {checkpoint}; "
        "continue with --resume"
    )
    assert [p.name for p in CheckpointManager(out).checkpoints()] == [checkpoint.name]
    assert not (out / "model.safetensors").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored
    deadline = time.time() + 30  # the driver killed the trainer and with it its actors
    while [a for a in local_ray.util.list_named_actors(True) if a["namespace"] == "proxrl"]:
        assert time.time() < deadline, "the run's actors are still there"
        time.sleep(0.1)
    if signum == signal.SIGINT:  # the resume after either signal is the same code: run it once
        ppo.train(replace(cfg, resume=True))
        assert_same_run(out, in_process_packed)


def overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_async_rollout_overlaps_the_update_within_the_staleness_bound_and_learns(
    local_ray, tiny_lm, prompts, tmp_path
):
    """GRPO with batch k+1 generated while batch k trains (max_staleness 1), the engine's
    log-probs as the behaviour policy's and TIS against them: every sample is exactly one
    policy version old after the first batch, the generation intervals intersect the previous
    update's (all but at most 3 of 29), and the reward still rises."""
    from proxrl.algos.online import grpo

    fields = dict(
        model=tiny_lm,
        prompts=prompts,
        reward_fn=("tests.algos.online_rewards:target_fraction",),
        output_dir=str(tmp_path),
        iterations=30,
        rollout_batch_size=8,
        group_size=4,
        max_new_tokens=8,
        temperature=1.0,
        mini_batch_size=16,
        ppo_epochs=2,
        learning_rate=3e-3,
        progress=False,
        seed=3,
        placement="ray",
        async_rollout=True,
        max_staleness=1,
        sampler_logprobs=True,
        rollout_correction="tis",
    )
    grpo.train(grpo.Config(**fields))
    rows = read_metrics(tmp_path)
    assert [r["rollout/staleness"] for r in rows] == [0.0] + [1.0] * 29
    # An update here takes ~70 ms: on a loaded machine the engine's task is sometimes scheduled
    # after it ended. Run one after the other, no interval would intersect.
    missed = [
        (before["step"], update, generation)
        for before, after in zip(rows[:-1], rows[1:], strict=True)
        if not overlaps(
            update := (before["time/update_start"], before["time/update_end"]),
            generation := (after["time/generate_start"], after["time/generate_end"]),
        )
    ]
    assert len(missed) <= 3, missed
    history = [r["objective/scores"] for r in rows]
    assert sum(history[-5:]) / 5 > sum(history[:5]) / 5 + 0.15, history


def test_a_role_no_node_can_hold_is_named_even_when_the_totals_fit(tiny_lm, prompts, tmp_path):
    """Two nodes of 1 GPU: a 2-GPU trainer fits the cluster's total but no node (Ray would
    leave it pending), named with its field; three 1-GPU engines fit each node but not the
    total, which says so; one engine and the trainer on a GPU each fit."""
    from proxrl.algos.online.placement.ray_run import check_resources

    nodes = [{"CPU": 4.0, "GPU": 1.0}, {"CPU": 4.0, "GPU": 1.0}]
    where = ("the Ray cluster", "any node of the Ray cluster")
    cfg = config(tiny_lm, prompts, tmp_path, placement="ray")

    def check(**overrides: float) -> None:
        check_resources(role_settings(replace(cfg, **overrides)).ray, nodes, *where)

    with pytest.raises(ProxrlError) as info:
        check(ray_trainer_gpus=2.0)
    assert str(info.value) == (
        "placement: the trainer actor asks for 2 GPUs (ray_trainer_gpus), more than any node "
        "of the Ray cluster has; lower ray_trainer_gpus"
    )
    with pytest.raises(ProxrlError, match=r"the roles ask for 3 GPUs \(ray_trainer_gpus 0 \+ "
                       r"ray_engines 3 × ray_engine_gpus 1 \+"):  # fmt: skip
        check(ray_engines=3, ray_engine_gpus=1.0)
    check(ray_trainer_gpus=1.0, ray_engine_gpus=1.0)


def test_placement_ray_without_the_ray_package_is_one_line(
    tiny_lm, prompts, tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    argv = ["ppo", "--model", tiny_lm, "--prompts", prompts, "--reward-fn", "os:getcwd"]
    code = main([*argv, "--placement", "ray", "--output-dir", str(tmp_path / "run")])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "proxrl ppo: error: placement: ray needs the ray package: "
        "pip install 'proxrl[ray]' (or pip install ray)"
    )
    assert not (tmp_path / "run").exists()


def test_an_actor_ray_cannot_place_and_a_run_past_its_deadline_are_named(
    local_ray, tmp_path, monkeypatch
):
    """An actor asking for a resource no node has is reported by name once the start deadline
    passes (not waited for for ever); the driver's wait for the trainers ends at its deadline
    with a line naming it."""
    from proxrl.algos.online.placement.ray_group import (
        RUN_TIMEOUT_ENV,
        ready_within,
        wait_forwarding_signals,
    )

    @local_ray.remote(num_cpus=0, resources={"no_such_node": 1})
    class Unplaceable:
        def ready(self) -> None:
            return None

    handle = Unplaceable.remote()
    began = time.monotonic()
    with pytest.raises(ProxrlError, match="placement: the reward actor did not start within 2 s"):
        ready_within([handle.ready.remote()], "the reward actor", timeout_s=2)
    assert time.monotonic() - began < 30
    local_ray.kill(handle)

    @local_ray.remote(num_cpus=0)
    class Slow:
        def train(self) -> tuple[str, None]:
            time.sleep(60)
            return "ok", None

    slow = Slow.remote()
    monkeypatch.setenv(RUN_TIMEOUT_ENV, "1")
    began = time.monotonic()
    with pytest.raises(ProxrlError, match="the trainer actors did not finish within 1 s"):
        wait_forwarding_signals([slow], [slow.train.remote()], str(tmp_path))
    assert time.monotonic() - began < 30
    local_ray.kill(slow)
