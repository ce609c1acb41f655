"""A table of named options: name → entry (a function, or any value), each with a one-line doc,
the config fields it reads (its knobs) and what it is (its traits).

Every option a config chooses by name (policy losses, estimators, KL estimators, samplers,
critics, rollout corrections, aggregations, DPO losses, trackers, ...) is one ``Registry``, and
its config field is typed ``REGISTRY.choice()``. Everything else follows from the table:

- the field's ``Literal`` choices, ``--help`` and the "did you mean" of a bad name;
- which fields apply to the run: a knob applies only while an entry that declares it is
  selected (``runtime.config.check_knobs`` refuses it otherwise, naming the option);
- what the code asks of the selected entry (``REGISTRY.trait(name, "group")``), never an ``==``
  on its name or a parallel list of names;
- the tests that parametrise over the entries and their knobs.

So adding an option is one function and one registration. Other spellings of a name (TRL's,
older ones) belong to the config edge (``choice(aliases=...)``), never to the table. This
module is plain Python below every layer: core fills its tables, runtime reads the markers.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Generic, Literal, TypeVar, cast

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
    """``Literal[names...]``: the type of a value that is one of ``names`` (not a config field's
    choice: that is ``Registry.choice``, which the knob checks and tests read)."""
    return cast(Any, Literal)[names]


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One option: its value, doc line, knobs (config field names) and traits."""

    value: T
    doc: str
    knobs: tuple[str, ...]
    traits: Mapping[str, Any]


class Registry(Mapping[str, T], Generic[T]):
    """Name → entry, in registration order. Read it as a mapping (``registry[name]`` fails with
    ``UnknownName``); fill it with ``register`` (a decorator) or ``add`` (a call), each with the
    entry's ``knobs`` (the config fields only it reads) and ``traits`` (keyword flags)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        """What an entry is, for messages: ``policy loss``, ``KL estimator``, ..."""
        self._entries: dict[str, Entry[T]] = {}

    def add(self, name: str, entry: T, doc: str, knobs: Collection[str] = (), **traits: Any) -> T:
        """Register ``entry`` under ``name``; a name is registered once."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        if not doc or "\n" in doc:
            raise ValueError(f"{self.kind} {name!r}: the doc is one non-empty line")
        self._entries[name] = Entry(entry, doc, tuple(knobs), dict(traits))
        return entry

    def register(
        self, name: str, doc: str, knobs: Collection[str] = (), **traits: Any
    ) -> Callable[[F], F]:
        """Decorator form of ``add``: ``@REGISTRY.register("name", "what it is", knobs=(...),
        trait=True)``; the function keeps its own signature for direct callers."""

        def decorate(entry: F) -> F:
            self.add(name, cast(T, entry), doc, knobs, **traits)
            return entry

        return decorate

    def _entry(self, name: str) -> Entry[T]:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise UnknownName(self.kind, name, self.names()) from None

    def __getitem__(self, name: str) -> T:
        return self._entry(name).value

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
        return self._entry(name).doc

    def knobs(self, name: str) -> tuple[str, ...]:
        """The config fields that apply only while ``name`` is selected."""
        return self._entry(name).knobs

    def trait(self, name: str, trait: str, default: Any = False) -> Any:
        """The value of ``name``'s ``trait`` (``default`` where it declares none)."""
        return self._entry(name).traits.get(trait, default)

    def having(self, trait: str) -> tuple[str, ...]:
        """The names whose ``trait`` is true, in registration order."""
        return tuple(n for n, e in self._entries.items() if e.traits.get(trait))

    def choice(
        self,
        off: Collection[str] = (),
        aliases: Mapping[str, str] | None = None,
        exclude: Collection[str] = (),
    ) -> Any:
        """The type of a config field that picks an entry: ``Literal[names, off, aliases]``
        marked ``Choice(self, ...)``. ``off``: names that select no entry (``none``);
        ``aliases``: other spellings → a registered name (each checked here); ``exclude``:
        entries this field does not offer."""
        aliases = dict(aliases or {})
        for target in aliases.values():
            _ = self[target]
        marker = Choice(self, tuple(off), tuple(aliases.items()))
        return Annotated[literal(*off, *self.names(exclude), *aliases), marker]


@dataclass(frozen=True, eq=False)
class Choice:
    """The marker of a config field whose value (or each item of a list) picks an entry of
    ``registry``; the knob checks and the tests read it from the field's annotation."""

    registry: Registry[Any]
    off: tuple[str, ...] = ()
    """Names that select no entry (``none``)."""
    spellings: tuple[tuple[str, str], ...] = ()
    """Other spellings (the config edge's aliases) → the registered name."""

    def selected(self, value: Any) -> tuple[str, ...]:
        """The registered names ``value`` (a name or a list of names) selects."""
        values = value if isinstance(value, list | tuple) else (value,)
        spelled = dict(self.spellings)
        names = (spelled.get(v, v) for v in values)
        return tuple(n for n in names if isinstance(n, str) and n in self.registry)


@dataclass(frozen=True, eq=False)
class AppliesWith:
    """The marker of a config field that applies only while ``field`` is set (not its default:
    a teacher_model given, an environment, a penalty): ``Annotated[float, AppliesWith(...)]``."""

    field: str


@dataclass(frozen=True)
class Bound:
    """The range of a number (``Annotated[float, Bound(gt=0)]``): a knob declared in core states
    it, and the config edge (``runtime.config.Range``, the same type) checks and words it.
    ``below``: the field whose value this one must stay under (a lower bound's upper one)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    below: str | None = None
