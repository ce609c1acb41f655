"""Each rank computes ``correction_stats`` of its own row of a fixed two-row rollout and
gathers them as the online loop does (``rollout.gathered_correction_stats``); every rank writes
what it got to OUT/rank<r>.json.

    torchrun --nproc_per_node=2 correction_stats_script.py OUT
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

from proxrl.algos.online.gather import gathered_correction_stats
from proxrl.core import correction_stats, mis_weights
from proxrl.runtime import distributed as dist

# ρ = π_old / π_sampler per token; row 1's last token is padding (as in tests/core).
RATIOS = [[0.4, 1.0, 3.0], [1.5, 2.5, 7.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]


def main(out: Path) -> None:
    rank = dist.rank()
    mask = torch.tensor(MASK[rank : rank + 1], dtype=torch.float64)
    log_ratio = torch.tensor([[math.log(r) for r in RATIOS[rank]]], dtype=torch.float64)
    sampler = torch.full_like(log_ratio, math.log(0.5))
    stats = correction_stats(
        sampler + log_ratio, sampler, mis_weights(log_ratio, mask, 2.0), mask, 2.0
    )
    combined = gathered_correction_stats({k: float(v) for k, v in stats.items()}, float(mask.sum()))
    (out / f"rank{rank}.json").write_text(json.dumps(combined))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    # As cli.main: a rank that ran FSDP2 ends without C++ teardown (runtime.distributed).
    dist.end_launched_process(0)
