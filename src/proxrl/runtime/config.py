"""Typed configs: a dataclass per command; ``[--config file.yaml] [--field value ...]`` replaces
its defaults by the file's values, then the flags'. pydantic reads each value (a YAML one strictly:
``1`` is no bool, ``"3"`` no int), ``cfg.validate()`` checks ranges and rules, tyro prints
``--help`` from the fields' docstrings; a refusal is one ``ProxrlError`` line naming the field."""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import pydantic
import tyro
import yaml

from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.fields import (
    FieldSpec,
    Range,
    check_ranges,
    field_table,
    optional_inner,
    spellings,
    type_name,
)
from proxrl.runtime.trackers import TrackerName, check_report_to

T = TypeVar("T")
_TRUE, _FALSE = {"true", "yes", "1", "on"}, {"false", "no", "0", "off"}
_NONE = {"none", "null", "~"}
# A number as people write it; YAML 1.1 (PyYAML) reads ``1e-4`` (no dot) as a string.
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
# Other libraries' names (TRL, CleanRL), suggested before the closest spelling (``lr`` is nearer
# ``lora_r`` than ``learning_rate``), where the command has the field.
KNOWN_SPELLINGS = dict(
    lr="learning_rate", num_train_epochs="epochs", per_device_train_batch_size="batch_size",
    gradient_accumulation_steps="grad_accum", max_seq_length="max_length", gae_lambda="lam",
    ent_coef="entropy_coef", minibatch_size="mini_batch_size", target_kl="early_stop_kl",
    norm_adv="whiten_advantages",
)  # fmt: skip


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


def _checked(tp: Any, value: Any, strict: bool, wrong: str, found: str | None = None) -> Any:
    """``value`` as pydantic reads it for ``tp``, or ``ProxrlError(wrong + found)`` (by default
    the offending item), with the closest choice of a ``Literal``."""
    try:
        return pydantic.TypeAdapter(tp).validate_python(value, strict=strict)
    except pydantic.ValidationError as e:
        bad = value if found else e.errors()[0]["input"]
    choices = typing.get_args(optional_inner(tp)[1]) if _literal(tp) else ()
    close = difflib.get_close_matches(str(bad), map(str, choices), 1)
    hint = f"; did you mean {close[0]}?" if close else ""
    raise ProxrlError(f"{wrong}, found {found or repr(bad)}{hint}")


def _literal(tp: Any) -> bool:
    return typing.get_origin(optional_inner(tp)[1]) is Literal


def _listed(tp: Any) -> bool:
    return typing.get_origin(optional_inner(tp)[1]) in (tuple, list)


def _unknown(kind: str, name: str, valid: list[str], prefix: str = "") -> ProxrlError:
    spelt = (lambda n: n.replace("_", "-")) if prefix else (lambda n: n)
    known = KNOWN_SPELLINGS.get(name.replace("-", "_"))
    close = [known] if known in valid else difflib.get_close_matches(name, valid, 1, 0.5)
    shown = spelt(name)
    shown = shown if shown.isprintable() and shown and shown == shown.strip() else repr(shown)
    hint = f"; did you mean {prefix}{spelt(close[0])}?" if close else ""
    return ProxrlError(f"unknown {kind} {prefix}{shown}{hint}")


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


def _number(v: Any) -> Any:
    return float(v) if isinstance(v, str) and _NUMBER.fullmatch(v.strip()) else v


def _yaml_value(name: str, tp: Any, value: Any) -> Any:
    """A value checked strictly; the only conversions: int → float, a number written ``1e-4``
    (a string to YAML 1.1) in a float field → float, one value → a one-item list."""
    listed, inner, written = _listed(tp), optional_inner(tp)[1], value
    kind = typing.get_origin(inner)  # list or tuple
    if listed and value is not None:
        value = kind(value) if isinstance(value, (list, tuple)) else kind([value])
    if (typing.get_args(inner)[0] if listed else inner) is float:
        value = kind(map(_number, value)) if listed and value is not None else _number(value)
    found = repr(written) if _literal(tp) else f"{type(written).__name__} {written!r}"
    found = f"list {list(written)!r}" if isinstance(written, tuple) else found
    return _checked(tp, value, True, f"field {name} expects {type_name(tp)}", found)


def _mapping_values(cls: type, mapping: dict, where: str, skip: frozenset, lenient=False) -> dict:
    """Field → checked value of ``mapping`` (dashes and aliases accepted), ``skip`` fields left
    out; ``lenient``: a key that is no field (an option a newer proxrl renamed) is passed over."""
    table, names, values = field_table(cls), spellings(cls), {}
    for key, value in mapping.items():
        name = names.get(str(key).replace("-", "_"))
        try:
            if name is None and not lenient:
                raise _unknown("key", str(key), list(names))
            if name is not None and name not in skip:
                values[name] = _yaml_value(name, table[name].type, value)
        except ProxrlError as e:
            raise ProxrlError(f"{where}: {e}") from None
    return values


def file_values(cls: type, path: str | Path, given: frozenset[str], lenient=False) -> dict:
    """Field → checked value of the YAML file at ``path``; the ``given`` fields (set elsewhere,
    so a bad value there is no error) left out."""
    return _mapping_values(cls, _read_yaml(Path(path)), f"config file {path}", given, lenient)


def load_config_file(cls: type[T], path: str | Path, validate=True, overridden=frozenset()) -> T:
    """``cls`` from a YAML file of field: value (the others keep their defaults)."""
    return config_from_mapping(
        cls, _read_yaml(Path(path)), f"config file {path}", validate, overridden
    )


def config_from_mapping(
    cls: type[T], mapping: dict, where: str, validate=True, overridden=frozenset(), base=None
) -> T:
    """``cls`` (or ``base`` with these fields replaced) from a mapping of field → value, with a
    YAML file's checks; a refusal is one line starting with ``where``."""
    values = _mapping_values(cls, mapping, where, overridden)
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
    return (
        file_values(cls, path, given | SESSION_OPTIONS, True) if resume and path.is_file() else {}
    )


def _flag_value(flag: str, f: FieldSpec, texts: list[str]) -> Any:
    """A flag's texts as its field's value: a switch's true/false word, ``none`` for an
    optional field, else pydantic's reading of the text (of each item for a list)."""
    optional, inner = optional_inner(f.type)
    words = [t.lower() for t in texts]
    if (f.switch or inner is bool) and words[:1] and words[0] in _TRUE | _FALSE:
        return words[0] in _TRUE
    if f.switch and words:
        raise ProxrlError(f"{flag} expects true or false, found {texts[0]!r}")
    if f.switch or (optional and words and words[0] in _NONE and len(words) == 1):
        return True if f.switch else None
    if not texts and not _listed(f.type):
        raise ProxrlError(f"{flag} needs a value ({type_name(f.type)})")
    value = texts if _listed(f.type) else texts[0]
    return _checked(f.type, value, False, f"{flag} expects {type_name(f.type)}")


def _split_argv(cls: type, argv: list[str]) -> tuple[str | None, dict, list[str]]:
    """``--config``'s path, field → the texts after its flag (``--no-x``: ``false``), and the
    problems, in order; a token no flag takes fills the next positional field."""
    table, names = field_table(cls), spellings(cls)
    positional = [n for n, f in table.items() if f.positional]
    path, texts, problems, i = None, {}, [], 0
    while i < len(argv):
        arg, i = argv[i], i + 1
        key, eq, inline = arg[2:].partition("=")
        name = key.replace("-", "_")
        field, off = names.get(name), names.get(name[3:]) if name.startswith("no_") else None
        if arg == "--config" and i == len(argv):
            raise ProxrlError("--config needs a file path")
        if arg == "--config" or arg.startswith("--config="):
            path, i = (inline, i) if eq else (argv[i], i + 1)
        elif not _flag_like(arg, False) and positional:
            texts[positional.pop(0)] = [arg]
        elif not arg.startswith("--"):
            problems.append(f"unexpected argument {arg!r}; options look like --name value")
        elif field is None and off is not None and table[off].switch:
            texts[off] = ["false"]
            problems += [f"--{key} takes no value, found {inline!r}"] if eq else []
        elif field is None and arg != "--":
            problems.append(str(_unknown("option", name, list(names), "--")))
        elif field is not None:  # a list takes each value up to the next flag
            taken, many, switch = (
                [inline] if eq else [],
                _listed(table[field].type),
                table[field].switch,
            )
            while (
                not eq and i < len(argv) and (many or not taken) and not _flag_like(argv[i], switch)
            ):
                taken, i = [*taken, argv[i]], i + 1
            texts[field] = taken
    return path, texts, problems


def _flag_like(arg: str, switch: bool) -> bool:
    """Not a value: ``-x`` (a number such as ``-1`` or ``-inf`` is one, but not for a switch)."""
    number = _NUMBER.fullmatch(arg) or arg.lower() in ("-inf", "-nan")
    return arg.startswith("-") and arg != "-" and (switch or not number)


def parse_config(cls: type[T], argv: list[str] | None, prog: str) -> T:
    """Parse ``[--config file.yaml] [--field value ...]`` into a validated ``cls``; with
    ``--resume``, the run's saved config (``saved_run_values``) is the starting point.
    ``--help`` prints every field with its docstring and exits 0 (``SystemExit``)."""
    table, args = field_table(cls), [a for a in argv or [] if a not in ("-h", "--help")]
    path, texts, problems = _split_argv(cls, args)
    values = file_values(cls, path, frozenset(texts)) if path else {}
    flags, ranked = {}, [(3, p) for p in problems]
    for n, t in texts.items():
        try:
            flags[n] = _flag_value("--" + n.replace("_", "-"), table[n], t)
        except ProxrlError as e:  # in tyro's order: switch; choice or no value; unknown; type
            f, inner = table[n], optional_inner(table[n].type)[1]
            choice = "one of" in type_name(f.type) or inner is bool or not (t or _listed(f.type))
            ranked.append((0 if f.switch else 1 if choice else 4, str(e)))
    saved: dict[str, Any] = {}
    if {"resume", "output_dir"} <= table.keys():
        setting = {**{n: getattr(cls, n, None) for n in table}, **values, **flags}.get
        saved = saved_run_values(cls, setting("resume"), setting("output_dir"), frozenset(texts))
    missing = [n.upper() for n, f in table.items() if f.required and n not in values | flags]
    if len(args) < len(argv or []):
        default = tyro.MISSING_NONPROP if missing else cls(**(saved | values))
        tyro.cli(cls, args=["--help"], default=default, prog=prog)
    ranked += [(2, f"missing {', '.join(missing)}")] if missing else []
    if ranked:
        raise ProxrlError(min(ranked, key=lambda r: r[0])[1])
    cfg = cls(**(saved | values | flags))
    if callable(getattr(cfg, "validate", None)):
        cfg.validate()
    return cfg
