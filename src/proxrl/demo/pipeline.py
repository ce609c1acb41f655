"""``proxrl demo``: the whole RLHF pipeline on a tiny model built from scratch, on a CPU, with
nothing downloaded — and what PPO and its KL penalty do, measured against the truth.

Stages (each timed; ``summary.json`` records the wall time of each and the peak RSS):
1. ``data``: generate the synthetic task (``demo.task``): sloppy demonstrations, clean
   preference pairs, RL prompts and held-out evaluation prompts.
2. ``base_model``: train a byte-level BPE tokenizer and initialise a tiny Llama.
3. ``sft``: imitate the demonstrations (the policy learns the format and the annotator's errors).
4. ``reward_model``: Bradley–Terry on the preference pairs; accuracy on held-out pairs.
5. ``ppo``: PPO (critic initialised from the reward model) against the learned reward model,
   KL penalty ``kl_coef`` to the SFT policy.
6. ``ppo_no_kl``: the same PPO with ``kl_coef`` 0.
7. ``grpo``: GRPO with the exact (verifiable) reward instead of the reward model.
8. ``evaluate``: every policy on the held-out prompts: gold (exact accuracy), proxy (mean
   reward-model score) and KL to the SFT policy.
9. ``report``: plots and ``report.md`` (``proxrl report``).

During RL the other signal is logged at weight 0 (the gold reward in the PPO runs, the reward
model in GRPO), so every run's metrics hold gold and proxy side by side without changing what
it optimises.

What the defaults show (benchmarks/results/demo_robustness.md: seeds 1-5, torch's CPU kernels,
1 and 2 threads): the rejected answers of the preference pairs are digits of the list, so "a
bigger digit is better" already ranks every held-out pair correctly and the reward model learns
that shortcut (held-out accuracy 1.0). PPO with the KL penalty stays near the SFT policy's
support (digits of the list) and climbs from ~0.25 to ~0.75 gold; without it, PPO drifts to
what the shortcut scores highest — " 9" whatever the list, or a digit repeated with no end
(" 9 9 9 9", " 7 7 7 7"), as the seed's reward model has it — and the proxy rises above every
other policy's while gold falls far below PPO's. ppo_no_kl trains at its own, higher learning
rate: at PPO's, whether it reaches that optimum within the run or stalls on " 8" depended on
float round-off (the CPU's kernels, issue 51). ``kl_coef`` is in reward-model units: the trained
scores have a std of about 8, so β = 3 is about 0.4 in standardised units. ``--off-list-rejects
0.1`` (some rejected answers outside the list) teaches the reward model the rule instead, and
the gap closes.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import time
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, ClassVar

import torch

from proxrl.algos.offline import reward, sft
from proxrl.algos.online import grpo, ppo
from proxrl.algos.online.samplers import ENGINES, SamplerChoice
from proxrl.data.formats import load_prompt_examples
from proxrl.demo import task
from proxrl.demo.evaluate import PolicyScores, evaluate_policy
from proxrl.model_card import publish
from proxrl.models.causal_lm import load_causal_lm
from proxrl.models.scalar_head import load_score_model
from proxrl.models.tokenizer import load_tokenizer, tokenizer_difference
from proxrl.rollout.rewards import RewardModelReward
from proxrl.rollout.vllm_sampler import EngineCache
from proxrl.runtime.checkpoint import CheckpointManager
from proxrl.runtime.errors import ProxrlError, RunFinished
from proxrl.runtime.fields import FREE_ON_RESUME, SESSION_OPTION, Range, check_ranges
from proxrl.runtime.metrics import read_metrics
from proxrl.runtime.run import Run
from proxrl.runtime.seeding import seed_everything

log = logging.getLogger(__name__)

GOLD_FN = "proxrl.demo.task:gold"
POLICIES = ("sft", "ppo", "ppo_no_kl", "grpo")
MAX_POSITIONS = 64
"""The tiny Llama's context: a prompt is ~10 tokens, an answer a digit and its end (ppo's and
grpo's default max_new_tokens, 64, does not fit: the demo passes max_new_tokens 4)."""


@dataclass
class Config:
    """proxrl demo: SFT → reward model → PPO (with and without KL) and GRPO on a tiny model, on
    CPU."""

    saved_config_file: ClassVar[str] = "demo_config.yaml"  # what --resume starts from

    output_dir: Annotated[str, SESSION_OPTION] = "runs/demo"
    """Directory for the data, every stage's run, summary.json and report.md."""
    seed: Annotated[int, Range(ge=0, le=2**32 - 1)] = 1
    """Random seed of the data, the model's initialisation and every stage."""
    overwrite: Annotated[bool, SESSION_OPTION] = True
    """Replace a previous demo in output_dir (only a directory that holds a proxrl run is
    deleted)."""
    resume: Annotated[bool, SESSION_OPTION] = False
    """Continue an interrupted demo in output_dir, with the same options: finished stages are kept,
    a stopped RL stage resumes from its last checkpoint (Ctrl-C saves one, and one is kept every
    quarter of a run), and a stage with none starts over."""
    resume_with_changes: Annotated[bool, SESSION_OPTION] = False
    """With --resume: continue even though options differ from the demo's demo_config.yaml (without
    it such a resume is refused, naming the changed options); every stage then runs with the new
    ones."""
    sft_examples: Annotated[int, Range(ge=1)] = 2000
    """Demonstrations (prompt → the sloppy annotator's answer)."""
    demo_accuracy: Annotated[float, Range(gt=0, le=1)] = 0.3
    """Share of demonstrations that name the largest digit."""
    off_list_rejects: Annotated[float, Range(ge=0, le=1)] = 0.0
    """Share of rejected answers drawn from all ten digits rather than from the list."""
    preference_pairs: Annotated[int, Range(ge=1)] = 2000
    """Preference pairs for the reward model (chosen: the largest digit; rejected: another
    digit)."""
    preference_eval_pairs: Annotated[int, Range(ge=1)] = 400
    """Held-out preference pairs the reward model's accuracy is measured on."""
    rl_prompts: Annotated[int, Range(ge=1)] = 1000
    """Prompts the RL runs sample from."""
    eval_prompts: Annotated[int, Range(ge=1)] = 200
    """Held-out prompts every policy is evaluated on."""
    eval_samples: Annotated[int, Range(ge=1)] = 4
    """Responses sampled per held-out prompt."""
    hidden_size: Annotated[int, Range(ge=2)] = 64
    """Width of the tiny Llama (a multiple of 2 × num_heads)."""
    num_heads: Annotated[int, Range(ge=1)] = 4
    """Attention heads of the tiny Llama (sampler vllm on a CPU needs a head width its attention
    supports, 32, 64, 80, ...: 2 heads at hidden_size 64)."""
    num_layers: Annotated[int, Range(ge=1)] = 2
    """Transformer blocks of the tiny Llama."""
    sft_epochs: Annotated[int, Range(ge=1)] = 3
    """Passes over the demonstrations."""
    sft_learning_rate: Annotated[float, Range(gt=0)] = 3e-3
    """SFT peak learning rate."""
    rm_epochs: Annotated[int, Range(ge=1)] = 2
    """Passes over the preference pairs."""
    rm_learning_rate: Annotated[float, Range(gt=0)] = 2e-3
    """Reward-model peak learning rate."""
    batch_size: Annotated[int, Range(ge=1)] = 32
    """Examples per optimizer step in SFT and reward-model training."""
    rl_iterations: Annotated[int, Range(ge=1)] = 100
    """Iterations of each RL run."""
    rollout_batch_size: Annotated[int, Range(ge=1)] = 32
    """Prompts per RL iteration."""
    group_size: Annotated[int, Range(ge=1)] = 2
    """Responses per prompt in PPO (GRPO uses grpo_group_size)."""
    grpo_group_size: Annotated[int, Range(ge=2)] = 4
    """Responses per prompt in GRPO."""
    ppo_epochs: Annotated[int, Range(ge=1)] = 2
    """Passes over each rollout batch."""
    rl_learning_rate: Annotated[float, Range(gt=0)] = 5e-4
    """Policy learning rate of every RL run."""
    critic_learning_rate: Annotated[float, Range(gt=0)] = 1e-3
    """PPO critic learning rate."""
    kl_coef: Annotated[float, Range(ge=0)] = 3.0
    """KL coefficient β of the PPO run, in reward-model units (its scores have a std of ~8 here);
    ppo_no_kl uses 0."""
    no_kl_learning_rate: Annotated[float, Range(gt=0)] = 1.5e-3
    """Policy learning rate of ppo_no_kl: at rl_learning_rate it reaches the reward model's
    favourite (nines whatever the list) within 100 iterations on some CPUs and seeds and stalls
    on ' 8' or ' 7' on others, as float round-off decides (issue 51); 3x faster, it gets there on
    every one measured (benchmarks/demo_robustness.py)."""
    grpo_kl_coef: Annotated[float, Range(ge=0)] = 0.0
    """KL coefficient β of the GRPO run (in the loss, k3)."""
    max_new_tokens: Annotated[int, Range(ge=1)] = 4
    """Longest response in tokens (a correct one is 1 token + EOS)."""
    temperature: Annotated[float, Range(gt=0)] = 1.0
    """Sampling temperature of rollouts and evaluation."""
    sampler: SamplerChoice = "cached"
    """Sampler of the three RL runs' rollouts (as ppo's and grpo's sampler)."""
    vllm_gpu_memory_utilization: Annotated[float, Range(gt=0, le=1), FREE_ON_RESUME] = 0.05
    """With sampler vllm: the engine's share of GPU memory (on a CPU, of RAM for its KV cache);
    below ppo's 0.3 because the toy model needs megabytes, and 0.3 of RAM can exceed what a CPU
    machine's NUMA node has free."""
    threads: Annotated[int, Range(ge=0), FREE_ON_RESUME] = 1  # how fast, not what
    """torch CPU threads (0: torch's default; one is fastest for a model this small)."""
    progress: Annotated[bool, SESSION_OPTION] = True
    """Show progress bars."""

    @property
    def task_sizes(self) -> task.TaskSizes:
        """How many rows of each split the task generates, from these options."""
        return task.TaskSizes(
            sft=self.sft_examples,
            preference=self.preference_pairs,
            preference_eval=self.preference_eval_pairs,
            rl=self.rl_prompts,
            eval=self.eval_prompts,
            demo_accuracy=self.demo_accuracy,
            off_list_rejects=self.off_list_rejects,
        )

    def validate(self) -> None:
        check_ranges(self)
        if self.hidden_size % (2 * self.num_heads):
            raise ProxrlError(
                f"hidden_size: expected a multiple of {2 * self.num_heads} ({self.num_heads} "
                f"attention heads of an even width), got {self.hidden_size}"
            )
        if ENGINES.trait(self.sampler, "needs_vllm"):
            self.check_vllm()

    def check_vllm(self) -> None:
        """What the RL stages' engine would refuse, before any stage trains."""
        from proxrl.rollout.vllm_sampler import CPU_HEAD_DIMS, INSTALL, vllm_available

        if not vllm_available():
            raise ProxrlError(f"sampler: vllm needs the vllm package: {INSTALL}")
        head_dim = self.hidden_size // self.num_heads
        if not torch.cuda.is_available() and head_dim not in CPU_HEAD_DIMS:
            raise ProxrlError(
                f"sampler: vllm's CPU attention does not support head_dim {head_dim} "
                f"(hidden_size {self.hidden_size} / num_heads {self.num_heads}); it supports "
                f"{', '.join(map(str, CPU_HEAD_DIMS))}: pick num_heads to match "
                f"(--num-heads 2 at hidden_size 64) or sampler cached"
            )


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def process_age_s() -> float | None:
    """Seconds since this process started (Linux ``/proc``; None elsewhere)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time in ticks
    except (OSError, ValueError, IndexError):
        return None


class Stopwatch:
    """Wall time per stage, logged as each stage ends. ``startup`` is the time from the start of
    the process to the first stage (Python, torch and transformers imports) when ``/proc`` tells
    it; ``total`` includes it."""

    def __init__(self) -> None:
        self._started = time.perf_counter()
        age = process_age_s()
        self._startup = max(age, 0.0) if age is not None else None
        self.wall_s: dict[str, float] = (
            {} if self._startup is None else {"startup": round(self._startup, 2)}
        )

    @contextmanager
    def stage(self, name: str):  # type: ignore[no-untyped-def]
        log.info("[demo] %s ...", name)
        started = time.perf_counter()
        yield
        self.wall_s[name] = round(time.perf_counter() - started, 2)
        log.info(
            "[demo] %s done in %.1f s (peak RSS %.0f MB)", name, self.wall_s[name], peak_rss_mb()
        )

    def total(self) -> dict[str, float]:
        total = time.perf_counter() - self._started + (self._startup or 0.0)
        return {"total": round(total, 2), **self.wall_s}


# Written into a stage's run directory once its trainer has returned: ``--resume`` skips it.
STAGE_DONE = "demo_stage_done"
DEMO_CONFIG = Config.saved_config_file


def demo_run(cfg: Config) -> Run:
    """The demo's run context (``runtime.run``): its own config file, and
    ``overwrite`` (on by default) off when resuming. It owns the directory and the config; each
    stage is a run of its own."""
    return Run(
        cfg,
        config_file=DEMO_CONFIG,
        what="demo",
        overwrite=cfg.overwrite and not cfg.resume,
    )


def check_same_demo(cfg: Config, run: Run | None = None) -> None:
    """``--resume`` continues the demo in ``output_dir`` with the options it started with, unless
    ``--resume-with-changes`` (``runtime.resume``: one policy for every command)."""
    if not (Path(cfg.output_dir) / DEMO_CONFIG).is_file():
        raise ProxrlError(f"--resume: {cfg.output_dir} holds no demo to resume (no {DEMO_CONFIG})")
    (run or demo_run(cfg)).check_resume()
    if (Path(cfg.output_dir) / "summary.json").is_file() and not cfg.resume_with_changes:
        raise RunFinished(
            f"the demo in {cfg.output_dir} is already finished (its summary.json is written); "
            "nothing to do"
        )


class StageRunner:
    """Runs one trainer stage; with ``resume``, a stage that finished is skipped (its last
    metrics row returned), one with a checkpoint resumes from it and any other starts over."""

    def __init__(self, resume: bool, resume_with_changes: bool = False) -> None:
        self.resume = resume
        self.resume_with_changes = resume_with_changes

    def __call__(self, train_fn: Any, config: Any) -> dict[str, float]:
        stage_dir = Path(config.output_dir)
        if self.resume and (stage_dir / STAGE_DONE).exists():
            log.info("[demo] %s: finished before, kept", stage_dir.name)
            return last_metrics(stage_dir)
        has_checkpoint = self.resume and CheckpointManager(stage_dir).latest() is not None
        metrics: dict[str, float] = train_fn(
            replace(
                config,
                resume=has_checkpoint,
                overwrite=not has_checkpoint,
                resume_with_changes=self.resume_with_changes,
            )
        )
        publish(STAGE_COMMANDS[type(config)], config, metrics)  # the stage's model card
        (stage_dir / STAGE_DONE).write_text("", encoding="utf-8")
        return metrics


STAGE_COMMANDS: Mapping[type, str] = MappingProxyType(
    {
        sft.Config: "sft",
        reward.Config: "rm",
        ppo.Config: "ppo",
        grpo.Config: "grpo",
    }
)


def last_metrics(run_dir: Path) -> dict[str, float]:
    """Every key's last logged value in ``run_dir/metrics.jsonl`` (evaluation rows included)."""
    merged: dict[str, float] = {}
    for row in read_metrics(run_dir):
        merged.update(row)
    return merged


def offline_fields(cfg: Config, out: Path) -> dict[str, Any]:
    """What the SFT and reward-model stages share."""
    return dict(
        model=str(out / "base"),
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        progress=cfg.progress,
        lr_schedule="linear",
        warmup_steps=10,
        max_length=32,
    )


def sft_config(cfg: Config, out: Path, data: Path) -> sft.Config:
    """The SFT stage (configs/examples/sft.yaml repeats its settings; a test checks they agree)."""
    return sft.Config(
        **offline_fields(cfg, out),
        output_dir=str(out / "sft"),
        data=str(data),
        epochs=cfg.sft_epochs,
        learning_rate=cfg.sft_learning_rate,
    )


def online_fields(cfg: Config, out: Path, name: str) -> dict[str, Any]:
    """What the three RL runs share (the demo's engine knobs where its sampler reads them)."""
    engine = {knob: getattr(cfg, knob) for knob in ENGINES.knobs(cfg.sampler) if hasattr(cfg, knob)}
    return engine | dict(
        output_dir=str(out / name),
        prompts=str(out / "data" / "rl_prompts.jsonl"),
        model=str(out / "sft"),
        iterations=cfg.rl_iterations,
        rollout_batch_size=cfg.rollout_batch_size,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        learning_rate=cfg.rl_learning_rate,
        ppo_epochs=cfg.ppo_epochs,
        seed=cfg.seed,
        sampler=cfg.sampler,
        sample_every=max(1, cfg.rl_iterations // 4),
        progress=cfg.progress,
        save_every=max(1, cfg.rl_iterations // 4),  # a killed stage resumes from the last quarter
    )


def no_kl_fields(cfg: Config, out: Path) -> dict[str, Any]:
    """``online_fields`` of the ppo_no_kl run: its own learning rate."""
    return online_fields(cfg, out, "ppo_no_kl") | dict(learning_rate=cfg.no_kl_learning_rate)


def train(cfg: Config) -> dict[str, Any]:
    """Run every stage; write ``summary.json`` and ``report.md``; return the summary."""
    # 1. Checks, the output directory and its demo_config.yaml (kept as it was on a resume).
    cfg.validate()
    from transformers.utils import logging as hf_logging  # here: `--help` answers without it

    hf_logging.disable_progress_bar()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    run = demo_run(cfg)
    if cfg.resume:
        check_same_demo(cfg, run)
    out = run.prepare()
    if not cfg.resume or cfg.resume_with_changes:
        run.write_config()
    watch = Stopwatch()
    run_stage = StageRunner(resume=cfg.resume, resume_with_changes=cfg.resume_with_changes)
    seed_everything(cfg.seed)

    # 2. The task's data and the tiny base model.
    with watch.stage("data"):
        data = task.generate(out / "data", cfg.task_sizes, cfg.seed)
    with watch.stage("base_model"):
        build_base_model(cfg, out / "base")

    # 3. SFT and the reward model; PPO with and without KL, GRPO.
    rm_accuracy = offline_stages(cfg, out, data, watch, run_stage)
    rl_stages(cfg, out, watch, run_stage)

    # 4. Every policy on the held-out prompts; summary.json and report.md.
    with watch.stage("evaluate"):
        scores = evaluate_all(cfg, out)
    return write_summary(out, watch, rm_accuracy, scores)


def build_base_model(cfg: Config, path: Path) -> Path:
    """The demo's tokenizer and tiny Llama (random weights, ``MAX_POSITIONS`` positions) in
    ``path``; the README's examples run on it in their test (tests/test_docs_blocks.py)."""
    from proxrl.models.tiny import build_tiny_lm

    return build_tiny_lm(
        path,
        task.tokenizer_corpus(),
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        vocab_size=300,
        max_positions=MAX_POSITIONS,
        seed=cfg.seed,
    )


def offline_stages(
    cfg: Config, out: Path, data: dict[str, Path], watch: Stopwatch, run_stage: StageRunner
) -> float:
    """SFT, then the reward model; returns its held-out accuracy."""
    with watch.stage("sft"):
        run_stage(sft.train, sft_config(cfg, out, data["sft"]))
    with watch.stage("reward_model"):
        rm_metrics = run_stage(
            reward.train,
            reward.Config(
                **offline_fields(cfg, out),
                output_dir=str(out / "rm"),
                data=str(data["preferences"]),
                eval_data=str(data["preferences_eval"]),
                epochs=cfg.rm_epochs,
                learning_rate=cfg.rm_learning_rate,
            ),
        )
    rm_accuracy: float = rm_metrics["eval/accuracy"]
    log.info("[demo] reward model held-out accuracy %.3f", rm_accuracy)
    return rm_accuracy


def rl_stages(cfg: Config, out: Path, watch: Stopwatch, run_stage: StageRunner) -> None:
    """PPO against the reward model with KL ``kl_coef`` and with none; GRPO on the gold reward
    (the other signal logged at weight 0). With ``sampler: vllm`` the three stages share one
    engine (``engines``): its start-up is paid once."""
    rm_dir = str(out / "rm")
    engines = EngineCache()
    ppo_fields = dict(
        reward_model=rm_dir,
        reward_fn=(GOLD_FN,),
        reward_weights=(1.0, 0.0),
        group_size=cfg.group_size,
        mini_batch_size=cfg.rollout_batch_size * cfg.group_size,
        critic_learning_rate=cfg.critic_learning_rate,
    )
    with watch.stage("ppo"):
        run_stage(
            partial(ppo.train, engines=engines),
            ppo.Config(**online_fields(cfg, out, "ppo"), **ppo_fields, kl_coef=cfg.kl_coef),
        )
    with watch.stage("ppo_no_kl"):
        run_stage(
            partial(ppo.train, engines=engines),
            ppo.Config(**no_kl_fields(cfg, out), **ppo_fields, kl_coef=0.0),
        )
    with watch.stage("grpo"):
        run_stage(
            partial(grpo.train, engines=engines),
            grpo.Config(
                **online_fields(cfg, out, "grpo"),
                reward_model=rm_dir,
                reward_fn=(GOLD_FN,),
                reward_weights=(0.0, 1.0),
                estimator="grpo",
                group_size=cfg.grpo_group_size,
                kl_coef=cfg.grpo_kl_coef,
                mini_batch_size=cfg.rollout_batch_size * cfg.grpo_group_size,
            ),
        )


def write_summary(
    out: Path, watch: Stopwatch, rm_accuracy: float, scores: dict[str, PolicyScores]
) -> dict[str, Any]:
    """The table, eval_samples.jsonl, report.md and summary.json; returns the summary."""
    from proxrl.report import write_report

    summary: dict[str, Any] = {
        "reward_model": {"heldout_accuracy": round(rm_accuracy, 4)},
        "policies": {
            name: {"gold": round(s.gold, 4), "proxy": round(s.proxy, 4), "kl": round(s.kl, 4)}
            for name, s in scores.items()
        },
    }
    with watch.stage("report"):
        write_eval_samples(out, scores)
        print_table(summary)
        # report.md shows the wall times up to here; summary.json (below) includes this stage
        write_report(
            out, summary=summary | {"wall_s": watch.total(), "peak_rss_mb": round(peak_rss_mb(), 1)}
        )
    summary["wall_s"] = watch.total()
    summary["peak_rss_mb"] = round(peak_rss_mb(), 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    log.info(
        "[demo] total %.1f s, peak RSS %.0f MB; wrote %s and %s",
        summary["wall_s"]["total"],
        summary["peak_rss_mb"],
        out / "summary.json",
        out / "report.md",
    )
    return summary


def evaluate_all(cfg: Config, out: Path) -> dict[str, PolicyScores]:
    tokenizer = load_tokenizer(str(out / "sft"))
    sft_model = load_causal_lm(str(out / "sft")).eval()
    rm_model = load_score_model(str(out / "rm")).eval()
    rm_tokenizer = load_tokenizer(str(out / "rm"))
    # (as the RL stages score: the sampled ids where the reward model has the policy's tokenizer)
    reads_ids = tokenizer_difference(tokenizer, rm_tokenizer) is None
    reward_source = RewardModelReward(rm_model, rm_tokenizer, reads_ids=reads_ids)
    prompts = load_prompt_examples(str(out / "data" / "eval_prompts.jsonl"))
    scores = {}
    for name in POLICIES:
        policy = sft_model if name == "sft" else load_causal_lm(str(out / name)).eval()
        scores[name] = evaluate_policy(
            policy,
            sft_model,
            reward_source,
            tokenizer,
            prompts,
            cfg.eval_samples,
            cfg.max_new_tokens,
            cfg.temperature,
            seed=cfg.seed,
        )
    return scores


def write_eval_samples(out: Path, scores: dict[str, PolicyScores]) -> None:
    """``eval_samples.jsonl``: one row per held-out response of every policy."""
    with open(out / "eval_samples.jsonl", "w", encoding="utf-8") as f:
        for name, s in scores.items():
            for row in s.samples:
                f.write(json.dumps({"policy": name, **row}) + "\n")


def print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"held-out prompts (reward model held-out accuracy "
        f"{summary['reward_model']['heldout_accuracy']:.3f})"
    )
    for column in ("policy", "gold (exact accuracy)", "proxy (reward model)", "KL to SFT"):
        table.add_column(column, justify="right" if column != "policy" else "left")
    for name, s in summary["policies"].items():
        table.add_row(name, f"{s['gold']:.3f}", f"{s['proxy']:+.3f}", f"{s['kl']:.3f}")
    Console().print(table)
