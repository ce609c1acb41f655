"""No module-level mutable state in src/proxrl: what a run has is decided by what it is handed
(its config, its placement, its run context), never by a module global another run changed.

Read from the source (ast), nothing imported: a module-level assignment of a mutable value (a
dict, list or set display or comprehension, or a call of dict, list, set, defaultdict,
OrderedDict, Counter, deque, bytearray) and any ``global`` statement fail, unless ``ALLOWED``
names it with its reason. A constant table is made immutable instead (``MappingProxyType``,
``tuple``, ``frozenset``). Registries (``proxrl.registry.Registry``) are filled once, at import,
by their entries' modules; they are the tables of what exists, not run state."""

from __future__ import annotations

import ast
from pathlib import Path

import proxrl

SOURCE = Path(proxrl.__file__).parent

MUTABLE_CALLS = frozenset(
    {"dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque", "bytearray"}
)

ALLOWED = {
    ("runtime/run_dir.py", "_HELD"): "the run-directory locks this process holds: process-wide "
    "by nature (a lock belongs to the process, whichever run asked for it)",
}
"""(module path under src/proxrl, name) → why it may be module state."""


def _mutable(value: ast.expr) -> bool:
    displays = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
    if isinstance(value, displays):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        return name in MUTABLE_CALLS
    return False


def module_state(source: str) -> list[tuple[int, str]]:
    """(line, name) of each module-level mutable assignment and each ``global`` statement;
    ``__all__`` (read by ``import *`` only) is no state."""
    tree = ast.parse(source)
    found = []
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        names = [ast.unparse(t) for t in targets]
        if _mutable(value) and names != ["__all__"]:
            found += [(node.lineno, name) for name in names]
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found += [(node.lineno, f"global {name}") for name in node.names]
    return found


def test_no_module_level_mutable_state():
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        module = path.relative_to(SOURCE).as_posix()
        for line, name in module_state(path.read_text(encoding="utf-8")):
            if (module, name.removeprefix("global ")) not in ALLOWED:
                found.append(f"{module}:{line}: {name}")
    assert not found, (
        "module-level mutable state (make a constant table immutable, hand state to what needs "
        "it, or allow it in ALLOWED with the reason): " + "; ".join(found)
    )


def test_every_allowed_name_still_exists():
    """An allowance outlives nothing: each names module state that is still there."""
    for module, name in ALLOWED:
        names = {n.removeprefix("global ") for _, n in module_state((SOURCE / module).read_text())}
        assert name in names, f"{module}: {name} is gone; drop it from ALLOWED"


def test_the_rule_finds_each_kind():
    source = (
        "A = {}\nB: list[int] = []\nC = set()\nD = {k: 1 for k in 'ab'}\n"
        "E = (1, 2)\nF = frozenset({1})\n__all__ = ['x']\n"
        "def f():\n    global G\n    local = {}\n"
    )
    assert [name for _, name in module_state(source)] == ["A", "B", "C", "D", "global G"]
