"""A table of named options: name → function (or any value), with a one-line doc per entry.

Every option a config chooses by name (policy losses, KL estimators, reward scales, rollout
corrections, aggregations, reward ensembles, ...) is one ``Registry``: the config's ``Literal``
choices (``literal``), ``--help``, the "did you mean" of a bad name and the tests that
parametrise over the keys all read it, so adding an option is one function and one
registration. Other spellings of a name (TRL's, older ones) belong to the config edge, never to
a registry.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, cast

T = TypeVar("T")
F = TypeVar("F")


class UnknownName(KeyError, ValueError):
    """A name no entry of a registry has: a ``KeyError`` for mapping use, a ``ValueError`` for
    callers that take a bad option as a bad value. The message names the choices and the
    closest one."""

    def __init__(self, kind: str, name: object, known: tuple[str, ...]) -> None:
        close = difflib.get_close_matches(str(name), known, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        self.message = f"unknown {kind} {name!r}; expected one of {known}{hint}"
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


def literal(*names: str) -> Any:
    """``Literal[names...]``: the type of a config field that takes one of ``names``."""
    return cast(Any, Literal)[names]


class Registry(Mapping[str, T], Generic[T]):
    """Name → entry, in registration order, each with a one-line ``doc``. Read it as a mapping
    (``registry[name]`` fails with ``UnknownName``); fill it with ``register`` (a decorator) or
    ``add`` (a call)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        """What an entry is, for messages: ``policy loss``, ``KL estimator``, ..."""
        self._entries: dict[str, T] = {}
        self._docs: dict[str, str] = {}

    def add(self, name: str, entry: T, doc: str) -> T:
        """Register ``entry`` under ``name``; a name is registered once."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        if not doc or "\n" in doc:
            raise ValueError(f"{self.kind} {name!r}: the doc is one non-empty line")
        self._entries[name] = entry
        self._docs[name] = doc
        return entry

    def register(self, name: str, doc: str) -> Callable[[F], F]:
        """Decorator form of ``add``: ``@REGISTRY.register("name", "what it is")``; the function
        keeps its own signature (its defaults included) for direct callers."""

        def decorate(entry: F) -> F:
            self.add(name, cast(T, entry), doc)
            return entry

        return decorate

    def __getitem__(self, name: str) -> T:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise UnknownName(self.kind, name, self.names()) from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self, exclude: Collection[str] = ()) -> tuple[str, ...]:
        """The registered names, in registration order, less ``exclude`` (each registered)."""
        for name in exclude:
            _ = self[name]  # a typo in ``exclude`` fails here, not silently
        return tuple(n for n in self._entries if n not in exclude)

    def doc(self, name: str) -> str:
        """The one-line description of ``name``."""
        _ = self[name]
        return self._docs[name]

    def literal(self, exclude: Collection[str] = ()) -> Any:
        """The ``Literal`` type of a config field that takes one of these names."""
        return literal(*self.names(exclude))


@dataclass(frozen=True)
class Bound:
    """The range of a knob declared in core (``Annotated[float, Bound(gt=0)]`` on a settings
    field): core states it, the config edge checks it with its own range type and wording."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
