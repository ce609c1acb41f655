"""Where proxrl's ``VLLMSampler`` loses to a bare ``LLM.generate``: one factor at a time.

    make setup-vllm
    OMP_NUM_THREADS=2 .venv-vllm/bin/python benchmarks/vllm_params_probe.py --rounds 8

One engine at the 42M shape of ``vllm_rollout.py`` (started and warmed up once, apart from every
figure), the same 32 prompts × 64 new tokens for every side. Each side changes ONE thing from the
bare request ``vllm_rollout.py`` first measured (seed ``i``, the same 32 seeds every call,
temperature 1, ``logprobs=0``, EOS as the only stop id) towards proxrl's: no seed, proxrl's
seeds (``torch.randint`` draws), its explicit "off" parameters (``top_k=-1, top_p=1, min_p=0,
ignore_eos=False``), no log-probs, the exact ``SamplingParams`` list the wrapper builds
(captured from it once, so its seeds repeat every call) passed to ``generate`` directly, the
same list built afresh with new seeds every call (as the wrapper does), and the wrapper itself.
A second bare side ("bare, again") is the null control: its ratio to bare is the noise floor a
factor has to clear. Every direct side is timed around ``generate`` and the same copy of tokens
and log-probs into tensors the wrapper does; the wrapper's own work outside ``generate``
(building requests, copying) is also timed apart. Rounds alternate their order (A B C …,
… C B A); each row ends with the load average; ratios are to bare within a round.
Besides wall-clock tokens/s, tokens per CPU-second of this process (the engine runs in it, so
that is all of its work): on a machine shared past its cores the wall clock measures the other
tenants as much as the code, the CPU time much less.

The engine's log-prob mode (``processed_logprobs``) is an engine option, so both sides share it
by construction; it cannot be a cause of a gap between them and is not varied here.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vllm_rollout import SHAPES, build, load, median, rollout_prompts, start

SHAPE = dataclasses.replace(SHAPES["42m"], prompts=32, new_tokens=64)


class _Captured(Exception):
    pass


class _Capture:
    """An engine stand-in that records what the wrapper would pass to ``generate``."""

    def generate(self, prompts: Any, params: Any, use_tqdm: bool = False) -> Any:
        self.prompts, self.params = prompts, params
        raise _Captured


class _TimedEngine:
    """The engine, with the seconds spent inside ``generate`` recorded."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.inside = engine, 0.0

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return self.engine.generate(*args, **kwargs)
        finally:
            self.inside = time.perf_counter() - started


def copy_out(outputs: Any, pad: int, with_logprobs: bool) -> int:
    """The wrapper's copy of tokens and log-probs into tensors; returns the token count."""
    from proxrl.rollout.vllm_sampler import outputs_as_tensors

    outputs_as_tensors(outputs, pad, with_logprobs)
    return sum(len(o.outputs[0].token_ids) for o in outputs)


def sides(engine: Any, path: str) -> tuple[dict[str, Callable[[], int]], list[float]]:
    """Each side as a call returning the tokens it got; and the list the wrapper's own
    overhead (seconds outside ``generate``) is appended to."""
    import torch
    from vllm import SamplingParams

    from proxrl.models.tokenizer import load_tokenizer
    from proxrl.rollout.generation import SamplingSettings
    from proxrl.rollout.vllm_sampler import VLLMSampler

    tokenizer = load_tokenizer(path)
    vocab = engine.llm_engine.model_config.get_vocab_size()
    ids_of, prompt_ids, mask = rollout_prompts(SHAPE, tokenizer, vocab)
    settings = SamplingSettings(max_new_tokens=SHAPE.new_tokens, temperature=1.0)
    rows = [
        {"prompt_token_ids": r[m.bool()].tolist()} for r, m in zip(prompt_ids, mask, strict=True)
    ]
    pad, eos, n = ids_of.pad_token_id, ids_of.eos_token_id, len(rows)
    base: dict[str, Any] = dict(
        max_tokens=SHAPE.new_tokens, temperature=1.0, logprobs=0, stop_token_ids=[eos]
    )
    off = dict(top_k=-1, top_p=1.0, min_p=0.0, ignore_eos=False)

    capture = _Capture()
    with contextlib.suppress(_Captured):
        VLLMSampler(capture, ids_of).sample(prompt_ids, mask, settings, with_logprobs=True)
    assert capture.prompts == rows, "the wrapper's prompts differ from the probe's"

    def direct(make: Callable[[], list[Any]], with_logprobs: bool = True) -> Callable[[], int]:
        def run() -> int:
            outputs = engine.generate(rows, make(), use_tqdm=False)
            return copy_out(outputs, pad, with_logprobs)

        return run

    def torch_seeds() -> list[int]:
        return [int(s) for s in torch.randint(0, 2**31 - 1, (n,))]

    timed = _TimedEngine(engine)
    overhead: list[float] = []

    def wrapper() -> int:
        started = time.perf_counter()
        samples = VLLMSampler(timed, ids_of).sample(prompt_ids, mask, settings, with_logprobs=True)
        overhead.append(time.perf_counter() - started - timed.inside)
        return int(samples.response_mask.sum())

    table = {
        "bare": direct(lambda: [SamplingParams(seed=i, **base) for i in range(n)]),
        "bare, again": direct(lambda: [SamplingParams(seed=i, **base) for i in range(n)]),
        "no seed": direct(lambda: [SamplingParams(**base) for _ in range(n)]),
        "torch seeds": direct(lambda: [SamplingParams(seed=s, **base) for s in torch_seeds()]),
        "off params": direct(lambda: [SamplingParams(seed=i, **base, **off) for i in range(n)]),
        "no logprobs": direct(
            lambda: [SamplingParams(seed=i, **{**base, "logprobs": None}) for i in range(n)],
            with_logprobs=False,
        ),
        "proxrl params": direct(lambda: list(capture.params)),
        "fresh proxrl params": direct(  # as the wrapper builds them, new seeds every call
            lambda: [SamplingParams(seed=s, **base, **off) for s in torch_seeds()]
        ),
        "wrapper": wrapper,
    }
    return table, overhead


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="alternating rounds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sides", nargs="+", default=None, help="a subset of the sides")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="vllm_probe_"))
    print(f"threads {args.threads}; {load()} at the start; {os.cpu_count()} CPUs")
    path, params = build(SHAPE, root)
    print(f"[42m] {params / 1e6:.1f}M parameters; {SHAPE.prompts} prompts x {SHAPE.new_tokens}")
    engine = start(SHAPE, path, root)
    table, overhead = sides(engine, path)
    names = args.sides or list(table)
    rates: dict[str, list[float]] = {name: [] for name in names}
    cpu_rates: dict[str, list[float]] = {name: [] for name in names}
    print("tokens/s per side (wall clock | per CPU-second of this process); the order alternates")
    print("  round " + " ".join(f"{name:>19}" for name in names) + "  load")
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else list(reversed(names)):
            started, cpu_started = time.perf_counter(), time.process_time()
            tokens = table[name]()
            rates[name].append(tokens / (time.perf_counter() - started))
            cpu_rates[name].append(tokens / (time.process_time() - cpu_started))
        cells = [f"{rates[n][-1]:9.0f} |{cpu_rates[n][-1]:8.0f}" for n in names]
        print(f"  {round_ + 1:5d} " + " ".join(f"{c:>19}" for c in cells), load())
    cells = [f"{median(rates[n]):9.0f} |{median(cpu_rates[n]):8.0f}" for n in names]
    print("  median" + " ".join(f"{c:>19}" for c in cells))
    if "bare" in rates:
        print("ratio to bare within each round, median [min, max]: wall clock | CPU time")
        for name in names:
            parts = []
            for table_ in (rates, cpu_rates):
                ratios = [r / b for r, b in zip(table_[name], table_["bare"], strict=True)]
                parts.append(f"{median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]")
            print(f"  {name:>13}: {parts[0]} | {parts[1]}")
    if overhead:
        print(
            f"wrapper's work outside generate: median {median(overhead) * 1e3:.1f} ms "
            f"(max {max(overhead) * 1e3:.1f} ms) per call of {SHAPE.prompts} x {SHAPE.new_tokens}"
        )


if __name__ == "__main__":
    main()
