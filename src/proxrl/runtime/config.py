"""Typed configs: a dataclass per command, loaded from YAML and overridden on the command line.

Every field carries a docstring on the line below it; ``tyro`` turns those into ``--help`` and
parses the flags (``--field_name`` and ``--field-name``, ``--x=v``, ``--flag`` / ``--no-flag``,
lists as ``--names a b``). YAML values are checked with pydantic's strict validation, one field
at a time, so ``1`` is no bool and ``"3"`` no int. The command line is
``[--config file.yaml] [--field value ...]``: YAML values become the defaults, flags override
them, then ``cfg.validate()`` checks values.

What this module adds to the two libraries, and why:

* a field's aliases (CleanRL's ``lr``) are accepted in YAML too, and its range is checked by
  ``RunConfig.validate()`` (both declared beside the field: ``runtime.fields``);
* tyro's parse errors (a boxed usage text and ``SystemExit``) are translated, through its
  parse-error hook, into the one-line ``ProxrlError`` messages of docs/errors.md;
* switches also take a value (``--resume true``) and optional fields take ``none``: two
  spellings users already rely on that tyro does not read (``_tyro_spellings``).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import typing
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import yaml

from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.fields import (
    Range,
    check_ranges,
    field_table,
    optional_inner,
    spellings,
    type_name,
)
from proxrl.runtime.trackers import TrackerName, check_report_to

T = TypeVar("T")

_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}
_NONE = {"none", "null", "~"}


@dataclasses.dataclass
class RunConfig:
    """Fields every trainer shares; algorithm configs subclass it."""

    range_style: ClassVar[Literal["field", "flag"]] = "field"

    output_dir: str = "runs/run"
    """Directory for metrics, TensorBoard events, checkpoints and the summary."""
    seed: Annotated[int, Range(ge=0, le=2**32 - 1)] = 1
    """Random seed for Python, NumPy, torch and the environments."""
    resume: bool = False
    """Continue the run in output_dir from its newest complete checkpoint."""
    resume_with_changes: bool = False
    """With --resume: continue even though options differ from the run's config.yaml (without
    it such a resume is refused, naming the changed options)."""
    overwrite: bool = False
    """Delete a previous run in output_dir and start afresh."""
    save_every: Annotated[int, Range(ge=0, style="flag")] = 0
    """Save a checkpoint every this many iterations (0: only at the end)."""
    keep_checkpoints: Annotated[int, Range(ge=1, style="flag")] = 3
    """How many of the newest checkpoints to keep on disk."""
    max_consecutive_skips: Annotated[int, Range(gt=0)] = 5
    """Stop after this many updates in a row skipped for a NaN/Inf (loss, gradient, advantages)."""
    progress: bool = True
    """Show a progress bar on a terminal."""
    report_to: tuple[TrackerName, ...] = ("tensorboard",)
    """Trackers that also get every metric: tensorboard, wandb, mlflow, trackio (several), none."""

    def validate(self) -> None:
        """Raise ``ProxrlError`` for values no run can use."""
        from proxrl.runtime.distributed import check_launch

        if self.resume and self.overwrite:
            raise ProxrlError("--resume and --overwrite exclude each other; pick one")
        check_ranges(self)
        check_launch()  # a launch that asked for several processes and got one
        check_report_to(self.report_to)


# --------------------------------------------------------------------------------------------
# Types: names in messages, and the strict check of a YAML value


@functools.cache
def _adapter(tp: Any) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(tp)


# A number as people write it; YAML 1.1 (PyYAML) reads ``1e-4`` (no dot) as a string.
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _as_written(tp: Any, value: Any) -> Any:
    """The spellings people write that YAML does not type as the field does: ``1e-4`` (a
    string to YAML 1.1) in a float field, and one value where a list is expected."""
    inner = optional_inner(tp)[1]
    listed = typing.get_origin(inner) in (tuple, list)
    item = (typing.get_args(inner) or (Any,))[0] if listed else inner
    if listed and value is not None and not isinstance(value, (list, tuple)):
        value = [value]
    if item is float:
        value = [_number(v) for v in value] if isinstance(value, list) else _number(value)
    return value


def _number(value: Any) -> Any:
    return float(value) if isinstance(value, str) and _NUMBER.fullmatch(value.strip()) else value


def _check_value(name: str, tp: Any, value: Any) -> Any:
    """A YAML value checked strictly against a field type (int → float, list → tuple, a
    number written ``1e-4`` → float and one value → a one-item list are the only conversions);
    a ``ProxrlError`` naming the field otherwise."""
    from pydantic import ValidationError

    written, value = value, _as_written(tp, value)
    if isinstance(value, list) and typing.get_origin(optional_inner(tp)[1]) is tuple:
        value = tuple(value)
    try:
        return _adapter(tp).validate_python(value, strict=True)
    except ValidationError:
        value = written  # the message shows what the file holds
    literal = typing.get_origin(optional_inner(tp)[1]) is Literal
    found = repr(value) if literal else f"{type(value).__name__} {value!r}"
    if isinstance(value, tuple):
        found = f"list {list(value)!r}"
    return _raise(f"field {name} expects {type_name(tp)}, found {found}", value, tp)


def _raise(message: str, value: Any, tp: Any) -> Any:
    """Raise ``message``, with the closest choice when ``tp`` is a ``Literal``."""
    inner = optional_inner(tp)[1]
    if typing.get_origin(inner) is Literal:
        close = difflib.get_close_matches(str(value), [str(a) for a in typing.get_args(inner)], 1)
        message += f"; did you mean {close[0]}?" if close else ""
    raise ProxrlError(message)


# Other libraries' names for fields of ours (transformers/TRL, CleanRL), suggested before any
# close spelling: the closest spelling can be another field (``lr`` is nearer ``lora_r`` than
# ``learning_rate``). Only suggested where the command has the field.
KNOWN_SPELLINGS = {
    "lr": "learning_rate",
    "num_train_epochs": "epochs",
    "per_device_train_batch_size": "batch_size",
    "gradient_accumulation_steps": "grad_accum",
    "max_seq_length": "max_length",
    "gae_lambda": "lam",
    "ent_coef": "entropy_coef",
    "minibatch_size": "mini_batch_size",
    "target_kl": "early_stop_kl",
    "norm_adv": "whiten_advantages",
}


def _unknown(kind: str, name: str, valid: list[str], flag: bool) -> ProxrlError:
    prefix = "--" if flag else ""
    shown = name.replace("_", "-") if flag else name
    pool = [v.replace("_", "-") for v in valid] if flag else valid
    known = KNOWN_SPELLINGS.get(name.replace("-", "_"))
    if known in valid:
        close = [known.replace("_", "-") if flag else known]
    else:
        close = difflib.get_close_matches(shown, pool, n=1, cutoff=0.5)
    hint = f"; did you mean {prefix}{close[0]}?" if close else ""
    if not shown.isprintable() or not shown or shown != shown.strip():
        shown = repr(shown)  # keep the message on one line and the name visible
    return ProxrlError(f"unknown {kind} {prefix}{shown}{hint}")


# --------------------------------------------------------------------------------------------
# YAML files


def _read_yaml(path: Path) -> dict[Any, Any]:
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ProxrlError(f"config file {path} does not exist") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or (str(e).splitlines() or [type(e).__name__])[0]
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        raise ProxrlError(f"config file {where} is not valid YAML: {problem}") from None
    except UnicodeDecodeError as e:
        raise ProxrlError(
            f"config file {path} is not UTF-8 text ({e.reason} at byte {e.start})"
        ) from None
    except IsADirectoryError:
        raise ProxrlError(f"config file {path} is a directory; expected a YAML file") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ProxrlError(f"config file {path} must hold a mapping of field: value")
    return raw


def load_config_file(
    config_cls: type[T],
    path: str | Path,
    validate: bool = True,
    overridden: frozenset[str] = frozenset(),
) -> T:
    """Build ``config_cls`` from a YAML mapping of field → value (missing fields keep defaults).

    Keys may use dashes and a field's aliases. Unknown keys and values of the wrong type raise
    ``ProxrlError`` naming the key. ``validate=False`` skips ``cfg.validate()``
    (``parse_config`` validates after overrides). The values of ``overridden`` fields are not
    read: a flag replaces them, so a bad one there is no error.
    """
    path = Path(path)
    return config_from_mapping(
        config_cls, _read_yaml(path), f"config file {path}", validate, overridden
    )


def config_from_mapping(
    config_cls: type[T],
    mapping: dict[Any, Any],
    where: str,
    validate: bool = True,
    overridden: frozenset[str] = frozenset(),
    base: T | None = None,
) -> T:
    """``config_cls`` (or ``base`` with these fields replaced) from a mapping of field → value,
    with the checks of a YAML file: aliases and dashes accepted, unknown keys and values of
    the wrong type refused in one line starting with ``where``."""
    values = _mapping_values(config_cls, mapping, where, overridden)
    cfg = config_cls(**values) if base is None else dataclasses.replace(base, **values)  # type: ignore[type-var]
    if validate:
        _validate(cfg)
    return cfg


def _file_values(
    config_cls: type, path: Path, overridden: frozenset[str], skip_unknown: bool = False
) -> dict[str, Any]:
    """Field → checked value of the YAML file at ``path`` (``_mapping_values``)."""
    return _mapping_values(
        config_cls, _read_yaml(path), f"config file {path}", overridden, skip_unknown
    )


def _mapping_values(
    config_cls: type,
    mapping: dict[Any, Any],
    where: str,
    overridden: frozenset[str],
    skip_unknown: bool = False,
) -> dict[str, Any]:
    """Field → checked value of ``mapping``, ``overridden`` fields left out. ``skip_unknown``: a
    key that is no field is passed over instead of refused (a run's saved config may hold an
    option that a newer proxrl renamed or removed)."""
    fields, names = field_table(config_cls), spellings(config_cls)
    values: dict[str, Any] = {}
    for key, value in mapping.items():
        name = names.get(str(key).replace("-", "_"))
        try:
            if name is None and skip_unknown:
                continue
            if name is None:
                raise _unknown("key", str(key), list(names), flag=False)
            if name in overridden:
                continue
            values[name] = _check_value(name, fields[name].type, value)
        except ProxrlError as e:
            raise ProxrlError(f"{where}: {e}") from None
    return values


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
    """``--config FILE`` / ``--config=FILE`` out of argv (it is not a field of any config)."""
    path: str | None = None
    rest: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--config":
            path = next(args, None)
            if path is None:
                raise ProxrlError("--config needs a file path")
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return path, rest


def _tyro_spellings(config_cls: type, argv: list[str]) -> list[str]:
    """Rewrite the spellings tyro does not read: a switch given a value (``--resume true``,
    ``--resume=false``) becomes ``--resume`` / ``--no-resume``; ``none``/``null``/``~`` for an
    optional field becomes tyro's ``None``, and ``true``/``false`` for a bool-or-None field
    tyro's ``True``/``False``. Everything else passes through untouched."""
    fields, names = field_table(config_cls), spellings(config_cls)
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg, i = argv[i], i + 1
        name, eq, inline = arg[2:].partition("=")
        field = names.get(name.replace("-", "_")) if arg.startswith("--") else None
        if field is None:
            out.append(arg)
            continue
        tp, flag = fields[field].type, "--" + field.replace("_", "-")
        if fields[field].switch:
            text = inline if eq else None
            if not eq and i < len(argv) and not argv[i].startswith("-"):
                text, i = argv[i], i + 1
            if text is not None and text.lower() not in _TRUE | _FALSE:
                raise ProxrlError(f"{flag} expects true or false, found {text!r}")
            out.append(flag if text is None or text.lower() in _TRUE else "--no-" + flag[2:])
        elif optional_inner(tp)[0] and (eq or (i < len(argv) and not argv[i].startswith("--"))):
            text = inline if eq else argv[i]
            i += 0 if eq else 1
            lowered = text.lower()
            if lowered in _NONE:
                text = "None"
            elif optional_inner(tp)[1] is bool and lowered in _TRUE | _FALSE:  # normalize_obs true
                text = str(lowered in _TRUE)
            out += [f"--{name}={text}"] if eq else [arg, text]
        else:
            out.append(arg)
    return out


def _flagged_fields(config_cls: type, argv: list[str]) -> frozenset[str]:
    """The fields argv sets (``--name``, ``--name=v``, ``--no-name``, aliases included)."""
    names = spellings(config_cls)
    found = set()
    for arg in argv:
        if not arg.startswith("--"):
            continue
        name = arg[2:].partition("=")[0].replace("-", "_")
        field = names.get(name) or (names.get(name[3:]) if name.startswith("no_") else None)
        if field is not None:
            found.add(field)
    return frozenset(found)


def _values_after(flags: tuple[str, ...], argv: list[str]) -> str:
    """The text given to the last of ``flags`` in argv (for an error message)."""
    spelt = {f.replace("_", "-") for f in flags}
    for i in range(len(argv) - 1, -1, -1):
        name, eq, inline = argv[i].partition("=")
        if name.replace("_", "-") in spelt:
            if eq:
                return inline
            values = [a for a in argv[i + 1 :]]
            stop = next((k for k, a in enumerate(values) if a.startswith("--")), len(values))
            return " ".join(values[:stop])
    return ""


def _translate(config_cls: type, argv: list[str]) -> Any:
    """A tyro parse-error hook raising the one-line ``ProxrlError`` for each kind of event."""
    from tyro import _errors as events

    fields = field_table(config_cls)

    def field_of(argument: Any) -> tuple[str, Any]:
        name = argument.field.intern_name
        return "--" + name.replace("_", "-"), fields[name].type if name in fields else str

    def hook(event: Any) -> None:
        if isinstance(event, events.UnrecognizedArgs):
            token = event.tokens[0]
            if token.startswith("--") and len(token) > 2:
                name = token[2:].partition("=")[0]
                raise _unknown(
                    "option", name.replace("-", "_"), list(spellings(config_cls)), flag=True
                )
            raise ProxrlError(f"unexpected argument {token!r}; options look like --name value")
        if isinstance(event, events.InvalidChoice):
            flag, tp = field_of(event.argument)
            _raise(f"{flag} expects {type_name(tp)}, found {event.value!r}", event.value, tp)
        if isinstance(event, events.BadValue):
            flag, tp = field_of(event.argument)
            if event.reason == "too_few_values":
                raise ProxrlError(f"{flag} needs a value ({type_name(tp)})")
            raise ProxrlError(f"{flag} takes no value, found {event.offending_value!r}")
        if isinstance(event, events.InstantiationFailure) and event.argument is not None:
            flag, tp = field_of(event.argument)
            text = _values_after(event.argument.lowered.name_or_flags, argv)
            raise ProxrlError(f"{flag} expects {type_name(tp)}, found {text!r}")
        if isinstance(event, events.MissingArgs):
            names = [
                a.arg.lowered.name_or_flags[-1].upper().replace("-", "_")
                for a in event.missing_arguments
            ]
            raise ProxrlError(f"missing {', '.join(names)}")
        raise ProxrlError(f"cannot parse the command line ({type(event).__name__})")

    return hook


def _given(config_cls: type, args: list[str], field: str) -> Any:
    """What ``args`` (in ``_tyro_spellings``' form) last give ``field``: True / False for a
    switch, the text after a value flag; None when they do not name it."""
    names, switch = spellings(config_cls), field_table(config_cls)[field].switch
    found: Any = None
    for i, arg in enumerate(args):
        name, eq, inline = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        key = name.replace("-", "_")
        if names.get(key) == field:
            found = True if switch else inline if eq else next(iter(args[i + 1 : i + 2]), None)
        elif switch and key.startswith("no_") and names.get(key[3:]) == field:
            found = False
    return found


def _resumed_run_values(
    config_cls: type, args: list[str], file_values: dict[str, Any], flagged: frozenset[str]
) -> dict[str, Any]:
    """With ``--resume``: ``saved_run_values`` of the run in the ``--output-dir`` that ``args``
    (or the ``--config`` file, or the default) name, flagged options left out."""
    defaults = {f.name: f.default for f in dataclasses.fields(config_cls)}  # type: ignore[arg-type]
    if "resume" not in defaults or "output_dir" not in defaults:
        return {}
    resume = _given(config_cls, args, "resume")
    if resume is None:
        resume = file_values.get("resume", defaults["resume"])
    output_dir = _given(config_cls, args, "output_dir")
    if output_dir is None:
        output_dir = file_values.get("output_dir", defaults["output_dir"])
    return saved_run_values(config_cls, bool(resume), output_dir, flagged)


def saved_run_values(
    config_cls: type, resume: bool, output_dir: Any, given: frozenset[str]
) -> dict[str, Any]:
    """When resuming: the options the run in ``output_dir`` saved (its config.yaml, or the file
    ``config_cls.saved_config_file`` names), the starting point that a config file, flags or
    the Python API's options then change (``runtime.resume`` decides which changes are
    allowed). Options that describe this invocation rather than the run
    (``runtime.resume.SESSION_OPTIONS``) and the ``given`` ones are left out; nothing when not
    resuming or the directory saved no config."""
    from proxrl.runtime.resume import CONFIG_FILE, SESSION_OPTIONS

    path = Path(str(output_dir)) / getattr(config_cls, "saved_config_file", CONFIG_FILE)
    if not resume or not path.is_file():
        return {}
    return _file_values(config_cls, path, given | SESSION_OPTIONS, skip_unknown=True)


def file_values(config_cls: type, path: str | Path, given: frozenset[str]) -> dict[str, Any]:
    """Field → checked value of the YAML config file at ``path``, the ``given`` fields (set
    elsewhere, so a bad value there is no error) left out."""
    return _file_values(config_cls, Path(path), given)


def _validate(cfg: Any) -> None:
    validate = getattr(cfg, "validate", None)
    if callable(validate):
        validate()


def parse_config(config_cls: type[T], argv: list[str] | None, prog: str) -> T:
    """Parse ``[--config file.yaml] [--field value ...]`` into a validated ``config_cls``.

    ``--help`` prints every field with its docstring and exits 0 (``SystemExit``).
    """
    import tyro
    from tyro import _errors as events

    config_path, rest = _split_config_flag(list(argv or []))
    flagged = _flagged_fields(config_cls, rest)
    values = _file_values(config_cls, Path(config_path), flagged) if config_path else {}
    args = _tyro_spellings(config_cls, rest)
    saved = _resumed_run_values(config_cls, args, values, flagged)
    default: Any = tyro.MISSING_NONPROP
    if config_path or saved:
        default = config_cls(**(saved | values))
    elif all(
        f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        for f in dataclasses.fields(config_cls)
    ):  # type: ignore[arg-type]
        default = config_cls()
    with events.on_parse_error(_translate(config_cls, args)):
        cfg: T = tyro.cli(config_cls, args=args, default=default, prog=prog)
    _validate(cfg)
    return cfg
