"""Rollout speed and whole iterations of ``sampler: vllm`` against the built-in samplers, side by
side in one run.

    make setup-vllm
    .venv-vllm/bin/python benchmarks/vllm_rollout.py                    # tiny and 42M
    .venv-vllm/bin/python benchmarks/vllm_rollout.py --shapes 0.5b      # Qwen2.5-0.5B's shape

Per shape (random weights, built locally; fp32; log-probs on, as the online loop asks):
rollout tokens/s of the bare engine (``LLM.generate``), proxrl's ``VLLMSampler`` over the same
engine, the built-in cached loop and transformers' ``generate``, on the same prompts, in rounds
whose order alternates (ABC…, …CBA) so that a change in the machine's load hits every side; the
ratio of proxrl's path to the bare engine is taken within each round (adjacent runs). Then whole
GRPO and PPO iterations per sampler, again alternating, each split into sampling, scoring,
forward passes, update, weight sync and the rest (advantages, metrics). The engine is started
and warmed up once per shape, before every figure, and its start-up printed on its own line.
The load average is printed beside every row: the machine may be shared. EOS is an id the
random model almost never draws, so every response runs to the token limit; tokens/s counts
the tokens actually returned.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "vllm"))  # rewards.py, the iteration's reward


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int | None  # None: the tiny tokenizer's own (whole iterations need to decode)
    prompts: int
    new_tokens: int
    tied: bool = False


SHAPES = {
    # the demo's model (hidden 64, 2 layers) with 2 heads: vLLM's CPU attention needs head_dim 32+
    "tiny": Shape("tiny", 64, 2, 2, 2, 128, None, 64, 128),  # build_tiny_lm: a Llama
    "42m": Shape("42m", 512, 8, 8, 8, 1536, 16000, 64, 128),
    # Qwen2.5-0.5B's configuration (config.json on the hub), random weights
    "0.5b": Shape("0.5b", 896, 24, 14, 2, 4864, 151936, 32, 64, tied=True),
}


def build(shape: Shape, root: Path) -> tuple[str, int]:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from proxrl.models.tiny import build_tiny_lm, build_tiny_tokenizer

    sys.path.insert(0, str(ROOT / "tests" / "algos"))
    from lm_tasks import CORPUS

    path = root / shape.name
    if shape.vocab is None:  # the demo's builder (a Llama), with 2 heads
        built = build_tiny_lm(
            path, CORPUS, hidden_size=shape.hidden, num_heads=shape.heads, vocab_size=300
        )
        model = AutoModelForCausalLM.from_pretrained(built)
        return str(built), sum(p.numel() for p in model.parameters())
    tokenizer = build_tiny_tokenizer(CORPUS)
    config = Qwen2Config(
        vocab_size=shape.vocab or len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=shape.tied,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    tokenizer.save_pretrained(path)
    model.save_pretrained(path)
    params = sum(p.numel() for p in model.parameters())
    return str(path), params


class Ids:
    """The two ids the samplers read from a tokenizer; EOS one the random model rarely draws."""

    def __init__(self, pad: int, eos: int) -> None:
        self.pad_token_id, self.eos_token_id = pad, eos


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.1f}/{five:.1f}/{fifteen:.1f}"


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def iteration_config(shape: Shape, path: str, root: Path, algo: str, sampler: str) -> Any:
    """The run one iteration is measured on: 32 responses of 64 new tokens (8 prompts × 4 for
    GRPO, 32 prompts for PPO); full fine-tuning below 0.5B, LoRA r=16 at the 0.5B shape (full
    AdamW there would hold ~8 GB of weights, gradients and moments on a 24 GB machine shared
    with others; the sync then sends merged weights, as ``sampler: vllm`` does under LoRA)."""
    from proxrl.algos.online import grpo, ppo

    prompts = root / "prompts.jsonl"
    words = ["abc", "def", "ghi", "jkl", "mno", "pqr", "stu", "vwx"] * 4
    prompts.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in words))
    decodes = shape.vocab is None  # the tiny tokenizer's vocabulary: completions are text
    common: dict[str, Any] = dict(
        model=path,
        prompts=str(prompts),
        reward_fn=("rewards:target_fraction" if decodes else "rewards:noise",),
        output_dir=str(root / f"run-{shape.name}-{algo}-{sampler}-{time.monotonic_ns()}"),
        iterations=1,
        max_new_tokens=64,
        mini_batch_size=32,
        grad_accum=4,
        temperature=1.0,
        learning_rate=1e-5,
        progress=False,
        sampler=sampler,
        vllm_gpu_memory_utilization=ENGINE_SHARE,
        save_every=0,
        sample_every=0,
        lora_r=16 if shape.name == "0.5b" else 0,
    )
    if algo == "grpo":
        return grpo.Config(rollout_batch_size=8, group_size=4, **common)
    # a value head on the policy: a separate critic would double the trained memory
    return ppo.Config(rollout_batch_size=32, critic="head", ppo_epochs=1, **common)


ENGINE_SHARE = 0.05  # on a CPU: of the RAM, for the KV cache (1.2 GB of 24 GB)


def start(shape: Shape, path: str, root: Path) -> Any:
    """The engine every figure of ``shape`` shares (the options the iterations' configs ask
    for), started and warmed up here, both printed apart from every figure."""
    from vllm import SamplingParams

    from proxrl.algos.online.roles import role_settings
    from proxrl.algos.online.samplers import engine_options
    from proxrl.rollout.vllm_sampler import start_engine

    cfg = iteration_config(shape, path, root, "grpo", "vllm")
    options = engine_options(role_settings(cfg).engine)
    started = time.perf_counter()
    engine = start_engine(options)
    print(f"[{shape.name}] vLLM engine start-up: {time.perf_counter() - started:.1f} s (once)")
    started = time.perf_counter()
    params = SamplingParams(max_tokens=shape.new_tokens, temperature=1.0, logprobs=0, seed=0)
    engine.generate([{"prompt_token_ids": [5, 6, 7, 8]}] * 8, params, use_tqdm=False)
    print(f"[{shape.name}] vLLM first generate (warm-up): {time.perf_counter() - started:.1f} s")
    return engine


def rollout_prompts(shape: Shape, tokenizer: Any, vocab_size: int) -> tuple[Ids, Any, Any]:
    """The ids the samplers read (EOS the last id, which a random model almost never draws) and
    ``shape.prompts`` left-padded prompts of 8–16 random tokens, the same on every call."""
    import torch

    ids_of = Ids(tokenizer.pad_token_id, vocab_size - 1)
    generator = torch.Generator().manual_seed(0)
    width = 16
    prompt_ids = torch.full((shape.prompts, width), tokenizer.pad_token_id)
    mask = torch.zeros_like(prompt_ids)
    for row in range(shape.prompts):
        n = int(torch.randint(8, width + 1, (1,), generator=generator))
        prompt_ids[row, width - n :] = torch.randint(
            5, min(len(tokenizer), vocab_size), (n,), generator=generator
        )
        mask[row, width - n :] = 1
    return ids_of, prompt_ids, mask


def rollout_speeds(shape: Shape, path: str, engine: Any, rounds: int, samplers: list[str]) -> None:
    from vllm import SamplingParams

    from proxrl.models.causal_lm import load_causal_lm
    from proxrl.models.tokenizer import load_tokenizer
    from proxrl.rollout.generation import CachedSampler, HFSampler, SamplingSettings
    from proxrl.rollout.vllm_sampler import VLLMSampler

    tokenizer = load_tokenizer(path)
    model = load_causal_lm(path).eval()
    ids_of, prompt_ids, mask = rollout_prompts(shape, tokenizer, model.config.vocab_size)
    settings = SamplingSettings(max_new_tokens=shape.new_tokens, temperature=1.0)
    rows = [r[m.bool()].tolist() for r, m in zip(prompt_ids, mask, strict=True)]

    calls = itertools.count()

    def bare() -> int:
        # new seeds every call, as proxrl's sampler draws them: a bare side repeating the same
        # seeds resamples the same responses every round, not the work an RL rollout does
        first = next(calls) * len(rows)
        params = [
            SamplingParams(
                max_tokens=shape.new_tokens,
                temperature=1.0,
                logprobs=0,
                seed=first + i,
                stop_token_ids=[ids_of.eos_token_id],
            )
            for i in range(len(rows))
        ]
        outputs = engine.generate([{"prompt_token_ids": r} for r in rows], params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outputs)

    def through(sampler: object) -> int:
        samples = sampler.sample(prompt_ids, mask, settings, with_logprobs=True)  # type: ignore[attr-defined]
        return int(samples.response_mask.sum())

    every = {
        "bare": ("vllm (bare LLM.generate)", bare),
        "vllm": ("vllm (proxrl VLLMSampler)", lambda: through(VLLMSampler(engine, ids_of))),
        "cached": ("cached (built-in loop)", lambda: through(CachedSampler(model, ids_of))),
        "hf": ("hf (generate)", lambda: through(HFSampler(model, ids_of))),
    }
    runs = {every[key][0]: every[key][1] for key in samplers}
    rates: dict[str, list[float]] = {name: [] for name in runs}
    print(f"[{shape.name}] {shape.prompts} prompts x {shape.new_tokens} new tokens, tokens/s:")
    # The engine's warm-up request is small; its first call at this batch's shape is slower
    # (0.5B: 45 tokens/s against 91 a round later), which would land on whichever side runs
    # first. One untimed call of every side at the measured shape takes it out of the figures.
    for run in runs.values():
        run()
    print("  round  " + " ".join(f"{name:>26}" for name in runs) + "  load")
    for round_ in range(rounds):  # the order alternates: a drift in load hits every side
        names = list(runs) if round_ % 2 == 0 else list(reversed(runs))
        for name in names:
            started = time.perf_counter()
            tokens = runs[name]()
            rates[name].append(tokens / (time.perf_counter() - started))
        print(f"  {round_ + 1:5d}  " + " ".join(f"{rates[n][-1]:26.0f}" for n in runs), load())
    print("  median " + " ".join(f"{median(rates[n]):26.0f}" for n in runs))
    bare_name, path_name = every["bare"][0], every["vllm"][0]
    if bare_name in rates and path_name in rates:
        ratios = [p / b for p, b in zip(rates[path_name], rates[bare_name], strict=True)]
        print(
            "  proxrl's vLLM path / bare engine, per round: "
            + ", ".join(f"{r:.2f}" for r in ratios)
            + f" (median {median(ratios):.2f}; target >= 0.90)"
        )
    if "cached (built-in loop)" in rates:
        base = median(rates["cached (built-in loop)"])
        print(
            "  median vs cached: " + ", ".join(f"{n} {median(rates[n]) / base:.2f}x" for n in runs)
        )


KEYS = ["rollout", "score", "forward", "update", "weight_sync"]


def iteration_split(
    shape: Shape, path: str, root: Path, algo: str, samplers: list[str], rounds: int
) -> None:
    from proxrl.algos.online import grpo, ppo
    from proxrl.runtime.metrics import read_metrics

    train = {"grpo": grpo.train, "ppo": ppo.train}[algo]
    label = ["sampling", "scoring", "forward", "update", "sync", "rest"]
    print(f"[{shape.name}] one {algo.upper()} iteration (32 responses x 64 new tokens), seconds:")
    print(
        f"  {'sampler':<8} {'length':>6} {'total':>7} "
        + " ".join(f"{k:>8}" for k in label)
        + "  sync share  load"
    )
    totals: dict[str, list[dict[str, float]]] = {s: [] for s in samplers}
    for round_ in range(rounds):
        for sampler in samplers if round_ % 2 == 0 else list(reversed(samplers)):
            cfg = iteration_config(shape, path, root, algo, sampler)
            train(cfg)
            row = read_metrics(Path(cfg.output_dir))[-1]
            parts = {k: row.get(f"time/{k}_s", 0.0) for k in KEYS}
            parts["rest"] = row["time/iteration_s"] - sum(parts.values())
            parts["total"] = row["time/iteration_s"]
            totals[sampler].append(parts)
            print(
                f"  {sampler:<8} {row['response/length_mean']:6.1f} {parts['total']:7.2f} "
                + " ".join(f"{parts[k]:8.2f}" for k in [*KEYS, "rest"])
                + f"  {parts['weight_sync'] / parts['total']:10.1%}  {load()}"
            )
    if "vllm" in totals and "cached" in totals:
        pick = {s: {k: median([t[k] for t in totals[s]]) for k in totals[s][0]} for s in totals}
        saved_sampling = pick["cached"]["rollout"] - pick["vllm"]["rollout"]
        saved_total = pick["cached"]["total"] - pick["vllm"]["total"]
        print(
            f"  medians: vllm {pick['vllm']['total']:.2f} s vs cached {pick['cached']['total']:.2f}"
            f" s ({pick['cached']['total'] / pick['vllm']['total']:.2f}x); the engine saves "
            f"{saved_sampling:.2f} s of sampling, the iteration {saved_total:.2f} s; weight sync "
            f"{pick['vllm']['weight_sync'] / pick['vllm']['total']:.1%} of vllm's iteration"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["tiny", "42m"], choices=list(SHAPES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="rollout rounds (alternating)")
    parser.add_argument(
        "--samplers", nargs="+", default=["bare", "vllm", "cached", "hf"], help="rollout sides"
    )
    parser.add_argument("--algos", nargs="*", default=["grpo", "ppo"], help="whole iterations")
    parser.add_argument(
        "--iteration-samplers", nargs="+", default=["vllm", "cached"], help="iteration sides"
    )
    parser.add_argument("--iteration-rounds", type=int, default=2, help="alternating rounds")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="vllm_rollout_"))
    print(f"threads {args.threads}; {load()} at the start; {os.cpu_count()} CPUs")
    for name in args.shapes:
        shape = SHAPES[name]
        path, params = build(shape, root)
        print(
            f"[{name}] {params / 1e6:.1f}M parameters, hidden {shape.hidden}, {shape.layers} layers"
        )
        engine = start(shape, path, root)
        if args.rounds:
            rollout_speeds(shape, path, engine, args.rounds, args.samplers)
        for algo in args.algos:
            iteration_split(shape, path, root, algo, args.iteration_samplers, args.iteration_rounds)


if __name__ == "__main__":
    main()
