"""Options that know where they belong (proxrl.registry, runtime.config.check_knobs).

Every choice field of every command takes its names from a registry; every knob a registry
entry declares (and every field ``AppliesWith`` another) is refused, in one line naming the
option that would select it, when the run has not selected it, and accepted when it has. The
cases are derived from the registries, so an entry added later is covered without a line here.
"""

from __future__ import annotations

import dataclasses
import importlib
import typing
from typing import Any, Literal

import pytest

from proxrl.algos.offline import dpo
from proxrl.algos.online import config as online_config
from proxrl.algos.online import grpo, ppo
from proxrl.api import COMMANDS
from proxrl.registry import Choice, Registry
from proxrl.runtime.config import (
    check_knobs,
    field_defaults,
    field_table,
    knob_owners,
    knob_refusal,
    list_item,
    optional_inner,
)
from proxrl.runtime.errors import ProxrlError

REQUIRED = {"model": "m", "prompts": "p", "data": "d", "reward_fn": "proxrl.demo.task:gold"}
KNOB_COMMANDS = (ppo.Config, grpo.Config, dpo.Config)


def command_configs() -> list[type]:
    """Every command's config class (the commands that parse their own arguments: none)."""
    modules = [importlib.import_module(module) for module, _ in COMMANDS.values()]
    return [m.Config for m in modules if hasattr(m, "Config")]


def hand_written_choices(cls: type) -> list[str]:
    """The fields of ``cls`` whose type (or list item) is a ``Literal`` no registry marks."""
    found = []
    for name, spec in field_table(cls).items():
        item = list_item(spec.type)[1]
        literal = typing.get_origin(typing.get_args(item)[0] if _annotated(item) else item)
        if literal is Literal and spec.choice is None:
            found.append(name)
    return found


def _annotated(tp: Any) -> bool:
    return hasattr(tp, "__metadata__")


@pytest.mark.parametrize("cls", command_configs(), ids=lambda c: c.__module__)
def test_every_choice_field_of_every_command_comes_from_a_registry(cls):
    assert hand_written_choices(cls) == []
    for name, spec in field_table(cls).items():
        if spec.choice is None:
            continue
        item = list_item(spec.type)[1]
        offered = typing.get_args(typing.get_args(item)[0] if _annotated(item) else item)
        registered = [n for n in offered if n in spec.choice.registry]
        spellings = dict(spec.choice.spellings)
        assert set(offered) == {*registered, *spec.choice.off, *spellings}, name
        assert set(spellings.values()) <= set(spec.choice.registry), name


MODES: Registry[None] = Registry("mode")
MODES.add("a", None, "one")
MODES.add("b", None, "the other")
ModeChoice = MODES.choice()


@dataclasses.dataclass
class HandWritten:
    mode: Literal["a", "b"] = "a"


@dataclasses.dataclass
class Derived:
    mode: ModeChoice = "a"


def test_the_derivation_check_fails_on_a_hand_written_choice():
    assert hand_written_choices(HandWritten) == ["mode"]
    assert hand_written_choices(Derived) == []


def _config(cls: type, **values: Any) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in REQUIRED.items() if k in names}, **values)


def _other_value(cls: type, name: str) -> Any:
    """A valid value of field ``name`` other than its default."""
    spec, default = field_table(cls)[name], field_defaults(cls)[name]
    optional, inner = optional_inner(spec.type)
    if spec.choice is not None:
        return next(n for n in typing.get_args(inner) if n != default)
    if inner is bool:
        return not default
    r = spec.range
    if inner in (int, float):
        low = (r.ge if r.ge is not None else r.gt) if r else None
        high = (r.le if r.le is not None else r.lt) if r else None
        start = default if default is not None else (low if low is not None else 0)
        for candidate in (start * 0.5, start + 1, start + 0.25, (low or 0) + 0.5):
            value = inner(candidate) if inner is int else candidate
            inside = (low is None or value > low or (r.ge is not None and value == r.ge)) and (
                high is None or value < high or (r.le is not None and value == r.le)
            )
            if value != default and inside:
                return value
    if inner is str:
        return "proxrl.demo.task:gold"
    raise AssertionError(f"no other value for {name}: {spec.type}")


def _select(cfg: Any, name: str) -> Any:
    """``cfg`` with field ``name`` made to apply: its first owner selected, and so on up."""
    owners = knob_owners(type(cfg)).get(name)
    if not owners:
        return cfg
    field, entry = owners[0]
    value = _other_value(type(cfg), field) if entry is None else entry
    return _select(dataclasses.replace(cfg, **{field: value}), field)


def _unselect(cfg: Any, name: str) -> Any:
    """``cfg`` with no owner of field ``name`` selected (None where every value selects one)."""
    cls, changes = type(cfg), {}
    for field, entry in knob_owners(cls)[name]:
        if entry is None:
            changes[field] = field_defaults(cls)[field]
            continue
        owning = {e for f, e in knob_owners(cls)[name] if f == field}
        choices = typing.get_args(optional_inner(field_table(cls)[field].type)[1])
        spellings = dict(_choice(cls, field).spellings)
        free = [n for n in choices if n not in owning and n not in spellings]
        if not free:
            return None
        default = field_defaults(cls)[field]
        changes[field] = default if default in free else free[0]
    return dataclasses.replace(cfg, **changes)


def _choice(cls: type, field: str) -> Choice:
    choice = field_table(cls)[field].choice
    assert choice is not None
    return choice


KNOB_CASES = [
    pytest.param(cls, knob, id=f"{cls.__module__.rsplit('.', 1)[-1]}-{knob}")
    for cls in KNOB_COMMANDS
    for knob in knob_owners(cls)
]


@pytest.mark.parametrize(("cls", "knob"), KNOB_CASES)
def test_a_knob_applies_only_while_an_owner_is_selected(cls, knob):
    value = _other_value(cls, knob)
    unselected = _unselect(_config(cls), knob)
    if unselected is None:
        pytest.skip(f"every choice of its option reads {knob}")
    refused = dataclasses.replace(unselected, **{knob: value})
    reason = knob_refusal(refused, knob)
    assert reason is not None and reason.startswith(f"{knob}: applies "), reason
    owner_fields = {field for field, _ in knob_owners(cls)[knob]}
    assert any(field in reason for field in owner_fields), reason
    harmless = getattr(cls, "harmless_when_unused", {})
    if knob not in harmless:
        with pytest.raises(ProxrlError):
            check_knobs(refused)
    selected = dataclasses.replace(_select(_config(cls), knob), **{knob: value})
    assert knob_refusal(selected, knob) is None


@pytest.mark.parametrize(
    ("cls", "values", "message"),
    [
        (
            ppo.Config,
            {"sapo_tau_pos": 2.0},
            "sapo_tau_pos: applies to policy_loss sapo; this run has ppo",
        ),
        (
            grpo.Config,
            {"policy_loss": "sapo", "dual_clip": 3.0},
            "dual_clip: applies to policy_loss ppo; this run has sapo",
        ),
        (
            grpo.Config,
            {"baseline_shift": 0.2},
            "baseline_shift: applies to estimator asymre; this run has grpo",
        ),
        (
            ppo.Config,
            {"distill_coef": 2.0},
            "distill_coef: applies with teacher_model; this run has none",
        ),
        (
            grpo.Config,
            {"distill_kl_estimator": "k2"},
            "distill_kl_estimator: applies to distill_loss reverse_kl_reward, and distill_loss "
            "applies with teacher_model; this run has none",
        ),
        (
            grpo.Config,
            {"estimator": "reinforce", "policy_loss": "cispo"},
            "policy_loss: applies to estimator grpo, rloo, remax, reinforce_pp, "
            "reinforce_pp_baseline, maxrl, asymre, gdpo; this run has reinforce",
        ),
        (
            dpo.Config,
            {"loss": "ipo", "label_smoothing": 0.1},
            "label_smoothing: applies to loss sigmoid, simpo; this run has ipo",
        ),
    ],
)
def test_the_refusal_names_the_option_that_selects_the_knob(cls, values, message):
    with pytest.raises(ProxrlError) as error:
        check_knobs(_config(cls, **values))
    assert str(error.value) == message
    if cls is not dpo.Config:  # (dpo's validate looks for its model first)
        with pytest.raises(ProxrlError, match=f"^{message.split(':')[0]}: applies"):
            _config(cls, **values).validate()


@pytest.mark.parametrize("low", [5.0, 6.0])
def test_a_lower_bound_at_or_above_its_upper_one_is_refused(low):
    cfg = _config(ppo.Config, policy_loss="clip_cov", clip_cov_lb=low, clip_cov_ub=5.0)
    with pytest.raises(ProxrlError) as error:
        cfg.validate()
    assert str(error.value) == f"clip_cov_lb: expected < clip_cov_ub (5), got {low}"
    _config(ppo.Config, policy_loss="clip_cov", clip_cov_lb=4.9, clip_cov_ub=5.0).validate()


def test_the_harmless_knobs_are_real_knobs_accepted_when_unused():
    harmless = online_config.HARMLESS_WHEN_UNUSED
    assert harmless and all(reason for reason in harmless.values())
    for knob in harmless:
        assert knob in knob_owners(ppo.Config)
        check_knobs(_config(ppo.Config, policy_loss="sapo", **{knob: 0.3}))


def test_estimator_traits_decide_the_group_size_and_the_kl_term():
    for name in grpo.ESTIMATORS.having("group"):
        with pytest.raises(ProxrlError, match=f"group_size: {name} needs at least 2"):
            _config(grpo.Config, estimator=name, group_size=1).validate()
    loss_kl = {n for n in grpo.ESTIMATORS if "kl_loss_type" in grpo.ESTIMATORS.knobs(n)}
    assert loss_kl == set(grpo.ESTIMATORS.having("kl_in_loss"))
    for name in grpo.ESTIMATORS:
        algorithm = grpo.build(_config(grpo.Config, estimator=name))
        assert (algorithm.kl_loss is not None) == grpo.ESTIMATORS.trait(name, "kl_in_loss")
        assert algorithm.needs_greedy == grpo.ESTIMATORS.trait(name, "needs_greedy")


def test_every_way_in_gets_the_same_refusal(tmp_path, capsys):
    """CLI flags, a YAML file, the Python API and the training client: one check, one line,
    and the output directory left as it was (not made)."""
    import proxrl
    from proxrl.cli import main

    message = "baseline_shift: applies to estimator asymre; this run has grpo"
    out = tmp_path / "run"
    given = {"model": "m", "prompts": "p", "reward_fn": "proxrl.demo.task:gold"}
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in given.items()]
    config = tmp_path / "config.yaml"
    config.write_text("".join(f"{k}: {v}\n" for k, v in given.items()) + "baseline_shift: 0.2\n")
    for argv in (
        ["grpo", *flags, "--baseline-shift", "0.2", "--output-dir", str(out)],
        ["grpo", "--config", str(config), "--output-dir", str(out)],
    ):
        assert main(argv) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == f"proxrl grpo: error: {message}"
    with pytest.raises(ProxrlError, match=f"^{message}$"):
        proxrl.grpo(**given, baseline_shift=0.2, output_dir=str(out))
    with pytest.raises(ProxrlError, match=rf"^proxrl.TrainingClient\(\): {message}$"):
        proxrl.TrainingClient("m", baseline_shift=0.2)
    assert not out.exists()


def test_a_client_leaves_the_policy_loss_open_but_refuses_other_unused_knobs():
    """A client picks its loss per call (forward_backward's ``loss``), so a policy loss's knob
    is taken whatever its config's policy_loss; any other unused knob is refused as by the
    command."""
    from proxrl.algos.online.client_checks import checked_config

    cfg = checked_config(grpo.Config, {"model": "m", "sapo_tau_pos": 2.0}, "client")
    assert cfg.sapo_tau_pos == 2.0
    with pytest.raises(ProxrlError, match="^client: m2po_tau: applies to off_policy_mask m2po"):
        checked_config(grpo.Config, {"model": "m", "m2po_tau": 0.1}, "client")


def test_a_sequence_return_keeps_its_dtype_at_the_last_token():
    """remax / rloo / reinforce in a float64 run: float64 returns on a float32 mask (the
    scatter refused the mixed dtypes)."""
    import torch

    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    returns = torch.tensor([0.5, -2.0], dtype=torch.float64)
    placed = grpo._at_last_token(returns, mask)
    assert placed.dtype == torch.float64
    assert placed.tolist() == [[0.0, 0.5, 0.0], [-2.0, 0.0, 0.0]]
