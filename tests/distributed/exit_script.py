"""A rank of a launched run ends in ``proxrl.cli.main``: start proxrl's process group between two
exit handlers, run ``main(["--version"])``, and record what ran (OUT_DIR/RANK_*).

    torchrun --nproc_per_node 2 exit_script.py OUT_DIR
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

import torch

from proxrl.cli import main
from proxrl.runtime import distributed as dist


def note(out_dir: str, what: str) -> None:
    Path(out_dir, f"{os.environ['RANK']}_{what}").write_text(
        str(torch.distributed.is_initialized())
    )
    print(f"exit handler {what} ran")


def run(out_dir: str) -> None:
    atexit.register(note, out_dir, "first_handler")  # runs last: after proxrl's _shutdown
    dist.all_reduce_sum(torch.ones(1))  # starts the group (and registers _shutdown)
    atexit.register(note, out_dir, "last_handler")  # runs first: the group is still up
    code = main(["--version"])  # a launched rank ends in here
    note(out_dir, f"main_returned_{code}")


if __name__ == "__main__":
    run(sys.argv[1])
