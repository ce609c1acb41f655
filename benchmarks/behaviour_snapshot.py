"""Behaviour snapshots: prove that a refactor changes nothing a user sees (issue 34).

Runs a fixed list of short, seeded training runs through the ``proxrl`` command line (each a
subprocess ``python -m proxrl``, ``OMP_NUM_THREADS=1``, a fresh output directory, tiny models
and data built locally) and records, per run, every row of ``metrics.jsonl`` (wall-clock keys
dropped, see ``DROPPED_*``), the run's ``summary.json`` if it writes one (wall-clock fields
dropped, its own path replaced by ``<out>``), the sha256 of every ``*.safetensors`` file under
its output directory (final weights and checkpoints) and of every ``samples.jsonl`` (the sampled
completions). Two snapshots, before and after a change, on the same machine, must be identical.

    # the baseline: the pre-refactor sources first on the path (checked: see proxrl_file)
    git worktree add ../baseline 8c7e3d4
    PYTHONPATH=../baseline/src .venv/bin/python benchmarks/behaviour_snapshot.py \\
        record --out /tmp/snapshots/baseline.json
    # the working tree
    PYTHONPATH=src .venv/bin/python benchmarks/behaviour_snapshot.py record --out after.json
    .venv/bin/python benchmarks/behaviour_snapshot.py compare baseline.json after.json
    # `make demo` alone (also the last run of record): compared when --against is given
    PYTHONPATH=src .venv/bin/python benchmarks/behaviour_snapshot.py demo --out demo.json \\
        --against /tmp/snapshots/baseline_demo.json

``record --only NAME ...`` records some runs (and the runs they start from; ``compare --common``
then compares only the runs both snapshots hold); ``--list`` names them. ``--src DIR`` puts DIR
first on the subprocesses' PYTHONPATH (the same as setting PYTHONPATH), ``--python`` picks the
interpreter, ``--vllm-python`` the one of the vLLM run (default .venv-vllm/bin/python beside
this script's repository; the run is skipped, with a note, where it does not exist). A run that
fails or passes its timeout is recorded with an error string; the others go on.

Inputs (the tiny base models and data) are built by the sources under test
(``proxrl.models.tiny``, ``proxrl.demo.task``, ``proxrl.demo.calculator``) and their hashes are
recorded as the run ``inputs``: a difference there explains every run's difference.

The reward functions and the multi-turn environment the runs name
(``behaviour_snapshot:digit_share`` ...) are defined in this module: the subprocesses find it
on PYTHONPATH. Nothing at its top level imports proxrl or torch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MODULE = Path(__file__).stem
FORMAT = 1

# Wall-clock metrics, never the same twice: every key under time/ (time/iteration_s,
# time/rollout_s, time/score_s, time/forward_s, time/update_s, time/weight_sync_s and, with
# placement ray, time/generate_start, time/generate_end, time/update_start, time/update_end),
# the online loop's throughput perf/tokens_per_s and classic's steps per second charts/SPS.
# perf/old_logprobs_pass and perf/nonpad_share are counts, not timings: kept.
DROPPED_METRIC_PREFIXES = ("time/",)
DROPPED_METRIC_KEYS = frozenset({"perf/tokens_per_s", "charts/SPS"})
# summary.json: the demo's wall_s (per stage) and peak_rss_mb, classic's wall_time_s and
# sps_this_session.
DROPPED_SUMMARY_KEYS = frozenset({"wall_s", "peak_rss_mb", "wall_time_s", "sps_this_session"})

DIGITS = set("0123456789")


# --- what the runs' subprocesses import from this module ---------------------------------


def digit_share(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    """Reward: the share of a completion's characters that are digits (0 for no text)."""
    return [sum(ch in DIGITS for ch in c) / max(len(c), 1) for c in completions]


def has_digit(prompts: list[str], completions: list[str], **columns: list) -> list[float]:
    """Reward: 1 when a completion holds a digit, else 0 (some groups all equal: dynamic
    sampling has groups to drop)."""
    return [float(any(ch in DIGITS for ch in c)) for c in completions]


class TwoTurns:
    """A multi-turn environment: answers the first model turn with a user message and ends
    after the second, rewarded by the share of digits in the second turn."""

    tools: list[Any] = []

    def reset(self, row: Mapping[str, Any]) -> None:
        self.turns = 0

    def step(self, completion: str) -> Any:
        from proxrl.rollout.environment import Turn

        self.turns += 1
        if self.turns == 1:
            return Turn([{"role": "user", "content": "again:"}])
        return Turn([], reward=digit_share([""], [completion])[0], done=True)


def two_turns() -> TwoTurns:
    return TwoTurns()


# --- the runs ------------------------------------------------------------------------------

INPUTS = "{inputs}"


@dataclass(frozen=True)
class Run:
    """One short run: ``proxrl <command> --config FILE`` with ``options`` in that file.

    String options may name ``{inputs}`` (the built inputs) or ``{run:NAME}`` (the output
    directory of run NAME, which then runs first)."""

    name: str
    command: str
    options: Mapping[str, Any]
    timeout_s: int = 240
    vllm: bool = False
    default: bool = True

    @property
    def needs(self) -> list[str]:
        text = json.dumps(self.options)
        return sorted(set(re.findall(r"\{run:([a-z0-9_]+)\}", text)))


COMMON = {"seed": 3, "progress": False, "report_to": ["none"]}
OFFLINE = COMMON | {
    "model": f"{INPUTS}/base",
    "epochs": 2,
    "batch_size": 16,
    "max_length": 32,
    "learning_rate": 1.0e-3,
}
PREFERENCES = {
    "data": f"{INPUTS}/data/preferences.jsonl",
    "eval_data": f"{INPUTS}/data/preferences_eval.jsonl",
}
ONLINE = COMMON | {
    "model": f"{INPUTS}/base",
    "prompts": f"{INPUTS}/data/rl_prompts.jsonl",
    "reward_fn": [f"{MODULE}:digit_share"],
    "iterations": 3,
    "rollout_batch_size": 8,
    "group_size": 4,
    "max_new_tokens": 6,
    "temperature": 1.0,
    "mini_batch_size": 16,
    "learning_rate": 3.0e-3,
    "sample_every": 1,
}
PPO = ONLINE | {"group_size": 2, "ppo_epochs": 2, "kl_coef": 0.05, "critic_learning_rate": 1.0e-3}
GRPO = ONLINE | {"kl_coef": 0.02}
CALCULATOR = {
    "model": f"{INPUTS}/calc_base",
    "prompts": f"{INPUTS}/calc_data/rl_prompts.jsonl",
    "max_new_tokens": 12,
    "max_turns": 3,
    "max_episode_tokens": 48,
}
CLASSIC = COMMON | {"env": "CartPole-v1", "total_steps": 4096}
ESTIMATORS = ("grpo", "rloo", "remax", "reinforce_pp", "reinforce_pp_baseline", "reinforce")
POLICY_LOSSES = ("gspo", "gspo_token", "cispo")  # ppo: the grpo_grpo run

RUNS: tuple[Run, ...] = (
    Run("sft", "sft", OFFLINE | {"data": f"{INPUTS}/data/sft.jsonl", "eval_fraction": 0.25}),
    Run("rm", "rm", OFFLINE | PREFERENCES),
    Run("dpo", "dpo", OFFLINE | PREFERENCES | {"beta": 0.1}),
    Run(
        "ppo_critic_separate",
        "ppo",
        PPO
        | {
            "critic": "separate",
            "reward_model": ["{run:rm}"],
            "reward_fn": [f"{MODULE}:digit_share"],
            "reward_weights": [0.5, 1.0],
        },
    ),
    Run("ppo_critic_head", "ppo", PPO | {"critic": "head"}),
    *(Run(f"grpo_{e}", "grpo", GRPO | {"estimator": e}) for e in ESTIMATORS),
    *(Run(f"grpo_loss_{p}", "grpo", GRPO | {"policy_loss": p}) for p in POLICY_LOSSES),
    Run(
        "grpo_dynamic_sampling",
        "grpo",
        GRPO
        | {
            "reward_fn": [f"{MODULE}:has_digit"],
            "dynamic_sampling": True,
            "max_sampling_rounds": 3,
            "clip_high": 0.28,
            "overlong_buffer": 2,
        },
    ),
    Run("grpo_mask_truncated", "grpo", GRPO | {"mask_truncated": True}),
    Run(
        "grpo_rollout_correction",
        "grpo",
        GRPO | {"sampler_logprobs": True, "rollout_correction": "tis", "ppo_epochs": 2},
    ),
    Run(
        "grpo_multiturn",
        "grpo",
        GRPO | CALCULATOR | {"environment": f"{MODULE}:two_turns", "reward_fn": []},
    ),
    Run(
        "ppo_calculator_tool",
        "ppo",
        PPO
        | CALCULATOR
        | {
            "environment": "proxrl.demo.calculator:environment",
            "reward_fn": [],
            "entropy_coef": 0.01,  # the exact reward is 0 for an untrained model: a gradient
        },
    ),
    Run("ppo_ray", "ppo", PPO | {"placement": "ray"}, timeout_s=300),
    Run("classic_ppo", "classic", CLASSIC | {"algo": "ppo"}),
    Run("classic_trpo", "classic", CLASSIC | {"algo": "trpo"}),
    Run(
        "grpo_vllm",
        "grpo",
        GRPO | {"sampler": "vllm", "model": f"{INPUTS}/base_vllm"},
        timeout_s=300,
        vllm=True,
    ),
    Run("demo", "demo", {"progress": False}, timeout_s=600),  # make demo: about a minute
)
RUNS_BY_NAME = {run.name: run for run in RUNS}


# --- recording -----------------------------------------------------------------------------


@dataclass
class Target:
    """The interpreters and sources the runs use."""

    python: str
    vllm_python: str | None
    src: str | None
    workspace: Path
    env: dict[str, str] = field(default_factory=dict)


def subprocess_env(src: str | None) -> dict[str, str]:
    """One thread, a fixed hash seed, ``src`` (if given) then this module's folder first on
    PYTHONPATH."""
    env = dict(os.environ)
    paths = [p for p in (src, str(HERE), env.get("PYTHONPATH")) if p]
    env.update(
        PYTHONPATH=os.pathsep.join(paths),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONHASHSEED="0",
        RAY_DEDUP_LOGS="0",
    )
    return env


def run_process(argv: Sequence[str], env: Mapping[str, str], log: Path, timeout_s: int) -> str:
    """Run ``argv`` in a session of its own, output to ``log``; '' on success, else an error
    string. Past ``timeout_s`` the whole process group is killed."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, env=dict(env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return f"timed out after {timeout_s} s"
    if code == 0:
        return ""
    tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-6:]
    return f"exit {code}: " + " | ".join(line.strip() for line in tail)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_hashes(root: Path, pattern: str) -> dict[str, str]:
    """sha256 of every file matching ``pattern`` under ``root``, by path relative to it."""
    return {str(p.relative_to(root)): sha256(p) for p in sorted(root.rglob(pattern))}


def kept_metric(key: str) -> bool:
    return not key.startswith(DROPPED_METRIC_PREFIXES) and key not in DROPPED_METRIC_KEYS


def metric_rows(path: Path) -> list[dict[str, Any]]:
    """Each metrics.jsonl row without its wall-clock keys."""
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if kept_metric(k)} for row in rows]


def normalised_summary(path: Path, out: Path) -> dict[str, Any] | None:
    """summary.json without wall-clock fields, the run's own directory written ``<out>``."""
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    kept = {k: v for k, v in summary.items() if k not in DROPPED_SUMMARY_KEYS}
    return json.loads(json.dumps(kept).replace(str(out), "<out>"))


def collect(out: Path) -> dict[str, Any]:
    """Metrics (of the run, or of each stage's sub-directory), summary and weight hashes."""
    metrics = {
        str(p.parent.relative_to(out)): metric_rows(p) for p in sorted(out.rglob("metrics.jsonl"))
    }
    return {
        "metrics": metrics,
        "summary": normalised_summary(out / "summary.json", out),
        "weights": file_hashes(out, "*.safetensors"),
        "samples": file_hashes(out, "samples.jsonl"),
    }


def substitute(value: Any, names: Mapping[str, str]) -> Any:
    """``{inputs}`` and ``{run:NAME}`` in every string of ``value`` replaced from ``names``."""
    if isinstance(value, str):
        for key, path in names.items():
            value = value.replace("{" + key + "}", path)
        return value
    if isinstance(value, list):
        return [substitute(v, names) for v in value]
    return value


def record_run(run: Run, target: Target, names: dict[str, str]) -> dict[str, Any]:
    """Run ``run`` in a fresh directory under the workspace; its record (or error)."""
    python = target.vllm_python if run.vllm else target.python
    if python is None:
        return {"skipped": "no .venv-vllm (make setup-vllm): the vLLM run is skipped"}
    missing = [n for n in run.needs if f"run:{n}" not in names]
    if missing:
        return {"error": f"needs {', '.join(missing)}, which failed"}
    out = target.workspace / "runs" / run.name
    options = {k: substitute(v, names) for k, v in run.options.items()}
    options["output_dir"] = str(out)
    config = target.workspace / "configs" / f"{run.name}.yaml"
    config.write_text(json.dumps(options, indent=1))  # JSON is YAML
    argv = [python, "-m", "proxrl", run.command, "--config", str(config)]
    started = time.perf_counter()
    error = run_process(
        argv, target.env, target.workspace / "logs" / f"{run.name}.log", run.timeout_s
    )
    record: dict[str, Any] = {"seconds": round(time.perf_counter() - started, 1)}
    record["options"] = dict(run.options)
    if error:
        record["error"] = error
        return record
    names[f"run:{run.name}"] = str(out)
    return record | collect(out)


def prepare_inputs(target: Target) -> dict[str, Any]:
    """Build the tiny models and data with the sources under test (``_prepare``); their hashes
    and where proxrl was imported from."""
    inputs = target.workspace / "inputs"
    log = target.workspace / "logs" / "inputs.log"
    argv = [target.python, str(Path(__file__).resolve()), "_prepare", str(inputs)]
    started = time.perf_counter()
    error = run_process(argv, target.env, log, 300)
    record: dict[str, Any] = {"seconds": round(time.perf_counter() - started, 1)}
    if error:
        return record | {"error": error}
    found = re.search(r"^proxrl_file (.+)$", log.read_text(), re.MULTILINE)
    files = sorted(p for p in inputs.rglob("*") if p.is_file())
    record["proxrl_file"] = found.group(1) if found else None
    record["files"] = {str(p.relative_to(inputs)): sha256(p) for p in files}
    return record


def build_inputs(root: Path) -> None:
    """``_prepare ROOT``: the demo task's data and tiny Llama, the calculator task's data and
    its tiny Llama (run in the interpreter under test)."""
    import proxrl
    from proxrl.demo import calculator, task
    from proxrl.models.tiny import build_tiny_lm

    print(f"proxrl_file {proxrl.__file__}", flush=True)
    sizes = task.TaskSizes(sft=64, preference=64, preference_eval=32, rl=64, eval=16)
    task.generate(root / "data", sizes, 1)
    build_tiny_lm(
        root / "base",
        task.tokenizer_corpus(),
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        vocab_size=300,
        max_positions=64,
        seed=1,
    )
    build_tiny_lm(  # vLLM's CPU attention needs a head_dim of 32 or more
        root / "base_vllm",
        task.tokenizer_corpus(),
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        vocab_size=300,
        max_positions=64,
        seed=1,
    )
    calculator.generate(root / "calc_data", calculator.TaskSizes(sft=16, rl=32, eval=8), 1)
    calculator.build_base(root / "calc_base", seed=1, hidden_size=32)


def selected_runs(only: Sequence[str] | None) -> list[Run]:
    """The runs named (with the runs they start from), in the list's order; by default every
    run but those marked ``default=False``."""
    if not only:
        return [r for r in RUNS if r.default]
    unknown = [n for n in only if n not in RUNS_BY_NAME]
    if unknown:
        raise SystemExit(f"unknown run(s) {unknown}; --list names them")
    wanted: set[str] = set()
    pending = list(only)
    while pending:
        name = pending.pop()
        if name not in wanted:
            wanted.add(name)
            pending.extend(RUNS_BY_NAME[name].needs)
    return [r for r in RUNS if r.name in wanted]


def git_head(file: str) -> str | None:
    """The commit (with ``+dirty``) of the git tree ``file`` (proxrl's) lives in, if any."""
    if not Path(file).is_file():
        return None
    where = str(Path(file).parent)
    try:
        head = subprocess.run(
            ["git", "-C", where, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", where, "status", "--porcelain", "--untracked-files=no", "."],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if status else "")


def proxrl_file(python: str, env: Mapping[str, str]) -> str:
    """Where ``python`` imports proxrl from, with the runs' environment."""
    argv = [python, "-c", "import proxrl; print(proxrl.__file__)"]
    done = subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=120)
    return done.stdout.strip() or f"import failed: {done.stderr.strip()[-300:]}"


def interpreters(runs: Sequence[Run], target: Target) -> list[str]:
    """The interpreters ``runs`` use."""
    vllm = [target.vllm_python] if target.vllm_python and any(r.vllm for r in runs) else []
    return [target.python, *vllm]


def record(runs: Sequence[Run], target: Target) -> dict[str, Any]:
    """Prepare the inputs, then every run in order; the snapshot."""
    for folder in ("inputs", "runs", "configs", "logs"):
        (target.workspace / folder).mkdir(parents=True, exist_ok=True)
    snapshot: dict[str, Any] = {
        "format": FORMAT,
        "python": target.python,
        "src": target.src,
        "proxrl_files": {p: proxrl_file(p, target.env) for p in interpreters(runs, target)},
        "dropped_metric_prefixes": list(DROPPED_METRIC_PREFIXES),
        "dropped_metric_keys": sorted(DROPPED_METRIC_KEYS),
        "dropped_summary_keys": sorted(DROPPED_SUMMARY_KEYS),
        "runs": {},
    }
    snapshot["git_head"] = git_head(snapshot["proxrl_files"][target.python])
    for python, file in snapshot["proxrl_files"].items():
        print(f"{python} imports proxrl from {file}", flush=True)
    inputs = prepare_inputs(target)
    print(f"inputs: {inputs['seconds']} s, proxrl from {inputs.get('proxrl_file')}", flush=True)
    snapshot["runs"]["inputs"] = inputs
    if "error" in inputs:
        print(f"  ERROR {inputs['error']}", flush=True)
        return snapshot
    names = {"inputs": str(target.workspace / "inputs")}
    for run in runs:
        result = record_run(run, target, names)
        snapshot["runs"][run.name] = result
        status = result.get("error") or result.get("skipped") or "ok"
        print(f"{run.name}: {result.get('seconds', 0)} s, {status}", flush=True)
    return snapshot


def default_vllm_python() -> str | None:
    path = REPO / ".venv-vllm" / "bin" / "python"
    return str(path) if path.exists() else None


def make_target(args: argparse.Namespace, workspace: Path) -> Target:
    vllm = args.vllm_python or default_vllm_python()
    if vllm is None:
        print("note: no .venv-vllm (make setup-vllm); the vLLM run is skipped", flush=True)
    return Target(
        python=args.python,
        vllm_python=vllm,
        src=args.src,
        workspace=workspace,
        env=subprocess_env(args.src),
    )


def record_to_file(args: argparse.Namespace, runs: Sequence[Run]) -> dict[str, Any]:
    """Record ``runs`` in a temporary workspace (kept with --keep) and write ``args.out``."""
    workspace = Path(args.keep or tempfile.mkdtemp(prefix="behaviour_snapshot_"))
    if args.keep and workspace.exists():
        shutil.rmtree(workspace)
    started = time.perf_counter()
    try:
        snapshot = record(runs, make_target(args, workspace))
    finally:
        if not args.keep:
            shutil.rmtree(workspace, ignore_errors=True)
    snapshot["seconds"] = round(time.perf_counter() - started, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(snapshot, indent=1) + "\n")
    print(f"wrote {args.out} in {snapshot['seconds']} s", flush=True)
    return snapshot


# --- comparing -----------------------------------------------------------------------------


def same_value(a: Any, b: Any) -> bool:
    """Exact equality; NaN equals NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def first_metric_difference(a: Mapping[str, list], b: Mapping[str, list]) -> str | None:
    """Where two runs' metrics first differ: sub-run, row (step), key, both values."""
    for sub in sorted(set(a) | set(b)):
        if sub not in a or sub not in b:
            return f"metrics of '{sub}' only in {'A' if sub in a else 'B'}"
        rows_a, rows_b = a[sub], b[sub]
        where = f"metrics '{sub}'" if sub != "." else "metrics"
        for i, (ra, rb) in enumerate(zip(rows_a, rows_b, strict=False)):
            step = ra.get("step", i + 1)
            for key in sorted(set(ra) | set(rb)):
                if key not in ra or key not in rb:
                    side = "A" if key in ra else "B"
                    return f"{where} step {step}: key {key} only in {side}"
                if not same_value(ra[key], rb[key]):
                    return f"{where} step {step}: {key} A={ra[key]!r} B={rb[key]!r}"
        if len(rows_a) != len(rows_b):
            return f"{where}: {len(rows_a)} rows in A, {len(rows_b)} in B"
    return None


def first_mapping_difference(a: Mapping[str, Any], b: Mapping[str, Any], what: str) -> str | None:
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            return f"{what} {key} only in {'A' if key in a else 'B'}"
        if not same_value(a[key], b[key]):
            return f"{what} {key}: A={a[key]!r} B={b[key]!r}"
    return None


def run_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """None when two records of a run agree, else what differs first."""
    for state in ("skipped", "error"):
        if (state in a) != (state in b) or a.get(state) != b.get(state):
            return f"{state}: A={a.get(state)!r} B={b.get(state)!r}"
    if "files" in a or "files" in b:  # the inputs
        return first_mapping_difference(a.get("files", {}), b.get("files", {}), "input file")
    return (
        first_metric_difference(a.get("metrics", {}), b.get("metrics", {}))
        or first_mapping_difference(
            flatten(a.get("summary") or {}), flatten(b.get("summary") or {}), "summary.json"
        )
        or first_mapping_difference(a.get("samples", {}), b.get("samples", {}), "samples file")
        or first_mapping_difference(a.get("weights", {}), b.get("weights", {}), "weight file")
    )


def flatten(value: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as ``a.b.c`` keys."""
    flat: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, Mapping):
            flat |= flatten(item, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = item
    return flat


def compare(a: Mapping[str, Any], b: Mapping[str, Any], common: bool = False) -> int:
    """Print identical / differs per run; 1 if any run differs (or is in one snapshot only,
    unless ``common``: then only the runs in both count)."""
    runs_a, runs_b = a["runs"], b["runs"]
    failed = False
    for name in ordered_names(runs_a, runs_b):
        if name not in runs_a or name not in runs_b:
            print(f"{name}: only in {'A' if name in runs_a else 'B'}")
            failed = failed or not common
            continue
        ra, rb = runs_a[name], runs_b[name]
        difference = run_difference(ra, rb)
        if difference is not None:
            print(f"{name}: DIFFERS: {difference}")
            failed = True
        elif "skipped" in ra:
            print(f"{name}: skipped in both ({ra['skipped']})")
        elif "error" in ra:
            print(f"{name}: identical, but FAILED in both: {ra['error']}")
        else:
            print(f"{name}: identical")
    print("DIFFERENT" if failed else "IDENTICAL")
    return 1 if failed else 0


def ordered_names(a: Iterable[str], b: Iterable[str]) -> list[str]:
    names = list(a)
    return names + [n for n in b if n not in names]


# --- command line --------------------------------------------------------------------------


def add_target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="snapshot JSON to write")
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter of the runs (default: this one)"
    )
    parser.add_argument(
        "--vllm-python",
        default=None,
        help="interpreter of the vLLM run (default: .venv-vllm/bin/python if it exists)",
    )
    parser.add_argument(
        "--src", default=None, help="sources put first on the runs' PYTHONPATH (e.g. ../x/src)"
    )
    parser.add_argument("--keep", default=None, help="keep the runs' files in this directory")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="record the runs' metrics and weight hashes")
    add_target_options(rec)
    rec.add_argument("--only", nargs="+", default=None, help="these runs (and what they need)")
    rec.add_argument("--list", action="store_true", help="name the runs and exit")
    cmp_ = commands.add_parser("compare", help="compare two snapshots; exit 1 if any differs")
    cmp_.add_argument("a")
    cmp_.add_argument("b")
    cmp_.add_argument(
        "--common", action="store_true", help="only the runs in both count (after --only)"
    )
    demo = commands.add_parser("demo", help="record `proxrl demo` (make demo) alone")
    add_target_options(demo)
    demo.add_argument("--against", default=None, help="a snapshot with a demo run to compare to")
    prep = commands.add_parser("_prepare", help=argparse.SUPPRESS)
    prep.add_argument("root")
    if argv is None:
        argv = sys.argv[1:]
    if "record" in argv and "--list" in argv:
        for run in RUNS:
            note = "" if run.default else "  (only when named)"
            print(f"{run.name}: proxrl {run.command}{note}")
        raise SystemExit(0)
    return parser.parse_args(argv)


def print_demo_summary(snapshot: Mapping[str, Any]) -> None:
    summary = snapshot["runs"]["demo"].get("summary") or {}
    for name, scores in summary.get("policies", {}).items():
        print(f"  {name}: gold {scores['gold']} proxy {scores['proxy']} kl {scores['kl']}")
    if "reward_model" in summary:
        print(f"  reward model held-out accuracy {summary['reward_model']['heldout_accuracy']}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "_prepare":
        build_inputs(Path(args.root))
        return 0
    if args.command == "compare":
        a, b = (json.loads(Path(p).read_text()) for p in (args.a, args.b))
        return compare(a, b, common=args.common)
    if args.command == "record":
        snapshot = record_to_file(args, selected_runs(args.only))
        return 1 if any("error" in r for r in snapshot["runs"].values()) else 0
    snapshot = record_to_file(args, [RUNS_BY_NAME["demo"]])
    print_demo_summary(snapshot)
    if args.against is None:
        return 1 if "error" in snapshot["runs"]["demo"] else 0
    baseline = json.loads(Path(args.against).read_text())
    mine = {"runs": {k: snapshot["runs"][k] for k in ("demo",)}}
    theirs = {"runs": {k: v for k, v in baseline["runs"].items() if k == "demo"}}
    return compare(theirs, mine)


if __name__ == "__main__":
    sys.exit(main())
