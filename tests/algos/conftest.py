from __future__ import annotations

import json
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


@pytest.fixture(scope="module")
def word_prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A prompt file of test_online's words, each row with its ``word`` column (for reward
    functions that take a data column)."""
    from tests.algos.test_online import WORDS

    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": f"say: {w} ->", "word": w}) + "\n" for w in WORDS)
    )
    return str(path)
