"""Peak memory of one PPO update micro-batch, alone: the policy's forward, the separate critic's,
and the backward of their sum, at vs_trl_05b.py's Qwen2-0.5B-wide shape (its ``--work``
models), each measured from a trimmed heap (``malloc_trim``) by the kernel's high-water mark
(VmHWM, reset through /proc/self/clear_refs), so that one process's earlier allocations do not
hide it. Rows of one 256-token prompt (random ids) with responses of the given lengths; one
JSON line per repeat (the second is the one to read: the first faults the weights in).

    PYTHONPATH=src OMP_NUM_THREADS=1 .venv/bin/python benchmarks/micro_batch_memory.py \
        --work runs/mem --variant shared --lengths 255,236,225,80

``--variant``: ``shared`` (a group's prompt once), ``padded`` (repeated, padded) or
``packed`` (repeated, padding-free). Any checkout's sources can be measured by putting them
first on PYTHONPATH (issue 50's bisect: benchmarks/results/issue50_ppo_memory.md)."""

from __future__ import annotations

import argparse
import ctypes
import json
from pathlib import Path


def status(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    raise KeyError(key)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="vs_trl_05b.py's --work (paths.json)")
    parser.add_argument("--variant", choices=["shared", "padded", "packed"], default="shared")
    parser.add_argument("--which", choices=["policy", "critic", "both"], default="both")
    parser.add_argument("--lengths", default="255,236,225,80")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    import torch

    from proxrl.models.causal_lm import load_causal_lm
    from proxrl.models.lora import apply_lora
    from proxrl.models.scalar_head import load_score_model
    from proxrl.rollout.forward import critic_forward, policy_forward

    torch.set_num_threads(1)
    libc = ctypes.CDLL(None)
    paths = json.loads((Path(args.work) / "paths.json").read_text())
    lengths = [int(x) for x in args.lengths.split(",")]
    P, T, B = args.prompt_tokens, max(lengths), len(lengths)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(10, 1000, (P,), generator=g)
    ids = torch.cat([prompt.expand(B, P), torch.randint(10, 1000, (B, T), generator=g)], 1)
    mask = torch.ones_like(ids)
    for row, n in enumerate(lengths):
        mask[row, P + n :] = 0
    policy = apply_lora(load_causal_lm(paths["model"]), 16, 32)
    critic = apply_lora(load_score_model(paths["reward"], new_head="zero"), 16, 32, task="seq_cls")
    policy.train()
    critic.train()
    options = dict(shared_prefix=args.variant == "shared", packed=args.variant == "packed")
    for repeat in range(args.repeats):
        libc.malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM from here
        base = status("VmRSS")
        out = torch.zeros(B, T)
        if args.which in ("policy", "both"):
            out = out + policy_forward(policy, ids, mask, P, 1.0, **options).logprobs
        after_policy = status("VmRSS")
        if args.which in ("critic", "both"):
            out = out + critic_forward(critic, ids, mask, P, **options)
        forward_peak, after_forward = status("VmHWM"), status("VmRSS")
        (out * mask[:, P:]).sum().backward()
        peak = status("VmHWM")
        del out
        policy.zero_grad(set_to_none=True)
        critic.zero_grad(set_to_none=True)
        print(
            json.dumps(
                dict(
                    variant=args.variant,
                    which=args.which,
                    lengths=lengths,
                    repeat=repeat,
                    base_mb=round(base),
                    after_policy_mb=round(after_policy - base),
                    after_forward_mb=round(after_forward - base),
                    forward_peak_mb=round(forward_peak - base),
                    peak_mb=round(peak - base),
                )
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
