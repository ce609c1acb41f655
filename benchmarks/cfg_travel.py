"""How far the run's config travels from the driver (issue 52, item 2): a static walk of
``src/proxrl`` that starts at ``proxrl.algos.online.loop.train_online`` with its ``cfg`` and
follows every call that hands on the config, or an object holding it.

    .venv/bin/python benchmarks/cfg_travel.py [--src src] [--list]

Reported: **places** (the distinct functions, besides the driver, that receive the config or
a holder of it), **stops** (the distinct caller → callee edges that carry it; ``sites`` counts
their call expressions), how many of those edges **climb back up** to a higher layer, and the
edges that carry it into something the walk cannot resolve (a callable held in a variable or a
registry, code outside ``src/proxrl``).

What carries the config, per function (flow-insensitive, every statement of the function and
of the functions nested in it):

- a parameter that received it, and a name assigned from an expression that carries it
  (``cfg = run.cfg``; tuple targets element by element);
- ``x.a`` where ``x`` is a *holder* and ``a`` the attribute that holds it (``run.cfg``,
  ``self.cfg``);
- a holder itself: a name or expression whose class holds the config. A class becomes a holder
  when the walk reaches its ``__init__`` with the config and the ``__init__`` stores it on
  ``self`` (``self.cfg = cfg``), or reaches a dataclass's generated constructor with the
  config as one of its fields (``OnlineRun(cfg, ...)``). Handing a holder on (``train(run,
  ...)``, ``run.held_out.step(...)``: the receiver too) is handing the config on.

A call's callee is resolved from the module's imports and definitions, ``self``/``cls``, and
the class of its receiver, typed from annotations (parameters, dataclass fields and class
attributes, ``self.x = param``, properties, return annotations) and constructor calls; a method
call reaches the method and its overrides in subclasses, and for a ``typing.Protocol`` every
class in ``src/proxrl`` that defines all of the protocol's methods (the protocol's own stubs
are not places). The walk runs to a fixed point (a class that becomes a holder makes more
expressions carry the config).

**Climbing back up**: the layers are those of the import contracts (``.importlinter``: the
layers contract between the top-level packages, and the acyclic contract that keeps the
import graph of every package's children a DAG), read as the import graph itself (grimp, as
``lint-imports`` builds it). Module A is above module B when A imports B, directly or through
other modules. An edge caller → callee *climbs back up* when the callee's module is above the
caller's: the caller could not import what it calls, and reached it through an object handed
down (a placement, a callback, an algorithm's loader, a protocol's implementation). An edge
within one module never climbs.

The issue's own count before the redesign ("144 stops in 47 places, 37 climbing back up") was
made by another method (not published with the issue); compare this script's numbers only
with its own, e.g. on two commits of the repository (``--src`` of a worktree of each).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DRIVER = "proxrl.algos.online.loop.train_online"
CONFIG = "config"  # what a name carries: the config itself, or the class of a holder of it
REPLACE = ("replace", "dataclasses.replace")


@dataclass
class Function:
    qualname: str  # module.func or module.Class.method
    module: str
    cls: str | None  # the class's qualname (a method), else None
    node: ast.FunctionDef | ast.AsyncFunctionDef
    params: list[str]  # positional then keyword-only, self/cls included
    stub: bool  # a Protocol's declaration, not code that runs


@dataclass
class ClassInfo:
    qualname: str
    module: str
    node: ast.ClassDef
    bases: list[str] = field(default_factory=list)  # resolved qualnames within src
    methods: dict[str, str] = field(default_factory=dict)  # name → function qualname
    attrs: dict[str, ast.expr] = field(default_factory=dict)  # name → annotation
    fields: list[str] = field(default_factory=list)  # a dataclass's init fields, in order
    dataclass: bool = False
    protocol: bool = False


class Source:
    """Every module of ``proxrl`` under ``src``: functions, classes, import names."""

    def __init__(self, src: Path) -> None:
        self.functions: dict[str, Function] = {}
        self.classes: dict[str, ClassInfo] = {}
        self.names: dict[str, dict[str, str]] = {}  # module → local name → qualname
        self.modules: set[str] = set()
        trees = {}
        for path in sorted((src / "proxrl").rglob("*.py")):
            parts = path.relative_to(src).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            self.modules.add(module)
            trees[module] = ast.parse(path.read_text(encoding="utf-8"))
        for module, tree in trees.items():
            self._index(module, tree)
        for module, tree in trees.items():
            self._imports(module, tree)
        for info in self.classes.values():
            info.bases = [b for b in map(self._base(info), info.node.bases) if b]
            info.protocol = any(
                isinstance(b, ast.Name | ast.Attribute) and ast.unparse(b).endswith("Protocol")
                for b in info.node.bases
            )

    def _index(self, module: str, tree: ast.Module) -> None:
        names = self.names.setdefault(module, {})
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names[node.name] = self._function(module, None, node).qualname
            elif isinstance(node, ast.ClassDef):
                names[node.name] = self._class(module, node)

    def _function(self, module: str, cls: str | None, node: ast.AST) -> Function:
        assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        a = node.args
        params = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
        body = [s for s in node.body if not isinstance(s, ast.Expr | ast.Pass)]
        stub = not body and cls is not None  # `...` or a docstring alone
        qualname = f"{cls or module}.{node.name}"
        self.functions[qualname] = Function(qualname, module, cls, node, params, stub)
        return self.functions[qualname]

    def _class(self, module: str, node: ast.ClassDef) -> str:
        qualname = f"{module}.{node.name}"
        info = self.classes[qualname] = ClassInfo(qualname, module, node)
        info.dataclass = any("dataclass" in ast.unparse(d) for d in node.decorator_list)
        for item in node.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                info.methods[item.name] = self._function(module, qualname, item).qualname
                prop = any(ast.unparse(d) == "property" for d in item.decorator_list)
                if prop and item.returns is not None:
                    info.attrs[item.name] = item.returns
                for sub in ast.walk(item):  # self.x: T = ... and self.x = param (typed)
                    self._self_attr(info, item, sub)
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                info.attrs[item.target.id] = item.annotation
                if "ClassVar" not in ast.unparse(item.annotation):
                    info.fields.append(item.target.id)
        return qualname

    @staticmethod
    def _self_attr(info: ClassInfo, method: ast.AST, node: ast.AST) -> None:
        assert isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef)
        if isinstance(node, ast.AnnAssign):
            target, annotation = node.target, node.annotation
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, annotation = node.targets[0], None
            if isinstance(node.value, ast.Name):
                a = method.args
                typed = {p.arg: p.annotation for p in a.posonlyargs + a.args + a.kwonlyargs}
                annotation = typed.get(node.value.id)
        else:
            return
        is_self = isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
        if is_self and target.value.id == "self" and annotation is not None:  # type: ignore[union-attr]
            info.attrs.setdefault(target.attr, annotation)  # type: ignore[union-attr]

    def _imports(self, module: str, tree: ast.Module) -> None:
        names = self.names[module]
        package = module if module in self._packages() else module.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")
                    up = up[: len(up) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    if target in self.modules:
                        names.setdefault(alias.asname or alias.name, target)
                    else:
                        found = self.names.get(base, {}).get(alias.name)
                        names.setdefault(alias.asname or alias.name, found or target)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        names.setdefault(alias.asname, alias.name)

    def _packages(self) -> set[str]:
        return {m.rpartition(".")[0] for m in self.modules}

    def _base(self, info: ClassInfo):  # type: ignore[no-untyped-def]
        return lambda b: self.resolve(info.module, b)

    def resolve(self, module: str, node: ast.expr) -> str | None:
        """The qualname a name or dotted attribute in ``module`` denotes, if known."""
        if isinstance(node, ast.Name):
            return self.names.get(module, {}).get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(module, node.value)
            if base in self.modules:
                return self.names.get(base, {}).get(node.attr, f"{base}.{node.attr}")
            if base in self.classes:
                return self.method(base, node.attr)
        return None

    def method(self, cls: str, name: str) -> str | None:
        """``name`` as ``cls`` resolves it (its own, then its bases')."""
        return self._inherited(cls, name, "methods")

    def attribute(self, cls: str, name: str) -> ast.expr | None:
        return self._inherited(cls, name, "attrs")

    def _inherited(self, cls: str, name: str, table: str) -> Any:
        """``name`` in the ``table`` of ``cls`` or of its nearest base that has it."""
        seen, todo = set(), [cls]
        while todo:
            c = todo.pop(0)
            if c in seen or c not in self.classes:
                continue
            seen.add(c)
            found = getattr(self.classes[c], table)
            if name in found:
                return found[name]
            todo += self.classes[c].bases
        return None

    def annotation_class(self, module: str, annotation: ast.expr | None) -> str | None:
        """The first class of ``src/proxrl`` an annotation names (``X | None`` → X)."""
        if annotation is None:
            return None
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                annotation = ast.parse(annotation.value, mode="eval").body
            except SyntaxError:
                return None
        for node in ast.walk(annotation):
            if isinstance(node, ast.Name | ast.Attribute):
                found = self.resolve(module, node)
                if found in self.classes:
                    return found
        return None

    def dispatch(self, cls: str, name: str) -> list[str]:
        """What calling ``name`` on an instance typed ``cls`` may run: its method and the
        overrides of subclasses; for a Protocol, the classes implementing all its methods."""
        found = [self.method(cls, name)]
        info = self.classes[cls]
        for other in self.classes.values():
            if other.qualname == cls:
                continue
            if info.protocol:
                wanted = [m for m in info.methods if not m.startswith("_")]
                if wanted and all(m in other.methods for m in wanted):
                    found.append(other.methods.get(name))
            elif self._inherits(other.qualname, cls):
                found.append(other.methods.get(name))
        return [f for f in dict.fromkeys(found) if f and not self.functions[f].stub]

    def _inherits(self, cls: str, base: str) -> bool:
        todo, seen = list(self.classes[cls].bases), set()
        while todo:
            c = todo.pop()
            if c == base:
                return True
            if c not in seen and c in self.classes:
                seen.add(c)
                todo += self.classes[c].bases
        return False


@dataclass
class Walk:
    """The fixed point: which parameters of which functions receive the config."""

    source: Source
    received: dict[str, dict[str, str]] = field(default_factory=lambda: defaultdict(dict))
    holders: dict[str, str] = field(default_factory=dict)  # class → holding attribute
    edges: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    unresolved: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))

    def run(self) -> None:
        self.received[DRIVER] = {"cfg": CONFIG}
        while True:
            before = (
                sum(map(len, self.received.values())),
                len(self.holders),
                len(self.edges),
            )
            self.edges.clear()
            self.unresolved.clear()
            for qualname in list(self.received):
                self._function(qualname)
            if before == (
                sum(map(len, self.received.values())),
                len(self.holders),
                len(self.edges),
            ):
                return

    def _function(self, qualname: str) -> None:
        if qualname not in self.source.functions:  # a dataclass's generated constructor
            return
        fn = self.source.functions[qualname]
        env = _Env(self, fn)
        for node in ast.walk(fn.node):
            if isinstance(node, ast.Call):
                self._call(env, node)
        if fn.node.name == "__init__" and fn.cls:  # self.cfg = cfg: the class holds it
            for node in ast.walk(fn.node):
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    t = node.targets[0]
                    on_self = isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self"
                    if on_self and env.carries(node.value) == CONFIG:
                        self.holders.setdefault(fn.cls, t.attr)  # type: ignore[union-attr]

    def _call(self, env: _Env, call: ast.Call) -> None:
        carried = [(i, env.carries(a)) for i, a in enumerate(call.args)]
        by_name = {k.arg: env.carries(k.value) for k in call.keywords if k.arg}
        receiver = None
        if isinstance(call.func, ast.Attribute):
            receiver = env.carries(call.func.value)
        if not any(c for _, c in carried) and not any(by_name.values()) and receiver is None:
            return
        callees, bound = env.callees(call.func)
        caller = env.fn.qualname
        if not callees:
            if (any(c for _, c in carried) or any(by_name.values())) and env.unknown(call.func):
                self.unresolved[(caller, ast.unparse(call.func))] += 1
            return
        for callee in callees:
            self._receive(caller, callee, bound, carried, by_name, receiver)

    def _receive(self, caller, callee, bound, carried, by_name, receiver) -> None:  # type: ignore[no-untyped-def]
        got: dict[str, str] = {}
        if callee in self.source.classes:  # a constructor
            info = self.source.classes[callee]
            init = self.source.method(callee, "__init__")
            if init is None and info.dataclass:
                for i, kind in carried:
                    if kind and i < len(info.fields):
                        got[info.fields[i]] = kind
                got |= {k: v for k, v in by_name.items() if v and k in info.fields}
                for name, kind in got.items():
                    if kind == CONFIG:
                        self.holders.setdefault(callee, name)
                if got:
                    self._edge(caller, callee, got)
                return
            if init is None:
                return
            callee, bound = init, True
        fn = self.source.functions[callee]
        params = fn.params[1:] if bound and fn.params[:1] in (["self"], ["cls"]) else fn.params
        for i, kind in carried:
            if kind and i < len(params):
                got[params[i]] = kind
        got |= {k: v for k, v in by_name.items() if v and k in fn.params}
        if receiver and receiver != CONFIG and bound and fn.params[:1] == ["self"]:
            got["self"] = receiver
        if got:
            self._edge(caller, callee, got)

    def _edge(self, caller: str, callee: str, got: dict[str, str]) -> None:
        self.edges[(caller, callee)] += 1
        self.received[callee].update(got)


class _Env:
    """One function's names that carry the config, and the classes of its names."""

    def __init__(self, walk: Walk, fn: Function) -> None:
        self.walk, self.fn, self.source = walk, fn, walk.source
        self.carrying = dict(walk.received.get(fn.qualname, {}))
        a = fn.node.args
        self.types: dict[str, str | None] = {
            p.arg: self.source.annotation_class(fn.module, p.annotation)
            for p in a.posonlyargs + a.args + a.kwonlyargs
        }
        if fn.cls and fn.params[:1] == ["self"]:
            self.types["self"] = fn.cls
        self.local = set(fn.params)  # names that are no module's
        for node in ast.walk(fn.node):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                self.local.add(node.id)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.arg):
                self.local.add(node.name if not isinstance(node, ast.arg) else node.arg)
        for _ in range(2):  # assignments, twice: a name may be assigned from a later one
            for node in ast.walk(fn.node):
                if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        self._assign(target, node.value)

    def _assign(self, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
            for t, v in zip(target.elts, value.elts, strict=False):
                self._assign(t, v)
            return
        if not isinstance(target, ast.Name):
            return
        kind = self.carries(value)
        if kind:
            self.carrying.setdefault(target.id, kind)
        self.types.setdefault(target.id, self.type_of(value))

    def type_of(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            held = self.carrying.get(node.id)
            return self.types.get(node.id) or (held if held != CONFIG else None)
        if isinstance(node, ast.Attribute):
            owner = self.type_of(node.value)
            if owner in self.source.classes:
                annotation = self.source.attribute(owner, node.attr)
                module = self.source.classes[owner].module
                return self.source.annotation_class(module, annotation)
            return None
        if isinstance(node, ast.Call):
            callees, _ = self.callees(node.func)
            for callee in callees:
                if callee in self.source.classes:
                    return callee
                fn = self.source.functions[callee]
                return self.source.annotation_class(fn.module, fn.node.returns)
        return None

    def carries(self, node: ast.expr) -> str | None:
        """What ``node`` hands on: CONFIG, the class of a holder of it, or None."""
        holders = self.walk.holders
        if isinstance(node, ast.Name) and node.id in self.carrying:
            return self.carrying[node.id]
        if isinstance(node, ast.Starred):
            return self.carries(node.value)
        if isinstance(node, ast.Attribute):
            owner = self.type_of(node.value)
            if owner in holders and holders[owner] == node.attr:
                return CONFIG
        if isinstance(node, ast.Call) and node.args and ast.unparse(node.func) in REPLACE:
            return self.carries(node.args[0])  # dataclasses.replace(cfg, ...): a config
        kind = self.type_of(node)
        return kind if kind in holders else None

    def unknown(self, func: ast.expr) -> bool:
        """Whether a call the walk did not resolve may run code of src/proxrl: not a builtin,
        not an import from outside it."""
        if isinstance(func, ast.Name) and func.id not in self.local:
            found = self.source.names[self.fn.module].get(func.id)
            return found is not None and found.startswith("proxrl.")
        value = func.value if isinstance(func, ast.Attribute) else None
        if isinstance(value, ast.Name) and value.id not in self.local:
            found = self.source.names[self.fn.module].get(value.id)
            return found is not None and found.startswith("proxrl.")
        return True

    def callees(self, func: ast.expr) -> tuple[list[str], bool]:
        """What a call of ``func`` may run, and whether it is bound (self passed)."""
        source, fn = self.source, self.fn
        if isinstance(func, ast.Name) and func.id == "cls" and fn.cls:
            return [fn.cls], False  # a classmethod's constructor call
        if isinstance(func, ast.Name):
            found = None if func.id in self.local else source.names[fn.module].get(func.id)
            if found in source.functions or found in source.classes:
                return [found], False
            return [], False
        if isinstance(func, ast.Attribute):
            on = func.value.id if isinstance(func.value, ast.Name) else None
            if fn.cls and (on == "cls" or (on == "self" and self.types.get("self") == fn.cls)):
                return source.dispatch(fn.cls, func.attr), True
            root = func.value
            while isinstance(root, ast.Attribute):
                root = root.value
            local = isinstance(root, ast.Name) and root.id in self.local
            dotted = None if local else source.resolve(fn.module, func)
            if dotted in source.functions or dotted in source.classes:
                owner = source.resolve(fn.module, func.value)
                return [dotted], owner in source.classes  # Class.classmethod: cls bound
            owner = self.type_of(func.value)
            if owner in source.classes:
                return source.dispatch(owner, func.attr), True
        return [], False


class Layers:
    """Whether a module may import another under the import contracts (``.importlinter``)."""

    def __init__(self, src: Path, contracts: Path) -> None:
        sys.path.insert(0, str(src.resolve()))
        import grimp  # lint-imports' graph builder (import-linter's dependency)

        self.graph = grimp.build_graph("proxrl", cache_dir=None)
        self.layer: dict[str, int] = {}  # top package → its layer (0: the top)
        lines = contracts.read_text(encoding="utf-8").splitlines()
        start = lines.index("[importlinter:contract:layers]")
        listing = False
        for line in lines[start + 1 :]:
            if line.startswith("["):
                break
            if line.strip() == "layers =":
                listing = True
            elif listing and line.startswith((" ", "\t")) and line.strip():
                index = len(set(self.layer.values()))  # siblings share their line's layer
                for package in line.replace("|", ":").split(":"):
                    self.layer[package.strip()] = index
            elif listing and line.strip():
                break

    def layer_of(self, module: str) -> str:
        """The contract's package ``module`` is in (its layer's line names it)."""
        found = [p for p in self.layer if module == p or module.startswith(p + ".")]
        return max(found, key=len) if found else module

    def _layer(self, module: str) -> int | None:
        found = [p for p in self.layer if module == p or module.startswith(p + ".")]
        return self.layer[max(found, key=len)] if found else None

    def climbs(self, caller: str, callee: str) -> bool:
        """Whether ``caller``'s module could not import ``callee``'s: the callee is in a
        higher layer (the layers contract), or it imports the caller's module already,
        directly or through others (the import would close a cycle)."""
        if caller == callee:
            return False
        a, b = self._layer(caller), self._layer(callee)
        if a is not None and b is not None and b < a:
            return True
        return caller in self.graph.find_upstream_modules(callee)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--src", default="src", help="the directory holding proxrl/ (.importlinter: beside it)"
    )
    parser.add_argument("--list", action="store_true", help="print every place and edge")
    args = parser.parse_args(argv)
    src = Path(args.src)
    walk = Walk(Source(src))
    walk.run()
    contracts = Layers(src, src.resolve().parent / ".importlinter")
    functions = walk.source.functions

    def module_of(qualname: str) -> str:
        info = functions.get(qualname) or walk.source.classes[qualname]
        return info.module

    climbing, direction = [], defaultdict(int)
    for caller, callee in walk.edges:
        a, b = module_of(caller), module_of(callee)
        if contracts.climbs(a, b):
            climbing.append((caller, callee))
        la, lb = contracts.layer_of(a), contracts.layer_of(b)
        direction[lb.rpartition(".")[2] if la != lb else "the same layer"] += 1
    places = {callee for _, callee in walk.edges} - {DRIVER}
    if args.list:
        for (caller, callee), n in sorted(walk.edges.items()):
            up = "  (climbs back up)" if (caller, callee) in climbing else ""
            print(f"{caller} -> {callee} [{n}]{up}")
        for (caller, what), n in sorted(walk.unresolved.items()):
            print(f"{caller} -> ? {what} [{n}]")
        print("holders:", ", ".join(f"{c}.{a}" for c, a in sorted(walk.holders.items())))
    print(
        f"from {DRIVER}: {len(places)} places, {len(walk.edges)} stops "
        f"({sum(walk.edges.values())} call sites), {len(climbing)} climbing back up; "
        f"{len(walk.unresolved)} more into callables the walk cannot resolve"
    )
    print("stops by the callee's layer:", dict(sorted(direction.items())))


if __name__ == "__main__":
    main()
