"""Python objects handed to a run by the Python API (``proxrl.api``), named by a string handle.

A config holds strings only (it is saved as ``config.yaml`` and compared on ``--resume``), so
an already-loaded model, a list of rows, a ``datasets.Dataset`` or a reward function given to
``proxrl.train(...)`` gets a handle such as ``python:model``, ``python:data@1a2b3c4d`` (a
fingerprint of the rows, so a resume with other rows is a changed option) or ``python:score``,
and the handle goes into the config field. The objects travel with the config object
(``attach``) and are registered only while its run runs (``registered``), in the run's context
(a ``contextvars`` variable: set for the block and reset after it, in this thread or task only;
no module global holds them, so two runs in two threads see their own). The loaders the
command line uses (``data.readers.read_rows``, ``models.causal_lm.load_pretrained``,
``models.tokenizer``, ``rollout.rewards.load_reward_function``) look a handle up here first:
one path for both.

A model object is trained in place the first time a run asks for it (as TRL trains the model it
is given); every later request in the same run (the frozen reference of ``ppo``, a critic
started from the policy) gets a copy, so a frozen role never aliases a trained one.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

PREFIX = "python:"
_ATTRIBUTE = "_proxrl_objects"


@dataclass
class Entry:
    obj: Any
    tokenizer: Any = None  # a model's tokenizer, when the caller gave one
    handed_out: bool = False  # take_model gave the object itself already
    saved_to: str | None = None  # a directory holding save_pretrained of obj (saved_copy)


_REGISTERED: ContextVar[Mapping[str, Entry]] = ContextVar(
    "proxrl_objects", default=MappingProxyType({})
)
"""The handles of the runs in progress in this context (``registered``)."""


def attach(cfg: Any, entries: Mapping[str, Entry]) -> None:
    """Keep ``entries`` with the config object whose fields name them."""
    object.__setattr__(cfg, _ATTRIBUTE, dict(entries))


def attached(cfg: Any) -> dict[str, Entry]:
    return dict(getattr(cfg, _ATTRIBUTE, {}))


def is_handle(name: object) -> bool:
    return isinstance(name, str) and name in _REGISTERED.get()


def fingerprint(rows: Any) -> str:
    """8 hex digits identifying the rows of a list or a ``datasets.Dataset``."""
    known = getattr(rows, "_fingerprint", None)  # datasets keeps one per table version
    if isinstance(known, str):
        return known[:8]
    if isinstance(rows, Mapping):  # a DatasetDict
        return fingerprint([fingerprint(rows[k]) + k for k in sorted(rows)])
    text = json.dumps(list(rows), sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def lookup(handle: str) -> Any:
    """The object behind ``handle`` (``KeyError`` if it is not one)."""
    return _REGISTERED.get()[handle].obj


def take_model(handle: str) -> Any:
    """The model behind ``handle``: itself the first time, afterwards a deep copy as
    ``from_pretrained`` would give it (every weight trainable, eval mode), even when the first
    taker froze the object (a reward model, then a critic started from it)."""
    entry = _REGISTERED.get()[handle]
    if not entry.handed_out:
        entry.handed_out = True
        return entry.obj
    return copy.deepcopy(entry.obj).requires_grad_(True).eval()


def tokenizer_of(handle: str) -> Any:
    """A copy of the tokenizer registered with the model ``handle`` (None if none was given).
    A copy: the run adds a pad token and sets the padding side on its own tokenizer."""
    tokenizer = _REGISTERED.get()[handle].tokenizer
    return None if tokenizer is None else copy.deepcopy(tokenizer)


def saved_copy(handle: str) -> str:
    """A temporary directory holding ``save_pretrained`` of the model behind ``handle`` (written
    once per run), for a loader that must build another class from it (a causal LM asked for
    as a sequence classifier: ``rm`` on a loaded LM, a critic started from the policy)."""
    entry = _REGISTERED.get()[handle]
    if entry.saved_to is None:
        entry.saved_to = tempfile.mkdtemp(prefix="proxrl-object-")
        entry.obj.save_pretrained(entry.saved_to)
        if entry.tokenizer is not None:
            entry.tokenizer.save_pretrained(entry.saved_to)
    return entry.saved_to


@contextmanager
def registered(entries: Mapping[str, Entry]) -> Iterator[None]:
    """Resolve the handles of ``entries`` inside the block (each run starts with no model
    handed out), then forget them and delete the copies written for them."""
    fresh = {h: Entry(e.obj, e.tokenizer) for h, e in entries.items()}
    token = _REGISTERED.set(MappingProxyType({**_REGISTERED.get(), **fresh}))
    try:
        yield
    finally:
        _REGISTERED.reset(token)
        for entry in fresh.values():
            if entry.saved_to is not None:
                shutil.rmtree(entry.saved_to, ignore_errors=True)
