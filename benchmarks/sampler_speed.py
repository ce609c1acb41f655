"""Sampling speed of proxrl's samplers on the same model and prompts, side by side in one run.

    .venv/bin/python benchmarks/sampler_speed.py                  # 128x2 and 256x4, 3 rounds
    .venv/bin/python benchmarks/sampler_speed.py --sizes 256x4 --rounds 5

For each size: a Qwen2-style model built locally (as in ``vs_trl.py``), 32 left-padded prompts,
32 new tokens at temperature 1 with log-probs (what the online loop asks for). Samplers run in
rounds, one call each per round in turn (``generate``, the lean loop, the compiled loop), so
machine noise hits all alike; printed: the median milliseconds per call and each one's speed
relative to the lean loop. The compiled loop's compile time (its first call) is printed apart.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_trl import build_models  # noqa: E402

from proxrl.models.causal_lm import load_causal_lm  # noqa: E402
from proxrl.models.tokenizer import load_tokenizer  # noqa: E402
from proxrl.rollout.generation import CachedSampler, HFSampler, SamplingSettings  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["128x2", "256x4"], help="hidden x layers")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=5, help="calls per sampler per round")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="sampler_speed_"))
    settings = SamplingSettings(max_new_tokens=32, temperature=1.0)
    print(f"{'size':<7} {'sampler':<9} {'ms/call':>8} {'vs lean':>8}")
    for size in args.sizes:
        hidden, layers = (int(x) for x in size.split("x"))
        path = build_models(root / size, hidden, layers)["model"]
        model, tokenizer = load_causal_lm(path), load_tokenizer(path)
        generator = torch.Generator().manual_seed(0)
        lengths = torch.randint(4, 12, (32,), generator=generator)
        ids = torch.full((32, 12), tokenizer.pad_token_id)
        mask = torch.zeros_like(ids)
        for row, n in enumerate(lengths.tolist()):  # left padding, as the online loop builds it
            ids[row, 12 - n :] = torch.randint(5, len(tokenizer), (n,), generator=generator)
            mask[row, 12 - n :] = 1
        samplers = {
            "generate": HFSampler(model, tokenizer),
            "lean": CachedSampler(model, tokenizer),
            "compiled": CachedSampler(model, tokenizer, compile_step=True),
        }
        started = time.perf_counter()
        samplers["compiled"].sample(ids, mask, settings, with_logprobs=True)
        compile_s = time.perf_counter() - started
        for sampler in samplers.values():  # warm-up
            sampler.sample(ids, mask, settings, with_logprobs=True)
        times: dict[str, list[float]] = {name: [] for name in samplers}
        for _ in range(args.rounds):
            for name, sampler in samplers.items():
                started = time.perf_counter()
                for _ in range(args.calls):
                    sampler.sample(ids, mask, settings, with_logprobs=True)
                times[name].append((time.perf_counter() - started) / args.calls)
        lean = statistics.median(times["lean"])
        for name, values in times.items():
            median = statistics.median(values)
            print(f"{size:<7} {name:<9} {median * 1000:>8.1f} {lean / median:>7.2f}x")
        print(f"{size:<7} compiled loop's first call (compiling): {compile_s:.1f} s")


if __name__ == "__main__":
    main()
