"""The Python API, as small as the command line: build a config, train, get the run back.

```python
import proxrl

run = proxrl.sft(model="runs/demo/base", data=[{"prompt": "2+2=", "completion": " 4"}],
                 output_dir="runs/nb-sft", max_steps=10)
run.output_dir, run.metrics["train/loss"]
policy = run.model                       # loaded back with plain transformers / peft

run = proxrl.grpo(model=policy, tokenizer=run.tokenizer, prompts=my_dataset,
                  reward_fn=lambda prompts, completions, **cols: [...], output_dir="runs/nb-grpo")

client = proxrl.TrainingClient(policy, tokenizer=run.tokenizer, learning_rate=1e-5)
rollout = client.sample(["2+2="], n=4)     # a loop of one's own: sample, logprobs,
...                                        # forward_backward, optim_step, save_state/save_model
```

Every option is a field of the command's config (``proxrl <command> --help`` lists them) and
gets the checks a YAML file gets. Where a field names a model, data or a reward function, a
Python object may stand in its place: a transformers model (``tokenizer=`` gives its
tokenizer, else its ``name_or_path`` names one), a list of dicts, a ``datasets.Dataset`` or
``DatasetDict``, a callable. Each is registered under a handle (``runtime.objects``) that the
config holds, and the loaders the command line uses resolve it: one code path for both. The
command line (``proxrl.cli``) parses flags into the same config and calls ``train`` below.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

from proxrl.runtime import objects
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.threads import choose_cpu_threads

COMMANDS: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "classic": ("proxrl.classic.train", "PPO / TRPO on gymnasium environments"),
        "classic-eval": ("proxrl.classic.evaluate", "run a saved classic policy deterministically"),
        "sft": ("proxrl.algos.offline.sft", "supervised fine-tuning"),
        "rm": ("proxrl.algos.offline.reward", "train a Bradley-Terry reward model"),
        "dpo": ("proxrl.algos.offline.dpo", "DPO / IPO / SimPO on preference pairs"),
        "ppo": ("proxrl.algos.online.ppo", "RLHF PPO (actor, critic, reference, reward)"),
        "grpo": ("proxrl.algos.online.grpo", "GRPO and the critic-free family"),
        "demo": ("proxrl.demo", "the whole pipeline on a tiny model"),
        "report": ("proxrl.report", "summarise runs"),
    }
)
"""Command → (module, one-line help). A module has ``Config`` and ``train(cfg)``, or
``main(argv)`` when it parses its own arguments (``classic-eval``)."""

MODEL_COMMANDS = ("sft", "rm", "dpo", "ppo", "grpo")
"""The commands whose output directory holds a transformers model (and its model card)."""

DATA_OPTIONS = ("data", "eval_data", "prompts")
"""Options that take rows: a list of dicts or a ``datasets.Dataset`` stands for a file."""

FACTORY_OPTIONS = ("environment",)
"""Options that take a factory, which may be a class (``environment=MyEnvironment``)."""

TOKENIZER_OPTIONS = MappingProxyType({"tokenizer": "model", "reward_tokenizer": "reward_model"})
"""Python-only options: the tokenizer of a model given as an object."""


def command_module(command: str) -> Any:
    """The module of ``command``; a one-line error for an unknown or unavailable one."""
    if command not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(command, list(COMMANDS), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise ProxrlError(f"unknown command {command!r}{hint}")
    module_path = COMMANDS[command][0]
    try:
        return importlib.import_module(module_path)
    except ModuleNotFoundError as e:
        if e.name is not None and module_path.startswith(e.name):
            raise ProxrlError(f"command {command!r} is not available in this build") from None
        raise


def command_of(cfg: Any) -> str:
    """The command whose ``Config`` ``cfg`` is (modules already imported are asked first, so
    a classic config never imports transformers)."""
    imported = [c for c, (path, _) in COMMANDS.items() if path in sys.modules]
    for command in [*imported, *(c for c in COMMANDS if c not in imported)]:
        if getattr(command_module(command), "Config", None) is type(cfg):
            return command
    raise ProxrlError(f"{type(cfg).__name__} is not the config of a proxrl command")


# --------------------------------------------------------------------------------------------
# Configs from Python values


def make_config(
    command: str, config: str | os.PathLike[str] | Mapping[str, Any] | None = None, **options: Any
) -> Any:
    """The validated config of ``command``: its defaults, then with ``resume=True`` the run's
    own saved config (as ``--resume`` on the command line), then ``config`` (a YAML file or a
    mapping of field → value), then ``options``. Python objects among the values (models,
    rows, datasets, reward functions) are registered with the config (``runtime.objects``)."""
    module = command_module(command)
    config_cls = getattr(module, "Config", None)
    if config_cls is None:
        raise ProxrlError(f"{command}: has no config; run it from the command line")
    from proxrl.runtime.config import config_from_mapping, file_values

    where = f"proxrl.{command.replace('-', '_')}()"
    from_file: dict[str, Any] = {}
    if isinstance(config, (str, os.PathLike)):
        from_file = file_values(config_cls, config, frozenset(options))
    elif isinstance(config, Mapping):  # its values may be Python objects too
        options = {**{str(k): v for k, v in config.items()}, **options}
    elif config is not None:
        raise ProxrlError(
            f"{where}: config: expected a YAML path or a mapping, got {type(config).__name__}"
        )
    tokenizers = {
        TOKENIZER_OPTIONS[k]: options.pop(k) for k in list(options) if k in TOKENIZER_OPTIONS
    }
    entries: dict[str, Any] = {}
    values = {k: _as_config_value(k, v, entries, tokenizers, where) for k, v in options.items()}
    unused = [
        k
        for k, owner in TOKENIZER_OPTIONS.items()
        if owner in tokenizers and f"{objects.PREFIX}{owner}" not in entries
    ]
    if unused:
        raise ProxrlError(
            f"{where}: {unused[0]} is only for a {TOKENIZER_OPTIONS[unused[0]]} "
            "given as a loaded model"
        )
    saved = _saved_run(config_cls, from_file, options, where)
    base = config_cls(**(saved | from_file)) if saved or from_file else None
    cfg = config_from_mapping(config_cls, values, where, validate=False, base=base)
    objects.attach(cfg, entries)
    with objects.registered(objects.attached(cfg)):
        validate = getattr(cfg, "validate", None)
        if callable(validate):
            validate()
    return cfg


def _saved_run(
    config_cls: type, from_file: dict[str, Any], options: dict[str, Any], where: str
) -> dict[str, Any]:
    """With ``resume=True``: what the run in ``output_dir`` saved, less the options given now.
    A Python object the run was given is saved as its handle only, so it must be given again."""
    import dataclasses

    from proxrl.runtime.config import saved_run_values

    defaults = {f.name: f.default for f in dataclasses.fields(config_cls)}
    if "resume" not in defaults or "output_dir" not in defaults:
        return {}

    def setting(name: str) -> Any:
        return options.get(name, from_file.get(name, defaults[name]))

    given = frozenset(options) | frozenset(from_file)
    saved = saved_run_values(config_cls, bool(setting("resume")), setting("output_dir"), given)
    for name, value in saved.items():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, str) and item.startswith(objects.PREFIX):
                raise ProxrlError(
                    f"{where}: resume: {name} of the run in {setting('output_dir')} was a "
                    f"Python object ({item}); pass it again as {name}=..."
                )
    return saved


def _as_config_value(
    name: str, value: Any, entries: dict[str, Any], tokenizers: dict[str, Any], where: str
) -> Any:
    """A config value for ``name``: a handle for a Python object, the value itself otherwise."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if _is_model(value):
        if hasattr(value, "peft_config"):
            raise ProxrlError(
                f"{where}: {name}: a peft model; pass model.merge_and_unload() "
                "(or the directory it was saved to)"
            )
        handle = objects.PREFIX + name
        entries[handle] = objects.Entry(value, tokenizers.get(name))
        return handle
    if _is_rows(name, value):
        return _rows_handle(name, value, entries, where)
    if callable(value) and (not isinstance(value, type) or name in FACTORY_OPTIONS):
        return _function_handle(value, entries)
    if isinstance(value, (list, tuple)) and any(callable(v) for v in value):
        return [_function_handle(v, entries) if callable(v) else v for v in value]
    return value


def _is_model(value: Any) -> bool:
    return hasattr(value, "save_pretrained") and hasattr(value, "parameters")


def _is_rows(name: str, value: Any) -> bool:
    """Rows for a data option: a ``datasets.Dataset`` / ``DatasetDict`` or a list (whose items
    must be dicts); elsewhere a dataset, or a list of dicts."""
    if hasattr(value, "column_names"):
        return True
    if not isinstance(value, (list, tuple)) or isinstance(value, str):
        return False
    return name in DATA_OPTIONS or (len(value) > 0 and isinstance(value[0], Mapping))


def _rows_handle(name: str, rows: Any, entries: dict[str, Any], where: str) -> str:
    if isinstance(rows, (list, tuple)):
        bad = next((i for i, r in enumerate(rows) if not isinstance(r, Mapping)), None)
        if bad is not None:
            raise ProxrlError(
                f"{where}: {name}[row {bad}]: expected a dict, got "
                f"{type(rows[bad]).__name__} (rows are dicts, or a "
                "datasets.Dataset)"
            )
        rows = [dict(r) for r in rows]
    handle = f"{objects.PREFIX}{name}@{objects.fingerprint(rows)}"
    entries[handle] = objects.Entry(rows)
    return handle


def _function_handle(fn: Callable[..., Any], entries: dict[str, Any]) -> str:
    """``python:<function name>`` (``reward/<name>`` in the metrics), numbered when two share
    a name (two lambdas)."""
    name = getattr(fn, "__name__", type(fn).__name__).strip("<>") or "fn"
    handle, n = objects.PREFIX + name, 1
    while handle in entries and entries[handle].obj is not fn:
        n += 1
        handle = f"{objects.PREFIX}{name}{n}"
    entries[handle] = objects.Entry(fn)
    return handle


# --------------------------------------------------------------------------------------------
# Runs


@dataclass
class Run:
    """What ``train`` returns: where the run is, its last metrics, and the trained model."""

    command: str
    output_dir: Path
    metrics: dict[str, Any]
    config: Any = field(repr=False)

    @cached_property
    def model(self) -> Any:
        """The saved model, loaded with plain transformers (peft for a LoRA adapter)."""
        from proxrl.model_card import load_saved_model

        return load_saved_model(self.output_dir, reward=self.command == "rm")

    @cached_property
    def tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.output_dir)


def train(
    command_or_config: Any, config: Any = None, *, command: str | None = None, **options: Any
) -> Run:
    """Run a command: ``train("sft", model=..., data=...)``, ``train("ppo", "ppo.yaml",
    iterations=10)``, or ``train(cfg)`` with a config from ``config(...)`` (or a command's
    ``Config``). Returns the ``Run``; bad input raises ``ProxrlError`` (one line), as the
    command line exits 2 with it. torch's CPU threads are chosen as the command line chooses
    them, unless the user has (``runtime.threads.choose_cpu_threads``)."""
    choose_cpu_threads()
    if isinstance(command_or_config, str):
        cfg = make_config(command_or_config, config, **options)
    elif config is not None or options:
        raise ProxrlError("train(cfg) takes no further options; build the config with them")
    else:
        cfg = command_or_config
    command = command or command_of(cfg)
    module = command_module(command)
    with objects.registered(objects.attached(cfg)):
        metrics = module.train(cfg)
        if command in MODEL_COMMANDS:
            from proxrl.model_card import publish

            publish(command, cfg, metrics or {})
    output_dir = Path(getattr(cfg, "output_dir", getattr(cfg, "run_dir", ".")))
    return Run(command, output_dir, dict(metrics or {}), cfg)


config = make_config
"""``proxrl.config(command, config=None, **options)``: ``make_config``."""


def _command(command: str) -> Callable[..., Run]:
    def run(config: Any = None, **options: Any) -> Run:
        return train(command, config, **options)

    run.__name__ = run.__qualname__ = command
    run.__doc__ = (
        f"``proxrl {command}`` from Python: {COMMANDS[command][1]}. Options are the "
        f"fields of ``proxrl {command} --help``; returns a ``Run``."
    )
    return run


def __getattr__(name: str) -> Any:
    """``TrainingClient`` (``algos.online.client``), imported on first use: it loads torch and
    transformers, which ``import proxrl.api`` does not."""
    if name == "TrainingClient":
        from proxrl.algos.online.client import TrainingClient

        return TrainingClient
    raise AttributeError(f"module 'proxrl.api' has no attribute {name!r}")


sft = _command("sft")
rm = _command("rm")
dpo = _command("dpo")
ppo = _command("ppo")
grpo = _command("grpo")
# classic and demo are subpackages of proxrl (proxrl.classic, proxrl.demo): from Python they
# run as proxrl.train("classic", ...) and proxrl.train("demo", ...).
