"""PPO and the critic-free family on a tiny model: what a step must do, and that a learnable
reward goes up."""

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
from proxrl.core import value_loss
from proxrl.rollout.experience import Experience
from proxrl.rollout.forward import critic_forward, policy_forward
from proxrl.rollout.generation import response_mask_after_stop, stopped
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.guard import NonFiniteGuard
from proxrl.runtime.metrics import read_metrics
from tests.algos.collected import rollout_of
from tests.algos.killed_runs import comparable, sigkill_after_first_checkpoint

WORDS = ["abc", "def", "ghi", "jkl", "mno", "pqr", "stu", "vwx"]
REWARD = ("tests.algos.online_rewards:target_fraction",)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": f"say: {w} ->", "word": w}) + "\n" for w in WORDS)
    )
    return str(path)


def small(config_cls, tiny_lm: str, prompts: str, out: Path, **overrides):
    fields = dict(
        model=tiny_lm,
        prompts=prompts,
        reward_fn=REWARD,
        output_dir=str(out),
        iterations=3,
        rollout_batch_size=8,
        max_new_tokens=8,
        temperature=1.0,
        mini_batch_size=8,
        learning_rate=3e-3,
        progress=False,
        seed=3,
    )
    return config_cls(**(fields | overrides))


def scores(out: Path) -> list[float]:
    return [row["objective/scores"] for row in read_metrics(out)]


def test_ppo_raises_a_learnable_reward(tiny_lm, prompts, tmp_path):
    """40 iterations of PPO lift the share of target letters from ~0.2 clearly upward."""
    cfg = small(
        ppo.Config,
        tiny_lm,
        prompts,
        tmp_path,
        iterations=40,
        group_size=2,
        ppo_epochs=4,
        critic_learning_rate=1e-3,
        kl_coef=0.01,
    )
    ppo.train(cfg)
    history = scores(tmp_path)
    assert sum(history[-5:]) / 5 > sum(history[:5]) / 5 + 0.2, history


@pytest.mark.parametrize("estimator", list(grpo.ESTIMATORS))
def test_group_estimators_raise_a_learnable_reward(estimator, tiny_lm, prompts, tmp_path):
    _grpo_learns(tiny_lm, prompts, tmp_path, estimator=estimator)


@pytest.mark.parametrize(
    "overrides",
    [
        {"policy_loss": "gspo", "loss_aggregation": "seq-mean-token-mean"},
        {"policy_loss": "cispo", "clip_high": 0.28},
        {
            "policy_loss": "gspo_token",
            "scale_rewards": "batch",
            "loss_aggregation": "dr_grpo",
            "kl_coef": 0.05,
            "kl_loss_type": "k3+",
        },
    ],
)
def test_new_surrogates_raise_a_learnable_reward(overrides, tiny_lm, prompts, tmp_path):
    _grpo_learns(tiny_lm, prompts, tmp_path, **overrides)


def _grpo_learns(tiny_lm, prompts, tmp_path, **overrides):
    cfg = small(
        grpo.Config,
        tiny_lm,
        prompts,
        tmp_path,
        **(dict(iterations=30, group_size=4, ppo_epochs=2, mini_batch_size=16) | overrides),
    )
    grpo.train(cfg)
    history = scores(tmp_path)
    assert sum(history[-5:]) / 5 > sum(history[:5]) / 5 + 0.15, history


# ---------------------------------------------------------------- what a step must do


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_reference_and_reward_model_stay_bit_identical(tiny_lm, prompts, reward_model, tmp_path):
    """Two full iterations (rollout and update) through the loop's own functions: the actor and
    critic move, the reference and the reward model do not change by a single bit."""
    cfg = small(
        ppo.Config,
        tiny_lm,
        prompts,
        tmp_path,
        reward_fn=(),
        reward_model=reward_model,
        group_size=2,
        ppo_epochs=2,
        critic_learning_rate=1e-3,
    )
    algo = ppo.build(cfg)
    models = load_models(role_settings(cfg).models, algo)
    rewards = load_rewards(role_settings(cfg).rewards)
    examples, ids = load_prompts(role_settings(cfg).prompts, models.tokenizer)
    before = {
        name: _state(m)
        for name, m in (
            ("actor", models.actor),
            ("critic", models.critic),
            ("reference", models.reference),
            ("reward", rewards.sources[0].model),
        )
    }
    optimizers = [
        torch.optim.AdamW(models.actor.parameters(), lr=1e-3),
        torch.optim.AdamW(models.critic.parameters(), lr=1e-3),
    ]
    for _ in range(2):
        experience, _, row = rollout_of(cfg, algo, models, rewards, examples, ids, 0.05, {})
        experience = estimate(algo, experience, 0.05)
        update(
            run_settings(cfg, algo, models.critic).updating,
            algo,
            models,
            experience,
            optimizers,
            UpdateStep(0.05, True, 1),
            torch.Generator().manual_seed(0),
            NonFiniteGuard(),
        )
    for name, model in (("reference", models.reference), ("reward", rewards.sources[0].model)):
        after = _state(model)
        assert all(torch.equal(before[name][k], after[k]) for k in after), name
    for name, model in (("actor", models.actor), ("critic", models.critic)):
        after = _state(model)
        assert any(not torch.equal(before[name][k], after[k]) for k in after), name


def test_first_iteration_kl_is_exactly_zero(tiny_lm, prompts, tmp_path):
    ppo.train(small(ppo.Config, tiny_lm, prompts, tmp_path, iterations=2, critic="head"))
    rows = read_metrics(tmp_path)
    assert rows[0]["objective/kl"] == 0.0
    assert rows[1]["objective/kl"] != 0.0


def test_each_iteration_logs_its_learning_rate_and_a_line_without_a_terminal(
    tiny_lm, prompts, tmp_path, caplog
):
    """``train/lr`` (sft's name) is the rate the iteration stepped with, the schedule's: linear
    from 3e-3 over 2 iterations, 3e-3 then 3e-3 · (1 − 1/2) = 1.5e-3. With the bar asked for and
    stderr not a terminal (a log file; here pytest's capture), each iteration of a 2-iteration
    run logs a plain line with its score, KL and rate (issue 51: nothing appeared)."""
    cfg = small(grpo.Config, tiny_lm, prompts, tmp_path, iterations=2, group_size=2)
    cfg = replace(cfg, progress=True, lr_schedule="linear")
    with caplog.at_level(logging.INFO, logger="proxrl.runtime.metrics"):
        grpo.train(cfg)
    assert [r["train/lr"] for r in read_metrics(tmp_path)] == pytest.approx([3e-3, 1.5e-3])
    lines = [r.getMessage() for r in caplog.records if r.name == "proxrl.runtime.metrics"]
    assert [line.split("  ")[0] for line in lines] == ["grpo 1/2", "grpo 2/2"], lines
    assert all(f" {k} " in line for line in lines for k in ("score", "kl", "lr")), lines
    assert lines[1].endswith("lr 0.0015"), lines


def test_tokens_after_the_stop_change_no_loss(tiny_lm, prompts, tmp_path):
    """Replace every token after each response's stop with random ids: the policy loss, value
    loss and their gradients are the same."""
    cfg = small(
        ppo.Config,
        tiny_lm,
        prompts,
        tmp_path,
        group_size=2,
        max_new_tokens=12,
        critic_learning_rate=1e-3,
    )
    algo = ppo.build(cfg)
    models = load_models(role_settings(cfg).models, algo)
    examples, ids = load_prompts(role_settings(cfg).prompts, models.tokenizer)
    experience, _, _ = rollout_of(
        cfg, algo, models, load_rewards(role_settings(cfg).rewards), examples, ids, 0.05, {}
    )
    experience = estimate(algo, experience, 0.05)
    experience.response_mask[::2, 5:] = 0  # force stops so every other row has masked tokens
    noise = torch.randint(3, len(models.tokenizer), experience.response_ids.shape)
    perturbed = Experience(
        **{
            **experience.__dict__,
            "response_ids": torch.where(
                experience.response_mask.bool(), experience.response_ids, noise
            ),
        }
    )
    assert not torch.equal(perturbed.response_ids, experience.response_ids)

    def loss_and_grads(exp):
        models.actor.zero_grad()
        models.critic.module.zero_grad()
        P = exp.prompt_ids.shape[1]
        out = policy_forward(models.actor, exp.input_ids, exp.attention_mask, P, cfg.temperature)
        loss, _ = algo.policy_loss(out.logprobs, exp)
        values = critic_forward(models.critic.module, exp.input_ids, exp.attention_mask, P)
        loss = loss + value_loss(values, exp.values, exp.returns, exp.response_mask.float(), 0.2)[0]
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in models.actor.parameters()]

    clean_loss, clean_grads = loss_and_grads(experience)
    noisy_loss, noisy_grads = loss_and_grads(perturbed)
    torch.testing.assert_close(noisy_loss, clean_loss, rtol=1e-6, atol=1e-7)
    for a, b in zip(clean_grads, noisy_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_critic_warmup_raises_explained_variance(tiny_lm, prompts, tmp_path):
    """During warm-up only the critic trains, on a score it can read off the prompt: its
    explained variance climbs from 0 (a zero-initialised head) towards 1, and no policy step is
    taken."""
    cfg = small(
        ppo.Config,
        tiny_lm,
        prompts,
        tmp_path,
        iterations=13,
        critic_warmup_iterations=12,
        reward_fn=("tests.algos.online_rewards:word_in_first_half",),
        group_size=2,
        ppo_epochs=4,
        critic_learning_rate=3e-3,
        critic="head",
        kl_coef=0.0,
    )
    ppo.train(cfg)
    explained = [row["value/explained_var"] for row in read_metrics(tmp_path)]
    assert sum(explained[-3:]) / 3 > sum(explained[:2]) / 2 + 0.2, explained
    assert all("policy/clipfrac" not in row for row in read_metrics(tmp_path)[:12])


def test_resume_equals_an_uninterrupted_run(tiny_lm, prompts, tmp_path):
    """Run 4 iterations checkpointing every 2; copy the run, drop its final checkpoint and
    resume from iteration 2: same metrics rows (timings aside) and bit-identical final weights."""
    import shutil

    whole = tmp_path / "whole"
    ppo.train(
        small(
            ppo.Config,
            tiny_lm,
            prompts,
            whole,
            iterations=4,
            save_every=2,
            group_size=2,
            sample_every=1,
        )
    )
    resumed = tmp_path / "resumed"
    shutil.copytree(whole, resumed)
    shutil.rmtree(
        resumed
        / "checkpoints"
        / next(p.name for p in (resumed / "checkpoints").iterdir() if p.name.endswith("4"))
    )
    ppo.train(
        small(
            ppo.Config,
            tiny_lm,
            prompts,
            resumed,
            iterations=4,
            save_every=2,
            group_size=2,
            sample_every=1,
            resume=True,
        )
    )

    assert comparable(read_metrics(resumed)) == comparable(read_metrics(whole))
    assert (resumed / "samples.jsonl").read_text() == (whole / "samples.jsonl").read_text()
    a, b = load_file(whole / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "overrides",
    [
        {"surrogate": "penalty"},
        {"surrogate": "clip+penalty", "dual_clip": 3.0, "clip_high": 0.28},
        {"surrogate": "clip+penalty", "policy_loss": "gspo_token", "loss_aggregation": "dr_grpo"},
        {"policy_loss": "cispo", "clip_high": 0.28},
        {"critic": "head", "kl_controller": "proportional", "kl_target": 0.1, "entropy_coef": 0.01},
        {"lora_r": 4, "whiten_rewards": True, "reward_clip": 0.5, "no_stop_penalty": -1.0},
        {
            "ref_reset_every": 1,
            "early_stop_kl": 1e-6,
            "loss_aggregation": "seq-mean-token-mean",
            "stop_strings": ("x",),
            "shared_prefix": False,  # KL to the policy's copy exactly 0 (see sampling_consistency)
        },
    ],
)
def test_ppo_variants_run_with_finite_metrics(overrides, tiny_lm, prompts, tmp_path):
    ppo.train(
        small(ppo.Config, tiny_lm, prompts, tmp_path, group_size=2, ppo_epochs=2, **overrides)
    )
    rows = read_metrics(tmp_path)
    assert len(rows) == 3
    assert all(
        isinstance(v, float) and v == v and abs(v) != float("inf")
        for r in rows
        for v in r.values()
        if not isinstance(v, int)
    )
    if "surrogate" in overrides:
        assert all("policy/penalty_beta" in r for r in rows)
    if overrides.get("ref_reset_every"):
        assert all(r["objective/kl"] == 0.0 for r in rows)  # each rollout samples the new reference
        assert all(r["policy/early_stopped"] == 1.0 for r in rows)
    if "no_stop_penalty" in overrides:
        assert (tmp_path / "adapter" / "adapter_config.json").exists()
        assert (tmp_path / "model.safetensors").exists()


def test_dataset_columns_reach_reward_functions(tiny_lm, prompts, tmp_path):
    grpo.train(
        small(
            grpo.Config,
            tiny_lm,
            prompts,
            tmp_path,
            reward_fn=("tests.algos.online_rewards:echoes_word",),
            iterations=1,
            group_size=2,
            mini_batch_size=16,
        )
    )
    assert len(read_metrics(tmp_path)) == 1
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 16 and {s["prompt"] for s in samples} <= {f"say: {w} ->" for w in WORDS}


# ---------------------------------------------------------------- sampling masks


def test_response_mask_after_stop_by_hand():
    """EOS = 2, pad = 0: (5, 2, 7, 0) keeps up to and including the EOS → (1, 1, 0, 0);
    (5, 6, 7, 8) never stops → all 1 and not stopped; (5, 6, 0, 0) stopped by a stop string;
    (5, 0, 6, 2): a pad the model sampled inside the response stays valid."""
    ids = torch.tensor([[5, 2, 7, 0], [5, 6, 7, 8], [5, 6, 0, 0], [5, 0, 6, 2]])
    mask = response_mask_after_stop(ids, eos_token_id=2, pad_token_id=0)
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]]
    assert stopped(mask, ids, eos_token_id=2, max_new_tokens=4).tolist() == [
        True,
        False,
        True,
        True,
    ]


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("command", "extra", "message"),
    [
        ("grpo", ["--group_size", "1"], "group_size: grpo needs at least 2"),
        ("ppo", ["--mini_batch_size", "3"], "mini_batch_size: 3 does not divide the 8 responses"),
        (
            "ppo",
            ["--reward_fn", "no_such_module:fn"],
            "reward_fn: no module named 'no_such_module' on the import path (the working",
        ),
        ("ppo", ["--reward_fn", "tests.algos.online_rewards:missing"], "has no function 'missing'"),
        ("ppo", ["--reward_fn", "tests.algos.online_rewards:raises"], "raised RuntimeError: boom"),
        (
            "ppo",
            ["--reward_fn", "tests.algos.online_rewards:wrong_count"],
            "returned 1 scores for 8 completions",
        ),
        (
            "ppo",
            ["--reward_fn", "tests.algos.online_rewards:not_finite"],
            "returned nan for prompt index 0",
        ),
        ("ppo", ["--prompts", "EMPTY"], "has no usable rows"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    command, extra, message, tiny_lm, prompts, tmp_path, capsys
):
    from proxrl.cli import main

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    extra = [str(empty) if x == "EMPTY" else x for x in extra]
    argv = [
        command,
        "--model",
        tiny_lm,
        "--prompts",
        prompts,
        "--reward_fn",
        "tests.algos.online_rewards:target_fraction",
        "--output_dir",
        str(tmp_path / "run"),
        "--iterations",
        "1",
        "--rollout_batch_size",
        "4",
        "--group_size",
        "2",
        "--mini_batch_size",
        "8",
        "--max_new_tokens",
        "4",
        "--progress",
        "False",
        *extra,
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err.splitlines()[-1] and "Traceback" not in err, err


def test_sampler_logprobs_match_the_forward_pass(tiny_lm, prompts, tmp_path):
    """π_old taken from the sampler's logits equals a fresh forward pass over the same tokens
    to float rounding (KV cache vs full pass), at a non-unit temperature."""
    cfg = small(
        ppo.Config, tiny_lm, prompts, tmp_path, temperature=0.7, sampler_logprobs=True, group_size=2
    )
    algo = ppo.build(cfg)
    models = load_models(role_settings(cfg).models, algo)
    examples, ids = load_prompts(role_settings(cfg).prompts, models.tokenizer)
    experience, _, _ = rollout_of(
        cfg, algo, models, load_rewards(role_settings(cfg).rewards), examples, ids, 0.05, {}
    )
    with torch.no_grad():
        fresh = policy_forward(
            models.actor,
            experience.input_ids,
            experience.attention_mask,
            experience.prompt_ids.shape[1],
            0.7,
        ).logprobs
    mask = experience.response_mask.bool()
    torch.testing.assert_close(experience.logprobs[mask], fresh[mask], rtol=0, atol=1e-4)
    assert (experience.logprobs[~mask] == 0).all()


# ---------------------------------------------------------------- killed and resumed


@pytest.mark.parametrize("command", ["ppo", "grpo"])
def test_sigkill_and_resume_equals_an_uninterrupted_run(command, tiny_lm, prompts, tmp_path):
    """A run killed with SIGKILL after its first checkpoint, then resumed with --resume, ends
    with bit-identical weights and the same metrics rows as the same run left alone. Only the
    killed run is a subprocess (``python -m proxrl``); the run left alone and the resume run in
    this process, so the state crosses processes through the checkpoint alone."""

    import yaml

    from proxrl.cli import main

    def config(out: Path) -> Path:
        fields = {
            "model": tiny_lm,
            "prompts": prompts,
            "reward_fn": list(REWARD),
            "output_dir": str(out),
            "iterations": 6,
            "rollout_batch_size": 8,
            "group_size": 2,
            "max_new_tokens": 8,
            "temperature": 1.0,
            "mini_batch_size": 8,
            "learning_rate": 3e-3,
            "progress": False,
            "seed": 5,
            "save_every": 1,
            "keep_checkpoints": 2,
        }
        path = out.with_suffix(".yaml")
        path.write_text(yaml.safe_dump(fields))
        return path

    whole, killed = tmp_path / "whole", tmp_path / "killed"
    argv = [command, "--config", str(config(killed))]
    sigkill_after_first_checkpoint(argv, killed, tmp_path / "killed.log")
    assert main([command, "--config", str(config(whole))]) == 0
    assert main([command, "--config", str(config(killed)), "--resume", "True"]) == 0

    assert comparable(read_metrics(killed)) == comparable(read_metrics(whole))
    a, b = load_file(whole / "model.safetensors"), load_file(killed / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------- non-finite guard


def test_nan_rewards_and_gradients_are_skipped_counted_and_stop_the_run(
    tiny_lm, prompts, tmp_path, monkeypatch
):
    """Iteration 2's rewards are NaN: its whole update is skipped and counted; from iteration 4
    on every gradient is NaN: each step is skipped until max_consecutive_skips stops the run
    with a clear message, the checkpoint of iteration 3 intact and no NaN in any saved weight."""
    cfg = small(
        ppo.Config,
        tiny_lm,
        prompts,
        tmp_path,
        iterations=8,
        group_size=2,
        save_every=1,
        max_consecutive_skips=3,
        critic_learning_rate=1e-3,
    )
    algo = ppo.build(cfg)
    estimate, calls = algo.estimate, []

    def poisoned_estimate(exp, kl_coef):
        rewards, advantages, returns = estimate(exp, kl_coef)
        calls.append(1)
        return (
            (rewards * float("nan"), advantages, returns)
            if len(calls) == 2
            else (rewards, advantages, returns)
        )

    algo.estimate = poisoned_estimate
    real_backward = torch.Tensor.backward

    def nan_backward(self, *args, **kwargs):
        real_backward(self, *args, **kwargs)
        if len(calls) >= 4:
            for p in algo_models[0].actor.parameters():
                p.grad = torch.full_like(p, float("nan"))

    import proxrl.algos.online.placement.base as online_module  # LocalPlacement loads the models

    algo_models = []
    real_load = online_module.load_models
    monkeypatch.setattr(
        online_module,
        "load_models",
        lambda c, a: algo_models.append(real_load(c, a)) or algo_models[0],
    )
    monkeypatch.setattr(ppo, "build", lambda c: algo)
    monkeypatch.setattr(torch.Tensor, "backward", nan_backward)
    with pytest.raises(
        ProxrlError,
        match=r"3 updates in a row were skipped .*grad of .* holds NaN.*last good checkpoint",
    ):
        ppo.train(cfg)
    rows = read_metrics(tmp_path)
    assert [r["guard/skipped_updates"] for r in rows[:3]] == [0.0, 1.0, 1.0]
    assert (
        "policy/optimizer_steps" not in rows[1] and rows[2]["policy/optimizer_steps"] == 8.0
    )  # 4 epochs × 2
    from proxrl.runtime.checkpoint import CheckpointManager

    latest = CheckpointManager(tmp_path).latest()
    tensors, state = CheckpointManager(tmp_path).load(latest)
    assert state["iteration"] == 3
    assert all(torch.isfinite(t).all() for group in tensors.values() for t in group.values())


def test_grpo_without_kl_tracking_loads_no_reference(tiny_lm, prompts, tmp_path):
    """β fixed at 0 and track_kl off: no reference model, no objective/kl; learning unaffected."""
    from proxrl.algos.online.roles import load_models

    cfg = small(
        grpo.Config,
        tiny_lm,
        prompts,
        tmp_path,
        iterations=2,
        group_size=2,
        mini_batch_size=16,
        track_kl=False,
        sampler_logprobs=True,
    )
    assert load_models(role_settings(cfg).models, grpo.build(cfg)).reference is None
    grpo.train(cfg)
    rows = read_metrics(tmp_path)
    assert len(rows) == 2 and all("objective/kl" not in r for r in rows)
    assert all(r["policy/optimizer_steps"] == 1.0 for r in rows)  # 1 epoch × 1 minibatch of 16


# ---------------------------------------------------------------- samplers


@pytest.fixture(scope="module")
def policy(tiny_lm):
    from proxrl.data.batching import pad_left
    from proxrl.models.causal_lm import load_causal_lm
    from proxrl.models.tokenizer import load_tokenizer

    tokenizer, model = load_tokenizer(tiny_lm), load_causal_lm(tiny_lm)
    ids = [tokenizer(f"say: {w} ->")["input_ids"] for w in ["abc", "de fg", "x", "hij kl mn"]] * 4
    return (
        model,
        tokenizer,
        pad_left(ids, tokenizer.pad_token_id),
        pad_left([[1] * len(r) for r in ids], 0),
    )


@pytest.mark.parametrize("compiled", [False, True])
def test_cached_sampler_greedy_equals_generate(compiled, policy):
    from proxrl.rollout.generation import CachedSampler, HFSampler, SamplingSettings

    model, tokenizer, ids, mask = policy
    settings = SamplingSettings(12, greedy=True)
    a = HFSampler(model, tokenizer).sample(ids, mask, settings)
    b = CachedSampler(model, tokenizer, compile_step=compiled).sample(ids, mask, settings)
    width = a.response_ids.shape[1]
    assert torch.equal(a.response_ids, b.response_ids[:, :width]) and torch.equal(
        a.response_mask, b.response_mask[:, :width]
    )


def test_compiled_sampler_on_a_lora_policy_equals_the_plain_loop(policy):
    """Through peft's wrapper (LoRA on q and v, non-zero adapters) the compiled step gives the
    plain loop's greedy tokens and log-probs, left padding included."""
    from peft import LoraConfig, get_peft_model

    from proxrl.rollout.generation import CachedSampler, SamplingSettings

    model, tokenizer, ids, mask = policy
    torch.manual_seed(0)
    lora = get_peft_model(
        copy.deepcopy(model),
        LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    settings = SamplingSettings(16, greedy=True)
    plain = CachedSampler(lora, tokenizer).sample(ids, mask, settings, with_logprobs=True)
    compiled = CachedSampler(lora, tokenizer, compile_step=True).sample(
        ids, mask, settings, with_logprobs=True
    )
    assert torch.equal(plain.response_ids, compiled.response_ids)
    torch.testing.assert_close(plain.logprobs, compiled.logprobs, rtol=0, atol=1e-5)


@pytest.mark.parametrize("sampler", ["hf", "cached", "compiled"])
def test_sampler_logprobs_equal_a_fresh_forward(sampler, policy):
    """Every sampler's own log-probs, over left-padded prompts of different lengths at T = 0.7,
    equal a full forward pass over the sampled tokens to float rounding."""
    from proxrl.rollout.generation import CachedSampler, HFSampler, SamplingSettings

    model, tokenizer, ids, mask = policy
    torch.manual_seed(0)
    chosen = (
        HFSampler(model, tokenizer)
        if sampler == "hf"
        else CachedSampler(model, tokenizer, compile_step=sampler == "compiled")
    )
    s = chosen.sample(ids, mask, SamplingSettings(24, temperature=0.7), with_logprobs=True)
    with torch.no_grad():
        full = policy_forward(
            model,
            torch.cat([ids, s.response_ids], 1),
            torch.cat([mask, s.response_mask], 1),
            ids.shape[1],
            0.7,
            with_entropy=True,
        )
    valid = s.response_mask.bool()
    torch.testing.assert_close(s.logprobs[valid], full.logprobs[valid], rtol=0, atol=1e-5)
    torch.testing.assert_close(s.entropy[valid], full.entropy[valid], rtol=0, atol=1e-5)


def test_filter_logits_by_hand():
    """logits (4, 3, 2, 1): top-k 2 keeps (4, 3); top-p 0.7 keeps the smallest prefix whose
    probability reaches 0.7 — softmax = (.644, .237, .087, .032), so the first two."""
    from proxrl.core import truncate_logits as filter_logits

    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0]])
    inf = float("-inf")
    assert filter_logits(logits, 2, 1.0).tolist() == [[4.0, 3.0, inf, inf]]
    assert filter_logits(logits, 0, 0.7).tolist() == [[4.0, 3.0, inf, inf]]
    assert filter_logits(logits, 0, 0.6).tolist() == [[4.0, inf, inf, inf]]


def test_compiled_sampler_draws_the_same_responses_in_a_run(tiny_lm, prompts, tmp_path):
    """compile_sampler changes how each step is computed, not what is drawn: with the same seed
    three GRPO iterations sample the same completions (logits agree to ~1e-6; the uniform draws
    are the same stream), so the compiled step also sees each update's new weights."""
    runs = {}
    for compiled in (False, True):
        out = tmp_path / str(compiled)
        grpo.train(
            small(
                grpo.Config,
                tiny_lm,
                prompts,
                out,
                iterations=3,
                group_size=4,
                mini_batch_size=16,
                sample_every=1,
                compile_sampler=compiled,
            )
        )
        runs[compiled] = [
            (row["iteration"], row["completion"])
            for row in map(json.loads, (out / "samples.jsonl").read_text().splitlines())
        ]
    assert len(runs[True]) == 3 * 32 and runs[True] == runs[False]
    first, last = ([c for i, c in runs[True] if i == k] for k in (1, 3))
    assert first != last  # the policy moved, so equal samples are not equal by accident


def test_draw_tokens_by_hand(monkeypatch):
    """CDF (0, .25, .25, 1): a uniform u picks the first token whose CDF exceeds u, so u in
    [0, .25) → 1 and [.25, 1) → 3; zero-probability tokens 0 and 2 are never picked. An
    unnormalised row (2, 0, 6) scales u by its total 8: u = .3 → 2.4 → token 2."""
    from proxrl.rollout import generation

    uniforms = torch.tensor([[0.0], [0.2499], [0.25], [0.9999]], dtype=torch.float64)
    monkeypatch.setattr(generation.torch, "rand", lambda *a, **k: uniforms)
    assert generation.draw_tokens(torch.tensor([[0.0, 0.25, 0.0, 0.75]] * 4)).tolist() == [
        1,
        1,
        3,
        3,
    ]
    monkeypatch.setattr(
        generation.torch, "rand", lambda *a, **k: torch.tensor([[0.3], [0.2]], dtype=torch.float64)
    )
    assert generation.draw_tokens(torch.tensor([[2.0, 0.0, 6.0], [2.0, 0.0, 6.0]])).tolist() == [
        2,
        0,
    ]


def test_draw_tokens_follows_the_distribution():
    """200,000 draws: every frequency within 4 standard errors of its probability (a draw
    off by one token would be ~100 standard errors out), zero-probability tokens never drawn."""
    from proxrl.rollout.generation import draw_tokens

    torch.manual_seed(0)
    p = torch.tensor([0.1, 0.0, 0.3, 0.05, 0.0, 0.55])
    n = 200_000
    counts = torch.bincount(draw_tokens(p.expand(n, -1)), minlength=6).double()
    standard_error = (p * (1 - p) / n).sqrt().double()
    assert counts[p == 0].sum() == 0
    assert ((counts / n - p.double()).abs() <= 4 * standard_error + 1e-12).all(), counts / n


def test_always_nan_gradients_stop_a_run_with_one_step_per_iteration(
    tiny_lm, prompts, tmp_path, monkeypatch
):
    """One optimizer step per iteration and every gradient NaN: the finite rollouts in between
    must not reset the in-a-row count, so the run stops after max_consecutive_skips iterations."""
    real_backward = torch.Tensor.backward

    def nan_backward(self, *args, **kwargs):
        real_backward(self, *args, **kwargs)
        for p in model_params:
            p.grad = torch.full_like(p, float("nan"))

    import proxrl.algos.online.placement.base as online_module  # LocalPlacement loads the models

    real_load, model_params = online_module.load_models, []

    def load_and_remember(settings, algo):
        models = real_load(settings, algo)
        model_params.extend(models.actor.parameters())
        return models

    monkeypatch.setattr(online_module, "load_models", load_and_remember)
    monkeypatch.setattr(torch.Tensor, "backward", nan_backward)
    cfg = small(
        grpo.Config,
        tiny_lm,
        prompts,
        tmp_path,
        iterations=10,
        group_size=2,
        mini_batch_size=16,
        max_consecutive_skips=3,
    )
    with pytest.raises(ProxrlError, match="3 updates in a row were skipped"):
        grpo.train(cfg)
    assert [r["guard/skipped_updates"] for r in read_metrics(tmp_path)] == [1.0, 2.0]
