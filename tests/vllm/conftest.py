"""One vLLM engine per module (a start costs seconds); the tiny model has head_dim 32, a size
vLLM's CPU attention supports (the tests/algos model's 32-wide, 4-head one has 8)."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch

from proxrl.models.tiny import build_tiny_lm

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
CORPUS = ["abcdefghijklmnopqrstuvwxyz =.:->" * 3, "copy: abc = abc", "say: abc -> def"]
WORDS = ["abc", "def", "ghi", "jkl", "mno", "pqr", "stu", "vwx"]


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(
        build_tiny_lm(tmp_path_factory.mktemp("tiny") / "lm", CORPUS, hidden_size=64, num_heads=2)
    )


@pytest.fixture(scope="session")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in WORDS))
    return str(path)


@pytest.fixture(autouse=True)
def _quiet() -> None:
    torch.set_num_threads(1)
    logging.getLogger("transformers").setLevel(logging.ERROR)
