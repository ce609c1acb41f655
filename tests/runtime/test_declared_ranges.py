"""Every numeric field of every command declares its range, and each range holds: the value just
outside a bound is refused by the command's ``validate()`` (with a message naming the field),
the value on the inside is accepted by ``check_ranges``, and NaN / ±inf never pass. Then the
rules that relate several fields, by hand."""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import typing
from typing import Any

import pytest

from proxrl.cli import COMMANDS
from proxrl.runtime.config import Range, check_ranges, field_table, optional_inner
from proxrl.runtime.errors import ProxrlError

# Commands whose module parses its own arguments (``main``) name their config class here.
OWN_PARSERS = {"classic-eval": "EvalConfig"}


def config_class(command: str) -> type:
    module = importlib.import_module(COMMANDS[command][0])
    name = OWN_PARSERS.get(command, "Config")
    assert hasattr(module, name), f"proxrl {command}: no config class {name} in {module.__name__}"
    return getattr(module, name)


def numeric_item(tp: Any) -> type | None:
    """int or float for a numeric field (optional, or a list of numbers), else None."""
    inner = optional_inner(tp)[1]
    if typing.get_origin(inner) in (tuple, list):
        inner = (typing.get_args(inner) or (None,))[0]
    return inner if inner in (int, float) else None


def numeric_fields() -> list[tuple[str, type, str, Range | None, type]]:
    rows = []
    for command in COMMANDS:
        cls = config_class(command)
        for name, spec in field_table(cls).items():
            item = numeric_item(spec.type)
            if item is not None:
                rows.append((command, cls, name, spec.range, item))
    return rows


FIELDS = numeric_fields()


def test_every_command_has_numeric_fields_to_check():
    assert {command for command, *_ in FIELDS} == set(COMMANDS)


@pytest.mark.parametrize(("command", "cls", "name", "range_", "item"), FIELDS)
def test_every_numeric_field_declares_a_range(command, cls, name, range_, item):
    assert range_ is not None, (
        f"proxrl {command}: {cls.__module__}.{cls.__qualname__}.{name} "
        f"({field_table(cls)[name].type}) declares no range: write it as "
        f"`{name}: Annotated[{item.__name__}, Range(...)]` (runtime/config.py; Range() for any "
        "finite number)"
    )


def _just(bound: float, direction: float, item: type) -> float:
    """The neighbour of ``bound`` one step towards ``direction`` (±inf): 1 for an int."""
    return bound + (1 if direction > 0 else -1) if item is int else math.nextafter(bound, direction)


def cases(range_: Range, item: type) -> tuple[list[float], list[float]]:
    """(values just outside, values just inside) the range."""
    outside, inside = [], []
    if range_.ge is not None:
        outside.append(_just(range_.ge, -math.inf, item))
        inside.append(item(range_.ge))
    if range_.gt is not None:
        outside.append(item(range_.gt))
        inside.append(_just(range_.gt, math.inf, item))
    if range_.le is not None:
        outside.append(_just(range_.le, math.inf, item))
        inside.append(item(range_.le))
    if range_.lt is not None:
        outside.append(item(range_.lt))
        inside.append(_just(range_.lt, -math.inf, item))
    if item is float:
        outside += [math.nan, math.inf, -math.inf]
    if not inside:  # Range(): any finite number
        inside = [item(-3), item(0), item(7)]
    return outside, inside


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A model directory and data files that pass the commands' source checks."""
    root = tmp_path_factory.mktemp("sources")
    (root / "model").mkdir()
    (root / "model" / "config.json").write_text("{}")
    (root / "data.jsonl").write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n")
    return {"model": str(root / "model"), "data": str(root / "data.jsonl")}


def valid_config(command: str, cls: type, sources: dict[str, str]) -> Any:
    """A config of ``cls`` whose validate() passes."""
    kwargs: dict[str, Any] = {
        "sft": dict(sources),
        "rm": dict(sources),
        "dpo": dict(sources),
        "ppo": {"model": "m", "prompts": "p", "reward_fn": ("os:getcwd",)},
        "grpo": {"model": "m", "prompts": "p", "reward_fn": ("os:getcwd",)},
        "report": {"run_dir": "runs/x"},
    }.get(command, {})
    cfg = cls(**kwargs)
    cfg.validate()
    return cfg


def _set(cfg: Any, name: str, value: float) -> Any:
    tp = field_table(type(cfg))[name].type
    listed = typing.get_origin(optional_inner(tp)[1]) in (tuple, list)
    return dataclasses.replace(cfg, **{name: (value,) if listed else value})


RANGED = [row for row in FIELDS if row[3] is not None]


@pytest.mark.parametrize(("command", "cls", "name", "range_", "item"), RANGED)
def test_each_range_refuses_just_outside_and_accepts_just_inside(
    command, cls, name, range_, item, sources
):
    cfg = valid_config(command, cls, sources)
    outside, inside = cases(range_, item)
    for value in outside:
        with pytest.raises(ProxrlError) as e:
            _set(cfg, name, value).validate()
        message = str(e.value)
        assert message.startswith((f"{name}: ", f"--{name.replace('_', '-')} ")), message
        assert "\n" not in message
    for value in inside:
        check_ranges(_set(cfg, name, value))


def test_a_range_names_its_bound_and_the_value():
    """The one wording, spot-checked on fields of each kind and command."""
    from proxrl.algos.online import grpo, ppo
    from proxrl.classic.config import ClassicConfig
    from proxrl.classic.evaluate import EvalConfig

    base = {"model": "m", "prompts": "p", "reward_fn": ("os:getcwd",)}
    for cfg, message in [
        (ppo.Config(**base, kl_coef=-0.1), "kl_coef: expected >= 0, got -0.1"),
        (ppo.Config(**base, clip=-0.2), "clip: expected > 0, got -0.2"),
        (ppo.Config(**base, top_p=1.5), "top_p: expected in (0, 1], got 1.5"),
        (ppo.Config(**base, dual_clip=1.0), "dual_clip: expected > 1, got 1.0"),
        (ppo.Config(**base, seed=-1), "seed: expected in [0, 4294967295], got -1"),
        (ppo.Config(**base, kl_horizon=0), "kl_horizon: expected >= 1, got 0"),
        (grpo.Config(**base, gamma=1.01), "gamma: expected in [0, 1], got 1.01"),
        (
            ppo.Config(**base, reward_weights=(math.nan,)),
            "reward_weights: expected a finite number, got nan",
        ),
        (
            ppo.Config(**base, learning_rate=math.inf),
            "learning_rate: expected a finite number, got inf",
        ),
        (EvalConfig(episodes=0), "episodes: expected >= 1, got 0"),
        (ClassicConfig(clip=math.nan), "clip: expected a finite number, got nan"),
    ]:
        with pytest.raises(ProxrlError) as e:
            cfg.validate()
        assert str(e.value) == message


# ------------------------------------------------------------------------ cross-field rules

ONLINE = {"model": "m", "prompts": "p", "reward_fn": ("os:getcwd",)}


def _refused(cfg: Any) -> str:
    with pytest.raises(ProxrlError) as e:
        cfg.validate()
    return str(e.value)


def test_dual_clip_must_lie_past_the_clip_range():
    from proxrl.algos.online import grpo, ppo

    assert _refused(ppo.Config(**ONLINE, dual_clip=1.2)) == (
        "dual_clip: expected > 1 + clip = 1.2 (it bounds the loss only past the clip range), "
        "got 1.2"
    )
    assert _refused(grpo.Config(**ONLINE, clip_high=0.28, dual_clip=1.25)) == (
        "dual_clip: expected > 1 + clip_high = 1.28 (it bounds the loss only past the clip "
        "range), got 1.25"
    )
    ppo.Config(**ONLINE, dual_clip=1.2000001).validate()
    grpo.Config(**ONLINE, clip_high=0.28, dual_clip=3.0).validate()


def test_dual_clip_the_core_refuses_is_refused_by_the_config_first():
    """A value <= 1 used to reach the core's ValueError (a traceback)."""
    from proxrl.algos.online import ppo

    for value in (0.5, 1.0):
        assert _refused(ppo.Config(**ONLINE, dual_clip=value)).startswith("dual_clip: expected")


def test_a_multiplicative_coefficient_cannot_start_at_zero():
    from proxrl.algos.online import ppo
    from proxrl.classic.config import ClassicConfig

    assert _refused(ppo.Config(**ONLINE, kl_controller="proportional", kl_coef=0.0)) == (
        "kl_coef: the proportional controller scales β, so it cannot start from 0"
    )
    ppo.Config(**ONLINE, kl_controller="fixed", kl_coef=0.0).validate()
    for surrogate in ("penalty", "clip+penalty"):
        assert _refused(ppo.Config(**ONLINE, surrogate=surrogate, penalty_beta=0.0)) == (
            f"penalty_beta: surrogate={surrogate} doubles or halves β, so it cannot start from 0"
        )
    assert _refused(ppo.Config(**ONLINE, surrogate="clip", penalty_beta=0.0)) == (
        "penalty_beta: applies to surrogate penalty, clip+penalty; this run has clip"
    )
    assert _refused(ClassicConfig(objective="adaptive-kl", penalty_beta=0.0)) == (
        "--penalty-beta must be > 0 with --objective adaptive-kl (it doubles or halves β)"
    )
    ClassicConfig(objective="fixed-kl", penalty_beta=0.0).validate()


def test_reward_weights_that_are_all_zero_are_refused():
    from proxrl.algos.online import grpo

    two = {**ONLINE, "reward_fn": ("os:getcwd", "os:getpid")}
    assert _refused(grpo.Config(**two, reward_weights=(0.0, 0.0))) == (
        "reward_weights: every weight is 0, so no reward reaches the policy"
    )
    grpo.Config(**two, reward_weights=(0.0, -0.5)).validate()  # a penalty-only reward is fine


def test_demo_hidden_size_must_split_into_its_attention_heads():
    from proxrl.demo import Config

    assert _refused(Config(hidden_size=12)) == (
        "hidden_size: expected a multiple of 8 (4 attention heads of an even width), got 12"
    )
    Config(hidden_size=16).validate()
    assert _refused(Config(hidden_size=64, num_heads=3)) == (
        "hidden_size: expected a multiple of 6 (3 attention heads of an even width), got 64"
    )
    Config(hidden_size=64, num_heads=2).validate()


def test_configs_outside_runconfig_check_their_ranges_in_validate():
    """demo, report and classic-eval do not subclass RunConfig: their validate() checks."""
    from proxrl.classic.evaluate import EvalConfig
    from proxrl.demo import Config as DemoConfig
    from proxrl.report import Config as ReportConfig
    from proxrl.runtime.run_config import RunConfig

    for cls in (EvalConfig, DemoConfig, ReportConfig):
        assert not issubclass(cls, RunConfig)
    assert _refused(EvalConfig(seed=-1)) == "seed: expected in [0, 4294967295], got -1"
    assert _refused(DemoConfig(temperature=0.0)) == "temperature: expected > 0, got 0.0"
    assert _refused(ReportConfig("x", samples=-1)) == "samples: expected >= 0, got -1"


def test_the_walk_sees_inherited_and_redeclared_fields():
    """A subclass that only changes a default keeps the base's range (ppo's ppo_epochs)."""
    from proxrl.algos.online import ppo

    assert field_table(ppo.Config)["ppo_epochs"].range == Range(ge=1)
    assert ("ppo", ppo.Config, "ppo_epochs", Range(ge=1), int) in FIELDS
