"""ppo and grpo with ``sampler: vllm``: the loop syncs the engine after every update (the engine
ends the run scoring as the saved policy), resume and SIGTERM continue a run as with the built-in
sampler, the NaN guard skips a poisoned update, and the engine's failures are one-line errors."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from proxrl.algos.online import grpo, ppo
from proxrl.cli import main
from proxrl.rollout.vllm_sampler import EngineOptions, start_engine
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.metrics import read_metrics

HERE = Path(__file__).parent
VOLATILE = ("time/", "perf/")


@pytest.fixture(autouse=True)
def _rewards_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))


def small(config_cls, tiny_lm, prompts, out, **overrides):
    fields = dict(
        model=tiny_lm,
        prompts=prompts,
        reward_fn=("tests.vllm.rewards:target_fraction",),
        output_dir=str(out),
        iterations=3,
        rollout_batch_size=8,
        group_size=2,
        max_new_tokens=8,
        temperature=1.0,
        mini_batch_size=8,
        learning_rate=3e-3,
        progress=False,
        seed=3,
        sampler="vllm",
        vllm_gpu_memory_utilization=0.02,
    )
    return config_cls(**(fields | overrides))


def _rows(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in read_metrics(run)]


def _engine_matches_saved_policy(cfg, run: Path, engines, adapters=None) -> float:
    """Largest |engine − trainer| log-prob over a sampled batch, the trainer being the run's
    saved policy: the engine (the run's, kept by ``engines``) must hold the weights of the last
    update (``adapters``: the run's ``AdapterVersions`` under vllm_lora_sync adapter, kept from
    its close)."""
    from transformers import AutoModelForCausalLM

    from proxrl.algos.online.roles import role_settings
    from proxrl.algos.online.samplers import engine_options
    from proxrl.models.tokenizer import load_tokenizer
    from proxrl.rollout.forward import policy_forward
    from proxrl.rollout.generation import SamplingSettings
    from proxrl.rollout.vllm_sampler import VLLMSampler

    engine = engines.get(engine_options(role_settings(cfg).engine)).llm  # the run's own
    tokenizer = load_tokenizer(str(run))
    model = AutoModelForCausalLM.from_pretrained(str(run), dtype=torch.float32)
    ids = [tokenizer(p)["input_ids"] for p in ["say: abc ->", "say: mno ->"]]
    width = max(map(len, ids))
    prompt_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in ids])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids])
    torch.manual_seed(0)
    samples = VLLMSampler(engine, tokenizer, adapters).sample(
        prompt_ids, mask, SamplingSettings(8, temperature=1.0), with_logprobs=True
    )
    with torch.no_grad():
        trainer = policy_forward(
            model,
            torch.cat([prompt_ids, samples.response_ids], 1),
            torch.cat([mask, samples.response_mask], 1),
            prompt_ids.shape[1],
            1.0,
        ).logprobs
    return ((samples.logprobs - trainer) * samples.response_mask).abs().max().item()


@pytest.mark.parametrize("command", [ppo, grpo])
def test_a_run_keeps_the_engine_on_the_policy(command, tiny_lm, prompts, tmp_path, train, engines):
    cfg = small(command.Config, tiny_lm, prompts, tmp_path)
    train(command, cfg)
    rows = read_metrics(tmp_path)
    assert len(rows) == 3
    assert all(r["time/weight_sync_s"] > 0 for r in rows)
    assert _engine_matches_saved_policy(cfg, tmp_path, engines) < 1e-4
    for row in rows:  # the defaults: π_old is the trainer's pass, vLLM's log-probs measured
        assert row["perf/old_logprobs_pass"] == 1.0
        # float32 both sides: |Δ log π| < 1e-4 (above), so KL ≈ Δ²/2 < 1e-8 and ρ within 1e-4;
        # log-probs not asked of the engine (zeros) would read KL ≈ 1 here
        assert 0 <= row["rollout/mismatch_kl"] < 1e-8, row
        assert abs(row["rollout/is_ratio_mean"] - 1) < 1e-4, row


def test_sampler_logprobs_take_the_engines_and_log_the_entropy_estimate(
    tiny_lm, prompts, tmp_path, train
):
    """Without the trainer's pass the entropy is the engine's sampled-token estimate: finite,
    and between 0 and log V (a uniform over the vocabulary; T 1, nothing truncated)."""
    import math

    from proxrl.models.tokenizer import load_tokenizer

    cfg = small(grpo.Config, tiny_lm, prompts, tmp_path, iterations=2, sampler_logprobs=True)
    train(grpo, cfg)
    rows = read_metrics(tmp_path)
    vocab = len(load_tokenizer(tiny_lm))
    assert len(rows) == 2
    assert all(0 < r["objective/entropy"] < math.log(vocab) for r in rows), rows


def test_resume_two_plus_one_equals_three(tiny_lm, prompts, tmp_path, train):
    """A run resumed from its iteration-2 checkpoint ends as the run left alone: same metrics
    (wall-clock aside) and bit-identical weights. The engine gets the restored weights at start
    and its request seeds come from the restored generator."""
    straight = tmp_path / "straight"
    options = dict(critic_learning_rate=1e-3, save_every=1, keep_checkpoints=5)
    train(ppo, small(ppo.Config, tiny_lm, prompts, straight, **options))
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    steps = sorted((resumed / "checkpoints").glob("step_*"), key=lambda p: int(p.name[5:]))
    assert len(steps) == 3
    shutil.rmtree(steps[-1])
    for path in resumed.glob("*.safetensors"):
        path.unlink()
    train(ppo, small(ppo.Config, tiny_lm, prompts, resumed, resume=True, **options))
    assert _rows(straight) == _rows(resumed)
    a = load_file(str(straight / "model.safetensors"))
    b = load_file(str(resumed / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_sigterm_saves_exits_143_and_the_run_resumes(tiny_lm, prompts, tmp_path, capsys, engines):
    run = tmp_path / "run"
    config = tmp_path / "grpo.yaml"
    fields = dict(
        model=tiny_lm,
        prompts=prompts,
        reward_fn=["tests.vllm.rewards:target_fraction"],
        iterations=200,
        rollout_batch_size=8,
        group_size=2,
        max_new_tokens=8,
        mini_batch_size=16,
        learning_rate=1e-3,
        save_every=1,
        progress=False,
        sampler="vllm",
        vllm_gpu_memory_utilization=0.02,
    )
    config.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in fields.items()))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE)}
    process = subprocess.Popen(
        [sys.executable, "-m", "proxrl", "grpo", "--config", str(config), "--output-dir", str(run)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while not any((run / "checkpoints").glob("step_*/manifest.json")):
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 143, err[-3000:]
    assert "received SIGTERM; checkpoint saved in" in err.strip().splitlines()[-1]
    done = len(read_metrics(run))
    engines.clear()  # the command's run starts its own: one engine at a time
    code = main(
        [
            "grpo",
            "--config",
            str(config),
            "--output-dir",
            str(run),
            "--resume",
            "--resume-with-changes",
            "--iterations",
            str(done + 1),
        ]
    )
    assert code == 0, capsys.readouterr().err
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == list(range(1, done + 2))


def test_a_poisoned_update_is_skipped_and_the_engine_stays_on_the_policy(
    tiny_lm, prompts, tmp_path, monkeypatch, train, engines
):
    cfg = small(ppo.Config, tiny_lm, prompts, tmp_path, critic_learning_rate=1e-3)
    algo = ppo.build(cfg)
    estimate, calls = algo.estimate, []

    def poisoned(exp, kl_coef):
        rewards, advantages, returns = estimate(exp, kl_coef)
        calls.append(1)
        return (rewards * float("nan") if len(calls) == 2 else rewards), advantages, returns

    algo.estimate = poisoned
    monkeypatch.setattr(ppo, "build", lambda c: algo)
    train(ppo, cfg)
    assert [r["guard/skipped_updates"] for r in read_metrics(tmp_path)] == [0.0, 1.0, 1.0]
    assert _engine_matches_saved_policy(cfg, tmp_path, engines) < 1e-4


def test_a_memory_share_the_machine_cannot_give_is_one_line(tiny_lm, engines):
    engines.clear()  # one engine at a time
    with pytest.raises(ProxrlError, match=r"^vllm_gpu_memory_utilization: 1.0 cannot be given"):
        start_engine(EngineOptions(tiny_lm, gpu_memory_utilization=1.0))
