"""What a config field declares beside its type, in ``Annotated`` metadata: other spellings
(``alias``: tyro's aliases, so ``--help`` lists them) and bounds (``Range``, pydantic checks)."""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Annotated, Any, Literal, NamedTuple, Union

import pydantic
import tyro

from proxrl.runtime.errors import ProxrlError


def alias(*names: str) -> Any:
    """Other accepted spellings of a field, in flags and YAML (e.g. CleanRL's ``lr``)."""
    return tyro.conf.arg(aliases=tuple("--" + n.replace("_", "-") for n in names))


@dataclasses.dataclass(frozen=True)
class Range:
    """Bounds of a number (of each item of a list), which must also be finite (``Range()``: any
    finite number). ``style``: the wording, else the config's ``range_style`` (new: "field")."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    style: Literal["field", "flag"] | None = None

    def message(self, name: str, value: Any, style: str, integer: bool) -> str:
        """``name: expected >= 1, got 0`` / ``name: expected in [0, 1), got 1.5`` (an int's
        ``> k`` reads ``>= k + 1``); the "flag" style of docs/errors.md: ``--name must be > 0,
        got 0`` / ``--name must lie in [0, 1]``; ``name: expected a finite number, got nan``."""
        flag, gt = style == "flag", None if integer and style != "flag" else self.gt
        ge = int(self.gt) + 1 if gt is None and self.gt is not None else self.ge
        low = [(op, b) for op, b in ((">=", ge), (">", gt)) if b is not None][:1]
        high = [(op, b) for op, b in (("<=", self.le), ("<", self.lt)) if b is not None][:1]
        who = f"--{name.replace('_', '-')} must" if flag else f"{name}: expected"
        if not (low or high) or not math.isfinite(value):
            return f"{who}{' be' * flag} a finite number, got {value}"
        if low and high:
            span = "[("[low[0][0] == ">"] + f"{_num(low[0][1])}, {_num(high[0][1])}"
            span += "])"[high[0][0] == "<"]
            return f"{who} lie in {span}" if flag else f"{who} in {span}, got {value}"
        return f"{who}{' be' * flag} {(low or high)[0][0]} {_num((low or high)[0][1])}, got {value}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


@functools.cache
def _bounds(r: Range) -> pydantic.TypeAdapter[float]:
    return pydantic.TypeAdapter(
        Annotated[float, pydantic.Field(gt=r.gt, ge=r.ge, lt=r.lt, le=r.le, allow_inf_nan=False)]
    )


class FieldSpec(NamedTuple):
    type: Any  # without Annotated
    range: Range | None
    aliases: tuple[str, ...]  # snake_case
    switch: bool  # --name / --no-name: a bool, or a bool-or-None marked tyro.conf.DisallowNone
    positional: bool  # tyro.conf.Positional
    required: bool  # no default


@functools.cache
def field_table(config_cls: Any) -> dict[str, FieldSpec]:
    """Field name → its type, range and aliases. A subclass that only changes a field's default
    keeps the range a base class declared."""
    hints = [typing.get_type_hints(b, include_extras=True) for b in reversed(config_cls.__mro__)]
    table = {}
    for f in (f for f in dataclasses.fields(config_cls) if f.init):
        hint = hints[-1][f.name]
        tp, *extras = typing.get_args(hint) if typing.get_origin(hint) is Annotated else (hint,)
        metadata = [m for h in hints for m in getattr(h.get(f.name), "__metadata__", ())]
        names = [a[2:].replace("-", "_") for m in extras for a in getattr(m, "aliases", 0) or ()]
        table[f.name] = FieldSpec(
            tp,
            ([None] + [m for m in metadata if isinstance(m, Range)])[-1],
            tuple(names),
            tp is bool or (optional_inner(tp)[1] is bool and tyro.conf.DisallowNone in extras),
            tyro.conf.Positional in extras,
            f.default is f.default_factory is dataclasses.MISSING,
        )
    return table


def check_ranges(cfg: Any) -> None:
    """Raise ``ProxrlError`` for the first field whose value lies outside its ``Range``."""
    for name, f in field_table(type(cfg)).items():
        value, inner = getattr(cfg, name), optional_inner(f.type)[1]
        listed = typing.get_origin(inner) in (tuple, list)
        items = [] if value is None or isinstance(value, bool) else value if listed else [value]
        for item in items if f.range else ():
            try:
                _bounds(f.range).validate_python(item, strict=True)
            except pydantic.ValidationError:
                style = f.range.style or getattr(cfg, "range_style", "field")
                is_int = (typing.get_args(inner)[0] if listed else inner) is int
                raise ProxrlError(f.range.message(name, item, style, is_int)) from None


def optional_inner(tp: Any) -> tuple[bool, Any]:
    """``Optional[X]`` / ``X | None`` → (True, X); anything else → (False, tp)."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (Union, types.UnionType) and len(args) == 2 and type(None) in args:
        return True, next(a for a in args if a is not type(None))
    return False, tp


def type_name(tp: Any) -> str:
    optional, inner = optional_inner(tp)
    if optional:
        return f"{type_name(inner)} or None"
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (list, tuple):
        return f"a list of {type_name(typing.get_args(tp)[0])}"
    return getattr(tp, "__name__", str(tp))
