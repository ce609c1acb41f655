"""Every shipped example config loads into its command's config class: no unknown key and no
value of the wrong type. (Value validation that looks for the models on disk is left out: the
examples chain on each other's outputs.)"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from proxrl.cli import COMMANDS
from proxrl.runtime.config import load_config_file

EXAMPLES = Path(__file__).resolve().parents[1] / "configs" / "examples"
COMMAND_OF = {
    "sft": "sft",
    "rm": "rm",
    "dpo": "dpo",
    "ppo": "ppo",
    "grpo": "grpo",
    "classic_hopper": "classic",
    "calculator_sft": "sft",
    "calculator_grpo": "grpo",
    "distill": "grpo",
}


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_example_config_loads(path: Path):
    module = importlib.import_module(COMMANDS[COMMAND_OF[path.stem]][0])
    cfg = load_config_file(module.Config, path, validate=False)
    assert cfg.output_dir.startswith("runs/examples/")


def test_every_trainer_has_an_example():
    assert set(COMMAND_OF) == {p.stem for p in EXAMPLES.glob("*.yaml")}


def test_the_sft_example_trains_as_the_demo_does():
    """The ppo/grpo examples start from the sft example's model: it must be trained with the
    demo's SFT settings (not weaker ones), or they start from a worse policy than README's
    numbers imply. Model, data and output directory may differ; what training does may not."""
    from proxrl.algos.offline import sft
    from proxrl.demo.pipeline import Config as DemoConfig
    from proxrl.demo.pipeline import sft_config

    example = load_config_file(sft.Config, EXAMPLES / "sft.yaml", validate=False)
    demo = sft_config(DemoConfig(), Path("runs/demo"), Path("runs/demo/data/sft.jsonl"))
    assert (example.model, example.data) == (demo.model, demo.data)
    where = {"output_dir", "progress"}
    differ = {
        f: (getattr(example, f), getattr(demo, f))
        for f in vars(demo)
        if f not in where and getattr(example, f) != getattr(demo, f)
    }
    assert differ == {}


def benchmark_configs(monkeypatch) -> dict[str, object]:
    """The configs ``benchmarks/calculator_task.py`` trains with its default arguments (its
    trainers replaced by a recorder: nothing is trained)."""
    import importlib.util
    import sys

    from proxrl.algos.offline import sft
    from proxrl.algos.online import grpo

    path = EXAMPLES.parents[1] / "benchmarks" / "calculator_task.py"
    spec = importlib.util.spec_from_file_location("calculator_task", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", [str(path)])
    args = module.parse_args()
    seen: dict[str, object] = {}
    monkeypatch.setattr(sft, "train", lambda cfg: seen.setdefault("calculator_sft", cfg))
    monkeypatch.setattr(grpo, "train", lambda cfg: seen.setdefault("calculator_grpo", cfg))
    out = Path("runs/calculator/seed1")
    module.sft_stage(args, out, out / "data" / "sft.jsonl", "sft", 1)
    module.grpo_stage(args, out, 1)
    return seen


@pytest.mark.parametrize("name", ["calculator_sft", "calculator_grpo"])
def test_the_calculator_examples_train_as_the_benchmark_does(monkeypatch, name):
    """The README's calculator numbers come from benchmarks/calculator_task.py: its example
    configs must train with the same settings (issue 40: the yaml's 30 iterations at 5e-4 scored
    0.12 where the benchmark's 60 at 1.5e-3 score 0.83). Where the files live and the seed may
    differ; what training does may not. Change one, change both."""
    module = importlib.import_module(COMMANDS[COMMAND_OF[name]][0])
    example = load_config_file(module.Config, EXAMPLES / f"{name}.yaml", validate=False)
    bench = benchmark_configs(monkeypatch)[name]
    where = {"output_dir", "progress", "overwrite", "model", "data", "prompts", "seed"}
    differ = {
        f: (getattr(example, f), getattr(bench, f))
        for f in vars(bench)
        if f not in where and getattr(example, f) != getattr(bench, f)
    }
    assert differ == {}


def test_the_readme_grpo_example_learns_at_the_example_configs_rate():
    """README's GRPO example (command line and Python) on the demo's models trains nothing at
    grpo's default learning rate 1e-6 (issue 40); it states the rate configs/examples/grpo.yaml
    uses, with which benchmarks/readme_grpo_example.py measured it learn."""
    import re

    from proxrl.algos.online import grpo

    readme = (EXAMPLES.parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## From Python")[1].split("\n## ")[0]
    cli = re.search(r"proxrl grpo --model runs/demo/sft .*?```", section, re.S).group(0)
    python = re.search(r"run = proxrl\.grpo\(.*?\n\)", section, re.S).group(0)
    example = load_config_file(grpo.Config, EXAMPLES / "grpo.yaml", validate=False)
    assert example.learning_rate != grpo.Config().learning_rate
    assert float(re.search(r"--learning-rate (\S+)", cli).group(1)) == example.learning_rate
    assert float(re.search(r"learning_rate=([\d.e-]+)", python).group(1)) == example.learning_rate
