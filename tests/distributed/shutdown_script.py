"""Start proxrl's process group, compile a function (torch.compile imports torch._dynamo, as
transformers' ``generate`` does), run proxrl's exit handler, and write the names of the
threads still running in this process to OUT_DIR/threads_RANK.json.

    torchrun --nproc_per_node 2 shutdown_script.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from proxrl.runtime import distributed as dist


def thread_names() -> list[str]:
    tasks = Path(f"/proc/{os.getpid()}/task")
    return sorted((task / "comm").read_text().strip() for task in tasks.iterdir())


def main(out_dir: str) -> None:
    rank = dist.rank()
    total = dist.all_reduce_sum(torch.ones(1))
    doubled = torch.compile(lambda x: 2 * x, backend="eager")(total)
    before = thread_names()
    dist._shutdown()  # what atexit runs
    report = {"before": before, "after": thread_names(), "value": float(doubled)}
    Path(out_dir, f"threads_{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
