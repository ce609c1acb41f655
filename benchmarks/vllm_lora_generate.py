"""What ``vllm_lora_sync: adapter`` costs and saves against ``merged``, outside a training loop.

    .venv/bin/python benchmarks/vllm_lora_generate.py --shape small --pairs 3
    flock /tmp/proxrl-05b.lock .venv/bin/python benchmarks/vllm_lora_generate.py --shape 05b

Each side runs in a fresh process of the vLLM environment (``PROXRL_VLLM_PYTHON``, default
``.venv-vllm``), alternating every pair: a Qwen2-style model (``small``: hidden 512, 8 layers,
vocabulary ~300; ``05b``: Qwen2-0.5B's shape, vs_trl_05b.QWEN2_05B), random weights, LoRA r 16
(alpha 32) on every linear layer with its B moved off zero (so the adapter changes the model), a
vLLM engine started as ``sampler: vllm`` starts it (``merged``: the plain engine; ``adapter``:
vLLM's LoRA layers, one rank-16 slot). Per side: the engine's start and first sync
(``adapter``: the base weights + the adapter), ``--syncs`` later syncs (each after a LoRA
update), then ``--rounds`` generates of 8 requests × 32 tokens (the length forced, EOS ignored;
one warm-up round dropped), each timed by the wall clock and the process's CPU time. Prints
one JSON line per side and the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_trl  # noqa: E402
import vs_trl_05b  # noqa: E402

SHAPES = {"small": (512, 8, {}), "05b": (896, 24, vs_trl_05b.QWEN2_05B)}
REQUESTS, TOKENS, RANK = 8, 32, 16


def worker(side: str, model: str, syncs: int, rounds: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from proxrl.models.lora import apply_lora
    from proxrl.models.tokenizer import load_tokenizer
    from proxrl.rollout.engines import VLLMEngine
    from proxrl.rollout.generation import SamplingSettings
    from proxrl.rollout.vllm_sampler import LORA_SYNCS, EngineOptions

    vs_trl_05b.force_lengths_in_vllm([TOKENS])
    tokenizer = load_tokenizer(model)
    policy = apply_lora(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), RANK)

    def update(seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in policy.named_parameters():
                if "lora_B" in name:
                    p.add_(torch.randn(p.shape, generator=generator) * 0.01)

    sync = LORA_SYNCS[side]
    options = EngineOptions(
        model,
        gpu_memory_utilization=vs_trl_05b.ENGINE_SHARE,
        max_lora_rank=RANK if sync.lora_slots else None,
    )
    engine = VLLMEngine(options, tokenizer, sync)
    update(0)
    started = time.perf_counter()
    engine.start(policy, 0)
    first_sync = time.perf_counter() - started
    sync_s, sync_cpu_s = [], []
    for i in range(syncs):
        update(i + 1)
        wall, cpu = time.perf_counter(), time.process_time()
        engine.after_update(policy, i)
        sync_s.append(time.perf_counter() - wall)
        sync_cpu_s.append(time.process_time() - cpu)
    ids = tokenizer("say: abc ->")["input_ids"]
    prompt_ids, mask = torch.tensor([ids] * REQUESTS), torch.ones(REQUESTS, len(ids), dtype=int)
    settings = SamplingSettings(TOKENS, temperature=1.0)
    generate_s, generate_cpu_s = [], []
    for _ in range(rounds + 1):
        wall, cpu = time.perf_counter(), time.process_time()
        samples = engine.sampler(policy).sample(prompt_ids, mask, settings, with_logprobs=True)
        generate_s.append(time.perf_counter() - wall)
        generate_cpu_s.append(time.process_time() - cpu)
        assert samples.response_ids.shape == (REQUESTS, TOKENS)  # EOS ignored: every token
    engine.close()
    return dict(
        side=side,
        start_and_first_sync_s=first_sync,  # the engine starts inside it
        sync_s=sync_s,
        sync_cpu_s=sync_cpu_s,
        generate_s=generate_s[1:],
        generate_cpu_s=generate_cpu_s[1:],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=list(SHAPES), default="small")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--syncs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results", help="also append every run's numbers here (JSON lines)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import logging

        import torch

        torch.set_num_threads(1)
        logging.disable(logging.WARNING)
        print(json.dumps(worker(args.worker, args.model, args.syncs, args.rounds)))
        return
    work = Path(tempfile.mkdtemp(prefix="vllm_lora_generate_"))
    hidden, layers, shape = SHAPES[args.shape]
    model = vs_trl.build_models(work, hidden, layers, **shape)["model"]
    env = os.environ | {
        "OMP_NUM_THREADS": "1",
        "PROXRL_NUM_THREADS": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "PYTHONPATH": f"{Path(__file__).parent}:{vs_trl.ROOT / 'src'}",
    }
    runs: dict[str, list[dict]] = {"merged": [], "adapter": []}
    try:
        for pair in range(args.pairs):
            for side in ("merged", "adapter") if pair % 2 == 0 else ("adapter", "merged"):
                command = [str(vs_trl_05b.VLLM_PYTHON), __file__, "--worker", side]
                command += ["--model", model, "--syncs", str(args.syncs)]
                command += ["--rounds", str(args.rounds)]
                done = subprocess.run(command, capture_output=True, text=True, env=env)
                lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
                if done.returncode or not lines:
                    print(f"pair {pair} {side} FAILED:\n{done.stderr[-3000:]}", flush=True)
                    continue
                numbers = json.loads(lines[-1]) | dict(
                    shape=args.shape, pair=pair, load=os.getloadavg()[0], time=time.time()
                )
                runs[side].append(numbers)
                print(json.dumps(numbers), flush=True)
                if args.results:
                    with open(args.results, "a") as sink:
                        sink.write(json.dumps(numbers) + "\n")
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    for side, numbers in runs.items():
        if not numbers:
            continue

        def median(key: str, numbers: list[dict] = numbers) -> float:
            return statistics.median(v for n in numbers for v in n[key])

        print(
            f"{args.shape} {side}: {len(numbers)} runs, median sync {median('sync_s'):.3f} s "
            f"(cpu {median('sync_cpu_s'):.3f}), generate {REQUESTS}x{TOKENS} "
            f"{median('generate_s'):.3f} s (cpu {median('generate_cpu_s'):.3f}), engine start + "
            "first sync "
            f"{statistics.median(n['start_and_first_sync_s'] for n in numbers):.2f} s"
        )


if __name__ == "__main__":
    main()
