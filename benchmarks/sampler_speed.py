"""Sampling speed of proxrl's samplers on the same model and prompts, side by side in one run.

    .venv/bin/python benchmarks/sampler_speed.py                  # 128x2 and 256x4, 3 rounds
    .venv/bin/python benchmarks/sampler_speed.py --sizes 256x4 --rounds 5
    .venv/bin/python benchmarks/sampler_speed.py --workload spread --sizes 128x2 --threads 1

For each size: a Qwen2-style model built locally (as in ``vs_trl.py``), 32 left-padded prompts,
32 new tokens at temperature 1 with log-probs (what the online loop asks for). Samplers run in
rounds, one call each per round in turn (``generate``, the lean loop, the compiled loop), so
machine noise hits all alike; printed: the median milliseconds per call and each one's speed
relative to the lean loop, by wall clock and by the process's CPU time. The compiled loop's
compile time (its first call) is printed first, apart.

``--workload spread``: up to 256 new tokens, response j stopping after ``vs_trl.SPREAD_LENGTHS[j]``
(8 to 256 tokens, EOS forced there and impossible before, as in ``vs_trl.py``), and one more
side, the lean loop decoding every row to the longest (``drop_stopped=False``): what dropping
the stopped rows from the batch saves on a batch whose responses differ in length. (No compiled
loop there: the forced-stop hook's step counter makes it recompile every step.)
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
from vs_trl import SPREAD_LENGTHS, Workload, build_models  # noqa: E402

from proxrl.models.causal_lm import load_causal_lm  # noqa: E402
from proxrl.models.tokenizer import load_tokenizer  # noqa: E402
from proxrl.rollout.generation import CachedSampler, HFSampler, SamplingSettings  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["128x2", "256x4"], help="hidden x layers")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=5, help="calls per sampler per round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workload", choices=["fixed", "spread"], default="fixed")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="sampler_speed_"))
    spread = args.workload == "spread"
    settings = SamplingSettings(max_new_tokens=max(SPREAD_LENGTHS) if spread else 32)
    columns = ("ms/call", "vs lean", "CPU ms/call", "vs lean")
    print(f"{'size':<7} {'sampler':<15} " + " ".join(f"{c:>8}" for c in columns))
    for size in args.sizes:
        hidden, layers = (int(x) for x in size.split("x"))
        paths = build_models(root / size, hidden, layers)
        model, tokenizer = load_causal_lm(paths["model"]), load_tokenizer(paths["model"])
        workload = Workload(spread, int(paths["eos"]), int(paths["vocab"])) if spread else None
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
        }
        if spread:  # (the forced-stop hook's counters recompile a compiled step every step)
            samplers["lean, every row"] = CachedSampler(model, tokenizer, drop_stopped=False)
        else:
            samplers["compiled"] = CachedSampler(model, tokenizer, compile_step=True)
            started = time.perf_counter()
            samplers["compiled"].sample(ids, mask, settings, with_logprobs=True)
            compile_s = time.perf_counter() - started
            print(f"{size:<7} compiled loop's first call (compiling): {compile_s:.1f} s")
        for sampler in samplers.values():  # warm-up
            sampler.sample(ids, mask, settings, with_logprobs=True)
        times: dict[str, list[float]] = {name: [] for name in samplers}
        cpu: dict[str, list[float]] = {name: [] for name in samplers}
        for round_ in range(args.rounds):  # the order alternates
            names = list(samplers) if round_ % 2 == 0 else list(reversed(samplers))
            for name in names:
                started, cpu_started = time.perf_counter(), time.process_time()
                for _ in range(args.calls):
                    samplers[name].sample(ids, mask, settings, with_logprobs=True)
                times[name].append((time.perf_counter() - started) / args.calls)
                cpu[name].append((time.process_time() - cpu_started) / args.calls)
        lean, lean_cpu = statistics.median(times["lean"]), statistics.median(cpu["lean"])
        for name, values in times.items():
            median, median_cpu = statistics.median(values), statistics.median(cpu[name])
            print(
                f"{size:<7} {name:<15} {median * 1000:>8.1f} {lean / median:>7.2f}x"
                f" {median_cpu * 1000:>12.1f} {lean_cpu / median_cpu:>7.2f}x"
            )
        if workload is not None:
            workload.handle.remove()  # the next size has its own


if __name__ == "__main__":
    main()
