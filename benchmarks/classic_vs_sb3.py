"""``proxrl classic`` against Stable-Baselines3 (and sb3-contrib's TRPO) on MuJoCo, side by side.

    nice -n 19 .venv/bin/python benchmarks/classic_vs_sb3.py \\
        --envs Hopper-v5 Walker2d-v5 HalfCheetah-v5 --seeds 1 2 3
    .venv/bin/python benchmarks/classic_vs_sb3.py --report     # the table from what finished
    .venv/bin/python benchmarks/classic_vs_sb3.py --report \\
        --plot benchmarks/results/classic_vs_sb3/curves.png         # and the learning curves

Needs the ``bench`` extra (``pip install stable-baselines3 sb3-contrib``; neither changes torch).

Every run is a fresh process on one torch thread (``OMP_NUM_THREADS=1``), one run at a time.
For each seed and environment the implementations run back to back (``--impls`` order for odd
seeds, reversed for even ones), so a pair meets similar machine load; the 1-minute load average
is sampled every 30 s beside each run. A finished run writes
``RESULTS_DIR/<env>_<impl>_s<seed>.json`` (returns, deterministic evaluation, steps/s, load,
the learning curve) and is skipped when the script runs again; an interrupted proxrl run resumes
from its checkpoint (``proxrl classic --resume``), an interrupted SB3 run starts again (SB3's
learning-rate schedule and rollout state do not survive a save/load exactly).

Hyperparameters: the PPO paper's MuJoCo defaults (proxrl's defaults for continuous actions, as
CleanRL ``ppo_continuous_action.py``): 1 env × 2048 steps, 10 epochs × minibatch 64, Adam 3e-4
(eps 1e-5) annealed linearly to 0, γ 0.99, λ 0.95, ε 0.2, ent 0, grad-norm 0.5, separate
64-64 tanh actor and critic with orthogonal init (√2 hidden, 0.01 policy head, 1 value head),
state-independent log-std initialised to 0, advantages whitened per minibatch, observations
normalised and rewards scaled by the discounted-return std (both clipped ±10, eps 1e-8),
time-limit truncations bootstrapped with γ·V(final obs), actions clipped to the bounds. SB3 is
given exactly these (``sb3_ppo_kwargs``), with three translations:

- SB3's value loss is ``MSE`` without proxrl's ``½``: ``vf_coef`` 0.25 in SB3 is proxrl's 0.5.
- SB3 calls the schedule after each rollout with ``1 − steps_done/total``, one iteration later
  than proxrl's ``1 − (iteration − 1)/iterations``: the schedule adds one batch back.
- PPO: neither side clips the value update (the paper's PPO, SB3's default and, since
  2026-12-02, proxrl's). ``--impls proxrl-ppo-vclip`` runs proxrl with CleanRL's value clipping
  (``½·max(unclipped, clipped)`` at ±0.2, OpenAI baselines ppo2), proxrl's default before:
  SB3's ``clip_range_vf`` is another form (the clipped term alone), so it has no peer.
- TRPO: proxrl clips its critic's update that way by default (``trpo_value_clip`` 0.2), which
  sb3-contrib does not; ``--impls proxrl-trpo-novclip`` runs proxrl without it.

Scores: the mean undiscounted return of the last 100 training episodes, and a deterministic
evaluation of the final policy (10 episodes, reset seeds 0..9, the Gaussian mean clipped to the
bounds, observations normalised with the frozen training statistics: ``proxrl classic-eval`` for
proxrl and the same loop here for SB3). Steps/s: environment steps over the training loop's wall
time (process start-up and the evaluation excluded on both sides).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
from paper_table import learning_curve  # its neighbour in benchmarks/

ROOT = Path(__file__).resolve().parents[1]
# proxrl's implementations are ``proxrl classic`` with these options; ``-vclip`` and
# ``-novclip`` are the ablations of the value clipping (see above) against each default.
PROXRL_OPTIONS = {
    "proxrl-ppo": ["--algo", "ppo"],
    "proxrl-trpo": ["--algo", "trpo"],
    "proxrl-ppo-vclip": ["--algo", "ppo", "--value-clip", "0.2"],
    "proxrl-trpo-novclip": ["--algo", "trpo", "--trpo-value-clip", "None"],
}
IMPLS = (
    "proxrl-ppo",
    "sb3-ppo",
    "proxrl-trpo",
    "sb3-trpo",
    "proxrl-ppo-vclip",
    "proxrl-trpo-novclip",
)
# The report's rows: a label, proxrl's implementation and the SB3 peer it is set beside.
REPORT_ROWS = (
    ("ppo", "proxrl-ppo", "sb3-ppo"),
    ("ppo, value clip 0.2", "proxrl-ppo-vclip", "sb3-ppo"),
    ("trpo", "proxrl-trpo", "sb3-trpo"),
    ("trpo, no value clip", "proxrl-trpo-novclip", "sb3-trpo"),
)
CLEANRL_V4 = {"Hopper-v5": (2383, 272), "Walker2d-v5": (2288, 572), "HalfCheetah-v5": (1443, 46)}
NUM_STEPS, LR, GAMMA = 2048, 3e-4, 0.99


# ------------------------------------------------------------------------------------------
# SB3 side (runs in a worker process)


def _lr_schedule(total_steps: int):  # noqa: ANN202 - SB3 pickles the callable with the model
    batch_share = NUM_STEPS / (total_steps // NUM_STEPS * NUM_STEPS)

    def schedule(progress_remaining: float) -> float:
        return LR * min(1.0, progress_remaining + batch_share)

    return schedule


def sb3_ppo_kwargs(total_steps: int) -> dict[str, Any]:
    """proxrl's MuJoCo PPO defaults in SB3's spelling (see the module docstring)."""
    import torch

    return dict(
        learning_rate=_lr_schedule(total_steps),
        n_steps=NUM_STEPS,
        batch_size=64,
        n_epochs=10,
        gamma=GAMMA,
        gae_lambda=0.95,
        clip_range=0.2,
        clip_range_vf=None,
        normalize_advantage=True,
        ent_coef=0.0,
        vf_coef=0.25,
        max_grad_norm=0.5,
        policy_kwargs=dict(
            net_arch=dict(pi=[64, 64], vf=[64, 64]),
            activation_fn=torch.nn.Tanh,
            ortho_init=True,
            log_std_init=0.0,
            share_features_extractor=False,
        ),
    )


def sb3_trpo_kwargs(total_steps: int) -> dict[str, Any]:
    """proxrl's TRPO defaults (δ 0.01, damping 0.1, 10 CG steps, 10 × 0.8 backtracking, the
    critic fitted by Adam 3e-4 annealed over 10 epochs × 64) in sb3-contrib's spelling. Left:
    sb3-contrib fits the critic without gradient clipping or value clipping."""
    ppo = sb3_ppo_kwargs(total_steps)
    return dict(
        learning_rate=ppo["learning_rate"],
        n_steps=NUM_STEPS,
        batch_size=64,
        gamma=GAMMA,
        gae_lambda=0.95,
        cg_max_steps=10,
        cg_damping=0.1,
        line_search_shrinking_factor=0.8,
        line_search_max_iter=10,
        n_critic_updates=10,
        normalize_advantage=True,
        target_kl=0.01,
        policy_kwargs=ppo["policy_kwargs"],
    )


def sb3_worker(
    impl: str, env_id: str, seed: int, total_steps: int, run_dir: Path, evaluate: bool = True
) -> None:
    """Train with SB3 / sb3-contrib, evaluate, write ``run_dir/summary.json`` and ``eval.json``
    and a ``metrics.jsonl`` that ``plot_curves.py`` reads."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    torch.set_num_threads(1)
    run_dir.mkdir(parents=True, exist_ok=True)
    venv = VecNormalize(
        DummyVecEnv([lambda: Monitor(gym.make(env_id))]),
        norm_obs=True,
        norm_reward=True,
        clip_obs=10.0,
        clip_reward=10.0,
        gamma=GAMMA,
        epsilon=1e-8,
    )
    if impl == "sb3-ppo":
        model = PPO("MlpPolicy", venv, seed=seed, device="cpu", **sb3_ppo_kwargs(total_steps))
    else:
        from sb3_contrib import TRPO

        model = TRPO("MlpPolicy", venv, seed=seed, device="cpu", **sb3_trpo_kwargs(total_steps))

    metrics = (run_dir / "metrics.jsonl").open("w")
    recent: deque[float] = deque(maxlen=100)

    class Recorder(BaseCallback):
        def _on_training_start(self) -> None:
            self.t0, self.ended = time.perf_counter(), []

        def _on_step(self) -> bool:
            self.ended += [i["episode"] for i in self.locals["infos"] if "episode" in i]
            return True

        def _on_rollout_end(self) -> None:
            row: dict[str, float] = {"global_step": self.num_timesteps}
            if self.ended:
                row["charts/episodic_return"] = float(np.mean([e["r"] for e in self.ended]))
                row["charts/episodic_length"] = float(np.mean([e["l"] for e in self.ended]))
                recent.extend(float(e["r"]) for e in self.ended)
            row["charts/SPS"] = self.num_timesteps / (time.perf_counter() - self.t0)
            metrics.write(json.dumps(row) + "\n")
            metrics.flush()
            self.ended = []

    start = time.perf_counter()
    model.learn(total_timesteps=total_steps // NUM_STEPS * NUM_STEPS, callback=Recorder())
    wall = time.perf_counter() - start
    metrics.close()
    model.save(run_dir / "model.zip")
    venv.save(str(run_dir / "vecnormalize.pkl"))
    summary = {
        "global_step": int(model.num_timesteps),
        "complete": True,
        "mean_return_last_100": float(np.mean(recent)),
        "std_return_last_100": float(np.std(recent)),
        "wall_time_s": wall,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    if not evaluate:
        return

    returns, lengths = [], []
    env = gym.make(env_id)
    for i in range(10):
        obs, _ = env.reset(seed=i)
        total, steps, done = 0.0, 0, False
        while not done:
            action, _ = model.predict(venv.normalize_obs(obs[None]), deterministic=True)
            action = np.clip(action[0], env.action_space.low, env.action_space.high)
            obs, reward, terminated, truncated, _ = env.step(action)
            total, steps, done = total + float(reward), steps + 1, terminated or truncated
        returns.append(total)
        lengths.append(steps)
    result = {
        "mean_return": float(np.mean(returns)),
        "std_return": float(np.std(returns)),
        "mean_length": float(np.mean(lengths)),
        "returns": returns,
    }
    (run_dir / "eval.json").write_text(json.dumps(result, indent=1))


# ------------------------------------------------------------------------------------------
# Driver


def _load_sampler(path: Path, stop: threading.Event) -> None:
    with path.open("a") as f:
        while not stop.is_set():
            f.write(json.dumps({"t": int(time.time()), "load1": os.getloadavg()[0]}) + "\n")
            f.flush()
            stop.wait(30)


def _load_path(run_dir: Path) -> Path:
    return run_dir.parent / f"{run_dir.name}.load.jsonl"  # beside: proxrl wants its dir clean


def _train(
    impl: str, env_id: str, seed: int, total_steps: int, run_dir: Path, evaluate: bool = True
) -> None:
    if impl.startswith("proxrl"):
        summary = run_dir / "summary.json"
        if summary.is_file() and json.loads(summary.read_text()).get("complete"):
            return
        cmd = [sys.executable, "-m", "proxrl", "classic", "--env", env_id, "--seed", str(seed)]
        cmd += ["--total-steps", str(total_steps), "--output-dir", str(run_dir), "--no-progress"]
        cmd += PROXRL_OPTIONS[impl]
        if (run_dir / "config.yaml").is_file():
            cmd.append("--resume")
    else:
        cmd = [sys.executable, __file__, "--worker", impl, "--envs", env_id]
        cmd += ["--seeds", str(seed), "--total-steps", str(total_steps), "--run-dir", str(run_dir)]
        cmd += [] if evaluate else ["--no-eval"]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    sampler = threading.Thread(target=_load_sampler, args=(_load_path(run_dir), stop))
    sampler.start()
    try:
        with (run_dir.parent / f"{run_dir.name}.log").open("a") as log:
            subprocess.run(cmd, check=True, env=env, stdout=log, stderr=subprocess.STDOUT)
    finally:
        stop.set()
        sampler.join()


def _proxrl_eval(run_dir: Path) -> dict[str, Any]:
    from proxrl.classic.evaluate import EvalConfig, evaluate

    return evaluate(EvalConfig(run_dir=str(run_dir), episodes=10, seed=0))


def _commit() -> str:
    """The proxrl commit that ran (a run's code can change between seeds of a long campaign)."""
    out = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip() or "unknown"


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "gymnasium", "mujoco", "stable-baselines3", "sb3-contrib"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out


def run_one(impl: str, env_id: str, seed: int, args: argparse.Namespace) -> Path:
    """Train (or resume) and evaluate one run; write and return its result JSON."""
    result_path = args.results_dir / f"{env_id}_{impl}_s{seed}.json"
    if result_path.is_file():
        return result_path
    run_dir = args.runs_dir / env_id / f"{impl}-s{seed}"
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"[{started}] {env_id} {impl} seed {seed} → {run_dir}", flush=True)
    _train(impl, env_id, seed, args.total_steps, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    evaluation = (
        _proxrl_eval(run_dir)
        if impl.startswith("proxrl")
        else json.loads((run_dir / "eval.json").read_text())
    )
    loads = [json.loads(x)["load1"] for x in _load_path(run_dir).read_text().splitlines()]
    result = {
        "env": env_id,
        "impl": impl,
        "seed": seed,
        "total_steps": args.total_steps,
        "global_step": summary["global_step"],
        "mean_return_last_100": summary["mean_return_last_100"],
        "std_return_last_100": summary["std_return_last_100"],
        "eval_mean_return": evaluation["mean_return"],
        "eval_std_return": evaluation["std_return"],
        "eval_mean_length": evaluation["mean_length"],
        "wall_time_s": summary["wall_time_s"],
        "sps": summary["global_step"] / summary["wall_time_s"],
        "load1_mean": float(np.mean(loads)),
        "load1_min": float(np.min(loads)),
        "load1_max": float(np.max(loads)),
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": _commit(),
        "versions": _versions(),
        "curve": learning_curve(run_dir),  # so that the plots outlive the run directories
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    result_path.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"  return {result['mean_return_last_100']:.0f}, eval {result['eval_mean_return']:.0f}, "
        f"{result['sps']:.0f} steps/s, load {result['load1_mean']:.1f} → {result_path}",
        flush=True,
    )
    return result_path


def speed(env_id: str, args: argparse.Namespace) -> Path:
    """Steps/s only: ``--speed`` pairs of short fresh runs (``--speed-steps`` each), A B, B A, …
    back to back, so both sides of a pair meet the same load; the ratio is per pair."""
    impls = [i for i in args.impls if i.endswith("-ppo")] or args.impls
    rows: list[dict[str, Any]] = []
    for pair in range(args.speed):
        for impl in impls if pair % 2 == 0 else impls[::-1]:
            run_dir = args.runs_dir / "speed" / env_id / f"{impl}-p{pair}"
            shutil.rmtree(run_dir, ignore_errors=True)
            _load_path(run_dir).unlink(missing_ok=True)
            _train(impl, env_id, 1, args.speed_steps, run_dir, evaluate=False)
            summary = json.loads((run_dir / "summary.json").read_text())
            loads = [json.loads(x)["load1"] for x in _load_path(run_dir).read_text().splitlines()]
            rows.append(
                {
                    "pair": pair,
                    "impl": impl,
                    "sps": summary["global_step"] / summary["wall_time_s"],
                    "load1_mean": float(np.mean(loads)),
                }
            )
            print(f"  {env_id} pair {pair} {impl}: {rows[-1]['sps']:.0f} steps/s", flush=True)
    ours, theirs = impls[0], impls[-1]
    ratios = [
        next(r["sps"] for r in rows if r["pair"] == p and r["impl"] == ours)
        / next(r["sps"] for r in rows if r["pair"] == p and r["impl"] == theirs)
        for p in range(args.speed)
    ]
    result = {
        "env": env_id,
        "steps_per_run": args.speed_steps // NUM_STEPS * NUM_STEPS,
        "ratio": f"{ours} / {theirs}",
        "ratios": ratios,
        "median_ratio": float(np.median(ratios)),
        "runs": rows,
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": _commit(),
        "versions": _versions(),
    }
    path = args.results_dir / "speed" / f"{env_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


def speed_report(results_dir: Path) -> str:
    lines = [
        "| env | steps per run | steps/s per pair (load) | ratio per pair | median ratio |",
        "|---|---|---|---|---|",
    ]
    for p in sorted((results_dir / "speed").glob("*.json")):
        r = json.loads(p.read_text())
        pairs = sorted({x["pair"] for x in r["runs"]})
        cells = [
            " / ".join(
                f"{x['sps']:.0f} ({x['load1_mean']:.1f})" for x in r["runs"] if x["pair"] == q
            )
            for q in pairs
        ]
        lines.append(
            f"| {r['env']} | {r['steps_per_run']} | {'; '.join(cells)} | "
            f"{', '.join(f'{x:.2f}' for x in r['ratios'])} | **{r['median_ratio']:.2f}** |"
        )
    return "\n".join(lines)


def _mean_std(xs: list[float]) -> str:
    if not xs:
        return "—"
    if len(xs) == 1:
        return f"{xs[0]:.0f} (n=1)"
    return f"{np.mean(xs):.0f} ± {np.std(xs):.0f} (n={len(xs)})"


def runs_table(results_dir: Path) -> str:
    """One row per finished run."""
    lines = [
        "| env | impl | seed | last-100 return (± std over the episodes) | deterministic eval "
        "(mean length) | steps/s | load 1-min mean (min–max) | wall | finished (UTC) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in sorted(results_dir.glob("*.json")):
        r = json.loads(p.read_text())
        lines.append(
            f"| {r['env']} | {r['impl']} | {r['seed']} | {r['mean_return_last_100']:.0f} ± "
            f"{r['std_return_last_100']:.0f} | {r['eval_mean_return']:.0f} ± "
            f"{r['eval_std_return']:.0f} ({r['eval_mean_length']:.0f}) | {r['sps']:.0f} | "
            f"{r['load1_mean']:.1f} ({r['load1_min']:.1f}–{r['load1_max']:.1f}) | "
            f"{r['wall_time_s'] / 60:.0f} min | {r['finished_utc'][11:16]} |"
        )
    return "\n".join(lines)


def report(results_dir: Path) -> str:
    """A markdown table of every finished run, per environment: proxrl beside its SB3 peer."""
    rows = [json.loads(p.read_text()) for p in sorted(results_dir.glob("*.json"))]
    by: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["env"], r["impl"]), {})[r["seed"]] = r
    lines = [
        "| env | algo | seeds | proxrl last-100 | SB3 last-100 | CleanRL v4 | proxrl eval | "
        "SB3 eval | steps/s proxrl / SB3 (load) per seed | steps/s ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    envs = sorted({r["env"] for r in rows}, key=lambda e: list(CLEANRL_V4).index(e))
    for env_id in envs:
        for label, ours_impl, theirs_impl in REPORT_ROWS:
            ours, theirs = by.get((env_id, ours_impl), {}), by.get((env_id, theirs_impl), {})
            # SB3 alone shows on its own algorithm's row, never on an ablation's.
            if not ours and (not theirs or label != theirs_impl.removeprefix("sb3-")):
                continue
            seeds = sorted(set(ours) | set(theirs))
            speed, ratios = [], []
            for s in seeds:
                a, b = ours.get(s), theirs.get(s)
                if a and b:
                    ratios.append(a["sps"] / b["sps"])
                    speed.append(
                        f"s{s}: {a['sps']:.0f} ({a['load1_mean']:.1f}) / "
                        f"{b['sps']:.0f} ({b['load1_mean']:.1f})"
                    )
            cleanrl = CLEANRL_V4.get(env_id) if label.startswith("ppo") else None
            lines.append(
                f"| {env_id} | {label} | {', '.join(map(str, seeds))} | "
                f"{_mean_std([r['mean_return_last_100'] for r in ours.values()])} | "
                f"{_mean_std([r['mean_return_last_100'] for r in theirs.values()])} | "
                f"{f'{cleanrl[0]} ± {cleanrl[1]}' if cleanrl else '—'} | "
                f"{_mean_std([r['eval_mean_return'] for r in ours.values()])} | "
                f"{_mean_std([r['eval_mean_return'] for r in theirs.values()])} | "
                f"{'; '.join(speed) or '—'} | "
                f"{', '.join(f'{x:.2f}' for x in ratios) or '—'} |"
            )
    return "\n".join(lines)


def plot(results_dir: Path, out: Path, smooth: int = 10) -> None:
    """One panel per environment: each implementation's learning curve, the mean over the seeds
    whose result holds a curve (on the 2048-step rollout grid, a ``smooth``-rollout moving
    mean), shaded between the lowest and highest seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(p.read_text()) for p in sorted(results_dir.glob("*.json"))]
    rows = [r for r in rows if r.get("curve")]
    envs = sorted({r["env"] for r in rows}, key=lambda e: list(CLEANRL_V4).index(e))
    fig, axes = plt.subplots(1, len(envs), figsize=(5 * len(envs), 3.8), squeeze=False)
    for ax, env_id in zip(axes[0], envs, strict=True):
        for impl in IMPLS:
            runs = [r for r in rows if (r["env"], r["impl"]) == (env_id, impl)]
            if not runs:
                continue
            curves = [np.array(r["curve"]) for r in runs]
            seeds = ", ".join(str(r["seed"]) for r in runs)
            grid = np.arange(NUM_STEPS, min(int(c[-1, 0]) for c in curves) + 1, NUM_STEPS)
            k = max(1, min(smooth, len(grid)))
            ys = np.stack(
                [
                    np.convolve(np.interp(grid, c[:, 0], c[:, 1]), np.ones(k) / k, mode="valid")
                    for c in curves
                ]
            )
            x = grid[k - 1 :]
            line = ax.plot(x, ys.mean(0), label=f"{impl} (seed {seeds})")[0]
            ax.fill_between(x, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.15, lw=0)
        ax.set_title(env_id)
        ax.set_xlabel("environment steps")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel(f"episodic return ({smooth}-rollout moving mean)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=["Hopper-v5", "Walker2d-v5", "HalfCheetah-v5"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=["proxrl-ppo", "sb3-ppo"])
    parser.add_argument("--total-steps", type=int, default=1_000_000)
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "classic_vs_sb3")
    parser.add_argument(
        "--results-dir", type=Path, default=ROOT / "benchmarks" / "results" / "classic_vs_sb3"
    )
    parser.add_argument("--report", action="store_true", help="only print the table")
    parser.add_argument("--plot", type=Path, help="also draw the learning curves into this PNG")
    parser.add_argument("--speed", type=int, default=0, help="only time this many pairs")
    parser.add_argument("--speed-steps", type=int, default=40_960, help="steps per timed run")
    parser.add_argument("--no-eval", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker", choices=["sb3-ppo", "sb3-trpo"], help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        sb3_worker(
            args.worker,
            args.envs[0],
            args.seeds[0],
            args.total_steps,
            args.run_dir,
            evaluate=not args.no_eval,
        )
        return 0
    missing = [
        m for m in ("stable_baselines3", "sb3_contrib") if importlib.util.find_spec(m) is None
    ]
    if missing and not args.report and any(i.startswith("sb3") for i in args.impls):
        print(f"classic_vs_sb3: {', '.join(missing)} not installed: pip install -e '.[bench]'")
        return 2
    if args.speed and not args.report:
        for env_id in args.envs:
            speed(env_id, args)
        print(speed_report(args.results_dir))
        return 0
    if not args.report:
        for seed in args.seeds:
            for env_id in args.envs:
                impls = args.impls if seed % 2 else args.impls[::-1]
                for impl in impls:
                    run_one(impl, env_id, seed, args)
    print(runs_table(args.results_dir) + "\n\n" + report(args.results_dir))
    if args.plot:
        plot(args.results_dir, args.plot)
    if (args.results_dir / "speed").is_dir():
        print("\n" + speed_report(args.results_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
