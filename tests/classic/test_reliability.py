"""Reliability of ``proxrl classic``: a run SIGKILLed at a random moment after its first
checkpoint and resumed, or stopped by SIGINT/SIGTERM from outside and resumed, ends with
bit-identical weights and identical metrics.jsonl rows (wall-clock keys aside) to the same run
left alone; injected NaN losses, gradients and rewards are skipped, counted in
``guard/skipped_updates``, and N skips in a row stop the run cleanly with the last good
checkpoint intact (and resumable to the run that never saw a NaN).

The killed run is a subprocess (``python -m proxrl classic --config ...``) that starts while
the uninterrupted run trains in this process; the resume runs here too, so the state crosses
processes through the checkpoint alone.
"""

from __future__ import annotations

import logging
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import proxrl.classic.ppo as ppo_mod
import proxrl.classic.train as train_mod
import proxrl.classic.trpo as trpo_mod
from proxrl.cli import main
from proxrl.runtime.checkpoint import CheckpointManager
from proxrl.runtime.metrics import read_metrics

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
VOLATILE = ("time/", "perf/", "charts/SPS")
NAN = float("nan")

# 40 iterations (about 1 s of training) with a checkpoint every 5: a kill shortly after the
# first checkpoint always lands mid-training.
LONG = {
    "CartPole-v1": dict(num_envs=2, num_steps=64, mini_batch_size=32, ppo_epochs=2),
    "Hopper-v5": dict(num_envs=1, num_steps=128, mini_batch_size=32, ppo_epochs=2),
}
ITERATIONS, BATCH = 40, 128
# 4 iterations of 128 steps, 8 minibatch steps each (4 minibatches × 2 epochs), a checkpoint
# after each.
SHORT = [
    "--env",
    "CartPole-v1",
    "--num-envs",
    "2",
    "--num-steps",
    "64",
    "--minibatch-size",
    "32",
    "--epochs",
    "2",
    "--total-steps",
    "512",
    "--save-every",
    "1",
    "--keep-checkpoints",
    "5",
    "--no-progress",
]


def _write_config(tmp_path: Path, env: str) -> Path:
    values = dict(
        env=env,
        total_steps=ITERATIONS * BATCH,
        save_every=5,
        keep_checkpoints=2,
        progress="false",
        **LONG[env],
    )
    path = tmp_path / f"{env}.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in values.items()))
    return path


def _launch(config: Path, run: Path) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "proxrl",
        "classic",
        "--config",
        str(config),
        "--output-dir",
        str(run),
    ]
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_checkpoint(process: subprocess.Popen, run: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not any((run / "checkpoints").glob("step_*/manifest.json")):
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.002)


def _cli(config: Path, run: Path, *extra: str) -> None:
    code = main(["classic", "--config", str(config), "--output-dir", str(run), *extra])
    assert code == 0


def _rows(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in read_metrics(run)]


def _final(run: Path) -> tuple[dict[str, torch.Tensor], dict]:
    manager = CheckpointManager(run)
    tensors, state = manager.load(manager.latest())
    return tensors["agent"], state


def _assert_same_run(a: Path, b: Path, steps: int) -> None:
    (wa, sa), (wb, sb) = _final(a), _final(b)
    assert sa["global_step"] == sb["global_step"] == steps
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key
    assert sa["guard"] == sb["guard"] == {"consecutive": 0, "skipped": 0}
    ra, rb = _rows(a), _rows(b)
    assert [r["global_step"] for r in rb] == [BATCH * i for i in range(1, ITERATIONS + 1)]
    assert ra == rb


@pytest.mark.parametrize("env", ["CartPole-v1", "Hopper-v5"])
def test_sigkill_at_a_random_moment_then_resume_equals_the_uninterrupted_run(tmp_path, env):
    config = _write_config(tmp_path, env)
    killed = tmp_path / "killed"
    process = _launch(config, killed)
    _cli(config, tmp_path / "straight")  # meanwhile, in this process

    _wait_for_checkpoint(process, killed)
    delay = random.uniform(0.0, 0.3)
    time.sleep(delay)
    process.kill()
    process.communicate()
    assert process.returncode == -signal.SIGKILL
    assert not (killed / "summary.json").exists(), f"finished before the kill ({delay=:.3f})"
    killed_at = CheckpointManager.step_of(CheckpointManager(killed).checkpoints()[-1])
    assert 5 * BATCH <= killed_at < ITERATIONS * BATCH

    _cli(config, killed, "--resume")
    _assert_same_run(tmp_path / "straight", killed, ITERATIONS * BATCH)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_from_outside_saves_exits_and_resumes_exactly(tmp_path, signum, code):
    config = _write_config(tmp_path, "CartPole-v1")
    run = tmp_path / "stopped"
    process = _launch(config, run)
    _cli(config, tmp_path / "straight")
    _wait_for_checkpoint(process, run)
    process.send_signal(signum)
    _, err = process.communicate()
    assert process.returncode == code, err
    last = err.strip().splitlines()[-1]
    name = signal.Signals(signum).name
    prefix = f"proxrl classic: stopped: received {name}; checkpoint saved in {run / 'checkpoints'}/"
    assert last.startswith(prefix + "step_") and last.endswith("; continue with --resume")
    saved = Path(last.split("checkpoint saved in ")[1].split(";")[0])
    assert CheckpointManager.verify(saved) is None and not (run / "summary.json").exists()
    # the stop came after a whole iteration, which is both logged and saved
    step = CheckpointManager.step_of(saved)
    assert step < ITERATIONS * BATCH and read_metrics(run)[-1]["global_step"] == step

    _cli(config, run, "--resume")
    _assert_same_run(tmp_path / "straight", run, ITERATIONS * BATCH)


# -- non-finite guard -------------------------------------------------------------------------


def _short(run: Path, *extra: str) -> int:
    return main(["classic", "--output-dir", str(run), *SHORT, *extra])


def _checkpoint_at(run: Path, iteration: int) -> tuple[dict[str, torch.Tensor], dict]:
    manager = CheckpointManager(run)
    path = next(p for p in manager.checkpoints() if manager.step_of(p) == iteration * BATCH)
    tensors, state = manager.load(path)
    return tensors["agent"], state


def _at_update(iteration: int, poison, update: str = "ppo_update"):
    """``train.<update>`` that runs ``poison(agent)`` (returning an undo) around the update of
    ``iteration``."""
    real = getattr(train_mod, update)

    def wrapped(*args):
        undo = poison(args[1]) if args[-1] == iteration else None
        try:
            return real(*args)
        finally:
            if undo is not None:
                undo()

    return wrapped


def _nan_grad(agent) -> Callable[[], None]:
    """Every gradient of the actor's first weight becomes NaN until the returned undo."""
    handle = agent.actor[0].weight.register_hook(lambda g: torch.full_like(g, NAN))
    return handle.remove


def test_nan_loss_skips_that_step_and_counts_it(tmp_path, monkeypatch, caplog):
    calls = [0]
    real = ppo_mod.value_loss

    def value_loss(*args, **kwargs):  # NaN at the first minibatch of iteration 2 (call 9)
        calls[0] += 1
        loss, stats = real(*args, **kwargs)
        return (loss * NAN if calls[0] == 9 else loss), stats

    monkeypatch.setattr(ppo_mod, "value_loss", value_loss)
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="proxrl.runtime.guard"):
        assert _short(run) == 0
    assert "step 2: loss is NaN; update skipped (1 in a row, 1 in total)" in caplog.text
    rows = read_metrics(run)
    assert [r["guard/skipped_updates"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert all(math.isfinite(v) for r in rows for v in r.values())
    assert "losses/value_loss" in rows[1]  # the means of the 7 steps taken
    weights, state = _final(run)
    assert all(bool(torch.isfinite(w).all()) for w in weights.values())
    assert state["guard"] == {"consecutive": 0, "skipped": 1}


def test_nan_gradients_stop_after_n_in_a_row_with_the_last_good_checkpoint_intact(
    tmp_path, monkeypatch, capsys
):
    straight = tmp_path / "straight"
    assert _short(straight) == 0
    monkeypatch.setattr(train_mod, "ppo_update", _at_update(3, _nan_grad))
    run = tmp_path / "run"
    assert _short(run, "--max-consecutive-skips", "3") == 2
    err = capsys.readouterr().err
    assert err == (
        "proxrl classic: error: stopped at step 3: 3 updates in a row were skipped for "
        "non-finite values (last: grad of actor.0.weight holds NaN); the last good checkpoint "
        f"in {run / 'checkpoints'} is intact\n"
    )
    manager = CheckpointManager(run)
    assert [manager.step_of(p) for p in manager.checkpoints()] == [BATCH, 2 * BATCH]
    assert manager.verify(manager.latest()) is None
    assert [r["global_step"] for r in read_metrics(run)] == [BATCH, 2 * BATCH]
    # the intact checkpoint is the clean run's, and resuming from it (the NaN gone) gives it
    good, _ = _checkpoint_at(run, 2)
    clean, _ = _checkpoint_at(straight, 2)
    assert all(torch.equal(good[k], clean[k]) for k in clean)
    monkeypatch.undo()
    assert _short(run, "--resume") == 0
    assert _final(run)[0].keys() == _final(straight)[0].keys()
    assert all(torch.equal(_final(run)[0][k], _final(straight)[0][k]) for k in good)
    assert _rows(run) == _rows(straight)


def test_trpo_nan_policy_gradient_skips_the_policy_step_only(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(train_mod, "trpo_update", _at_update(2, _nan_grad, "trpo_update"))
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="proxrl.runtime.guard"):
        assert _short(run, "--algo", "trpo") == 0
    assert "step 2: policy gradient holds NaN; update skipped (1 in a row" in caplog.text
    rows = read_metrics(run)
    assert [r["guard/skipped_updates"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    (before, _), (after, _) = _checkpoint_at(run, 1), _checkpoint_at(run, 2)
    actor = [k for k in before if k.startswith("actor")]
    assert actor and all(torch.equal(before[k], after[k]) for k in actor)
    assert not torch.equal(before["critic.0.weight"], after["critic.0.weight"])
    assert rows[1]["losses/trpo_accepted"] == 0.0 and "losses/value_loss" in rows[1]


@pytest.mark.parametrize("algo", ["ppo", "trpo"])
def test_nan_reward_skips_the_iterations_update(tmp_path, monkeypatch, caplog, algo):
    calls = [0]
    real = train_mod.gae_env

    def gae_env(rewards, *args):  # one NaN reward in iteration 2's rollout
        calls[0] += 1
        if calls[0] == 2:
            rewards = rewards.clone()
            rewards[5, 0] = NAN
        return real(rewards, *args)

    monkeypatch.setattr(train_mod, "gae_env", gae_env)
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="proxrl.runtime.guard"):
        assert _short(run, "--algo", algo, "--stop-at-step", str(3 * BATCH)) == 0
    assert "step 2: advantages holds NaN; update skipped (1 in a row, 1 in total)" in caplog.text
    assert _short(run, "--algo", algo, "--resume") == 0  # the count goes on from the checkpoint
    rows = read_metrics(run)
    assert [r["guard/skipped_updates"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert "losses/value_loss" not in rows[1] and "losses/value_loss" in rows[2]
    (before, _), (after, state) = _checkpoint_at(run, 1), _checkpoint_at(run, 2)
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing was updated
    assert state["guard"] == {"consecutive": 1, "skipped": 1}
    assert _final(run)[1]["guard"] == {"consecutive": 0, "skipped": 1}


@pytest.mark.parametrize(
    ("module", "argv", "clip"),
    [
        (ppo_mod, [], None),  # PPO: off by default (the paper, SB3)
        (ppo_mod, ["--value-clip", "0.3"], 0.3),
        (trpo_mod, ["--algo", "trpo"], 0.2),  # TRPO: its own field, on by default
        (trpo_mod, ["--algo", "trpo", "--trpo-value-clip", "None"], None),
        (trpo_mod, ["--algo", "trpo", "--value-clip", "0.3"], 0.2),  # PPO's field is not TRPO's
    ],
)
def test_each_algorithm_clips_its_value_update_by_its_own_field(
    tmp_path, monkeypatch, module, argv, clip
):
    seen: list[float | None] = []
    real = module.value_loss

    def spy(*args, clip, **kwargs):
        seen.append(clip)
        return real(*args, clip=clip, **kwargs)

    monkeypatch.setattr(module, "value_loss", spy)
    assert _short(tmp_path / "run", *argv) == 0
    assert seen and set(seen) == {clip}
