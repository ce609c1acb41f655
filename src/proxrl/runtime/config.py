"""Typed configs: a dataclass per command; ``[--config file.yaml] [--field value ...]`` replaces
its defaults by the file's values, then the flags'. argparse splits the flags, pydantic reads each
value (a YAML one strictly: ``1`` is no bool, ``"3"`` no int), ``cfg.validate()`` checks ranges
and rules, tyro prints ``--help``; a refusal is one ``ProxrlError`` line naming the field."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

import pydantic
import tyro
import yaml

from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.fields import FieldSpec, field_table, optional_inner, type_name
from proxrl.runtime.run_config import RunConfig  # noqa: F401  (its old home: callers import it)

T = TypeVar("T")
# A number as people write it; YAML 1.1 (PyYAML) reads ``1e-4`` (no dot) as a string.
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_NEGATIVE = re.compile(r"^-(\.?\d|inf$|nan$)", re.I)  # a flag's value, not an option: -1e-3, -inf
# Other libraries' names (TRL, CleanRL), suggested before the closest spelling (``lr`` is nearer
# ``lora_r`` than ``learning_rate``), where the command has the field.
KNOWN_SPELLINGS = dict(
    lr="learning_rate", num_train_epochs="epochs", per_device_train_batch_size="batch_size",
    gradient_accumulation_steps="grad_accum", max_seq_length="max_length", gae_lambda="lam",
    ent_coef="entropy_coef", minibatch_size="mini_batch_size", target_kl="early_stop_kl",
    norm_adv="whiten_advantages",
)  # fmt: skip


def _checked(tp: Any, value: Any, strict: bool, wrong: str, found: str | None = None) -> Any:
    """``value`` as pydantic reads it for ``tp``, or ``ProxrlError(wrong + found)`` (by default
    the offending item), with the closest choice of a ``Literal``."""
    try:
        return pydantic.TypeAdapter(tp).validate_python(value, strict=strict)
    except pydantic.ValidationError as e:
        bad = value if found else e.errors()[0]["input"]
    inner = optional_inner(tp)[1]
    choices = typing.get_args(inner) if typing.get_origin(inner) is Literal else ()
    close = difflib.get_close_matches(str(bad), map(str, choices), 1)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise ProxrlError(f"{wrong}, found {found or repr(bad)}{hint}")


def _unknown(kind: str, name: str, cls: type, prefix: str = "") -> ProxrlError:
    valid, spelt = list(_spellings(cls)), (lambda n: n.replace("_", "-") if prefix else n)
    known = KNOWN_SPELLINGS.get(name.replace("-", "_"))
    close = [known] if known in valid else difflib.get_close_matches(name, valid, 1, 0.5)
    shown = spelt(name)
    shown = shown if shown.isprintable() and shown and shown == shown.strip() else repr(shown)
    hint = f"; did you mean {prefix}{spelt(close[0])}?" if close else ""
    return ProxrlError(f"unknown {kind} {prefix}{shown}{hint}")


def _spellings(cls: type) -> dict[str, str]:
    """Every accepted snake_case spelling (names and aliases) → field name."""
    return {s: name for name, f in field_table(cls).items() for s in (name, *f.aliases)}


def _listed(tp: Any) -> bool:
    return typing.get_origin(optional_inner(tp)[1]) in (tuple, list)


def _read_yaml(path: Path) -> dict[Any, Any]:
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ProxrlError(f"config file {path} does not exist") from None
    except IsADirectoryError:
        raise ProxrlError(f"config file {path} is a directory; expected a YAML file") from None
    except UnicodeDecodeError as e:
        why = f"{e.reason} at byte {e.start}"
        raise ProxrlError(f"config file {path} is not UTF-8 text ({why})") from None
    except yaml.YAMLError as e:
        mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = problem or (str(e).splitlines() or [type(e).__name__])[0]
        raise ProxrlError(f"config file {where} is not valid YAML: {problem}") from None
    if not isinstance(raw, dict | None):
        raise ProxrlError(f"config file {path} must hold a mapping of field: value")
    return raw or {}


def _yaml_value(wrong: str, tp: Any, value: Any) -> Any:
    """A value checked strictly; the only conversions: int → float, a number written ``1e-4``
    (a string to YAML 1.1) in a float field → float, one value → a one-item list."""
    listed, inner, written = _listed(tp), optional_inner(tp)[1], value
    kind = typing.get_origin(inner)  # list or tuple
    if listed and value is not None:
        value = kind(value) if isinstance(value, (list, tuple)) else kind([value])
    if (typing.get_args(inner)[0] if listed else inner) is float:
        value = kind(map(_number, value)) if listed and value is not None else _number(value)
    found = repr(written) if typing.get_origin(inner) is Literal else None
    found = f"list {list(written)!r}" if isinstance(written, tuple) else found
    return _checked(tp, value, True, wrong, found or f"{type(written).__name__} {written!r}")


def _number(v: Any) -> Any:
    return float(v) if isinstance(v, str) and _NUMBER.fullmatch(v.strip()) else v


def file_values(cls: type, path: str | Path, given: frozenset[str], lenient=False) -> dict:
    """Field → checked value of the YAML file at ``path``; the ``given`` fields (set elsewhere,
    so a bad value there is no error) left out; ``lenient``: a key that is no field (an option a
    newer proxrl renamed) is passed over."""
    return _mapping_values(cls, _read_yaml(Path(path)), f"config file {path}", given, lenient)


def _mapping_values(cls: type, mapping: dict, where: str, skip=frozenset(), lenient=False) -> dict:
    """Field → checked value of ``mapping`` (dashes and aliases accepted), ``skip`` fields out."""
    names, values = _spellings(cls), {}
    for key, value in mapping.items():
        name = names.get(str(key).replace("-", "_"))
        if name is None and not lenient:
            raise ProxrlError(f"{where}: {_unknown('key', str(key), cls)}")
        if name is not None and name not in skip:
            tp = field_table(cls)[name].type
            values[name] = _yaml_value(f"{where}: field {name} expects {type_name(tp)}", tp, value)
    return values


def load_config_file(cls: type[T], path: str | Path, validate=True) -> T:
    """``cls`` from a YAML file of field: value (the others keep their defaults)."""
    return config_from_mapping(cls, _read_yaml(Path(path)), f"config file {path}", validate)


def config_from_mapping(cls: type[T], mapping: dict, where: str, validate=True, base=None) -> T:
    """``cls`` (or ``base`` with these fields replaced) from a mapping of field → value, with a
    YAML file's checks; a refusal is one line starting with ``where``."""
    values = _mapping_values(cls, mapping, where)
    cfg = cls(**values) if base is None else dataclasses.replace(base, **values)
    if validate and callable(getattr(cfg, "validate", None)):
        cfg.validate()
    return cfg


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A config as a plain dict (tuples become lists), ready for YAML or JSON."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(cfg).items()}


def save_config_file(cfg: Any, path: str | Path) -> None:
    """Write a config as YAML that ``load_config_file`` reads back to an equal config."""
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def saved_run_values(cls: type, resume: bool, output_dir: Any, given: frozenset[str]) -> dict:
    """With ``resume``: the options the run in ``output_dir`` saved (config.yaml, or
    ``cls.saved_config_file``), less the ``given`` ones and those of this invocation
    (``runtime.resume.SESSION_OPTIONS``): what a config file, flags or API options change."""
    from proxrl.runtime.resume import CONFIG_FILE, SESSION_OPTIONS

    path = Path(str(output_dir)) / getattr(cls, "saved_config_file", CONFIG_FILE)
    ok = resume and path.is_file()
    return file_values(cls, path, given | SESSION_OPTIONS, True) if ok else {}


class _Flags(argparse.ArgumentParser):
    """A config's flags as texts: ``--name v`` (a list ``--name v w``), a switch ``--name
    [true|false]`` or ``--no-name``, aliases, positional fields; a refusal raises."""

    def __init__(self, cls: type) -> None:
        super().__init__(add_help=False, allow_abbrev=False, exit_on_error=False)
        self.argument_default, self._negative_number_matcher = argparse.SUPPRESS, _NEGATIVE
        self.add_argument("--config")
        for name, f in field_table(cls).items():
            flags = ["--" + n.replace("_", "-") for n in (name, *f.aliases)]
            nargs = "*" if _listed(f.type) else "?" if f.switch or f.positional else None
            dest = {} if f.positional else {"dest": name}
            self.add_argument(*([name] if f.positional else flags), nargs=nargs, **dest)
            if f.switch:
                nos = ["--no-" + s[2:] for s in flags]
                self.add_argument(*nos, dest=name, action="store_const", const="false")


def _flag_value(name: str, f: FieldSpec, given: str | list[str] | None) -> Any:
    """A flag's text(s) as its field's value: a switch's word, ``none`` for an optional field,
    else pydantic's reading of the text (of each item for a list)."""
    flag = "--" + name.replace("_", "-")
    if f.switch:
        return _checked(
            bool, "true" if given is None else given, False, f"{flag} expects true or false"
        )
    if optional_inner(f.type)[0] and str(given).lower() in ("none", "null", "~"):
        return None
    return _checked(f.type, given, False, f"{flag} expects {type_name(f.type)}")


def parse_config(cls: type[T], argv: list[str] | None, prog: str) -> T:
    """Parse ``[--config file.yaml] [--field value ...]`` into a validated ``cls``; with
    ``--resume``, the run's saved config (``saved_run_values``) is the starting point.
    ``--help`` prints every field with its docstring and exits 0 (``SystemExit``)."""
    table, argv = field_table(cls), list(argv or [])
    args = [a for a in argv if a not in ("-h", "--help")]
    dashed = [re.sub(r"^(--[^=]*)", lambda m: m[1].replace("_", "-"), a) for a in args]
    try:
        texts, extras = _Flags(cls).parse_known_args(dashed)
    except argparse.ArgumentError as e:
        flag = (e.argument_name or "").split("/")[0]
        tp = table.get(flag[2:].replace("-", "_"))
        need = f"a value ({type_name(tp.type)})" if tp else "a file path"
        why = e.message.replace("ignored explicit argument", f"{flag} takes no value, found")
        raise ProxrlError(f"{flag} needs {need}" if why.startswith("expected") else why) from None
    texts = vars(texts)
    path = texts.pop("config", None)
    values = file_values(cls, path, frozenset(texts)) if path else {}
    flags, bad = {}, []
    for n, t in texts.items():
        try:
            flags[n] = _flag_value(n, table[n], t)
        except ProxrlError as e:
            bad.append(e)
    saved: dict[str, Any] = {}
    if {"resume", "output_dir"} <= table.keys():
        setting = {**{n: getattr(cls, n, None) for n in table}, **values, **flags}.get
        saved = saved_run_values(cls, setting("resume"), setting("output_dir"), frozenset(texts))
    missing = [n.upper() for n, f in table.items() if f.required and n not in values | flags]
    if len(args) < len(argv):
        default = tyro.MISSING_NONPROP if missing else cls(**(saved | values))
        tyro.cli(cls, args=["--help"], default=default, prog=prog)
    for arg in (a for a in extras if a != "--"):
        if arg.startswith("--"):
            raise _unknown("option", arg[2:].partition("=")[0].replace("-", "_"), cls, "--")
        raise ProxrlError(f"unexpected argument {arg!r}; options look like --name value")
    if missing or bad:
        raise ProxrlError(f"missing {', '.join(missing)}") if missing else bad[0]
    cfg = cls(**(saved | values | flags))
    if callable(getattr(cfg, "validate", None)):
        cfg.validate()
    return cfg
