"""One vLLM engine for the session (a start costs seconds), kept by ``engines`` and handed to
every run through ``train``; the tiny model has head_dim 32, a size vLLM's CPU attention
supports (the tests/algos model's 32-wide, 4-head one has 8)."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch

from proxrl.models.tiny import build_tiny_lm
from proxrl.rollout.vllm_sampler import EngineCache

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


@pytest.fixture(scope="session")
def engines() -> EngineCache:
    """The session's vLLM engine, kept between its tests and runs."""
    return EngineCache()


@pytest.fixture
def train(engines):
    """``command.train(cfg)`` as a command runs it (``launch``: the config and the run checked,
    then the driver), handed the session's ``engines``: the run takes the engine kept there and
    leaves it for the test to read."""

    def run(command, cfg):
        return command.train(cfg, engines)

    return run
