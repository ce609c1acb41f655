"""Typed configs: a dataclass per command, a field's other spellings (``alias``) and bounds
(``Range``) in its ``Annotated`` metadata. ``[--config file.yaml] [--field value ...]`` replaces
the defaults by the file's values, then the flags': argparse splits the flags, pydantic reads each
value (a YAML one strictly: ``1`` is no bool, ``"3"`` no int) and checks the ranges, tyro prints
``--help``; a refusal is one ``ProxrlError`` line naming the field."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, TypeVar, Union

import pydantic
import tyro
import yaml

from proxrl.registry import AppliesWith, Bound, Choice
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.foreign_names import DIFFERENT, SAME

T = TypeVar("T")
# A number as people write it; YAML 1.1 (PyYAML) reads ``1e-4`` (no dot) as a string.
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_NEGATIVE = re.compile(r"^-(\.?\d|inf$|nan$)", re.I)  # a flag's value, not an option: -1e-3, -inf
# Prefixed to such a value so that argparse reads it as one (it takes -1 for a value, not -1e-3 or
# -inf), and taken off after: a command line cannot hold a NUL, so no real argument has it.
_VALUE = "\0"


def alias(*names: str) -> Any:
    """Other spellings of a field, in flags and YAML (CleanRL's ``lr``): tyro's, for ``--help``."""
    return tyro.conf.arg(aliases=tuple("--" + n.replace("_", "-") for n in names))


Range = Bound
"""Bounds of a finite number (of each item of a list); ``Range()``: any finite number. The one
range type: a config field's and a core knob's (``Bound``) alike."""


CONFIG_FILE = "config.yaml"
"""A run's saved config, in its output directory (what ``--resume`` starts from)."""


@dataclasses.dataclass(frozen=True)
class OnResume:
    """How ``--resume`` treats a field, in its ``Annotated`` metadata (``runtime.resume``); a
    field without one is compared with the saved run's value, and a change refused."""

    session: bool  # True: it describes this invocation, never read from the saved config


SESSION_OPTION = OnResume(session=True)
"""Describes this invocation rather than the run: never taken from the saved config, and free
to differ from it."""
FREE_ON_RESUME = OnResume(session=False)
"""May change on resume: it says where the run lives, how it is driven, saved and shown, never
what it computes."""


class FieldSpec(NamedTuple):
    type: Any  # without Annotated
    range: Range | None  # a subclass that only changes the default keeps its base's
    aliases: tuple[str, ...]  # snake_case
    switch: bool  # --name / --no-name: a bool, or a bool-or-None marked tyro.conf.DisallowNone
    positional: bool  # tyro.conf.Positional
    required: bool  # no default
    choice: Choice | None  # the registry whose entry (each item's, for a list) the value picks
    applies_with: str | None  # the field that must be set for this one to apply
    on_resume: OnResume | None  # how --resume treats it (None: a change is refused)


@functools.cache
def field_table(config_cls: Any) -> dict[str, FieldSpec]:
    hints = [typing.get_type_hints(b, include_extras=True) for b in reversed(config_cls.__mro__)]
    table = {}
    for f in (f for f in dataclasses.fields(config_cls) if f.init):
        hint = hints[-1][f.name]
        tp, *extras = typing.get_args(hint) if typing.get_origin(hint) is Annotated else (hint,)
        metadata = [m for h in hints for m in getattr(h.get(f.name), "__metadata__", ())]
        names = [a[2:].replace("-", "_") for m in extras for a in getattr(m, "aliases", 0) or ()]
        item = list_item(tp)[1]
        item_extras = getattr(item, "__metadata__", ()) if list_item(tp)[0] else ()
        markers = [*metadata, *item_extras]
        table[f.name] = FieldSpec(
            tp,
            ([None] + [m for m in metadata if isinstance(m, Range)])[-1],
            tuple(names),
            tp is bool or (optional_inner(tp)[1] is bool and tyro.conf.DisallowNone in extras),
            tyro.conf.Positional in extras,
            f.default is f.default_factory is dataclasses.MISSING,
            next((m for m in markers if isinstance(m, Choice)), None),
            next((m.field for m in markers if isinstance(m, AppliesWith)), None),
            next((m for m in metadata if isinstance(m, OnResume)), None),
        )
    spelt = {s for n, f in table.items() for s in (n, *f.aliases)}
    for name, (field, _) in SAME.items():  # another library's name of the same meaning
        if field in table and name not in spelt:
            table[field] = table[field]._replace(aliases=(*table[field].aliases, name))
    return table


@functools.cache
def _bounds(r: Range) -> pydantic.TypeAdapter[list[float]]:
    bounds = pydantic.Field(ge=r.ge, gt=r.gt, le=r.le, lt=r.lt, allow_inf_nan=False)
    return pydantic.TypeAdapter(list[Annotated[float, bounds]])


def check_ranges(cfg: Any) -> None:
    """Raise ``ProxrlError`` for the first value (or list item) outside its field's ``Range``:
    ``name: expected >= 1, got 0`` (an int's ``> 0`` reads ``>= 1``), ``name: expected in [0,
    1), got 1.5``, ``name: expected a finite number, got nan``."""
    for name, f in field_table(type(cfg)).items():
        value, (kind, item), r = getattr(cfg, name), list_item(f.type), f.range
        try:
            if r and value is not None and not isinstance(value, bool):
                _bounds(r).validate_python(list(value) if kind else [value], strict=True)
            continue
        except pydantic.ValidationError as e:
            got = e.errors()[0]["input"]
        ge, gt = (int(r.gt) + 1, None) if item is int and r.gt is not None else (r.ge, r.gt)
        low = [(op, b) for op, b in ((">=", ge), (">", gt)) if b is not None]
        high = [(op, b) for op, b in (("<=", r.le), ("<", r.lt)) if b is not None]
        want = " ".join(f"{op} {b:.15g}" for op, b in (low + high)[:1])
        if low and high:
            ends = "[("[low[0][0] == ">"], "])"[high[0][0] == "<"]
            want = f"in {ends[0]}{low[0][1]:.15g}, {high[0][1]:.15g}{ends[1]}"
        want = want if math.isfinite(got) else "a finite number"
        raise ProxrlError(f"{name}: expected {want}, got {got}")


def _check_order(cfg: Any) -> None:
    """A lower bound at or above its upper one (``Range(below=...)``) would leave nothing
    between them: refused, naming both."""
    for name, f in field_table(type(cfg)).items():
        upper = f.range.below if f.range else None
        low, high = getattr(cfg, name), getattr(cfg, upper) if upper else None
        if upper and low is not None and high is not None and low >= high:
            raise ProxrlError(f"{name}: expected < {upper} ({high:g}), got {low}")


@functools.cache
def field_defaults(config_cls: Any) -> dict[str, Any]:
    """Field → its default (a default_factory called once) in ``config_cls``."""
    return {
        f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(config_cls)
        if f.init and not (f.default is f.default_factory is dataclasses.MISSING)
    }


@functools.cache
def knob_owners(config_cls: Any) -> dict[str, list[tuple[str, str | None]]]:
    """Field → what makes it apply: (choice field, entry) for each registry entry of the
    config's choice fields that declares it a knob, (field, None) for ``AppliesWith(field)``.
    A field with no owner always applies."""
    table, owners = field_table(config_cls), {}
    for name, f in table.items():
        for entry in f.choice.registry if f.choice else ():
            for knob in f.choice.registry.knobs(entry):
                if knob in table:  # a knob of a field this command lacks is not its business
                    owners.setdefault(knob, []).append((name, entry))
        if f.applies_with is not None:
            owners.setdefault(name, []).append((f.applies_with, None))
    return owners


def _is_set(cfg: Any, name: str) -> bool:
    return getattr(cfg, name) != field_defaults(type(cfg)).get(name, dataclasses.MISSING)


def _shown(value: Any) -> str:
    if value is None or value == ():
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    return ", ".join(map(str, value)) if isinstance(value, list | tuple) else str(value)


def knob_refusal(
    cfg: Any, name: str, open_choices: Collection[str] = (), seen: frozenset[str] = frozenset()
) -> str | None:
    """None where field ``name`` applies to the run, else why not (the option that would make
    it apply and what the run has instead). ``open_choices``: choice fields whose entry is
    picked later (a training client's loss, per call): any knob of theirs applies."""
    owners, table = knob_owners(type(cfg)), field_table(type(cfg))
    if name not in owners or name in seen:
        return None
    seen |= {name}
    for field, entry in owners[name]:
        choice = table[field].choice
        on = _is_set(cfg, field) if entry is None else entry in choice.selected(getattr(cfg, field))
        if on or field in open_choices:
            reason = knob_refusal(cfg, field, open_choices, seen)
            if reason is None:
                return None
            through = f"with {field}" if entry is None else f"to {field} {entry}"
            return f"{name}: applies {through}, and {reason.replace(':', '', 1)}"
    wanted: dict[str, list[str]] = {}
    for field, entry in owners[name]:
        wanted.setdefault(field, []).extend([] if entry is None else [entry])
    parts = [f"{f} {', '.join(e)}" if e else f"with {f}" for f, e in wanted.items()]
    has = [_shown(getattr(cfg, f)) for f in wanted]
    if len(wanted) > 1:
        has = [f"{f} {h}" for f, h in zip(wanted, has, strict=True)]
    target = " or ".join(p if p.startswith("with ") else f"to {p}" for p in parts)
    return f"{name}: applies {target}; this run has {', '.join(has)}"


def check_knobs(cfg: Any, open_choices: Collection[str] = ()) -> None:
    """Raise ``ProxrlError`` for a field set away from its default while nothing that reads it
    is selected: a knob of a registry entry the run has not chosen (``sapo_tau_pos: applies to
    policy_loss sapo; this run has ppo``), or a field ``AppliesWith`` another that is unset.
    The config class's ``harmless_when_unused`` (field → why) lists the deliberate exceptions.
    First, a lower bound at or above its upper one (``Range(below=...)``) is refused.
    ``open_choices``: as ``knob_refusal``'s."""
    _check_order(cfg)
    exempt = getattr(type(cfg), "harmless_when_unused", {})
    for name in field_table(type(cfg)):
        unused = name not in exempt and _is_set(cfg, name)
        reason = knob_refusal(cfg, name, open_choices) if unused else None
        if reason is not None:
            raise ProxrlError(reason)


def optional_inner(tp: Any) -> tuple[bool, Any]:
    """``Optional[X]`` / ``X | None`` → (True, X); anything else → (False, tp)."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (Union, types.UnionType) and len(args) == 2 and type(None) in args:
        return True, next(a for a in args if a is not type(None))
    return False, tp


def list_item(tp: Any) -> tuple[Any, Any]:
    """(list or tuple, the item type) of a list field, else (None, the type without None)."""
    inner = optional_inner(tp)[1]
    kind = typing.get_origin(inner)
    return (kind, typing.get_args(inner)[0]) if kind in (list, tuple) else (None, inner)


def type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Annotated:  # a list item's registry marker
        tp = typing.get_args(tp)[0]
    (optional, inner), (kind, item) = optional_inner(tp), list_item(tp)
    if optional or kind:
        return f"{type_name(inner)} or None" if optional else f"a list of {type_name(item)}"
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(tp)))
    return getattr(tp, "__name__", str(tp))


def _value(tp: Any, value: Any, wrong: str, strict=True) -> Any:
    """``value`` as pydantic reads it for ``tp``, else ``ProxrlError("{wrong}, found …")`` with
    the closest choice. ``strict`` (a YAML value): int → float, a float written ``1e-4`` → float
    and one value → a one-item list are its only conversions; else a flag's text(s), or none."""
    (kind, item), written, (optional, inner) = list_item(tp), value, optional_inner(tp)
    if not strict and optional and str(value).lower() in ("none", "null", "~"):
        return None
    items = value if isinstance(value, list | tuple) else [value]
    if strict and item is float:
        items = [
            float(v) if isinstance(v, str) and _NUMBER.fullmatch(v.strip()) else v for v in items
        ]
    if strict and value is not None and (kind or not isinstance(value, list | tuple)):
        value = kind(items) if kind else items[0]
    try:
        return pydantic.TypeAdapter(tp).validate_python(value, strict=strict)
    except pydantic.ValidationError as e:
        bad = written if strict else e.errors()[0]["input"]  # a flag's offending item
    choices = typing.get_args(inner) if typing.get_origin(inner) is Literal else ()
    close = difflib.get_close_matches(str(bad), map(str, choices), 1)
    shown = list(bad) if isinstance(bad, tuple) else bad
    found = f"{type(shown).__name__} {shown!r}" if strict and not choices else repr(bad)
    raise ProxrlError(f"{wrong}, found {found}" + (f"; did you mean {close[0]}?" if close else ""))


def _hint(name: str, table: dict[str, FieldSpec], flag: bool) -> str:
    """What an unknown ``name`` is: another library's (``foreign_names``: what to use instead),
    else the closest spelling of the command's options; '' when none is close."""
    if name in DIFFERENT:
        who, what = DIFFERENT[name]
        return f": in {who} it {what}"
    if name in SAME:
        return f": in {SAME[name][1]} it is {SAME[name][0]}, which this command does not have"
    spellings = [s for n, f in table.items() for s in (n, *f.aliases)]
    close = difflib.get_close_matches(name, spellings, 1, 0.5)
    shown = ["--" + n.replace("_", "-") if flag else n for n in close[:1]]
    return f"; did you mean {shown[0]}?" if shown else ""


def _unknown(names: list[tuple[str, str]], table: dict[str, FieldSpec]) -> ProxrlError:
    """One error, one line, for every unknown name, (where, name): ``where`` a file's (or
    mapping's) prefix, '' for a flag; a name given twice is named once."""
    rows = []
    for where, name in dict.fromkeys(names):
        key = name.replace("-", "_")
        shown = "--" + key.replace("_", "-") if not where else name
        ok = shown.isprintable() and shown == shown.strip() and name
        rows.append((where, shown if ok else repr(shown), _hint(key, table, not where)))
    if len(rows) == 1:
        where, shown, hint = rows[0]
        return ProxrlError(
            f"{where}: unknown key {shown}{hint}" if where else f"unknown option {shown}{hint}"
        )
    places = {where for where, _, _ in rows}
    if len(places) > 1:
        head = f"{len(rows)} unknown keys and options"
        items = [f"{where}: {shown}" if where else shown for where, shown, _ in rows]
    else:
        where = places.pop()
        head = f"{where}: {len(rows)} unknown keys" if where else f"{len(rows)} unknown options"
        items = [shown for _, shown, _ in rows]
    # each hint in brackets after its name ("; did you mean x?" → "(did you mean x?)")
    items = [
        f"{item} ({hint[2:]})" if hint else item
        for item, (_, _, hint) in zip(items, rows, strict=True)
    ]
    return ProxrlError(f"{head}: " + "; ".join(items))


def _foreign_help(table: dict[str, FieldSpec]) -> str:
    """--help's list of the other libraries' names this command takes (``foreign_names``)."""
    taken = [
        f"  --{a.replace('_', '-')} ({SAME[a][1]}) = --{n.replace('_', '-')}"
        for n, f in table.items()
        for a in f.aliases
        if a in SAME and SAME[a][0] == n
    ]
    head = "other libraries' names this command takes (docs/coming_from_trl.md):"
    return "\n".join([head, *taken]) if taken else ""


def _twice(seen: dict[str, str], name: str, spelling: str, where: str) -> None:
    """A field given under two of its names (``beta`` and ``kl_coef``) in one place: refused,
    rather than one of them silently winning."""
    if seen.setdefault(name, spelling) != spelling:
        raise ProxrlError(f"{where}{name} given twice, as {seen[name]} and {spelling}; keep one")


def file_values(
    cls: type, path: Any, given=frozenset(), lenient=False, where="", unknown=None
) -> dict:
    """Field → checked value of the YAML file at ``path`` (or of the mapping ``path`` from
    ``where``), less the ``given`` fields (set elsewhere, so a bad value there is no error);
    ``lenient``: a key that is no field (an option a newer proxrl renamed) is passed over. Every
    unknown key is refused in one error, or with ``unknown`` (a list) added to it instead."""
    names = {s: n for n, f in field_table(cls).items() for s in (n, *f.aliases)}
    values, where, mapping = {}, where or f"config file {path}", path
    keep_unknown, unknown = unknown is not None, [] if unknown is None else unknown
    if not isinstance(path, dict) and (Path(path).is_dir() or not Path(path).exists()):
        what = "is a directory; expected a YAML file" if Path(path).is_dir() else "does not exist"
        raise ProxrlError(f"{where} {what}")
    try:
        mapping = path if isinstance(path, dict) else yaml.safe_load(Path(path).read_text())
    except UnicodeDecodeError as e:
        raise ProxrlError(f"{where} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        problem = getattr(e, "problem", None) or (str(e).splitlines() or [type(e).__name__])[0]
        raise ProxrlError(f"config file {at} is not valid YAML: {problem}") from None
    if not isinstance(mapping, dict | None):
        raise ProxrlError(f"{where} must hold a mapping of field: value")
    seen: dict[str, str] = {}
    for key, value in (mapping or {}).items():
        name = names.get(str(key).replace("-", "_"))
        if name is None and not lenient:
            unknown.append((where, str(key)))
        if name is not None:
            _twice(seen, name, str(key), f"{where}: ")
        if name not in {None, *given}:
            tp = field_table(cls)[name].type
            values[name] = _value(tp, value, f"{where}: field {name} expects {type_name(tp)}")
    if unknown and not keep_unknown:
        raise _unknown(unknown, field_table(cls))
    return values


def load_config_file(cls: type[T], path: str | Path, validate=True) -> T:
    """``cls`` from a YAML file of field: value (the others keep their defaults)."""
    return config_from_mapping(cls, str(path), f"config file {path}", validate)


def config_from_mapping(cls: type[T], mapping: Any, where: str, validate=True, base=None) -> T:
    """``cls`` (or ``base`` with these fields replaced) from a mapping of field → value (or a
    YAML file), checked as ``file_values`` does; a refusal is one line starting with ``where``."""
    values = file_values(cls, mapping, where=where)
    cfg = cls(**values) if base is None else dataclasses.replace(base, **values)
    if validate and callable(getattr(cfg, "validate", None)):
        cfg.validate()
    return cfg


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A config as a plain dict (tuples become lists), ready for YAML or JSON."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(cfg).items()}


def narrowed(record: type[T], cfg: Any, **given: Any) -> T:
    """A stage's settings record (a dataclass) from the config: each of its fields the config's
    field of the same name, except those in ``given`` (what a record derives or holds that is no
    option). A record field the config lacks and ``given`` does not supply is a TypeError: the
    name of a setting means one thing in the config and in every record."""
    taken = {
        f.name: getattr(cfg, f.name)
        for f in dataclasses.fields(record)  # type: ignore[arg-type]
        if f.init and f.name not in given and hasattr(cfg, f.name)
    }
    return record(**taken, **given)


def save_config_file(cfg: Any, path: str | Path) -> None:
    """Write a config as YAML that ``load_config_file`` reads back to an equal config."""
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def free_on_resume(config_cls: Any, session_only: bool = False) -> frozenset[str]:
    """The fields of ``config_cls`` marked ``FREE_ON_RESUME`` or ``SESSION_OPTION`` (with
    ``session_only``, only the latter): a subclass that changes only a default keeps its
    base's mark."""
    return frozenset(
        name
        for name, f in field_table(config_cls).items()
        if f.on_resume is not None and (f.on_resume.session or not session_only)
    )


def saved_run_values(cls: type, resume: bool, output_dir: Any, given: frozenset[str]) -> dict:
    """With ``resume``: the options the run in ``output_dir`` saved (config.yaml, or
    ``cls.saved_config_file``), less the ``given`` ones and those of this invocation (marked
    ``SESSION_OPTION``): what a config file, flags or API options change."""
    path = Path(str(output_dir)) / getattr(cls, "saved_config_file", CONFIG_FILE)
    if not (resume and path.is_file()):
        return {}
    values = file_values(cls, path, given | free_on_resume(cls, session_only=True), True)
    return former_defaults_unset(cls, values)


def former_defaults_unset(cls: type, saved: dict[str, Any]) -> dict[str, Any]:
    """A saved config's values, each option of ``cls.former_defaults`` (name → the default an
    earlier proxrl saved) read as its default now where it holds that earlier default: the run
    took the default, not a value its user chose."""
    former = getattr(cls, "former_defaults", {})
    now = {f.name: f.default for f in dataclasses.fields(cls) if f.name in former}
    return {
        name: now[name] if name in former and value == former[name] else value
        for name, value in saved.items()
    }


def _unmarked(text: Any) -> Any:
    """A value parsed from the command line, or a list of them, without ``_VALUE``."""
    if isinstance(text, list):
        return [_unmarked(t) for t in text]
    return text.removeprefix(_VALUE) if isinstance(text, str) else text


def parse_config(cls: type[T], argv: list[str] | None, prog: str) -> T:
    """Parse ``[--config file.yaml] [--field value ...]`` into a validated ``cls``: argparse splits
    ``--name v`` (a list ``--name v w``), a switch ``--name [true|false]`` or ``--no-name``,
    aliases, positional fields; pydantic reads the texts; with ``--resume`` the run's saved
    config (``saved_run_values``) is the base. ``--help`` prints the fields and exits 0."""
    table, argv = field_table(cls), list(argv or [])
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    parser.argument_default = argparse.SUPPRESS
    parser.add_argument("--config")
    for name, f in table.items():
        flags = ["--" + n.replace("_", "-") for n in (name, *f.aliases)]
        nargs = "*" if list_item(f.type)[0] else "?" if f.switch or f.positional else None
        parser.add_argument(*[name] if f.positional else flags, nargs=nargs)
        for no in ["--no-" + s[2:] for s in flags] if f.switch else ():
            parser.add_argument(no, dest=name, action="store_const", const="false")
    args = [a for a in argv if a not in ("-h", "--help")]
    try:
        dashed = [re.sub(r"^(--[^=]*)", lambda m: m[1].replace("_", "-"), a) for a in args]
        known, extras = parser.parse_known_args(
            [_VALUE + a if _NEGATIVE.match(a) else a for a in dashed]
        )
    except argparse.ArgumentError as e:
        flag = (e.argument_name or "").split("/")[0]
        tp = table.get(flag[2:].replace("-", "_"))
        need = f"a value ({type_name(tp.type)})" if tp else "a file path"
        why = e.message.replace("ignored explicit argument", f"{flag} takes no value, found")
        raise ProxrlError(f"{flag} needs {need}" if why.startswith("expected") else why) from None
    texts, unknown = {k: _unmarked(v) for k, v in vars(known).items()}, []
    extras = _unmarked(extras)
    path = texts.pop("config", None)
    values = file_values(cls, path, frozenset(texts), unknown=unknown) if path else {}
    spelt, seen = {s: n for n, f in table.items() for s in (n, *f.aliases)}, {}
    for arg in (a[2:].partition("=")[0].replace("-", "_") for a in dashed if a.startswith("--")):
        if arg in spelt:
            _twice(seen, spelt[arg], "--" + arg.replace("_", "-"), "")
    flags, bad = {}, []
    for name, text in texts.items():
        tp, flag = bool if table[name].switch else table[name].type, "--" + name.replace("_", "-")
        wrong = f"{flag} expects {'true or false' if tp is bool else type_name(tp)}"
        try:
            flags[name] = _value(tp, "true" if text is None else text, wrong, strict=False)
        except ProxrlError as e:
            bad.append(e)
    saved: dict[str, Any] = {}
    if {"resume", "output_dir"} <= table.keys():
        setting = {**{n: getattr(cls, n, None) for n in table}, **values, **flags}.get
        saved = saved_run_values(cls, setting("resume"), setting("output_dir"), frozenset(texts))
    missing = [n.upper() for n, f in table.items() if f.required and n not in values | flags]
    if len(args) < len(argv):
        default = tyro.MISSING_NONPROP if missing else cls(**(saved | values))
        try:
            tyro.cli(cls, args=["--help"], default=default, prog=prog)
        finally:
            print(_foreign_help(table))
    for arg in (a for a in extras if a != "--"):
        if arg.startswith("--"):
            unknown.append(("", arg[2:].partition("=")[0]))
        elif not unknown or unknown[-1][0]:  # else the value of an unknown flag
            raise ProxrlError(f"unexpected argument {arg!r}; options look like --name value")
    if unknown:
        raise _unknown(unknown, table)
    if missing or bad:
        raise ProxrlError(f"missing {', '.join(missing)}") if missing else bad[0]
    cfg = cls(**(saved | values | flags))
    if callable(getattr(cfg, "validate", None)):
        cfg.validate()
    return cfg
