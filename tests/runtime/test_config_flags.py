"""How flags are read (runtime.config's own tokenizer, pydantic reads the values): numbers that
start with ``-`` are values, a switch takes no ``=value`` when negated, several refusals report
the one tyro reported first, and ``--help`` shows a config file's values as the defaults."""

from __future__ import annotations

import dataclasses
from typing import Literal

import pytest

from proxrl.runtime.config import RunConfig, parse_config
from proxrl.runtime.errors import ProxrlError


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
    with pytest.raises(ProxrlError, match=r"^--target needs a value \(float or None\)$"):
        parse_config(Flags, ["--target", "-x"], "t")
    with pytest.raises(ProxrlError, match=r"^unexpected argument '-1'"):
        parse_config(Flags, ["--resume", "-1"], "t")  # a switch takes no number


def test_a_negated_switch_takes_no_value():
    assert parse_config(Flags, ["--no-progress"], "t").progress is False
    with pytest.raises(ProxrlError, match=r"^--no-progress takes no value, found 'true'$"):
        parse_config(Flags, ["--no-progress=true"], "t")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bogus", "--mode", "fats"], "--mode expects one of fast, slow, found 'fats'"),
        (["--lr", "x", "--bogus"], "unknown option --bogus"),
        (["--lr", "x", "--target"], "--target needs a value (float or None)"),
        (["--mode", "fats", "--resume", "maybe"], "--resume expects true or false, found 'maybe'"),
    ],
)
def test_of_several_refusals_the_first_in_tyros_order_is_reported(argv, message):
    with pytest.raises(ProxrlError) as e:
        parse_config(Flags, argv, "t")
    assert str(e.value).startswith(message)


def test_help_shows_the_config_files_values_as_defaults(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("lr: 0.25\n")
    with pytest.raises(SystemExit) as e:
        parse_config(Flags, ["--config", str(path), "--help", "--bogus"], "t")
    assert e.value.code == 0 and "0.25" in capsys.readouterr().out
