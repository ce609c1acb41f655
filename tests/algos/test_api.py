"""The Python API (``proxrl.api``): every command from Python with in-memory data, loaded
models and Python reward functions, through the same loaders as the command line."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

import proxrl
from proxrl.cli import main
from proxrl.runtime import objects
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.metrics import read_metrics
from tests.algos.errors_cases import API_CASES

WORDS = ["abc", "bca", "cab", "dab", "bad", "fed", "ace", "cafe"]
SFT_ROWS = [{"prompt": f"copy: {w} =", "completion": f" {w}"} for w in WORDS]
PAIRS = [
    {"prompt": f"say: {w} ->", "chosen": " abcd.", "rejected": f" wxyz{i}."}
    for i, w in enumerate(WORDS)
]
PROMPTS = [{"prompt": f"say: {w} ->", "word": w} for w in WORDS]
OFFLINE = dict(batch_size=4, max_steps=2, progress=False, report_to=["none"])
ONLINE = dict(
    iterations=2,
    rollout_batch_size=4,
    mini_batch_size=4,
    max_new_tokens=4,
    progress=False,
    report_to="none",
)


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_sft_from_rows_and_a_loaded_model_trains_that_model(tiny_lm, tmp_path):
    """A loaded model is trained in place (as TRL trains the model it is given), the rows are
    read as a data file's would be, and the run gives the saved model back."""
    model = AutoModelForCausalLM.from_pretrained(tiny_lm)
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm)
    before = _weights(model)

    run = proxrl.sft(
        model=model, tokenizer=tokenizer, data=SFT_ROWS, output_dir=tmp_path / "sft", **OFFLINE
    )

    assert run.output_dir == tmp_path / "sft" and run.command == "sft"
    last = read_metrics(run.output_dir)[-1]
    assert last["step"] == 2 and run.metrics["train/loss"] == last["train/loss"]
    saved = run.model.state_dict()
    after = model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    for key, value in saved.items():
        torch.testing.assert_close(value, after[key], rtol=0, atol=0)
    config = yaml.safe_load((run.output_dir / "config.yaml").read_text())
    assert config["model"] == "python:model"
    assert config["data"] == f"python:data@{objects.fingerprint(SFT_ROWS)}"
    assert not objects.is_handle("python:model"), "the run's objects are forgotten after it"


def test_rows_as_a_file_and_as_a_list_train_the_same_model(tiny_lm, tmp_path):
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in SFT_ROWS))
    from_file = proxrl.sft(model=tiny_lm, data=str(path), output_dir=tmp_path / "a", **OFFLINE)
    from_list = proxrl.sft(
        model=tiny_lm,
        data=datasets.Dataset.from_list(SFT_ROWS),
        output_dir=tmp_path / "b",
        **OFFLINE,
    )
    assert from_file.metrics["train/loss"] == from_list.metrics["train/loss"]
    for key, value in from_file.model.state_dict().items():
        torch.testing.assert_close(value, from_list.model.state_dict()[key], rtol=0, atol=0)


def test_rm_and_dpo_from_a_dataset(tiny_lm, tmp_path):
    pairs = datasets.Dataset.from_list(PAIRS)
    rm = proxrl.train("rm", model=tiny_lm, data=pairs, output_dir=tmp_path / "rm", **OFFLINE)
    assert type(rm.model).__name__ == "LlamaForSequenceClassification"
    assert "train/accuracy" in rm.metrics
    dpo = proxrl.dpo(  # a mapping may hold Python objects too
        {"model": tiny_lm, "data": PAIRS, "eval-fraction": 0.25},
        output_dir=tmp_path / "dpo",
        **OFFLINE,
    )
    assert {"train/loss", "eval/loss"} <= dpo.metrics.keys()
    assert (dpo.output_dir / "model.safetensors").is_file()


def test_grpo_with_a_python_reward_function_and_prompt_columns(tiny_lm, tmp_path):
    calls: list[int] = []

    def has_word(prompts, completions, word, **columns):
        calls.append(len(completions))
        return [float(w in c) for w, c in zip(word, completions, strict=True)]

    run = proxrl.grpo(
        model=tiny_lm,
        prompts=datasets.Dataset.from_list(PROMPTS),
        reward_fn=[has_word, lambda prompts, completions, **cols: [0.5] * len(completions)],
        group_size=2,
        output_dir=tmp_path / "grpo",
        **ONLINE,
    )
    assert calls == [8, 8]  # 4 prompts × 2 responses, 2 iterations
    rows = read_metrics(run.output_dir)
    assert [r["reward/lambda"] for r in rows] == [0.5, 0.5]
    assert all(0 <= r["reward/has_word"] <= 1 for r in rows)
    assert yaml.safe_load((run.output_dir / "config.yaml").read_text())["reward_fn"] == [
        "python:has_word",
        "python:lambda",
    ]


def test_ppo_with_loaded_policy_and_reward_model_keeps_the_reference_frozen(tiny_lm, tmp_path):
    """The actor object is trained; the reference (and the critic started from the reward model)
    are copies, so the KL to the reference grows from 0 instead of staying 0."""
    rm = proxrl.rm(model=tiny_lm, data=PAIRS, output_dir=tmp_path / "rm", **OFFLINE)
    policy = AutoModelForCausalLM.from_pretrained(tiny_lm)
    reward_model = rm.model
    reward_before = _weights(reward_model)
    run = proxrl.ppo(
        model=policy,
        tokenizer=AutoTokenizer.from_pretrained(tiny_lm),
        reward_model=reward_model,
        prompts=PROMPTS,
        output_dir=tmp_path / "ppo",
        learning_rate=1e-2,
        **ONLINE,
    )
    rows = read_metrics(run.output_dir)
    assert rows[0]["objective/kl"] == 0.0 and rows[1]["objective/kl"] != 0.0
    for key, value in reward_model.state_dict().items():  # frozen, and not the critic
        torch.testing.assert_close(value, reward_before[key], rtol=0, atol=0)
    for key, value in run.model.state_dict().items():
        torch.testing.assert_close(value, policy.state_dict()[key], rtol=0, atol=0)
    assert (run.output_dir / "critic" / "config.json").is_file()


def test_a_config_object_runs_as_the_command_line_does(tiny_lm, tmp_path, monkeypatch):
    """``proxrl.config`` + ``proxrl.train(cfg)`` and ``proxrl sft`` write the same run."""
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in SFT_ROWS))
    options = dict(model=tiny_lm, data=str(data), max_steps=2, batch_size=4, report_to=["none"])
    cfg = proxrl.config("sft", options, output_dir=str(tmp_path / "py"), progress=False)
    python = proxrl.train(cfg)
    argv = [
        f"--{k}={v}" if not isinstance(v, list) else f"--{k}={v[0]}" for k, v in options.items()
    ]
    assert main(["sft", *argv, f"--output-dir={tmp_path / 'cli'}", "--no-progress"]) == 0
    cli_rows = read_metrics(tmp_path / "cli")
    assert [r["train/loss"] for r in read_metrics(python.output_dir)] == [
        r["train/loss"] for r in cli_rows
    ]
    assert (tmp_path / "cli" / "README.md").is_file()


def test_a_yaml_file_and_options_on_top(tiny_lm, tmp_path):
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in SFT_ROWS))
    config = tmp_path / "sft.yaml"
    config.write_text(f"model: {tiny_lm}\ndata: {data}\nmax_steps: 5\nbatch_size: eight\n")
    cfg = proxrl.config("sft", config, batch_size=2, max_steps=1)  # the file's bad value unused
    assert (cfg.batch_size, cfg.max_steps, cfg.data) == (2, 1, str(data))


@pytest.fixture(scope="module")
def error_workspace(tiny_lm, tmp_path_factory) -> Path:
    from tests.algos.errors_cases import build_workspace

    return build_workspace(tmp_path_factory.mktemp("api-errors") / "ws", tiny_lm)


@pytest.mark.parametrize("case", API_CASES, ids=[c.what for c in API_CASES])
def test_bad_api_call_gets_its_documented_message(case, error_workspace, tmp_path, monkeypatch):
    import shutil

    from peft import LoraConfig, get_peft_model

    workspace = tmp_path / "ws"
    shutil.copytree(error_workspace, workspace)
    monkeypatch.chdir(workspace)
    before = {str(p): p.read_bytes() for p in workspace.rglob("*") if p.is_file()}
    model = AutoModelForCausalLM.from_pretrained("model")
    fresh = type(model.config)(
        **{k: v for k, v in model.config.to_dict().items() if k != "_name_or_path"}
    )
    bare_model = AutoModelForCausalLM.from_config(fresh)  # built in a notebook: no name
    namespace = {
        "proxrl": proxrl,
        "model": model,
        "tokenizer": AutoTokenizer.from_pretrained("model"),
        "peft_model": get_peft_model(
            AutoModelForCausalLM.from_pretrained("model"),
            LoraConfig(r=2, target_modules=["q_proj"]),
        ),
        "bare_model": bare_model,
        "rows": [json.loads(line) for line in Path("sft.jsonl").read_text().splitlines()],
    }
    with pytest.raises(ProxrlError) as raised:
        eval(case.code, namespace)  # noqa: S307 (the cases are this repository's own)
    assert str(raised.value) == case.message
    assert {str(p): p.read_bytes() for p in workspace.rglob("*") if p.is_file()} == before


def test_resume_sees_the_same_rows_as_unchanged_and_other_rows_as_a_change(tiny_lm, tmp_path):
    from proxrl.runtime.resume import check_resume

    out = tmp_path / "sft"
    proxrl.sft(model=tiny_lm, data=SFT_ROWS, output_dir=out, **OFFLINE)
    same = proxrl.config(
        "sft", model=tiny_lm, data=list(SFT_ROWS), output_dir=out, resume=True, **OFFLINE
    )
    check_resume(same)  # the same rows (another list object): the same handle
    other = proxrl.config(
        "sft", model=tiny_lm, data=SFT_ROWS[:4], output_dir=out, resume=True, **OFFLINE
    )
    with pytest.raises(ProxrlError, match=r"--resume: data is 'python:data@"):
        check_resume(other)


def test_classic_from_python_reports_to_its_trackers(tmp_path):
    run = proxrl.train(
        "classic",
        env="CartPole-v1",
        num_envs=2,
        num_steps=64,
        mini_batch_size=32,
        ppo_epochs=1,
        total_steps=128,
        output_dir=tmp_path / "cartpole",
        progress=False,
        report_to=["tensorboard"],
    )
    assert run.command == "classic" and [r["global_step"] for r in read_metrics(run.output_dir)]
    assert (run.output_dir / "tensorboard").is_dir()
    assert not (run.output_dir / "README.md").exists()  # no transformers model, no card


def test_resume_from_python_starts_from_the_runs_saved_config(tiny_lm, tmp_path):
    """``resume=True`` from Python reads the run's config.yaml as ``--resume`` does: a run of
    4 steps with non-default options, cut back to its checkpoint at step 2, resumes from
    ``output_dir`` and ``resume`` alone and ends where the uninterrupted run ended."""
    import shutil

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in SFT_ROWS * 2))
    out = tmp_path / "sft"
    options = dict(batch_size=4, learning_rate=0.01, seed=5, progress=False, report_to=["none"])
    proxrl.sft(model=tiny_lm, data=str(data), output_dir=out, save_every=1, **options)
    uninterrupted = [row["train/loss"] for row in read_metrics(out)]
    assert len(uninterrupted) == 4
    for step in (3, 4):
        shutil.rmtree(out / "checkpoints" / f"step_{step:09d}")

    run = proxrl.sft(output_dir=out, resume=True, progress=False)

    assert [row["train/loss"] for row in read_metrics(out)] == uninterrupted
    assert run.config.learning_rate == 0.01 and run.config.seed == 5


def test_resume_from_python_asks_again_for_the_objects_the_run_was_given(tiny_lm, tmp_path):
    out = tmp_path / "sft"
    proxrl.sft(model=tiny_lm, data=SFT_ROWS, output_dir=out, **OFFLINE)
    handle = yaml.safe_load((out / "config.yaml").read_text())["data"]
    with pytest.raises(ProxrlError) as raised:
        proxrl.config("sft", output_dir=out, resume=True)
    assert str(raised.value) == (
        f"proxrl.sft(): resume: data of the run in {out} was a Python object ({handle}); "
        "pass it again as data=..."
    )
    again = proxrl.config("sft", data=SFT_ROWS, output_dir=out, resume=True)
    assert again.model == tiny_lm and again.max_steps == OFFLINE["max_steps"]
