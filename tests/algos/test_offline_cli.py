"""`proxrl sft|rm|dpo` from the command line: a YAML config plus overrides runs end to end, and
each bad input is one line on stderr with exit code 2, leaving no run directory behind."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from proxrl.cli import main
from tests.algos.lm_tasks import preference_rows, sft_rows, write_jsonl


def _run(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err.strip()


def _one_line_error(code: int, err: str, command: str, *needles: str) -> None:
    assert code == 2
    last = err.splitlines()[-1]
    assert last.startswith(f"proxrl {command}: error: ")
    for needle in needles:
        assert needle in last, last
    assert "Traceback" not in err


def test_yaml_config_with_overrides_runs_sft_end_to_end(tiny_lm, tmp_path, capsys):
    data = write_jsonl(tmp_path / "d.jsonl", sft_rows(32, seed=0))
    config = tmp_path / "sft.yaml"
    config.write_text(
        f"model: {tiny_lm}\ndata: {data}\nbatch_size: 8\nlearning_rate: 0.001\nprogress: false\n"
    )
    out = tmp_path / "run"
    code, err = _run(
        [
            "sft",
            "--config",
            str(config),
            "--output-dir",
            str(out),
            "--max-steps",
            "2",
            "--eval-fraction",
            "0.25",
        ],
        capsys,
    )
    assert code == 0, err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert "eval/loss" in rows[-1]
    assert AutoModelForCausalLM.from_pretrained(out).config.num_hidden_layers == 2


def test_malformed_jsonl_line(tiny_lm, tmp_path, capsys):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "a", "completion": \n')
    code, err = _run(
        ["sft", "--model", tiny_lm, "--data", str(data), "--output-dir", str(tmp_path / "run")],
        capsys,
    )
    _one_line_error(code, err, "sft", f"{data}:2:", "malformed JSON")
    assert not (tmp_path / "run").exists()


def test_missing_field_names_file_line_and_field(tiny_lm, tmp_path, capsys):
    rows = preference_rows(3, seed=0)
    del rows[2]["rejected"]
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    code, err = _run(
        ["rm", "--model", tiny_lm, "--data", data, "--output-dir", str(tmp_path / "run")], capsys
    )
    _one_line_error(code, err, "rm", f"{data}:3:", "missing field 'rejected'")
    assert not (tmp_path / "run").exists()


def test_wrong_type_names_the_field(tiny_lm, tmp_path, capsys):
    rows = preference_rows(3, seed=0)
    rows[1]["chosen"] = 7
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    code, err = _run(
        ["dpo", "--model", tiny_lm, "--data", data, "--output-dir", str(tmp_path / "run")], capsys
    )
    _one_line_error(
        code,
        err,
        "dpo",
        f"{data}:2:",
        "field 'chosen'",
        "expected a string or a list of messages, got int",
    )


def test_chosen_equal_to_rejected_is_warned_and_dropped_with_a_count(
    tiny_lm, tmp_path, capsys, caplog
):
    rows = preference_rows(16, seed=0)
    for row in rows[:3]:
        row["rejected"] = row["chosen"]
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING):
        code, err = _run(
            [
                "dpo",
                "--model",
                tiny_lm,
                "--data",
                data,
                "--output-dir",
                str(out),
                "--max-steps",
                "1",
                "--batch-size",
                "16",
                "--no-progress",
            ],
            capsys,
        )
    assert code == 0, err
    warnings = [r.getMessage() for r in caplog.records if "equals 'rejected'" in r.getMessage()]
    assert (
        len(warnings) == 1 and "dropped 3 of 16 rows" in warnings[0] and f"{data}:1" in warnings[0]
    )
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[0])["step"] == 1


def test_model_path_that_does_not_exist(tmp_path, capsys):
    data = write_jsonl(tmp_path / "d.jsonl", sft_rows(4, seed=0))
    missing = str(tmp_path / "no-such-model")
    code, err = _run(
        ["sft", "--model", missing, "--data", data, "--output-dir", str(tmp_path / "run")], capsys
    )
    _one_line_error(code, err, "sft", f"model path '{missing}' does not exist")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("how", ["yaml", "flag"])
def test_unknown_config_key_suggests_the_closest(tiny_lm, tmp_path, capsys, how):
    if how == "yaml":
        config = tmp_path / "c.yaml"
        config.write_text(f"model: {tiny_lm}\nlearning_rat: 0.1\n")
        argv = ["rm", "--config", str(config)]
    else:
        argv = ["rm", "--model", tiny_lm, "--learning-rat", "0.1"]
    code, err = _run(argv, capsys)
    _one_line_error(code, err, "rm", "learning", "did you mean")
    assert "learning_rate" in err or "learning-rate" in err


def test_batch_size_zero(tiny_lm, tmp_path, capsys):
    data = write_jsonl(tmp_path / "d.jsonl", sft_rows(4, seed=0))
    code, err = _run(
        [
            "sft",
            "--model",
            tiny_lm,
            "--data",
            data,
            "--batch-size",
            "0",
            "--output-dir",
            str(tmp_path / "run"),
        ],
        capsys,
    )
    _one_line_error(code, err, "sft", "batch_size: expected >= 1, got 0")
    assert not Path(tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("command", "figures"),
    [
        ("sft", ("train/loss", "eval/loss", "eval/perplexity")),
        ("rm", ("train/loss", "eval/loss", "eval/accuracy")),
        ("dpo", ("train/loss", "eval/loss", "eval/rewards/accuracies")),
    ],
)
def test_a_finished_run_ends_with_a_summary_line(command, figures, tiny_lm, tmp_path, caplog):
    """With --no-progress (or piped output) nothing else says how the run ended: the last INFO
    line names the model's directory and the final loss and eval figures, as the metrics hold."""
    rows = sft_rows(16, seed=0) if command == "sft" else preference_rows(16, seed=0)
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    out = tmp_path / "run"
    argv = [command, "--model", tiny_lm, "--data", data, "--output-dir", str(out)]
    with caplog.at_level(logging.INFO, logger="proxrl"):
        assert main([*argv, "--batch-size", "4", "--eval-fraction", "0.25", "--no-progress"]) == 0
    last = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-1]
    expected = f"{command}: finished; model saved in {out}" + "".join(
        f"; {key} {last[key]:.4g}" for key in figures
    )
    assert caplog.records[-1].getMessage() == expected
