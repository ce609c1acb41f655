"""``proxrl demo --sampler vllm`` at toy size: the three RL stages sample through one engine and
every policy gets a gold score; a head width the CPU engine lacks is refused before any stage."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch

from proxrl import cli

TOY = [
    "--sft-examples", "48",
    "--preference-pairs", "48",
    "--preference-eval-pairs", "16",
    "--rl-prompts", "16",
    "--eval-prompts", "8",
    "--eval-samples", "2",
    "--num-layers", "1",
    "--sft-epochs", "1",
    "--rm-epochs", "1",
    "--batch-size", "16",
    "--rl-iterations", "2",
    "--rollout-batch-size", "4",
    "--no-progress",
]  # fmt: skip


def test_demo_with_the_vllm_sampler_runs_end_to_end(tmp_path: Path, engines, caplog) -> None:
    engines.clear()  # the demo holds an engine of its own for its stages: one at a time
    out = tmp_path / "demo"
    argv = ["demo", "--output-dir", str(out), "--sampler", "vllm", "--num-heads", "2", *TOY]
    with caplog.at_level(logging.INFO, logger="proxrl.rollout.vllm_sampler"):
        assert cli.main(argv) == 0
    # Its three RL stages sample with one engine: the start-up is paid once.
    starts = [r for r in caplog.records if r.getMessage().startswith("vLLM engine started")]
    assert len(starts) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["policies"]) == ["sft", "ppo", "ppo_no_kl", "grpo"]
    for name, scores in summary["policies"].items():
        assert math.isfinite(scores["gold"]) and 0 <= scores["gold"] <= 1, name
    assert json.loads((out / "base" / "config.json").read_text())["num_attention_heads"] == 2
    for run in ("ppo", "ppo_no_kl", "grpo"):
        config = (out / run / "config.yaml").read_text()
        assert "sampler: vllm" in config, run
        rows = (out / run / "metrics.jsonl").read_text().splitlines()
        assert len(rows) == 2, run


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU engine's head widths")
def test_a_head_width_the_cpu_engine_lacks_is_refused_before_any_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "demo"
    assert cli.main(["demo", "--output-dir", str(out), "--sampler", "vllm", *TOY]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "proxrl demo: error: sampler: vllm's CPU attention does not support head_dim 16 "
        "(hidden_size 64 / num_heads 4); it supports 32, 64, 80, 96, 112, 128, 160, 192, 224, "
        "256, 512: pick num_heads to match (--num-heads 2 at hidden_size 64) or sampler cached"
    )
    assert not out.exists()  # nothing trained, nothing written
