"""What a config field declares beside its type, in ``Annotated`` metadata: other accepted
spellings (``alias``) and the bounds of its value (``Range``). One declaration serves the
command line, YAML files, ``--help`` and ``validate()``: ``check_ranges`` is the one place a
range is checked and worded. The naming policy is the glossary in docs/architecture.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Annotated, Any, Literal, Union

from proxrl.runtime.errors import ProxrlError


def alias(*names: str) -> Any:
    """Other accepted spellings of a field, in flags and YAML (e.g. CleanRL's ``lr``)."""
    import tyro

    return tyro.conf.arg(aliases=tuple("--" + n.replace("_", "-") for n in names))


@dataclasses.dataclass(frozen=True)
class Range:
    """Bounds a numeric field must lie within (``None`` values are not checked).

    ``style`` picks the wording (``check_ranges``); ``None`` takes the config class's
    ``range_style``. New fields use the default, ``"field"``.
    """

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    style: Literal["field", "flag"] | None = None

    def holds(self, value: float) -> bool:
        """Within the bounds, and finite: no formula takes NaN or ±inf (``Range()`` declares a
        field that takes any finite number)."""
        return math.isfinite(value) and not (
            (self.ge is not None and value < self.ge)
            or (self.gt is not None and value <= self.gt)
            or (self.le is not None and value > self.le)
            or (self.lt is not None and value >= self.lt)
        )

    def message(self, name: str, value: Any, style: str, integer: bool) -> str:
        """``field``: ``name: expected >= 1, got 0`` / ``name: expected in [0, 1), got 1.5``;
        ``flag`` (the classic commands' and RunConfig's wording, kept because docs/errors.md
        shows it): ``--name must be > 0, got 0`` / ``--name must lie in [0, 1]``. NaN, ±inf
        and ``Range()``: ``name: expected a finite number, got nan``."""
        unbounded = all(b is None for b in (self.ge, self.gt, self.le, self.lt))
        if unbounded or not math.isfinite(value):
            if style == "flag":
                return f"--{name.replace('_', '-')} must be a finite number, got {value}"
            return f"{name}: expected a finite number, got {value}"
        gt, ge = self.gt, self.ge
        if style == "field" and integer and self.gt is not None:  # an int's > k reads as >= k + 1
            gt, ge = None, int(self.gt) + 1
        low = (">=", ge) if ge is not None else (">", gt) if gt is not None else None
        high = (
            ("<=", self.le)
            if self.le is not None
            else ("<", self.lt)
            if self.lt is not None
            else None
        )
        if low and high:
            opening = "[" if low[0] == ">=" else "("
            closing = "]" if high[0] == "<=" else ")"
            interval = f"{opening}{_num(low[1])}, {_num(high[1])}{closing}"
            if style == "flag":
                return f"--{name.replace('_', '-')} must lie in {interval}"
            return f"{name}: expected in {interval}, got {value}"
        op, bound = low or high  # type: ignore[misc]
        if style == "flag":
            return f"--{name.replace('_', '-')} must be {op} {_num(bound)}, got {value}"
        return f"{name}: expected {op} {_num(bound)}, got {value}"


def _num(x: float | None) -> str:
    return str(int(x)) if x is not None and float(x).is_integer() else str(x)


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    type: Any  # without Annotated
    range: Range | None
    aliases: tuple[str, ...]  # snake_case
    switch: bool  # --name / --no-name: a bool, or a bool-or-None marked tyro.conf.DisallowNone


@functools.cache
def field_table(config_cls: Any) -> dict[str, FieldSpec]:
    """Field name → its type, range and aliases, for a dataclass type."""
    import tyro

    if not dataclasses.is_dataclass(config_cls):
        raise TypeError(f"{config_cls!r} is not a dataclass")
    hints = typing.get_type_hints(config_cls, include_extras=True)
    # A subclass that only changes a field's default (``learning_rate: float = 2e-5``) keeps the
    # range its base declared: ranges are looked up from the base classes down.
    inherited: dict[str, Range] = {}
    for base in reversed(config_cls.__mro__):  # type: ignore[union-attr]
        if dataclasses.is_dataclass(base):
            for name, hint in typing.get_type_hints(base, include_extras=True).items():
                for meta in getattr(hint, "__metadata__", ()):
                    if isinstance(meta, Range):
                        inherited[name] = meta
    table: dict[str, FieldSpec] = {}
    for f in dataclasses.fields(config_cls):
        if not f.init:
            continue
        tp, extras = hints[f.name], list[Any]()
        if typing.get_origin(tp) is Annotated:
            tp, *extras = typing.get_args(tp)
        ranges = [m for m in extras if isinstance(m, Range)]
        aliases = [
            a.lstrip("-").replace("-", "_")
            for m in extras
            for a in (getattr(m, "aliases", None) or ())
        ]
        switch = tp is bool or (optional_inner(tp)[1] is bool and tyro.conf.DisallowNone in extras)
        table[f.name] = FieldSpec(
            tp, ranges[0] if ranges else inherited.get(f.name), tuple(aliases), switch
        )
    return table


def spellings(config_cls: Any) -> dict[str, str]:
    """Every accepted snake_case spelling (names and aliases) → field name."""
    return {s: name for name, f in field_table(config_cls).items() for s in (name, *f.aliases)}


def check_ranges(cfg: Any) -> None:
    """Raise ``ProxrlError`` for the first field whose value lies outside its ``Range``."""
    style = getattr(cfg, "range_style", "field")
    for name, f in field_table(type(cfg)).items():  # type: ignore[arg-type]
        value = getattr(cfg, name)
        if f.range is None or value is None or isinstance(value, bool):
            continue
        inner = optional_inner(f.type)[1]
        if typing.get_origin(inner) in (tuple, list):  # a list field: the range of each item
            items, inner = list(value), (typing.get_args(inner) or (float,))[0]
        else:
            items = [value]
        for item in items:
            if not f.range.holds(item):
                message = f.range.message(name, item, f.range.style or style, inner is int)
                raise ProxrlError(message)


def optional_inner(tp: Any) -> tuple[bool, Any]:
    """``Optional[X]`` / ``X | None`` → (True, X); anything else → (False, tp)."""
    origin = typing.get_origin(tp)
    if origin is Union or origin is types.UnionType:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) < len(typing.get_args(tp)) and len(args) == 1:
            return True, args[0]
    return False, tp


def type_name(tp: Any) -> str:
    optional, inner = optional_inner(tp)
    if optional:
        return f"{type_name(inner)} or None"
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (list, tuple):
        (arg, *_) = typing.get_args(tp) or (Any,)
        return f"a list of {type_name(arg)}"
    return getattr(tp, "__name__", str(tp))
