"""How flags are read (argparse splits them, pydantic reads the values): numbers that start with
``-`` are values, a switch takes no ``=value`` when negated, of several refusals the command
line's shape comes first (a flag without its value, then an unknown option) and then the values
in command-line order, and ``--help`` shows a config file's values as the defaults."""

from __future__ import annotations

import dataclasses
from typing import Literal

import pytest

from proxrl.runtime.config import parse_config
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.run_config import RunConfig


@dataclasses.dataclass
class Flags(RunConfig):
    lr: float = 1e-3
    """Learning rate."""
    target: float | None = None
    """Optional target."""
    mode: Literal["fast", "slow"] = "fast"
    """How to run."""
    weights: tuple[float, ...] = ()
    """Weights."""
    names: tuple[str, ...] = ()
    """Names."""


def test_numbers_starting_with_a_minus_are_values():
    cfg = parse_config(
        Flags, ["--lr", "-0.5", "--target=-1e-3", "--weights", "-1", "2", "-inf"], "t"
    )
    assert (cfg.lr, cfg.target, cfg.weights) == (-0.5, -1e-3, (-1.0, 2.0, float("-inf")))
    assert parse_config(Flags, ["--names", "-", "a"], "t").names == ("-", "a")
    # argparse alone reads -1e-3, -.5e2 and -nan after a flag as options
    cfg = parse_config(Flags, ["--target", "-1e-3", "--weights", "-.5e2", "-NaN"], "t")
    assert cfg.target == -1e-3 and cfg.weights[0] == -50.0 and cfg.weights[1] != cfg.weights[1]
    assert parse_config(Flags, ["--names", "-1e-3", "x"], "t").names == ("-1e-3", "x")
    with pytest.raises(ProxrlError, match=r"^--target needs a value \(float or None\)$"):
        parse_config(Flags, ["--target", "-x"], "t")
    with pytest.raises(ProxrlError, match=r"^--resume expects true or false, found '-1'$"):
        parse_config(Flags, ["--resume", "-1"], "t")  # a switch's value is a word


def test_a_negated_switch_takes_no_value():
    assert parse_config(Flags, ["--no-progress"], "t").progress is False
    with pytest.raises(ProxrlError, match=r"^--no-progress takes no value, found 'true'$"):
        parse_config(Flags, ["--no-progress=true"], "t")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bogus", "--mode", "fats"], "unknown option --bogus"),
        (["--lr", "x", "--bogus"], "unknown option --bogus"),
        (["--bogus", "--lr", "x", "--target"], "--target needs a value (float or None)"),
        (["--mode", "fats", "--resume", "maybe"], "--mode expects one of fast, slow, found 'fats'"),
        (["--resume", "maybe", "--mode", "fats"], "--resume expects true or false, found 'maybe'"),
    ],
)
def test_of_several_refusals_the_shape_comes_first_then_the_values_in_order(argv, message):
    with pytest.raises(ProxrlError) as e:
        parse_config(Flags, argv, "t")
    assert str(e.value).startswith(message)


def test_help_shows_the_config_files_values_as_defaults(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("lr: 0.25\n")
    with pytest.raises(SystemExit) as e:
        parse_config(Flags, ["--config", str(path), "--help", "--bogus"], "t")
    assert e.value.code == 0 and "0.25" in capsys.readouterr().out


def test_spellings_mix_dashes_and_underscores_and_abbreviations_are_refused():
    cfg = parse_config(
        Flags, ["--output_dir", "a", "--no_progress", "--max-consecutive_skips=2"], "t"
    )
    assert (cfg.output_dir, cfg.progress, cfg.max_consecutive_skips) == ("a", False, 2)
    with pytest.raises(
        ProxrlError, match=r"^unknown option --output; did you mean --output-dir\?$"
    ):
        parse_config(Flags, ["--output", "a"], "t")  # argparse's prefix matching is off


def test_help_wins_over_a_bad_value(capsys):
    with pytest.raises(SystemExit) as e:
        parse_config(Flags, ["--lr", "x", "--mode", "fats", "--help"], "t")
    assert e.value.code == 0 and "Learning rate." in capsys.readouterr().out
