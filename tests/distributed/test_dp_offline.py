"""Two data-parallel CPU processes (gloo) give the same run as one process with the same
global config, for ``proxrl sft`` (launched with ``accelerate launch``) and ``proxrl dpo``
(launched with ``torchrun``).

Each config is global: ``batch_size`` examples per micro-batch across all ranks, split 2 ways;
41 SFT rows with batch_size 8 leave a last micro-batch of one example, so one rank holds no
example of that step (it must still join the gradient all-reduce). Weights are float64, so the
only differences are summation order (per-rank partial sums, padding to a shorter length):

- per-step ``train/loss``: |1 proc − 2 procs| ≤ 1e-10 (measured ~1e-15);
- final weights: max |Δ| ≤ 1e-9 (measured ~1e-15; each weight moved ~1e-2, so a wrong
  normaliser, e.g. per-rank instead of global token counts, shows as ~1e-3).
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file

from proxrl.runtime.metrics import read_metrics
from tests.algos.lm_tasks import preference_rows, sft_rows, write_jsonl
from tests.distributed.launch import accelerate_launch, check, torchrun

LOSS_TOL = 1e-10
WEIGHT_TOL = 1e-9


def _write_config(path: Path, fields: dict) -> str:
    path.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in fields.items()))
    return str(path)


def _compare(one: Path, two: Path, start: str) -> tuple[float, float, float]:
    """(max |Δ loss| over steps, max |Δ weight|, max |weight − start|)."""
    rows_one, rows_two = read_metrics(one), read_metrics(two)
    assert [r["step"] for r in rows_one] == [r["step"] for r in rows_two]
    assert len(rows_one) >= 4
    loss_diff = max(
        abs(a["train/loss"] - b["train/loss"]) for a, b in zip(rows_one, rows_two, strict=True)
    )
    w1, w2 = load_file(str(one / "model.safetensors")), load_file(str(two / "model.safetensors"))
    w0 = load_file(str(Path(start) / "model.safetensors"))
    assert w1.keys() == w2.keys()
    weight_diff = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    moved = max(float((w1[k] - w0[k].to(w1[k].dtype)).abs().max()) for k in w1 if k in w0)
    return loss_diff, weight_diff, moved


def _run_one_process(module, cfg_path: str, output_dir: Path) -> None:
    from proxrl.runtime.config import parse_config

    argv = ["--config", cfg_path, "--output-dir", str(output_dir)]
    module.train(parse_config(module.Config, argv, prog="proxrl"))


def test_sft_two_processes_match_one(tiny_lm, tmp_path):
    from proxrl.algos.offline import sft

    cfg = _write_config(
        tmp_path / "sft.yaml",
        {
            "model": tiny_lm,
            "data": write_jsonl(tmp_path / "train.jsonl", sft_rows(41, seed=0)),
            "batch_size": 8,
            "grad_accum": 2,
            "epochs": 2,
            "learning_rate": 3e-3,
            "dtype": "float64",
            "progress": False,
            "save_every": 2,
        },
    )
    _run_one_process(sft, cfg, tmp_path / "one")
    result = accelerate_launch(
        ["-m", "proxrl", "sft", "--config", cfg, "--output-dir", str(tmp_path / "two")]
    )
    check(result)
    loss_diff, weight_diff, moved = _compare(tmp_path / "one", tmp_path / "two", tiny_lm)
    print(
        f"sft 1 vs 2 processes: max |Δloss| {loss_diff:.2e}, max |Δw| {weight_diff:.2e}, "
        f"moved {moved:.2e}"
    )
    assert moved > 1e-3
    assert loss_diff <= LOSS_TOL
    assert weight_diff <= WEIGHT_TOL
    # Rank 0 alone wrote: one metrics row per step, checkpoints once.
    assert len(read_metrics(tmp_path / "two")) == len(read_metrics(tmp_path / "one"))
    ckpts = sorted(p.name for p in (tmp_path / "two" / "checkpoints").iterdir())
    assert ckpts == sorted(p.name for p in (tmp_path / "one" / "checkpoints").iterdir())


def test_dpo_two_processes_match_one_under_torchrun(tiny_lm, tmp_path):
    from proxrl.algos.offline import dpo

    cfg = _write_config(
        tmp_path / "dpo.yaml",
        {
            "model": tiny_lm,
            "data": write_jsonl(tmp_path / "pairs.jsonl", preference_rows(32, seed=0)),
            "batch_size": 4,
            "grad_accum": 2,
            "epochs": 1,
            "learning_rate": 3e-3,
            "beta": 0.5,
            "dtype": "float64",
            "progress": False,
        },
    )
    _run_one_process(dpo, cfg, tmp_path / "one")
    check(torchrun(["-m", "proxrl", "dpo", "--config", cfg, "--output-dir", str(tmp_path / "two")]))
    loss_diff, weight_diff, moved = _compare(tmp_path / "one", tmp_path / "two", tiny_lm)
    print(
        f"dpo 1 vs 2 processes: max |Δloss| {loss_diff:.2e}, max |Δw| {weight_diff:.2e}, "
        f"moved {moved:.2e}"
    )
    assert moved > 1e-3
    assert loss_diff <= LOSS_TOL
    assert weight_diff <= WEIGHT_TOL
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    for key in ("rewards/accuracies", "rewards/margins"):  # stats reduced over ranks too
        assert max(abs(a[key] - b[key]) for a, b in zip(one, two, strict=True)) <= LOSS_TOL


def test_batch_that_does_not_divide_is_an_error_naming_the_field(tiny_lm, tmp_path):
    cfg = _write_config(
        tmp_path / "sft.yaml",
        {
            "model": tiny_lm,
            "data": write_jsonl(tmp_path / "train.jsonl", sft_rows(8, seed=0)),
            "batch_size": 3,
            "progress": False,
        },
    )
    result = torchrun(
        ["-m", "proxrl", "sft", "--config", cfg, "--output-dir", str(tmp_path / "run")]
    )
    assert result.returncode != 0
    assert "batch_size: the global batch of 3 does not divide across 2 processes" in result.stderr


def test_a_two_process_checkpoint_resumes_on_one_process(tiny_lm, tmp_path):
    """3 steps on 2 processes, then ``--resume`` on 1 process to step 6, equals 6 steps on 1
    process (constant learning rate, so max_steps does not change the schedule): the checkpoint
    holds the global state, whatever the world size that wrote it. Float64, |Δ| ≤ 1e-9."""
    from proxrl.algos.offline import sft

    fields = {
        "model": tiny_lm,
        "data": write_jsonl(tmp_path / "train.jsonl", sft_rows(48, seed=0)),
        "batch_size": 8,
        "grad_accum": 1,
        "learning_rate": 3e-3,
        "lr_schedule": "constant",
        "dtype": "float64",
        "progress": False,
    }
    three = _write_config(tmp_path / "three.yaml", fields | {"max_steps": 3})
    six = _write_config(tmp_path / "six.yaml", fields | {"max_steps": 6})
    check(
        torchrun(
            ["-m", "proxrl", "sft", "--config", three, "--output-dir", str(tmp_path / "resumed")]
        )
    )
    from proxrl.runtime.config import parse_config

    # extending the run changes max_steps: a changed option, so --resume-with-changes
    sft.train(
        parse_config(
            sft.Config,
            [
                "--config",
                six,
                "--output-dir",
                str(tmp_path / "resumed"),
                "--resume",
                "--resume-with-changes",
            ],
            prog="proxrl",
        )
    )
    _run_one_process(sft, six, tmp_path / "straight")
    loss_diff, weight_diff, moved = _compare(tmp_path / "straight", tmp_path / "resumed", tiny_lm)
    print(
        f"sft 2-proc checkpoint resumed on 1 proc: max |Δloss| {loss_diff:.2e}, "
        f"max |Δw| {weight_diff:.2e}"
    )
    assert moved > 1e-3
    assert loss_diff <= LOSS_TOL
    assert weight_diff <= WEIGHT_TOL


def test_reward_model_two_processes_match_one(tiny_lm, tmp_path):
    """``proxrl rm`` (whose loss calls the backbone and score head directly) on 2 processes."""
    from proxrl.algos.offline import reward

    cfg = _write_config(
        tmp_path / "rm.yaml",
        {
            "model": tiny_lm,
            "data": write_jsonl(tmp_path / "pairs.jsonl", preference_rows(32, seed=0)),
            "batch_size": 4,
            "grad_accum": 2,
            "epochs": 1,
            "learning_rate": 3e-3,
            "dtype": "float64",
            "progress": False,
        },
    )
    _run_one_process(reward, cfg, tmp_path / "one")
    check(torchrun(["-m", "proxrl", "rm", "--config", cfg, "--output-dir", str(tmp_path / "two")]))
    loss_diff, weight_diff, moved = _compare(tmp_path / "one", tmp_path / "two", tiny_lm)
    print(
        f"rm 1 vs 2 processes: max |Δloss| {loss_diff:.2e}, max |Δw| {weight_diff:.2e}, "
        f"moved {moved:.2e}"
    )
    assert moved > 1e-3
    assert loss_diff <= LOSS_TOL
    assert weight_diff <= WEIGHT_TOL
