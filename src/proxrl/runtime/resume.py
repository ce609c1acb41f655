"""What ``--resume`` does with options that changed since the run started: one policy for every
command (the LM trainers, ``classic`` and ``demo``).

The starting point of a resumed run is its own saved config: ``proxrl ppo --output-dir runs/x
--resume`` needs no other option (``runtime.config.parse_config`` reads ``runs/x/config.yaml``
under ``--config`` and the flags; a field marked ``SESSION_OPTION`` is never taken from it).
Resuming a run that already took every step it was configured for raises ``RunFinished`` (``proxrl``
prints one line and exits 0): there is nothing to do, and a retried job should not fail on it.

A resumed run is compared with the options it was started with, read from its saved config
(``config.yaml``; the demo's ``demo_config.yaml``). If any differs, the resume is refused
(``ProxrlError``, exit 2) with one line naming each changed option with its new and old value,
because the run would silently continue as a mix of two configurations. ``--resume-with-changes``
accepts them: each change is logged at WARNING and the trainer writes the new config file.

A field marked ``FREE_ON_RESUME`` (or ``SESSION_OPTION``) in its ``Annotated`` metadata
(``runtime.config``) may always change on resume: it says where the run lives, how it is
driven, saved and shown, never what it computes; the mark sits beside the field. ``save_every``,
``keep_checkpoints`` and ``max_consecutive_skips`` are among them: how often a run saves, how many
checkpoints it keeps and how many bad steps it tolerates before stopping change no step it takes;
nor does the vLLM engine's memory share, which a run that ran out of memory must be able to lower.
The run's length (``iterations``, ``max_steps``, ``epochs``, ``total_steps``) is not: it sets the
learning-rate schedule, so extending a run needs ``--resume-with-changes``.

Only options present in both configs are compared: one that a newer proxrl added or renamed is not
a change the user made. Nor is a default that a newer proxrl reads differently: a config class's
``former_defaults`` (``shared_prefix: true``, saved as the default before an explicit true was
refused where it cannot apply) are read back as unset, here and as the resumed run's base.

A run is resumed by the command that made it: the run marker records it (``run_dir.record_run``)
and ``check_command`` refuses another in one line naming both (a ``grpo`` run resumed with
``ppo`` would otherwise pass for finished, or fail deep inside a restore). A run directory
written before the command was recorded is accepted.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from proxrl.runtime import distributed as dist
from proxrl.runtime.checkpoint import MANIFEST, CheckpointManager
from proxrl.runtime.config import CONFIG_FILE, former_defaults_unset, free_on_resume
from proxrl.runtime.errors import ProxrlError, RunFinished
from proxrl.runtime.run_dir import run_command

log = logging.getLogger(__name__)


def changed_options(
    saved: Mapping[str, Any], now: Mapping[str, Any], free: Iterable[str] = ()
) -> dict[str, tuple[Any, Any]]:
    """``{option: (saved value, new value)}`` for every option in both that differs, in the
    order of ``now``; ``free`` options are left out."""
    skip = set(free)
    return {
        key: (saved[key], value)
        for key, value in now.items()
        if key not in skip and key in saved and saved[key] != value
    }


def check_resume(
    cfg: Any, config_file: str = CONFIG_FILE, what: str = "run"
) -> dict[str, tuple[Any, Any]]:
    """Apply the policy to ``cfg`` (a config with ``output_dir``, ``resume`` and
    ``resume_with_changes``): nothing to do unless resuming a run whose ``config_file`` exists;
    changed options are refused unless ``cfg.resume_with_changes``, then logged. Returns the
    changes (empty when none). ``what`` names the run in the message. Reads only; call it
    before anything is written."""
    path = Path(cfg.output_dir) / config_file
    if not cfg.resume or not path.is_file():
        return {}
    try:
        saved = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ProxrlError(
            f"--resume: {path} is not a readable YAML config ({type(exc).__name__})"
        ) from None
    if not isinstance(saved, dict):
        raise ProxrlError(f"--resume: {path} does not hold a mapping of option: value")
    # The new config as its YAML file would read back (tuples as lists), so values compare alike.
    now = yaml.safe_load(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
    saved = former_defaults_unset(type(cfg), saved)
    changes = changed_options(saved, now, free_on_resume(type(cfg)))
    if not changes:
        return {}
    if not getattr(cfg, "resume_with_changes", False):
        (first, (old, new)), *rest = changes.items()
        message = (
            f"--resume: {first} is {new!r} but the {what} in {cfg.output_dir} ran with {old!r}"
        )
        message += "".join(f", {key} is {n!r} (was {o!r})" for key, (o, n) in rest)
        raise ProxrlError(message + "; pass --resume-with-changes to continue with the new values")
    if dist.is_main():
        for key, (old, new) in changes.items():
            log.warning("--resume-with-changes: %s changed from %r to %r", key, old, new)
    return changes


def command_of_config(cfg: Any) -> str:
    """The command whose config ``cfg`` is, named from the module that defines its class
    (``proxrl.algos.online.grpo`` → ``grpo``, ``proxrl.algos.offline.reward`` → ``rm``,
    ``proxrl.classic.*`` → ``classic``, ``proxrl.demo.*`` → ``demo``)."""
    parts = type(cfg).__module__.split(".")
    if parts[:2] in (["proxrl", "classic"], ["proxrl", "demo"]):
        return parts[1]
    return {"reward": "rm"}.get(parts[-1], parts[-1])


def check_command(cfg: Any, command: str) -> None:
    """With ``cfg.resume``: refuse (``ProxrlError``) a run in ``cfg.output_dir`` that another
    command made; one without a recorded command (older proxrl) is accepted."""
    if not cfg.resume:
        return
    made_by = run_command(cfg.output_dir)
    if made_by is not None and made_by != command:
        raise ProxrlError(
            f"--resume: the run in {cfg.output_dir} was made by proxrl {made_by}, not proxrl "
            f"{command}; resume it with proxrl {made_by}, or start a new one in another "
            "directory"
        )


def check_not_finished(cfg: Any, total: int, unit: str, longer: str) -> None:
    """With ``cfg.resume``: raise ``RunFinished`` when the newest checkpoint in ``cfg.output_dir``
    is already at step ``total`` (the run's length under ``cfg``). ``unit`` names a step
    ("iteration"), ``longer`` the option that extends the run ("--iterations"). Reads manifests
    only (the checkpoint is verified when it is the one that decides)."""
    if not cfg.resume:
        return
    manager = CheckpointManager(cfg.output_dir)
    saved = [p for p in manager.checkpoints() if (p / MANIFEST).is_file()]
    if not saved or CheckpointManager.step_of(saved[-1]) < total:
        return
    latest = manager.latest()
    if latest is None or CheckpointManager.step_of(latest) < total:
        return
    raise RunFinished(
        f"the run in {cfg.output_dir} is already finished ({unit} {total} of {total}); nothing "
        f"to do (to train longer: --resume-with-changes {longer} N)"
    )
