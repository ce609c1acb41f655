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


@pytest.fixture(scope="session")
def tiny_teacher(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A teacher for on-policy distillation: the tiny model's tokenizer, another architecture
    (48 wide, 1 layer) and a distribution a student can learn in seconds (build_sharp_teacher)."""
    return build_sharp_teacher(tmp_path_factory.mktemp("teacher") / "lm")


TEACHER_LETTERS = "abcdefghij"


def build_sharp_teacher(path) -> str:  # type: ignore[no-untyped-def]
    """A 48-wide 1-layer Llama whose next-token distribution hardly depends on the context:
    its layer adds nothing (o_proj, down_proj 0), every embedding carries 20 in dimension 0, so
    the normalised hidden state is ≈ √48 there, and the head reads logit 4 for each of the
    letters a–j from it (≈ 0.64 of the mass on them, the rest near uniform)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    build_tiny_lm(path, CORPUS, hidden_size=48, num_layers=1, num_heads=4, seed=5)
    model = AutoModelForCausalLM.from_pretrained(path)
    letters = AutoTokenizer.from_pretrained(path).convert_tokens_to_ids(list(TEACHER_LETTERS))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight[:, 0] = 20.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[letters, 0] = 4.0 / 48**0.5
    model.save_pretrained(path)
    return str(path)


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


@pytest.fixture(scope="module")
def reward_model(tiny_lm: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A reward model in the sequence-classifier layout: the tiny model's body with a new scalar
    head (drawn from the global generator, as each module's copy of this fixture did)."""
    from proxrl.models.scalar_head import load_score_model
    from proxrl.models.tokenizer import load_tokenizer

    out = tmp_path_factory.mktemp("rm") / "rm"
    load_score_model(tiny_lm, new_head="reward").save_pretrained(out)
    load_tokenizer(tiny_lm).save_pretrained(out)
    return str(out)
