"""Shared-prefix passes at a user's lengths (issue 50): a group's prompt once against every row
repeating it, for the passes of one GRPO iteration.

    .venv/bin/python benchmarks/shared_prefix.py                   # 5 pairs, the default shape
    .venv/bin/python benchmarks/shared_prefix.py --pairs 7 --layers 4 --prompt 1024

The work: G = 8 responses to each of 2 prompts of ``--prompt`` tokens, response lengths spread
16–256 (a model that stops: 16, 40, 64, 96, 128, 160, 200, 256, right-padded), a Qwen2-shaped
model as wide as Qwen2-0.5B (hidden 896, 14 heads, 2 KV heads, MLP 4864; vocabulary 151,936,
tied) with ``--layers`` of its 24 layers (fewer fit this machine's time; say which), random
weights, float32, LoRA r 16 on every linear layer. One iteration's passes: π_old and π_ref
(no gradient: the reference is the adapter-disabled policy) and the policy's forward and
backward (GRPO's clipped loss), in micro-batches of ``--micro`` rows that keep a group's rows
together (as collect's rows are). Each side runs in its own fresh process, one thread, sides
alternating (``--pairs`` pairs); printed: each pair's CPU and wall seconds, the ratio of the
repeated to the shared side per pair, the median (min–max) ratio, and each side's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

RESPONSES = [16, 40, 64, 96, 128, 160, 200, 256]


def run_side(args: argparse.Namespace, shared: bool) -> dict[str, float]:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from proxrl.core import ppo_clip_loss
    from proxrl.models.lora import adapter_disabled, apply_lora
    from proxrl.rollout.forward import policy_forward

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=args.layers,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    model = apply_lora(Qwen2ForCausalLM(config), 16, 32.0)
    P = args.prompt
    T = max(RESPONSES)
    rows = []
    for prompt in range(2):
        prompt_ids = torch.randint(
            10, 151000, (P,), generator=torch.Generator().manual_seed(prompt)
        )
        for length in RESPONSES:
            response = torch.randint(10, 151000, (T,))
            real = (torch.arange(T) < length).long()
            rows.append(
                (torch.cat([prompt_ids, response * real]), torch.cat([torch.ones(P), real]))
            )
    ids = torch.stack([r[0] for r in rows])
    mask = torch.stack([r[1] for r in rows]).long()
    started, cpu = time.perf_counter(), time.process_time()
    for lo in range(0, len(ids), args.micro):
        batch, batch_mask = ids[lo : lo + args.micro], mask[lo : lo + args.micro]
        response_mask = batch_mask[:, P:].float()
        with torch.no_grad():
            old = policy_forward(model, batch, batch_mask, P, 1.0, shared_prefix=shared).logprobs
            with adapter_disabled(model):
                policy_forward(model, batch, batch_mask, P, 1.0, shared_prefix=shared)
        new = policy_forward(model, batch, batch_mask, P, 1.0, shared_prefix=shared).logprobs
        advantages = torch.randn(len(batch), 1).expand_as(new)
        loss, _ = ppo_clip_loss(new, old, advantages, response_mask)
        loss.backward()
    return {
        "cpu_s": time.process_time() - cpu,
        "wall_s": time.perf_counter() - started,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--micro", type=int, default=8, help="rows per micro-batch (one group)")
    parser.add_argument("--side", choices=["shared", "repeated"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        print(json.dumps(run_side(args, args.side == "shared")))
        return
    print(
        f"prompt {args.prompt} tokens, G={len(RESPONSES)} responses {RESPONSES[0]}-"
        f"{RESPONSES[-1]}, 2 prompts, Qwen2-0.5B width with {args.layers} of its 24 layers, "
        f"LoRA r16, micro-batches of {args.micro} rows, 1 thread"
    )
    results: dict[str, list[dict[str, float]]] = {"repeated": [], "shared": []}
    for pair in range(args.pairs):
        order = ["repeated", "shared"] if pair % 2 == 0 else ["shared", "repeated"]
        for side in order:
            argv = [sys.executable, __file__, "--side", side, "--layers", str(args.layers)]
            argv += ["--prompt", str(args.prompt), "--micro", str(args.micro)]
            out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
            results[side].append(json.loads(out.strip().splitlines()[-1]))
        r, s = results["repeated"][-1], results["shared"][-1]
        print(
            f"pair {pair + 1}: repeated {r['cpu_s']:.2f} s CPU ({r['wall_s']:.2f} wall), "
            f"shared {s['cpu_s']:.2f} s CPU ({s['wall_s']:.2f} wall): "
            f"{r['cpu_s'] / s['cpu_s']:.2f}x"
        )
    ratios = [
        r["cpu_s"] / s["cpu_s"] for r, s in zip(results["repeated"], results["shared"], strict=True)
    ]
    print(
        f"repeated / shared by CPU time: median {statistics.median(ratios):.2f}x "
        f"({min(ratios):.2f}-{max(ratios):.2f}) over {len(ratios)} pairs"
    )
    for side, runs in results.items():
        peaks = [run["peak_rss_mb"] for run in runs]
        print(f"{side}: peak RSS {min(peaks):.0f}-{max(peaks):.0f} MB")


if __name__ == "__main__":
    main()
