"""Why bf16 autocast is slower than float32 on this CPU: the matrix products an update is made
of, timed in both dtypes side by side in one run.

    .venv/bin/python benchmarks/bf16_matmul.py --threads 1

A CPU without bfloat16 arithmetic in its vector units (AVX-512 BF16 or AMX; AVX2 has neither)
computes a bf16 product by converting to float32 and back, so the product costs more than the
float32 one instead of less. The script prints the CPU's flags that decide it, then for the
shapes of the benchmarks' 128 × 2 model (a projection, the MLP, attention scores) the time
per product of float32, bf16, and float32 under ``torch.autocast("cpu", bfloat16)`` — what
``mixed_precision: bf16`` runs — forward and backward, in alternating rounds, with the ratio
bf16 / float32 per round (CPU time: the machine may be shared).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

# (name, batch, M, K, N) of one (batched) product: a micro-batch of 16 rows × 256 tokens of
# the 128 × 2 model (hidden 128, MLP 256, 2 heads of 64)
SHAPES = [
    ("q/k/v/o projection 4096x128 @ 128x128", 1, 4096, 128, 128),
    ("MLP up 4096x128 @ 128x256", 1, 4096, 128, 256),
    ("attention scores 32 x (256x64 @ 64x256)", 32, 256, 64, 256),
]
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_flags() -> str:
    """The flags of /proc/cpuinfo that decide whether bf16 has hardware arithmetic."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown (no /proc/cpuinfo)"
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    present = set(line.split(":", 1)[-1].split())
    return ", ".join(f"{flag} {'yes' if flag in present else 'no'}" for flag in FLAGS)


def product(
    batch: int, m: int, k: int, n: int, dtype: torch.dtype, autocast: bool
) -> Callable[[], None]:
    """One forward and backward of ``a @ b`` in ``dtype`` (or float32 under bf16 autocast)."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(batch, m, k, generator=generator).to(dtype).requires_grad_()
    b = torch.randn(batch, k, n, generator=generator).to(dtype).requires_grad_()

    def run() -> None:
        context = (
            torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
        )
        with context:
            out = a @ b
        out.float().sum().backward()
        a.grad = b.grad = None

    return run


def cpu_seconds(run: Callable[[], None], repeats: int) -> float:
    started = time.process_time()
    for _ in range(repeats):
        run()
    return (time.process_time() - started) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5, help="products per timing")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s); CPU: {cpu_flags()}")
    print(f"{'product (forward + backward)':52} {'fp32 ms':>8} {'bf16 ms':>8} {'autocast ms':>11}"
          f" {'bf16/fp32':>10} {'autocast/fp32':>14}")  # fmt: skip
    for name, *dims in SHAPES:
        sides = {
            "fp32": product(*dims, torch.float32, False),
            "bf16": product(*dims, torch.bfloat16, False),
            "autocast": product(*dims, torch.float32, True),
        }
        for run in sides.values():  # warm-up: the first call allocates
            run()
        times: dict[str, list[float]] = {side: [] for side in sides}
        for round_ in range(args.rounds):  # the order alternates
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            for side in order:
                times[side].append(cpu_seconds(sides[side], args.repeats))
        bf16_ratio = statistics.median(
            b / f for b, f in zip(times["bf16"], times["fp32"], strict=True)
        )
        autocast_ratio = statistics.median(
            a / f for a, f in zip(times["autocast"], times["fp32"], strict=True)
        )
        ms = {side: 1000 * statistics.median(values) for side, values in times.items()}
        print(f"{name:52} {ms['fp32']:8.2f} {ms['bf16']:8.2f} {ms['autocast']:11.2f}"
              f" {bf16_ratio:10.2f} {autocast_ratio:14.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
