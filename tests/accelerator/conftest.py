"""Checks of the GPU code paths. Without a GPU they are skipped, unless PROXRL_TEST_DEVICE=cpu
runs them on the CPU (to keep the tests themselves working where no GPU is lent):

    .venv/bin/python -m pytest tests/accelerator          # on a machine with a GPU
    PROXRL_TEST_DEVICE=cpu .venv/bin/python -m pytest tests/accelerator
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from proxrl.models.tiny import build_tiny_lm  # noqa: E402
from tests.algos.lm_tasks import CORPUS  # noqa: E402

DEVICE = os.environ.get("PROXRL_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if DEVICE:
        return
    skip = pytest.mark.skip(reason="no GPU (PROXRL_TEST_DEVICE=cpu runs these on the CPU)")
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device(DEVICE)


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_lm(tmp_path_factory.mktemp("tiny") / "lm", CORPUS))
