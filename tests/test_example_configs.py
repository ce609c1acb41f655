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
