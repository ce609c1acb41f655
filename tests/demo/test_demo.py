"""``proxrl demo`` at toy size (every stage runs, every artefact is written), the synthetic
task's exact measure and splits, held-out evaluation, and ``proxrl report`` on a hand-written
metrics file."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from proxrl import cli
from proxrl.demo import pipeline, task

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STAGES = [
    "data",
    "base_model",
    "sft",
    "reward_model",
    "ppo",
    "ppo_no_kl",
    "grpo",
    "evaluate",
    "report",
]
TOY = [
    "--sft-examples",
    "48",
    "--preference-pairs",
    "48",
    "--preference-eval-pairs",
    "16",
    "--rl-prompts",
    "16",
    "--eval-prompts",
    "8",
    "--eval-samples",
    "2",
    "--hidden-size",
    "16",
    "--num-layers",
    "1",
    "--sft-epochs",
    "1",
    "--rm-epochs",
    "1",
    "--batch-size",
    "16",
    "--rl-iterations",
    "2",
    "--rollout-batch-size",
    "4",
    "--no-progress",
    "--seed",
    "3",
]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def toy_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The whole demo through the command line, at toy size."""
    out = tmp_path_factory.mktemp("demo") / "demo"
    assert cli.main(["demo", "--output-dir", str(out), *TOY]) == 0
    return out


# ------------------------------------------------------------------------------- the pipeline


def test_every_stage_ran_and_summary_has_the_issue_shape(toy_demo: Path) -> None:
    summary = json.loads((toy_demo / "summary.json").read_text())
    assert set(summary) == {"reward_model", "policies", "wall_s", "peak_rss_mb"}
    assert set(summary["reward_model"]) == {"heldout_accuracy"}
    assert 0 <= summary["reward_model"]["heldout_accuracy"] <= 1
    assert list(summary["policies"]) == ["sft", "ppo", "ppo_no_kl", "grpo"]
    for name, scores in summary["policies"].items():
        assert set(scores) == {"gold", "proxy", "kl"}, name
        assert 0 <= scores["gold"] <= 1
    assert summary["policies"]["sft"]["kl"] == 0.0
    assert [k for k in summary["wall_s"] if k != "startup"] == [
        "total",
        *STAGES,
    ]  # startup: Linux only
    assert all(v >= 0 for v in summary["wall_s"].values())
    assert (
        summary["wall_s"]["total"]
        >= sum(v for k, v in summary["wall_s"].items() if k != "total") - 0.1
    )
    # the process's peak so far (in a full test session, earlier tests' peaks count too)
    from proxrl.demo.pipeline import peak_rss_mb

    assert 100 < summary["peak_rss_mb"] <= peak_rss_mb() + 0.1


def test_the_rl_runs_take_the_demos_small_vllm_share(toy_demo: Path) -> None:
    """The demo's 0.05, not ppo's 0.3 (0.3 of RAM for a toy model's KV cache can exceed what a
    CPU machine's NUMA node has free, and vLLM then refuses to start), where the RL runs sample
    with vllm; the cached sampler's runs are not given it (a knob of sampler vllm only)."""
    vllm = pipeline.online_fields(pipeline.Config(sampler="vllm"), toy_demo, "ppo")
    assert vllm["vllm_gpu_memory_utilization"] == 0.05
    for run in ("ppo", "ppo_no_kl", "grpo"):
        config = (toy_demo / run / "config.yaml").read_text()
        assert "\nsampler: cached\nvllm_gpu_memory_utilization: 0.3\n" in config, run


def test_every_artefact_was_written(toy_demo: Path) -> None:
    for split in ("sft", "preferences", "preferences_eval", "rl_prompts", "eval_prompts"):
        assert (toy_demo / "data" / f"{split}.jsonl").stat().st_size > 0, split
    for model in ("base", "sft", "rm", "ppo", "ppo_no_kl", "grpo"):
        assert (toy_demo / model / "config.json").exists(), model
        assert (toy_demo / model / "model.safetensors").exists(), model
    for run in ("sft", "rm", "ppo", "ppo_no_kl", "grpo"):
        assert (toy_demo / run / "metrics.jsonl").stat().st_size > 0, run
        assert (toy_demo / run / "README.md").read_text().startswith("---\n"), run  # model card
    for run in ("ppo", "ppo_no_kl", "grpo"):
        rows = [
            json.loads(line) for line in (toy_demo / run / "metrics.jsonl").read_text().splitlines()
        ]
        assert len(rows) == 2
        # the signal a run does not optimise is logged beside the one it does
        assert all("reward/gold" in r and "reward/reward_model" in r for r in rows), run
        assert (toy_demo / run / "samples.jsonl").exists()
    samples = [
        json.loads(line) for line in (toy_demo / "eval_samples.jsonl").read_text().splitlines()
    ]
    assert {r["policy"] for r in samples} == {"sft", "ppo", "ppo_no_kl", "grpo"}
    assert len(samples) == 4 * 8 * 2  # policies × eval prompts × samples per prompt
    assert all(r["correct"] == task.is_correct(r["prompt"], r["completion"]) for r in samples)


def test_report_links_plots_that_exist(toy_demo: Path) -> None:
    report = (toy_demo / "report.md").read_text()
    links = [
        line.split("](")[1].rstrip(")") for line in report.splitlines() if line.startswith("![")
    ]
    assert "plots/gold_vs_proxy.png" in links
    assert {"plots/score.png", "plots/kl.png", "plots/value_loss.png"} <= set(links)
    for link in links:
        assert (toy_demo / link).read_bytes()[:8] == PNG_MAGIC, link
    summary = json.loads((toy_demo / "summary.json").read_text())
    assert f"| ppo | {summary['policies']['ppo']['gold']:.3f} |" in report


def test_the_gold_summary_is_the_share_of_correct_samples(toy_demo: Path) -> None:
    summary = json.loads((toy_demo / "summary.json").read_text())
    samples = [
        json.loads(line) for line in (toy_demo / "eval_samples.jsonl").read_text().splitlines()
    ]
    for policy, scores in summary["policies"].items():
        rows = [r for r in samples if r["policy"] == policy]
        assert scores["gold"] == pytest.approx(
            sum(r["correct"] for r in rows) / len(rows), abs=1e-4
        )
        assert scores["proxy"] == pytest.approx(sum(r["proxy"] for r in rows) / len(rows), abs=1e-3)


def test_kl_of_an_identical_copy_is_zero_and_of_a_changed_policy_positive(toy_demo: Path) -> None:
    """evaluate_policy's KL: a second copy of the SFT weights gives exactly 0; the PPO policy,
    which moved, gives a positive mean (k1 on its own samples is unbiased for KL ≥ 0)."""
    from proxrl.data.formats import load_prompt_examples
    from proxrl.demo.evaluate import evaluate_policy
    from proxrl.models.causal_lm import load_causal_lm
    from proxrl.models.scalar_head import load_score_model
    from proxrl.models.tokenizer import load_tokenizer
    from proxrl.rollout.rewards import RewardModelReward

    tokenizer = load_tokenizer(str(toy_demo / "sft"))
    sft = load_causal_lm(str(toy_demo / "sft")).eval()
    copy = load_causal_lm(str(toy_demo / "sft")).eval()
    rm = RewardModelReward(
        load_score_model(str(toy_demo / "rm")).eval(), load_tokenizer(str(toy_demo / "rm"))
    )
    prompts = load_prompt_examples(str(toy_demo / "data" / "eval_prompts.jsonl"))
    same = evaluate_policy(copy, sft, rm, tokenizer, prompts, 4, 4, seed=0)
    assert same.kl == 0.0
    assert (
        evaluate_policy(sft, sft, rm, tokenizer, prompts, 4, 4, seed=0).samples == same.samples
    )  # seeded
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(0.5 * torch.randn_like(p))
    assert evaluate_policy(copy, sft, rm, tokenizer, prompts, 8, 4, seed=0).kl > 0


def test_the_demo_never_deletes_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    assert cli.main(["demo", "--output-dir", str(foreign), *TOY]) == 2
    assert (foreign / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("flag", "field"), [(["--demo-accuracy", "0"], "demo_accuracy"), (["--resume"], "resume")]
)
def test_bad_demo_option_is_a_one_line_error(
    flag: list[str], field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["demo", "--output-dir", str(tmp_path / "d"), *flag]) == 2
    err = capsys.readouterr().err
    assert field in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "d").exists()


def test_a_demo_stopped_by_ctrl_c_resumes_to_the_uninterrupted_results(
    toy_demo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGINT during GRPO: the trainer saves a checkpoint and the demo exits 130. ``--resume``
    then runs none of the finished stages again, continues GRPO from its checkpoint and ends
    with exactly the summary of the demo that was never interrupted (same options, same seed)."""
    import os
    import signal

    from proxrl.algos.offline import reward, sft
    from proxrl.algos.online import grpo, ppo
    from proxrl.runtime import metrics

    out = tmp_path / "demo"
    original_log = metrics.MetricsLogger.log

    def interrupt_grpo(self, step, row):  # type: ignore[no-untyped-def]
        result = original_log(self, step, row)
        if self.path.parent.name == "grpo" and step == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return result

    monkeypatch.setattr(metrics.MetricsLogger, "log", interrupt_grpo)
    assert cli.main(["demo", "--output-dir", str(out), *TOY]) == 130
    assert not (out / "summary.json").exists() and (out / "grpo" / "checkpoints").is_dir()

    monkeypatch.setattr(metrics.MetricsLogger, "log", original_log)
    for module in (sft, reward, ppo):
        monkeypatch.setattr(
            module, "train", lambda cfg, **_: pytest.fail(f"{cfg.output_dir} ran again")
        )
    grpo_configs = []
    grpo_train = grpo.train
    monkeypatch.setattr(
        grpo, "train", lambda cfg, **kw: grpo_configs.append(cfg) or grpo_train(cfg, **kw)
    )
    assert cli.main(["demo", "--output-dir", str(out), *TOY, "--resume"]) == 0
    assert [c.resume for c in grpo_configs] == [True]  # from its checkpoint, not from scratch
    resumed, uninterrupted = (json.loads((d / "summary.json").read_text()) for d in (out, toy_demo))
    for key in ("reward_model", "policies"):
        assert resumed[key] == uninterrupted[key]


def test_resume_refuses_other_options(toy_demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        cli.main(["demo", "--output-dir", str(toy_demo), *TOY, "--rl-iterations", "3", "--resume"])
        == 2
    )
    assert "--resume: rl_iterations is 3 but the demo in" in capsys.readouterr().err


def test_resuming_the_finished_demo_from_its_directory_alone_says_it_is_finished(
    toy_demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--resume`` starts from demo_config.yaml (the toy options need not be given again) and a
    finished demo is left untouched: one line, exit 0."""
    before = {p: p.read_bytes() for p in sorted(toy_demo.rglob("*")) if p.is_file()}
    capsys.readouterr()
    assert cli.main(["demo", "--output-dir", str(toy_demo), "--resume"]) == 0
    assert capsys.readouterr().out == (
        f"proxrl demo: the demo in {toy_demo} is already finished (its summary.json is written); "
        "nothing to do\n"
    )
    assert {p: p.read_bytes() for p in sorted(toy_demo.rglob("*")) if p.is_file()} == before


def test_resume_with_changes_keeps_finished_stages_and_runs_with_the_new_options(
    toy_demo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one resume policy (runtime.resume): a changed option goes through with
    ``--resume-with-changes``; the finished stages are kept and demo_config.yaml is rewritten."""
    import shutil

    import yaml

    from proxrl.algos.offline import reward, sft
    from proxrl.algos.online import grpo, ppo

    out = tmp_path / "demo"
    shutil.copytree(toy_demo, out)
    for module in (sft, reward, ppo, grpo):
        monkeypatch.setattr(
            module, "train", lambda cfg, **_: pytest.fail(f"{cfg.output_dir} ran again")
        )
    changed = [arg if arg != "3" else "4" for arg in TOY]  # --seed 3 → 4
    assert cli.main(["demo", "--output-dir", str(out), *changed, "--resume"]) == 2
    assert (
        cli.main(["demo", "--output-dir", str(out), *changed, "--resume", "--resume-with-changes"])
        == 0
    )
    assert yaml.safe_load((out / "demo_config.yaml").read_text())["seed"] == 4
    assert json.loads((out / "summary.json").read_text())["policies"].keys() == {
        "sft",
        "ppo",
        "ppo_no_kl",
        "grpo",
    }


# ------------------------------------------------------------------------------- the task


def test_gold_is_exact() -> None:
    prompts = ["max 3 8 1 5 =", "max 3 8 1 5 =", "max 3 8 1 5 =", "max 0 0 7 2 =", "max 9 9 1 2 ="]
    completions = [" 8", "8 ", " 5", " 7 7", " 9"]
    assert task.gold(prompts, completions) == [1.0, 1.0, 0.0, 0.0, 1.0]
    with pytest.raises(ValueError):
        task.answer_of("max 3 8 =x")


def test_splits_are_disjoint_and_the_data_tells_the_story(tmp_path: Path) -> None:
    sizes = task.TaskSizes(
        sft=400, preference=300, preference_eval=100, rl=100, eval=100, demo_accuracy=0.3
    )
    paths = task.generate(tmp_path, sizes, seed=5)
    rows = {
        name: [json.loads(line) for line in path.read_text().splitlines()]
        for name, path in paths.items()
    }
    assert {name: len(r) for name, r in rows.items()} == {
        "sft": 400,
        "preferences": 300,
        "preferences_eval": 100,
        "rl_prompts": 100,
        "eval_prompts": 100,
    }
    prompt_sets = [{r["prompt"] for r in split} for split in rows.values()]
    assert sum(len(s) for s in prompt_sets) == len(
        set().union(*prompt_sets)
    )  # no prompt in two splits
    sft_accuracy = sum(task.is_correct(r["prompt"], r["completion"]) for r in rows["sft"]) / 400
    assert 0.22 < sft_accuracy < 0.38  # 0.3 ± 3.5 binomial standard deviations
    for r in rows["sft"]:  # the sloppy annotator names a digit of the list
        assert r["completion"].strip() in r["prompt"].split()[1:-1]
    for r in rows["preferences"] + rows["preferences_eval"]:
        assert task.is_correct(r["prompt"], r["chosen"]) and not task.is_correct(
            r["prompt"], r["rejected"]
        )
    for r in rows["eval_prompts"]:
        assert r["answer"] == task.answer_of(r["prompt"])
    again = task.generate(tmp_path / "again", sizes, seed=5)
    assert all(again[n].read_text() == paths[n].read_text() for n in paths)  # seeded


def test_off_list_rejects_are_digits_outside_the_list() -> None:
    rng = random.Random(0)
    prompt = "max 1 2 3 4 ="
    on_list = {task.wrong_answer(rng, prompt, off_list=0.0) for _ in range(200)}
    assert on_list == {"1", "2", "3"}
    anywhere = {task.wrong_answer(rng, prompt, off_list=1.0) for _ in range(500)}
    assert anywhere == {str(d) for d in range(10)} - {"4"}


# ------------------------------------------------------------------------------- proxrl report

METRICS = [
    {
        "step": i,
        "objective/scores": 0.1 * i,
        "objective/kl": 0.05 * i,
        "policy/kl_coef": 0.1,
        "value/loss": 1.0 / i,
        "policy/clipfrac": 0.02 * i,
        "objective/entropy": 2.0 - 0.1 * i,
        "response/length_mean": 4.0 + i,
        "reward/gold": 0.2 + 0.05 * i,
        "reward/reward_model": 0.3 * i,
    }
    for i in range(1, 7)
]


def _write_run(run: Path, metrics: list[dict], samples: list[dict] | None = None) -> None:
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    if samples is not None:
        (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))


def test_report_on_a_small_metrics_file(tmp_path: Path) -> None:
    samples = [
        {"iteration": it, "prompt": f"max 1 {it} =", "completion": f" c{it}|{k}", "score": 0.5 * it}
        for it in (1, 6)
        for k in range(5)
    ]
    _write_run(tmp_path / "run", METRICS, samples)
    assert cli.main(["report", str(tmp_path / "run"), "--samples", "2"]) == 0
    expected = [
        "score",
        "kl",
        "kl_coef",
        "value_loss",
        "clip_fraction",
        "entropy",
        "response_length",
        "gold_vs_proxy",
    ]
    for name in expected:
        assert (tmp_path / "run" / "plots" / f"{name}.png").read_bytes()[:8] == PNG_MAGIC, name
    assert not (tmp_path / "run" / "plots" / "loss.png").exists()  # no run logged train/loss
    report = (tmp_path / "run" / "report.md").read_text()
    for name in expected:
        assert f"(plots/{name}.png)" in report
    # two samples before (iteration 1) and two after (iteration 6), "|" escaped for the table
    assert "| before | `max 1 1 =` | ` c1\\|0` | +0.500 |" in report
    assert "| after | `max 1 6 =` | ` c6\\|1` | +3.000 |" in report
    assert "c1\\|2" not in report


def test_report_overlays_a_directory_of_runs(tmp_path: Path) -> None:
    _write_run(tmp_path / "runs" / "a", METRICS)
    _write_run(
        tmp_path / "runs" / "b", [{"step": 1, "train/loss": 2.0}, {"step": 2, "train/loss": 1.5}]
    )
    assert cli.main(["report", str(tmp_path / "runs")]) == 0
    report = (tmp_path / "runs" / "report.md").read_text()
    assert "Runs: a, b." in report
    assert "(plots/loss.png)" in report and "(plots/gold_vs_proxy.png)" in report


def test_report_without_metrics_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["report", str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
