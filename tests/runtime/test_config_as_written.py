"""Config files as people write them: ``1e-4`` (a string to YAML 1.1) in a float field, one value
where a list is expected, and a flag that overrides a bad value in the file."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import pytest
import yaml

from proxrl.runtime.config import Range, load_config_file, parse_config
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.run_config import RunConfig


@dataclasses.dataclass
class Written(RunConfig):
    learning_rate: Annotated[float, Range(gt=0)] = 1e-3
    """Learning rate."""
    target: float | None = None
    """Optional target."""
    steps: Annotated[int, Range(ge=1)] = 4
    """Steps."""
    weights: tuple[float, ...] = ()
    """Weights."""
    names: tuple[str, ...] = ()
    """Names."""


def _load(tmp_path, text: str, *flags: str) -> Written:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return parse_config(Written, ["--config", str(path), *flags], "t")


def test_yaml_1_1_reads_exponents_without_a_dot_as_strings():
    """Why the conversion exists: PyYAML's safe_load gives a str for 1e-4."""
    assert yaml.safe_load("x: 1e-4")["x"] == "1e-4"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("learning_rate: 1e-4\n", 1e-4),
        ("learning_rate: 3E-5\n", 3e-5),
        ("learning_rate: 2e3\n", 2000.0),
        ("learning_rate: '5e-6'\n", 5e-6),
        ("target: -1e-2\n", -0.01),
        ("target: +5e1\n", 50.0),
    ],
)
def test_a_number_written_with_an_exponent_is_a_float(tmp_path, text, value):
    cfg = _load(tmp_path, text)
    got = cfg.learning_rate if text.startswith("learning_rate") else cfg.target
    assert got == value and isinstance(got, float)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("learning_rate: fast\n", "field learning_rate expects float, found str 'fast'"),
        ("learning_rate: 1e-4x\n", "field learning_rate expects float, found str '1e-4x'"),
        ("steps: 1e3\n", "field steps expects int, found str '1e3'"),  # only float fields
        ("learning_rate: 0e0\n", "learning_rate: expected > 0, got 0.0"),  # then its range
        ("weights: [1, x]\n", "field weights expects a list of float, found list [1, 'x']"),
    ],
)
def test_what_is_still_not_a_number_is_refused(tmp_path, text, message):
    with pytest.raises(ProxrlError) as e:
        _load(tmp_path, text)
    assert str(e.value).endswith(message)


def test_one_value_for_a_list_field_is_a_one_item_list(tmp_path):
    cfg = _load(tmp_path, "weights: 1\nnames: os:getcwd\n")
    assert cfg.weights == (1.0,) and isinstance(cfg.weights[0], float)
    assert cfg.names == ("os:getcwd",)
    assert _load(tmp_path, "weights: [1, 2e-1]\n").weights == (1.0, 0.2)
    assert _load(tmp_path, "weights: 5e-1\n").weights == (0.5,)


def test_a_flag_wins_over_a_bad_value_in_the_file(tmp_path):
    text = "learning_rate: fast\nsteps: 0\nseed: 3\n"
    cfg = _load(tmp_path, text, "--learning-rate", "0.5", "--steps=2")
    assert (cfg.learning_rate, cfg.steps, cfg.seed) == (0.5, 2, 3)
    with pytest.raises(ProxrlError, match="field learning_rate expects float"):
        _load(tmp_path, text, "--steps", "2")  # not overridden: still an error
    with pytest.raises(ProxrlError, match="steps: expected >= 1, got 0"):
        _load(tmp_path, text, "--learning_rate", "0.5")  # the file's range error stands


def test_a_switch_flag_wins_over_a_bad_value_too(tmp_path):
    assert _load(tmp_path, "resume: maybe\n", "--no-resume").resume is False
    assert _load(tmp_path, "overwrite: 7\n", "--overwrite").overwrite is True


def test_an_unknown_key_is_an_error_even_when_a_flag_is_given(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("learnin_rate: 1\n")
    with pytest.raises(ProxrlError, match="unknown key learnin_rate"):
        parse_config(Written, ["--config", str(path), "--learning-rate", "0.5"], "t")


def test_load_config_file_alone_still_reads_every_value(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("learning_rate: fast\n")
    with pytest.raises(ProxrlError, match="field learning_rate expects float"):
        load_config_file(Written, path)
