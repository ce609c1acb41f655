"""Rollout speed of ``sampler: vllm`` against the built-in samplers, side by side in one run.

    make setup-vllm
    .venv-vllm/bin/python benchmarks/vllm_rollout.py                    # tiny and 42M
    .venv-vllm/bin/python benchmarks/vllm_rollout.py --shapes 0.5b      # Qwen2.5-0.5B's shape

Per shape (random weights, built locally; fp32; log-probs on, as the online loop asks):
rollout tokens/s of the bare engine (``LLM.generate``), proxrl's ``VLLMSampler`` over the same
engine, the built-in cached loop and transformers' ``generate``, on the same prompts; then one
whole GRPO iteration per sampler (the third of a 3-iteration run) split into sampling, scoring,
forward passes, update and weight sync. The engine's start-up is printed once per shape, apart
from every figure after it. EOS is an id the random model almost never draws, so every response
runs to the token limit; tokens/s counts the tokens actually returned.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

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


def rollout_speeds(shape: Shape, path: str, threads: int, rounds: int) -> None:
    import torch
    from vllm import SamplingParams

    from proxrl.models.causal_lm import load_causal_lm
    from proxrl.models.tokenizer import load_tokenizer
    from proxrl.rollout.generation import CachedSampler, HFSampler, SamplingSettings
    from proxrl.rollout.vllm_sampler import EngineOptions, VLLMSampler, start_engine

    torch.set_num_threads(threads)
    tokenizer = load_tokenizer(path)
    model = load_causal_lm(path).eval()
    ids_of = Ids(tokenizer.pad_token_id, model.config.vocab_size - 1)
    generator = torch.Generator().manual_seed(0)
    width = 16
    prompt_ids = torch.full((shape.prompts, width), tokenizer.pad_token_id)
    mask = torch.zeros_like(prompt_ids)
    for row in range(shape.prompts):
        n = int(torch.randint(8, width + 1, (1,), generator=generator))
        prompt_ids[row, width - n :] = torch.randint(
            5, min(len(tokenizer), model.config.vocab_size), (n,), generator=generator
        )
        mask[row, width - n :] = 1
    settings = SamplingSettings(max_new_tokens=shape.new_tokens, temperature=1.0)

    started = time.perf_counter()
    engine = start_engine(EngineOptions(path, gpu_memory_utilization=0.05))
    print(f"[{shape.name}] vLLM engine start-up: {time.perf_counter() - started:.1f} s (once)")
    rows = [r[m.bool()].tolist() for r, m in zip(prompt_ids, mask, strict=True)]

    def bare() -> int:
        params = [
            SamplingParams(
                max_tokens=shape.new_tokens,
                temperature=1.0,
                logprobs=0,
                seed=i,
                stop_token_ids=[ids_of.eos_token_id],
            )
            for i in range(len(rows))
        ]
        outputs = engine.generate([{"prompt_token_ids": r} for r in rows], params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outputs)

    def through(sampler: object) -> int:
        samples = sampler.sample(prompt_ids, mask, settings, with_logprobs=True)  # type: ignore[attr-defined]
        return int(samples.response_mask.sum())

    runs = {
        "vllm (bare LLM.generate)": bare,
        "vllm (proxrl VLLMSampler)": lambda: through(VLLMSampler(engine, ids_of)),
        "cached (built-in loop)": lambda: through(CachedSampler(model, ids_of)),
        "hf (generate)": lambda: through(HFSampler(model, ids_of)),
    }
    started = time.perf_counter()
    bare()  # vLLM's first generate warms up
    print(f"[{shape.name}] vLLM first generate (warm-up): {time.perf_counter() - started:.1f} s")
    best: dict[str, float] = {}
    for _ in range(rounds):  # rounds, each sampler once per round: noise hits all alike
        for name, run in runs.items():
            started = time.perf_counter()
            tokens = run()
            rate = tokens / (time.perf_counter() - started)
            best[name] = max(best.get(name, 0.0), rate)
    cached = best["cached (built-in loop)"]
    print(
        f"[{shape.name}] {shape.prompts} prompts x {shape.new_tokens} new tokens, "
        f"best of {rounds} rounds:"
    )
    print(f"  {'sampler':<28} {'tokens/s':>9} {'vs cached':>10}")
    for name, rate in best.items():
        print(f"  {name:<28} {rate:9.0f} {rate / cached:9.2f}x")
    ratio = best["vllm (proxrl VLLMSampler)"] / best["vllm (bare LLM.generate)"]
    print(f"  proxrl's vLLM path / bare engine: {ratio:.2f}")


def iteration_split(shape: Shape, path: str, root: Path) -> None:
    from proxrl.algos.online import grpo
    from proxrl.runtime.metrics import read_metrics

    prompts = root / "prompts.jsonl"
    words = ["abc", "def", "ghi", "jkl", "mno", "pqr", "stu", "vwx"]
    prompts.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in words))
    keys = ["rollout", "score", "forward", "update", "weight_sync"]
    print(f"[{shape.name}] one GRPO iteration (3rd of 3; 8 prompts x 8 samples, 64 new tokens):")
    print(
        f"  {'sampler':<8} {'length':>7} {'total s':>8} "
        + " ".join(f"{k + ' s':>13}" for k in keys)
    )
    for sampler in ("vllm", "cached", "hf"):
        out = root / f"run-{shape.name}-{sampler}"
        cfg = grpo.Config(
            model=path,
            prompts=str(prompts),
            reward_fn=("rewards:target_fraction",),
            output_dir=str(out),
            iterations=3,
            rollout_batch_size=8,
            group_size=8,
            max_new_tokens=64,
            mini_batch_size=64,
            grad_accum=4,
            temperature=1.0,
            learning_rate=1e-5,
            progress=False,
            sampler=sampler,
            vllm_gpu_memory_utilization=0.05,
            save_every=0,
        )
        grpo.train(cfg)
        row = read_metrics(out)[-1]
        parts = " ".join(f"{row.get(f'time/{k}_s', 0.0):13.2f}" for k in keys)
        length = row["response/length_mean"]
        print(f"  {sampler:<8} {length:7.1f} {row['time/iteration_s']:8.2f} {parts}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["tiny", "42m"], choices=list(SHAPES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-iteration", action="store_true", help="rollout speeds only")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="vllm_rollout_"))
    for name in args.shapes:
        shape = SHAPES[name]
        path, params = build(shape, root)
        print(
            f"[{name}] {params / 1e6:.1f}M parameters, hidden {shape.hidden}, {shape.layers} layers"
        )
        rollout_speeds(shape, path, args.threads, args.rounds)
        if shape.vocab is None and not args.no_iteration:
            iteration_split(shape, path, root)


if __name__ == "__main__":
    main()
