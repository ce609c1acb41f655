"""parse_config / load_config_file: YAML defaults, flag overrides, and one-line errors."""

from __future__ import annotations

import dataclasses
from typing import Literal

import pytest

from proxrl.runtime.config import load_config_file, parse_config, save_config_file
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.run_config import RunConfig


@dataclasses.dataclass
class Demo(RunConfig):
    batch_size: int = 8
    """Samples per step."""
    lr: float = 1e-3
    """Learning rate."""
    mode: Literal["fast", "slow"] = "fast"
    """How to run."""
    target: float | None = None
    """Optional target."""
    names: list[str] = dataclasses.field(default_factory=lambda: ["a"])
    """A list of names."""

    def validate(self) -> None:
        super().validate()
        if self.batch_size <= 0:
            raise ProxrlError(f"--batch-size must be > 0, got {self.batch_size}")


def test_defaults_and_overrides_in_both_spellings():
    cfg = parse_config(Demo, ["--batch-size", "4", "--output_dir", "x", "--lr=0.5"], "t")
    assert (cfg.batch_size, cfg.output_dir, cfg.lr, cfg.mode) == (4, "x", 0.5, "fast")
    assert cfg.seed == 1 and cfg.resume is False


def test_bool_switches_optional_and_lists():
    cfg = parse_config(Demo, ["--resume", "--target", "0.1", "--names", "p", "q"], "t")
    assert cfg.resume is True and cfg.target == 0.1 and cfg.names == ["p", "q"]
    cfg = parse_config(Demo, ["--resume", "false", "--target", "None"], "t")
    assert cfg.resume is False and cfg.target is None
    assert parse_config(Demo, ["--overwrite", "true"], "t").overwrite is True


def test_yaml_values_become_defaults_and_flags_win(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("batch_size: 16\nmode: slow\nlr: 1\noutput-dir: from_yaml\n")
    cfg = parse_config(Demo, ["--config", str(path), "--batch-size", "2"], "t")
    assert (cfg.batch_size, cfg.mode, cfg.lr, cfg.output_dir) == (2, "slow", 1.0, "from_yaml")
    assert isinstance(cfg.lr, float)


def test_save_then_load_round_trips(tmp_path):
    cfg = Demo(batch_size=3, target=0.5, names=["x", "y"], mode="slow")
    save_config_file(cfg, tmp_path / "c.yaml")
    assert load_config_file(Demo, tmp_path / "c.yaml") == cfg


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batch-sise", "3"], "unknown option --batch-sise; did you mean --batch-size?"),
        (["--batch-size", "three"], "--batch-size expects int, found 'three'"),
        (["--lr", "fast"], "--lr expects float, found 'fast'"),
        (["--mode", "fats"], "--mode expects one of fast, slow, found 'fats'; did you mean fast?"),
        (["--resume", "maybe"], "--resume expects true or false, found 'maybe'"),
        (["--batch-size", "0"], "--batch-size must be > 0, got 0"),
        (["--batch-size"], "--batch-size needs a value (int)"),
        (["stray"], "unexpected argument 'stray'"),
        (["--resume", "--overwrite"], "--resume and --overwrite exclude each other"),
    ],
)
def test_bad_flags_are_one_line_errors(argv, message):
    with pytest.raises(ProxrlError) as e:
        parse_config(Demo, argv, "t")
    assert message in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("batch_sise: 3\n", "unknown key batch_sise; did you mean batch_size?"),
        ("batch_size: three\n", "field batch_size expects int, found str 'three'"),
        ("batch_size: 2.5\n", "field batch_size expects int, found float 2.5"),
        ("resume: 1\n", "field resume expects bool, found int 1"),
        ("mode: medium\n", "field mode expects one of fast, slow, found 'medium'"),
        ("names: {a: 1}\n", "field names expects a list of str, found dict {'a': 1}"),
        ("- 1\n- 2\n", "must hold a mapping"),
        ("batch_size: 0\n", "--batch-size must be > 0"),
        ("a: [\n", "is not valid YAML"),
    ],
)
def test_bad_yaml_is_a_one_line_error_naming_the_key(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ProxrlError) as e:
        load_config_file(Demo, path)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ProxrlError, match="does not exist"):
        parse_config(Demo, ["--config", str(tmp_path / "nope.yaml")], "t")


def test_help_shows_field_docstrings(capsys):
    with pytest.raises(SystemExit) as e:
        parse_config(Demo, ["--help"], "proxrl demo")
    assert e.value.code == 0
    text = capsys.readouterr().out
    for doc in [
        "Samples per step.",
        "Learning rate.",
        "Save a checkpoint every",
        "--batch-size",
        "proxrl demo",
    ]:
        assert doc in text


# ------------------------------------------------------------------------ ranges and aliases
from typing import Annotated  # noqa: E402

from proxrl.runtime.config import Range, alias  # noqa: E402


@dataclasses.dataclass
class Ranged(RunConfig):
    steps: Annotated[int, Range(gt=0)] = 1
    """Steps."""
    share: Annotated[float, Range(ge=0, lt=1)] = 0.0
    """A share."""
    learning_rate: Annotated[float | None, Range(gt=0), alias("lr")] = None
    """Learning rate."""
    whiten: Annotated[bool, alias("norm_adv")] = True
    """Whiten."""


@dataclasses.dataclass
class RangedChild(Ranged):
    steps: int = 5  # only the default changes: the range declared above still holds
    """Steps."""


@pytest.mark.parametrize(
    ("cls", "argv", "message"),
    [
        (Ranged, ["--steps", "0"], "steps: expected >= 1, got 0"),  # an int's > 0 reads >= 1
        (Ranged, ["--share", "1"], "share: expected in [0, 1), got 1.0"),
        (Ranged, ["--lr", "0"], "learning_rate: expected > 0, got 0.0"),
        (RangedChild, ["--steps", "-2"], "steps: expected >= 1, got -2"),
        (Ranged, ["--share", "nan"], "share: expected a finite number, got nan"),
        (Ranged, ["--save-every", "-1"], "save_every: expected >= 0, got -1"),  # RunConfig's own
    ],
)
def test_ranges_declared_beside_the_field_are_checked_in_one_wording(cls, argv, message):
    with pytest.raises(ProxrlError) as e:
        parse_config(cls, argv, "t")
    assert str(e.value) == message


def test_aliases_work_in_flags_and_yaml(tmp_path):
    cfg = parse_config(Ranged, ["--lr", "0.5", "--no-norm-adv"], "t")
    assert (cfg.learning_rate, cfg.whiten) == (0.5, False)
    assert (
        parse_config(Ranged, ["--norm_adv", "false", "--learning_rate", "none"], "t").whiten
        is False
    )
    path = tmp_path / "c.yaml"
    path.write_text("lr: 1\nnorm-adv: false\n")
    cfg = load_config_file(Ranged, path)
    assert (cfg.learning_rate, cfg.whiten) == (1.0, False) and isinstance(cfg.learning_rate, float)
    path.write_text("lrr: 1\n")
    with pytest.raises(ProxrlError, match="unknown key lrr; did you mean lr?"):
        load_config_file(Ranged, path)


def test_required_positional_and_report_options(capsys):
    from proxrl.report import Config as ReportConfig

    assert parse_config(ReportConfig, ["runs/x", "--samples", "2"], "t") == ReportConfig(
        "runs/x", 2
    )
    for argv, message in [
        ([], "missing RUN_DIR"),
        (["r", "--sample", "2"], "unknown option --sample; did you mean --samples?"),
        (["r", "--samples", "-1"], "samples: expected >= 0, got -1"),
    ]:
        with pytest.raises(ProxrlError) as e:
            parse_config(ReportConfig, argv, "t")
        assert str(e.value) == message


def test_narrowed_takes_the_records_fields_by_name_and_refuses_a_missing_one():
    from dataclasses import dataclass

    from proxrl.runtime.config import narrowed

    @dataclass(frozen=True)
    class Cfg:
        lr: float = 1e-3
        seed: int = 7
        unrelated: str = "x"

    @dataclass(frozen=True)
    class Record:
        seed: int
        lr: float
        derived: int

    assert narrowed(Record, Cfg(lr=0.5), derived=3) == Record(seed=7, lr=0.5, derived=3)
    assert narrowed(Record, Cfg(), lr=2.0, derived=0).lr == 2.0  # given wins over the config
    with pytest.raises(TypeError, match="derived"):
        narrowed(Record, Cfg())
