from __future__ import annotations

import pytest

from proxrl.models.tiny import build_tiny_lm  # noqa: E402
from tests.algos.lm_tasks import CORPUS  # noqa: E402


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny Llama + byte-level BPE tokenizer, saved to a temp dir (as in tests/algos)."""
    return str(build_tiny_lm(tmp_path_factory.mktemp("tiny") / "lm", CORPUS))
