"""mixed_precision=bf16: every forward pass of a run computes in bfloat16 under autocast, while
weights, gradients and losses stay float32, and a run still learns. ``no`` changes nothing."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from proxrl.algos.offline import dpo, reward, sft
from proxrl.algos.online import grpo, ppo
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.metrics import read_metrics
from tests.algos.lm_tasks import preference_rows, sft_rows, write_jsonl
from tests.algos.test_online import prompts, scores, small  # noqa: F401  (fixtures)


@contextmanager
def linear_output_dtypes() -> Iterator[dict[str, set[torch.dtype]]]:
    """The dtypes the ``nn.Linear`` layers of any model produced while the block ran: "body"
    for the transformer's, "head" for the scalar reward / value heads (one output)."""
    seen: dict[str, set[torch.dtype]] = {"body": set(), "head": set()}

    def record(module: torch.nn.Module, args: object, output: object) -> None:
        if isinstance(module, torch.nn.Linear) and isinstance(output, torch.Tensor):
            seen["head" if module.out_features == 1 else "body"].add(output.dtype)

    handle = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        yield seen
    finally:
        handle.remove()


def _saved_dtypes(out: Path) -> set[torch.dtype]:
    return {t.dtype for t in load_file(str(out / "model.safetensors")).values()}


def _assert_finite_metrics(out: Path) -> None:
    rows = read_metrics(out)
    assert rows
    for row in rows:
        bad = {k: v for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)}
        assert not bad, bad


@pytest.mark.parametrize(
    ("precision", "compute"), [("no", torch.float32), ("bf16", torch.bfloat16)]
)
def test_ppo_computes_in_the_chosen_precision_and_keeps_float32_weights(
    precision,
    compute,
    tiny_lm,
    prompts,  # noqa: F811  (a fixture)
    reward_model,  # noqa: F811  (a fixture)
    tmp_path,
):
    """Sampling, the reference / critic / reward-model passes and the update all run in
    ``compute``, except the scalar heads: scores and values stay float32 (a bf16 score near 8
    moves in steps of 1/32). What is trained and saved stays float32."""
    cfg = small(
        ppo.Config,
        tiny_lm,
        prompts,
        tmp_path,
        iterations=2,
        group_size=2,
        mixed_precision=precision,
        reward_fn=(),
        reward_model=reward_model,
        critic_learning_rate=1e-3,
        kl_coef=0.05,
    )
    with linear_output_dtypes() as seen:
        ppo.train(cfg)
    assert seen == {"body": {compute}, "head": {torch.float32}}
    assert _saved_dtypes(tmp_path) == {torch.float32}
    assert {
        t.dtype for t in load_file(str(tmp_path / "critic" / "model.safetensors")).values()
    } == {torch.float32}
    _assert_finite_metrics(tmp_path)


def test_grpo_learns_in_bf16(tiny_lm, prompts, tmp_path):  # noqa: F811
    """The learnable-reward test of test_online, in bfloat16: rounding does not stop learning."""
    cfg = small(
        grpo.Config,
        tiny_lm,
        prompts,
        tmp_path,
        estimator="grpo",
        iterations=30,
        group_size=4,
        ppo_epochs=2,
        mini_batch_size=16,
        mixed_precision="bf16",
    )
    grpo.train(cfg)
    history = scores(tmp_path)
    assert sum(history[-5:]) / 5 > sum(history[:5]) / 5 + 0.15, history


def _offline(trainer: str, tiny_lm: str, tmp_path: Path, precision: str):
    common = dict(
        model=tiny_lm,
        output_dir=str(tmp_path / "run"),
        batch_size=8,
        max_steps=2,
        learning_rate=1e-3,
        progress=False,
        mixed_precision=precision,
    )
    if trainer == "sft":
        data = write_jsonl(tmp_path / "sft.jsonl", sft_rows(32, seed=0))
        return sft.train, sft.Config(**common, data=data, eval_fraction=0.25, eval_every=1)
    data = write_jsonl(tmp_path / "pairs.jsonl", preference_rows(32, seed=0))
    if trainer == "dpo":
        return dpo.train, dpo.Config(**common, data=data, eval_fraction=0.25, eval_every=1)
    return reward.train, reward.Config(**common, data=data, eval_fraction=0.25, eval_every=1)


@pytest.mark.parametrize("trainer", ["sft", "rm", "dpo"])
@pytest.mark.parametrize(
    ("precision", "compute"), [("no", torch.float32), ("bf16", torch.bfloat16)]
)
def test_offline_trainers_compute_in_the_chosen_precision(
    trainer, precision, compute, tiny_lm, tmp_path
):
    """Training steps, evaluation and (DPO) the reference log-probs run in ``compute``; the
    saved model is float32 and every logged number finite."""
    train, cfg = _offline(trainer, tiny_lm, tmp_path, precision)
    with linear_output_dtypes() as seen:
        train(cfg)
    assert seen == {"body": {compute}, "head": {torch.float32} if trainer == "rm" else set()}
    assert _saved_dtypes(tmp_path / "run") == {torch.float32}
    _assert_finite_metrics(tmp_path / "run")
    assert any("eval/loss" in row for row in read_metrics(tmp_path / "run"))


def test_unknown_precision_is_named():
    with pytest.raises(ProxrlError, match=r"mixed_precision: expected no or bf16, got 'fp16'"):
        sft.Config(model="m", data="d.jsonl", output_dir="o", mixed_precision="fp16").validate()
