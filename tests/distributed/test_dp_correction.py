"""Rollout-correction metrics on 2 processes describe the whole rollout: each rank holds one
row of the two-row rollout of tests/core/test_correction.py, and the gathered stats on every
rank equal those of both rows on one process (the ratio's min 0.4 and max 3.0 come from rank 0
and the token mean 1.68 weighs rank 0's 3 tokens against rank 1's 2; averaging the ranks' stats
instead gives min 0.95, max 2.75, mean 1.733)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from proxrl.core import correction_stats, mis_weights
from tests.distributed.launch import check, torchrun

SCRIPT = Path(__file__).with_name("correction_stats_script.py")
RATIOS = [[0.4, 1.0, 3.0], [1.5, 2.5, 7.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]


def test_correction_stats_on_two_processes_equal_one(tmp_path):
    check(torchrun([str(SCRIPT), str(tmp_path)]))
    mask = torch.tensor(MASK, dtype=torch.float64)
    log_ratio = torch.tensor([[math.log(r) for r in row] for row in RATIOS], dtype=torch.float64)
    sampler = torch.full_like(log_ratio, math.log(0.5))
    whole = correction_stats(
        sampler + log_ratio, sampler, mis_weights(log_ratio, mask, 2.0), mask, 2.0
    )
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got.keys() == whole.keys()
        for key, value in whole.items():
            assert math.isclose(got[key], float(value), rel_tol=1e-12, abs_tol=1e-15), key
    for key, value in (("is_ratio_min", 0.4), ("is_ratio_max", 3.0), ("is_ratio_mean", 1.68)):
        assert math.isclose(got[key], value, rel_tol=1e-12), key
