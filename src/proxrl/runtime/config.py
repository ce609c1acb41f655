"""Typed configs: a dataclass per algorithm, loaded from YAML and overridden on the command line.

Every field carries a docstring on the line below it; ``tyro`` turns those into ``--help``.
The command line is ``[--config file.yaml] [--field value ...]``: YAML values become the
defaults, flags override them, then ``cfg.validate()`` (if the class defines one) checks values.
Flags may be spelled ``--field_name`` or ``--field-name``; boolean fields are switches
(``--resume`` / ``--no-resume``, and ``--resume true`` is accepted too).

Before ``tyro`` sees the arguments, every flag and every YAML key is checked here against the
dataclass fields, so an unknown name or a value of the wrong type is a one-line ``ProxrlError``
naming the field (with a "did you mean" suggestion) rather than a usage dump.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

from proxrl.runtime.errors import ProxrlError

T = TypeVar("T")

_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}
_NONE = {"none", "null", "~"}


@dataclasses.dataclass
class RunConfig:
    """Fields every trainer shares; algorithm configs subclass it."""

    output_dir: str = "runs/run"
    """Directory for metrics, TensorBoard events, checkpoints and the summary."""
    seed: int = 1
    """Random seed for Python, NumPy, torch and the environments."""
    resume: bool = False
    """Continue the run in output_dir from its newest complete checkpoint."""
    resume_with_changes: bool = False
    """With --resume: continue even though options differ from the run's config.yaml (without
    it such a resume is refused, naming the changed options)."""
    overwrite: bool = False
    """Delete a previous run in output_dir and start afresh."""
    save_every: int = 0
    """Save a checkpoint every this many iterations (0: only at the end)."""
    keep_checkpoints: int = 3
    """How many of the newest checkpoints to keep on disk."""

    def validate(self) -> None:
        """Raise ``ProxrlError`` for values no run can use."""
        if self.resume and self.overwrite:
            raise ProxrlError("--resume and --overwrite exclude each other; pick one")
        if self.save_every < 0:
            raise ProxrlError(f"--save-every must be >= 0, got {self.save_every}")
        if self.keep_checkpoints < 1:
            raise ProxrlError(f"--keep-checkpoints must be >= 1, got {self.keep_checkpoints}")


# --------------------------------------------------------------------------------------------
# Field introspection and value checking


def _fields(config_cls: type) -> dict[str, Any]:
    """Field name → resolved type annotation, for a dataclass type."""
    if not dataclasses.is_dataclass(config_cls):
        raise TypeError(f"{config_cls!r} is not a dataclass")
    hints = typing.get_type_hints(config_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(config_cls) if f.init}


def _unknown(kind: str, name: str, valid: list[str], flag: bool) -> ProxrlError:
    prefix = "--" if flag else ""
    shown = name.replace("_", "-") if flag else name
    pool = [v.replace("_", "-") for v in valid] if flag else valid
    close = difflib.get_close_matches(shown, pool, n=1, cutoff=0.5)
    hint = f"; did you mean {prefix}{close[0]}?" if close else ""
    if not shown.isprintable() or not shown or shown != shown.strip():
        shown = repr(shown)  # keep the message on one line and the name visible
    return ProxrlError(f"unknown {kind} {prefix}{shown}{hint}")


def _optional_inner(tp: Any) -> tuple[bool, Any]:
    """``Optional[X]`` / ``X | None`` → (True, X); anything else → (False, tp)."""
    origin = typing.get_origin(tp)
    if origin is Union or origin is types.UnionType:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) < len(typing.get_args(tp)) and len(args) == 1:
            return True, args[0]
    return False, tp


def _type_name(tp: Any) -> str:
    optional, inner = _optional_inner(tp)
    if optional:
        return f"{_type_name(inner)} or None"
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (list, tuple):
        (arg, *_) = typing.get_args(tp) or (Any,)
        return f"a list of {_type_name(arg)}"
    return getattr(tp, "__name__", str(tp))


def _found(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def _check_value(name: str, tp: Any, value: Any) -> Any:
    """Check a YAML value against a field type; return it converted (int → float, list → tuple)."""
    optional, inner = _optional_inner(tp)
    if value is None:
        if optional:
            return None
        raise ProxrlError(f"field {name} expects {_type_name(tp)}, found None")
    tp = inner
    origin = typing.get_origin(tp)
    bad = ProxrlError(f"field {name} expects {_type_name(tp)}, found {_found(value)}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            close = difflib.get_close_matches(str(value), [str(a) for a in typing.get_args(tp)], 1)
            raise ProxrlError(
                f"field {name} expects {_type_name(tp)}, found {value!r}"
                + (f"; did you mean {close[0]}?" if close else "")
            )
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise bad
        args = [a for a in typing.get_args(tp) if a is not Ellipsis] or [Any]
        items = [_check_value(f"{name}[{i}]", args[0], v) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    return value  # a type we do not check here; tyro or validate() will


def _check_flag_value(name: str, tp: Any, text: str) -> str:
    """Check the text of a ``--name value`` flag against the field type; return it in the
    spelling tyro expects (``None``, ``True``, ``False``)."""
    optional, inner = _optional_inner(tp)
    if optional and text.lower() in _NONE:
        return "None"
    origin = typing.get_origin(inner)
    expected = _type_name(tp)
    if inner is bool:
        if text.lower() not in _TRUE | _FALSE:
            raise ProxrlError(f"--{name.replace('_', '-')} expects {expected}, found {text!r}")
        return "True" if text.lower() in _TRUE else "False"
    if origin is Literal:
        choices = [str(a) for a in typing.get_args(inner)]
        if text not in choices:
            close = difflib.get_close_matches(text, choices, 1)
            raise ProxrlError(
                f"--{name.replace('_', '-')} expects {expected}, found {text!r}"
                + (f"; did you mean {close[0]}?" if close else "")
            )
        return text
    converters: dict[Any, Any] = {int: int, float: float}
    if inner in converters:
        try:
            converters[inner](text)
        except ValueError:
            raise ProxrlError(
                f"--{name.replace('_', '-')} expects {expected}, found {text!r}"
            ) from None
    return text


# --------------------------------------------------------------------------------------------
# YAML files


def _yaml_problem(path: Path, e: yaml.YAMLError) -> str:
    """``file:line:column is not valid YAML: <problem>`` from a PyYAML error."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or (str(e).splitlines() or [type(e).__name__])[0]
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    return f"{where} is not valid YAML: {problem}"


def load_config_file(config_cls: type[T], path: str | Path, validate: bool = True) -> T:
    """Build ``config_cls`` from a YAML mapping of field → value (missing fields keep defaults).

    Unknown keys and values of the wrong type raise ``ProxrlError`` naming the key.
    ``validate=False`` skips ``cfg.validate()`` (``parse_config`` validates after overrides).
    """
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ProxrlError(f"config file {path} does not exist") from None
    except yaml.YAMLError as e:
        raise ProxrlError(f"config file {_yaml_problem(path, e)}") from None
    except UnicodeDecodeError as e:
        raise ProxrlError(f"config file {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except IsADirectoryError:
        raise ProxrlError(f"config file {path} is a directory; expected a YAML file") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ProxrlError(f"config file {path} must hold a mapping of field: value")
    fields = _fields(config_cls)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in fields:
            err = _unknown("key", str(key), list(fields), flag=False)
            raise ProxrlError(f"config file {path}: {err}")
        try:
            values[name] = _check_value(name, fields[name], value)
        except ProxrlError as e:
            raise ProxrlError(f"config file {path}: {e}") from None
    cfg = config_cls(**values)
    if validate:
        _validate(cfg)
    return cfg


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A config as a plain dict (tuples become lists), ready for YAML or JSON."""
    out = dataclasses.asdict(cfg)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


def save_config_file(cfg: Any, path: str | Path) -> None:
    """Write a config as YAML that ``load_config_file`` reads back to an equal config."""
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


# --------------------------------------------------------------------------------------------
# Command line


def _split_config_flag(argv: list[str]) -> tuple[str | None, list[str]]:
    path: str | None = None
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config":
            if i + 1 >= len(argv):
                raise ProxrlError("--config needs a file path")
            path, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--config="):
            path, i = arg.split("=", 1)[1], i + 1
            continue
        rest.append(arg)
        i += 1
    return path, rest


def _check_flags(config_cls: type, argv: list[str]) -> list[str]:
    """Reject unknown flags and mistyped values; return argv with bool values made switches."""
    fields = _fields(config_cls)
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            out.append(arg)
            i += 1
            continue
        if not arg.startswith("--"):
            raise ProxrlError(f"unexpected argument {arg!r}; options look like --name value")
        name, eq, inline = arg[2:].partition("=")
        name = name.replace("-", "_")
        negated = name.startswith("no_") and name[3:] in fields and name not in fields
        field = name[3:] if negated else name
        if field not in fields:
            raise _unknown("option", name, list(fields), flag=True)
        tp = fields[field]
        flag = "--" + field.replace("_", "-")
        if tp is bool:
            text = inline if eq else None
            if text is None and not negated and i + 1 < len(argv):
                nxt = argv[i + 1].lower()
                if nxt in _TRUE | _FALSE or not nxt.startswith("-"):  # a value: checked below
                    text, i = argv[i + 1], i + 1
            if text is not None:
                if negated or text.lower() not in _TRUE | _FALSE:
                    raise ProxrlError(f"{flag} expects true or false, found {text!r}")
                negated = text.lower() in _FALSE
            out.append("--no-" + flag[2:] if negated else flag)
            i += 1
            continue
        if negated:
            raise _unknown("option", name, list(fields), flag=True)
        if typing.get_origin(_optional_inner(tp)[1]) in (list, tuple):
            values = [inline] if eq else []
            i += 1
            while not eq and i < len(argv) and not argv[i].startswith("--"):
                values.append(argv[i])
                i += 1
            if not values:
                raise ProxrlError(f"{flag} needs one or more values ({_type_name(tp)})")
            (item_tp, *_) = typing.get_args(_optional_inner(tp)[1]) or (str,)
            out += [flag, *(_check_flag_value(field, item_tp, v) for v in values)]
            continue
        if eq:
            value, i = inline, i + 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value, i = argv[i + 1], i + 2
        else:
            raise ProxrlError(f"{flag} needs a value ({_type_name(tp)})")
        out += [flag, _check_flag_value(field, tp, value)]
    return out


def _validate(cfg: Any) -> None:
    validate = getattr(cfg, "validate", None)
    if callable(validate):
        validate()


def parse_config(config_cls: type[T], argv: list[str] | None, prog: str) -> T:
    """Parse ``[--config file.yaml] [--field value ...]`` into a validated ``config_cls``.

    ``--help`` prints every field with its docstring and exits 0 (``SystemExit``).
    """
    import tyro

    argv = list(argv or [])
    config_path, rest = _split_config_flag(argv)
    default = (
        load_config_file(config_cls, config_path, validate=False)
        if config_path
        else config_cls()
    )
    rest = _check_flags(config_cls, rest)
    cfg = tyro.cli(config_cls, args=rest, default=default, prog=prog)
    _validate(cfg)
    return cfg
