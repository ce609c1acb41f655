"""The classic trainer end to end: every objective and TRPO on CartPole and Hopper, exact resume,
the adaptive-β rule, evaluation, bad input, and CartPole solved (≥ 400) with the clip objective."""

from __future__ import annotations

import json
import math

import pytest
import torch

from proxrl import cli
from proxrl.classic.agent import Agent
from proxrl.classic.config import ClassicConfig
from proxrl.classic.evaluate import EvalConfig, evaluate
from proxrl.classic.train import _action_kind, train
from proxrl.runtime.checkpoint import CheckpointManager
from proxrl.runtime.metrics import read_metrics

# small but complete iterations: 2 × 64 CartPole steps, 128 Hopper steps
TINY = {
    "CartPole-v1": dict(
        num_envs=2, num_steps=64, mini_batch_size=32, ppo_epochs=2, total_steps=256
    ),
    "Hopper-v5": dict(num_envs=1, num_steps=128, mini_batch_size=32, ppo_epochs=2, total_steps=256),
}
REQUIRED = [
    "global_step",
    "charts/SPS",
    "charts/learning_rate",
    "losses/policy_loss",
    "losses/value_loss",
    "losses/entropy",
    "losses/approx_kl",
    "losses/kl",
    "losses/explained_variance",
]
PPO_ONLY = ["losses/clipfrac", "losses/kl_beta", "losses/approx_kl_k1", "losses/epochs"]
SETTINGS = [
    dict(objective="clip"),
    dict(objective="adaptive-kl"),
    dict(objective="fixed-kl"),
    dict(objective="none"),
    dict(algo="trpo"),
]


def _cfg(tmp_path, env="CartPole-v1", **kw):
    return ClassicConfig(
        output_dir=str(tmp_path / "run"), env=env, progress=False, **{**TINY[env], **kw}
    )


def _agent_weights(run_dir):
    manager = CheckpointManager(run_dir)
    return manager.load(manager.latest())[0]["agent"]


@pytest.mark.parametrize("env", ["CartPole-v1", "Hopper-v5"])
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "-".join(s.values()))
def test_each_objective_runs_with_finite_metrics(tmp_path, env, setting):
    cfg = _cfg(tmp_path, env, **setting)
    summary = train(cfg)
    rows = read_metrics(cfg.output_dir)
    assert [r["global_step"] for r in rows] == [cfg.total_steps // 2, cfg.total_steps]
    keys = REQUIRED + (
        PPO_ONLY
        if setting.get("algo") != "trpo"
        else ["losses/trpo_accepted", "losses/trpo_step_frac"]
    )
    for row in rows:
        for key in keys:
            assert math.isfinite(row[key]), (key, row[key])
    assert summary["global_step"] == cfg.total_steps and summary["complete"]
    # the policy and the critic both moved away from their initialisation
    discrete, obs_dim, act_dim = _action_kind(env)
    torch.manual_seed(cfg.seed)  # the run builds its agent right after seeding
    fresh = Agent(obs_dim, act_dim, discrete).state_dict()
    trained = _agent_weights(cfg.output_dir)
    assert not torch.equal(fresh["critic.0.weight"], trained["critic.0.weight"])
    moved = not torch.equal(fresh["actor.0.weight"], trained["actor.0.weight"])
    accepted = any(r.get("losses/trpo_accepted", 1.0) for r in rows)
    assert moved == accepted
    if setting.get("objective") == "fixed-kl":
        assert all(r["losses/kl_beta"] == 1.0 for r in rows)
    if setting.get("objective") in ("clip", "none"):
        assert all(r["losses/kl_beta"] == 0.0 for r in rows)
    assert any((tmp_path / "run" / "tensorboard").iterdir())
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["episodes"] >= 0


def test_adaptive_beta_follows_the_paper_rule(tmp_path):
    """β_{i+1} = 2β_i if d_i > 1.5·d_targ, β_i/2 if d_i < d_targ/1.5, else β_i (β_1 = 1)."""
    cfg = _cfg(tmp_path, objective="adaptive-kl", penalty_target=0.003, total_steps=128 * 6)
    train(cfg)
    rows = read_metrics(cfg.output_dir)
    assert rows[0]["losses/kl_beta"] == 1.0
    for prev, row in zip(rows, rows[1:], strict=False):
        d, beta = prev["losses/kl"], prev["losses/kl_beta"]
        expected = 2 * beta if d > 1.5 * 0.003 else beta / 2 if d < 0.003 / 1.5 else beta
        assert row["losses/kl_beta"] == expected
    assert len({r["losses/kl_beta"] for r in rows}) > 1  # the rule actually fired


_TIMING = {"charts/SPS", "time/rollout_s", "time/update_s"}


def _comparable(rows):
    return [{k: v for k, v in r.items() if k not in _TIMING} for r in rows]


@pytest.mark.parametrize("env", ["CartPole-v1", "Hopper-v5"])
def test_resume_after_a_stop_equals_an_uninterrupted_run(tmp_path, env):
    kw = dict(total_steps=TINY[env]["total_steps"] * 2, save_every=1)
    full = _cfg(tmp_path / "a", env, **kw)
    train(full)
    half = _cfg(tmp_path / "b", env, stop_at_step=kw["total_steps"] // 2, **kw)
    first = train(half)
    assert not first["complete"]
    # a crash after the checkpoint left a line the resumed run must replace
    with open(tmp_path / "b" / "run" / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 10**9, "global_step": 10**9}) + "\n")
    resumed = train(_cfg(tmp_path / "b", env, resume=True, **kw))
    assert resumed["complete"]
    assert _comparable(read_metrics(half.output_dir)) == _comparable(read_metrics(full.output_dir))
    a, b = _agent_weights(full.output_dir), _agent_weights(half.output_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)
    summary_a = json.loads((tmp_path / "a" / "run" / "summary.json").read_text())
    assert resumed["mean_return_last_100"] == summary_a["mean_return_last_100"]


def test_evaluation_is_deterministic(tmp_path):
    cfg = _cfg(tmp_path)
    train(cfg)
    first = evaluate(EvalConfig(run_dir=cfg.output_dir, episodes=3, seed=5))
    second = evaluate(EvalConfig(run_dir=cfg.output_dir, episodes=3, seed=5))
    assert first["returns"] == second["returns"] and len(first["returns"]) == 3
    assert first["mean_return"] > 0
    assert json.loads((tmp_path / "run" / "eval.json").read_text())["episodes"] == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--env", "Hoper-v5"],
            "--env: unknown gymnasium environment 'Hoper-v5'; did you mean Hopper-v5?",
        ),
        (["--objective", "kl"], "--objective expects one of clip, adaptive-kl, fixed-kl, none"),
        (["--total-steps", "-1000"], "total_steps: expected >= 1, got -1000"),
        (
            ["--minibatch-size", "100"],
            "--minibatch-size 100 does not divide num_envs × num_steps = 4 × 128 = 512",
        ),
        (["--total-steps", "100"], "--total-steps 100 is less than one iteration"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    assert cli.main(["classic", "--output-dir", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("proxrl classic: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()  # nothing was created for a run that never started


BOX2D_MISSING = (
    "Box2D is not installed, you can install it by run `pip install swig` followed by "
    '`pip install "gymnasium[box2d]"`'
)


def test_an_environment_whose_extra_is_missing_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    """gymnasium raises DependencyNotInstalled naming the extra (Box2D for LunarLander): that
    line, exit 2, instead of a 30-line traceback; nothing is created."""
    import gymnasium as gym

    def make(env_id, *args, **kwargs):
        raise gym.error.DependencyNotInstalled(BOX2D_MISSING)

    monkeypatch.setattr(gym, "make", make)
    out = tmp_path / "run"
    assert cli.main(["classic", "--env", "LunarLander-v3", "--output-dir", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"proxrl classic: error: --env LunarLander-v3: {BOX2D_MISSING}\n"
    )
    assert not out.exists()


def test_lunar_lander_without_box2d_names_the_extra(tmp_path, capsys):
    try:
        import Box2D  # noqa: F401

        pytest.skip("Box2D is installed here")
    except ImportError:
        pass
    assert cli.main(["classic", "--env", "LunarLander-v3", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gymnasium[box2d]" in err and "Traceback" not in err


def test_existing_run_needs_resume_or_overwrite(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    train(cfg)
    argv = ["classic", "--output-dir", cfg.output_dir, "--total-steps", "512"]
    assert cli.main(argv) == 2
    assert "already holds a run; pass --resume" in capsys.readouterr().err
    assert cli.main(["classic-eval", "--run-dir", str(tmp_path / "none")]) == 2
    assert "holds no config.yaml" in capsys.readouterr().err


def test_yaml_config_and_flag_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    out = tmp_path / "run"
    path.write_text(
        f"env: Hopper-v5\nnum_steps: 64\nminibatch_size: 32\nepochs: 1\n"
        f"total_steps: 1000\noutput_dir: {out}\nprogress: false\n"
    )
    assert cli.main(["classic", "--config", str(path), "--total-steps", "128"]) == 0
    rows = read_metrics(out)
    assert [r["global_step"] for r in rows] == [64, 128]
    saved = (out / "config.yaml").read_text()
    assert "env: Hopper-v5" in saved and "normalize_obs: true" in saved  # resolved defaults


@pytest.mark.slow
def test_cartpole_reaches_400_with_the_clip_objective(tmp_path):
    """CleanRL's classic-control settings (4 × 128 steps, 4 epochs, 4 minibatches, lr 2.5e-4
    annealed, ent 0.01) for 300k steps: ~40 s on one core; seeds 1-3 reach 480-495."""
    cfg = ClassicConfig(
        output_dir=str(tmp_path / "run"),
        env="CartPole-v1",
        objective="clip",
        total_steps=300_000,
        seed=1,
        progress=False,
    )
    summary = train(cfg)
    assert summary["mean_return_last_100"] >= 400, summary


def test_cleanrl_spellings_are_aliases_in_flags_and_yaml(tmp_path):
    """The LM trainers' names are canonical; CleanRL's still work (a run's older config.yaml
    too)."""
    from proxrl.runtime.config import load_config_file, parse_config

    argv = [
        "--lr",
        "1e-3",
        "--gae_lambda",
        "0.9",
        "--ent-coef",
        "0.02",
        "--minibatch-size",
        "16",
        "--epochs",
        "3",
        "--no-norm-adv",
        "--target-kl",
        "0.05",
        "--kl-target",
        "0.02",
        "--kl-beta",
        "2",
    ]
    cfg = parse_config(ClassicConfig, argv, "t")
    assert (cfg.learning_rate, cfg.lam, cfg.entropy_coef, cfg.mini_batch_size, cfg.ppo_epochs) == (
        1e-3,
        0.9,
        0.02,
        16,
        3,
    )
    assert (cfg.whiten_advantages, cfg.early_stop_kl, cfg.penalty_target, cfg.penalty_beta) == (
        False,
        0.05,
        0.02,
        2.0,
    )
    path = tmp_path / "config.yaml"
    path.write_text("lr: 0.001\ngae_lambda: 0.9\nnorm_adv: false\nclip_vloss: true\nclip: 0.1\n")
    cfg = load_config_file(ClassicConfig, path)
    assert (cfg.learning_rate, cfg.lam, cfg.whiten_advantages) == (0.001, 0.9, False)
    assert cfg.resolved(discrete=True).value_clip == 0.1  # clip_vloss on: the value range is clip


@pytest.mark.parametrize(
    ("argv", "value_clip"),
    [
        ([], None),
        (["--clip-vloss"], 0.3),
        (["--no-clip-vloss"], None),
        (["--value-clip", "0.5"], 0.5),
        (["--value-clip", "none"], None),
    ],
)
def test_value_clip_and_cleanrls_clip_vloss_switch(argv, value_clip):
    from proxrl.runtime.config import parse_config

    cfg = parse_config(ClassicConfig, ["--clip", "0.3", *argv], "t").resolved(discrete=True)
    assert cfg.value_clip == value_clip and cfg.clip_vloss is None
