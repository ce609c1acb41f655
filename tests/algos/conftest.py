from __future__ import annotations

import logging

import pytest
import torch

from proxrl.models.tiny import build_tiny_lm
from tests.algos.lm_tasks import CORPUS


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny Llama + locally trained byte-level BPE tokenizer, saved to a temp dir."""
    return str(build_tiny_lm(tmp_path_factory.mktemp("tiny") / "lm", CORPUS))


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)
    logging.getLogger("transformers").setLevel(logging.ERROR)
