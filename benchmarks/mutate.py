"""Mutation check of the files a change touched (issue 54): mutmut 3 on a copy of the checkout,
each mutant against focused tests only, and a score with every survivor named.

    make mutate FILES="src/proxrl/core/masks.py" TESTS="tests/core/test_masks.py"
    .venv/bin/python benchmarks/mutate.py src/proxrl/core/masks.py --tests tests/core/test_masks.py
    .venv/bin/python benchmarks/mutate.py                  # src/proxrl files changed since HEAD~1
    .venv/bin/python benchmarks/mutate.py FILE --tests T --results r.json        # saves the result
    .venv/bin/python benchmarks/mutate.py FILE --tests T --results r.json --only-survivors

Why a copy: mutmut writes its mutated tree (``mutants/``) into the directory it runs in, and
others may be running tests from this checkout. The copy holds the files git sees (tracked and
untracked, not ignored: uncommitted edits included), goes to a temporary directory and is
deleted afterwards (``--keep`` keeps it, to run ``mutmut show``/``mutmut browse`` in it).

How mutants are run: mutmut copies ``src/`` into ``mutants/src`` with every function of the
FILES rewritten as a trampoline onto its mutants and runs the TESTS once (which test reaches
which function, how long each takes). Then each mutant runs in a process forked from a server
that imported the heavy third-party modules (``PRELOAD``; ``process_isolation = "forkserver"``
in pyproject.toml: torch is not fork-safe from a process that ran tests), so a mutant costs an
import of proxrl and its tests' time, not an import of torch. It runs against every test of
TESTS (``-x``: up to the first failure), not only those mutmut saw call its function
(``run_mutmut``); a function that no test of TESTS reached is reported "no tests", unrun.
What mutmut does not mutate: module-level code (constants, registrations), decorated functions
(except @staticmethod/@classmethod), annotations, and defaults that are not literals.

TESTS: the pytest arguments run per mutant (files, node ids, ``-k``). Left out, each file's
default is ``tests/**/test_<stem>.py``; a file with none is an error (name its tests).

Printed: per file, killed / total (a timeout counts as killed: the mutant changed behaviour;
so does an "import error": the tests failed to import under it), the count of each outcome,
and each survivor as ``file:line``, mutmut's name and the line before (-) and after (+).
"no tests" (no test of TESTS reached the function) counts as a survivor.
Exit status 1 when a score is under ``--fail-under`` (default 0: never).

Survivors only: ``--results FILE`` writes each mutant's outcome (JSON, with each file's
sha256); ``--only-survivors`` then reruns just the mutants FILE records as survivors ("no
tests" included), against this run's TESTS, merges their new outcomes into the file's
recorded ones (the killed ones stand: tests were only added) and rewrites FILE. It refuses a
file whose source changed since (mutmut numbers a function's mutants in order: the same name
may be another mutation). ``--mutants NAME...`` runs the named mutants only (mutmut's names or
globs, e.g. ``'*x__check_ids__mutmut_*'``), scored among themselves. Either way mutmut still
runs TESTS once unmutated first (which test reaches which function).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
KILLED = {"killed", "timeout", "caught by type check", "import error"}
# Imported once by the fork server, before any mutant: the third-party modules the tests load
# (torch alone is 2 s). proxrl and the tests are not: each mutant's process imports them with
# the mutant active, so a mutation of code that runs at import (a registry filling its table,
# a config class built from it) is tested too. Collected in the server (mutmut's default
# warmup) they would be imported unmutated before the fork, and such a mutant always survives.
PRELOAD = [
    "torch",
    "numpy",
    "pydantic",
    "tyro",
    "yaml",
    "gymnasium",
    "hypothesis",
    "transformers",
    "safetensors",
    "xdist.plugin",
    "pytest_timeout",
    # what tests/algos/conftest.py's ``proxrl.models.tiny`` pulls from transformers' lazy
    # namespace (1.9 s a mutant otherwise) and the Parquet reader
    "transformers.models.llama.modeling_llama",
    "transformers.tokenization_utils_fast",
    "tokenizers",
    "pyarrow.parquet",
]


def changed_files(since: str) -> list[str]:
    """src/proxrl .py files that differ from ``since`` in the working tree, or are new."""
    git = ["git", "-C", str(ROOT)]
    diff = subprocess.run(
        [*git, "diff", "--name-only", "--diff-filter=AMR", since, "--", "src/proxrl"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    new = subprocess.run(
        [*git, "ls-files", "--others", "--exclude-standard", "--", "src/proxrl"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return sorted({f for f in diff + new if f.endswith(".py")})


def default_tests(file: str) -> list[str]:
    found = sorted(
        p.relative_to(ROOT) for p in (ROOT / "tests").rglob(f"test_{Path(file).stem}.py")
    )
    if not found:
        sys.exit(f"no tests/**/test_{Path(file).stem}.py for {file}: name its tests in TESTS")
    return [str(p) for p in found]


def copy_checkout() -> Path:
    """The files git sees (tracked and untracked, not ignored) in a temporary directory."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    dest = Path(tempfile.mkdtemp(prefix="proxrl-mutate-"))
    for raw in listed:
        rel = raw.decode()
        src = ROOT / rel
        if rel and src.is_file():  # a deleted, not yet committed file is listed but absent
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def configure(copy: Path, files: list[str], tests: list[str]) -> None:
    """Adds the run's files, tests and preload list under the [tool.mutmut] of the copy's
    pyproject.toml (the fixed settings live there; these three keys never do)."""
    pyproject = copy / "pyproject.toml"
    text = pyproject.read_text()
    if "\n[tool.mutmut]\n" not in text:
        sys.exit("pyproject.toml has no [tool.mutmut] table")
    preload = copy / ".mutmut-preload.txt"
    preload.write_text("\n".join(PRELOAD) + "\n")
    keys = (
        f"only_mutate = {json.dumps(files)}\n"
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
        f"preload_modules_file = {json.dumps(str(preload))}\n"
    )
    pyproject.write_text(text.replace("\n[tool.mutmut]\n", f"\n[tool.mutmut]\n{keys}", 1))


def run_mutmut(max_children: int, names: list[str]) -> None:
    """``mutmut run`` (in the copy, the working directory), each mutant against every one of
    TESTS. mutmut itself runs a mutant against the tests it saw call the mutated function; a
    function called while the tests are imported (a registry's ``add``) is seen by one test at
    most, and its mutants would be checked against that test alone."""
    import mutmut.__main__ as mutmut_main

    if mutmut_main.__dict__.get("collect_or_load_stats") is None:
        sys.exit("mutmut's internals changed (collect_or_load_stats): pin mutmut==3.8.1")
    collect = mutmut_main.collect_or_load_stats

    def collect_then_widen(*args: object, **kwargs: object) -> None:
        collect(*args, **kwargs)  # type: ignore[arg-type]
        state = mutmut_main.state()
        every = set(state.duration_by_test)
        for function, reached in state.tests_by_mangled_function_name.items():
            if reached:  # a function no test reached stays "no tests"
                state.tests_by_mangled_function_name[function] = set(every)

    mutmut_main.collect_or_load_stats = collect_then_widen
    mutmut_main.cli(["run", "--max-children", str(max_children), *names])


def function_span(source: str, function: str, cls: str | None) -> tuple[int, int]:
    """First line (decorators included) and last line of ``cls.function`` or ``function``."""
    tree = ast.parse(source)
    scope: list[ast.stmt] = tree.body
    if cls is not None:
        scope = next(n.body for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    for node in scope:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return first, node.end_lineno or node.lineno
    raise LookupError(f"{cls}.{function}")


def locate(diff: str, source_lines: list[str], span: tuple[int, int]) -> tuple[int, str, str]:
    """The line a mutant changes, from mutmut's diff of the function (its line numbers count
    from the function's first line), checked against the file's text."""
    hunk = re.search(r"^@@ -(\d+)", diff, re.M)
    start = int(hunk.group(1)) if hunk else 1
    body = diff[hunk.end() :].split("\n")[1:] if hunk else []
    old = [ln[1:] for ln in body if ln.startswith("-")]
    new = [ln[1:] for ln in body if ln.startswith("+")]
    offset = next((i for i, ln in enumerate(body) if ln.startswith("-")), 0)
    guess = span[0] + start - 1 + offset
    if old:  # the file's line with the removed text nearest the guess
        hits = [
            n for n in range(span[0], span[1] + 1) if source_lines[n - 1].strip() == old[0].strip()
        ]
        if hits:
            guess = min(hits, key=lambda n: abs(n - guess))
    return guess, " / ".join(s.strip() for s in old), " / ".join(s.strip() for s in new)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def outcomes(copy: Path, file: str) -> dict[str, str] | None:
    """Each mutant of ``file`` this run ran, and its outcome (None: mutmut mutates nothing in
    the file)."""
    from mutmut.stats import status_by_exit_code

    meta = copy / "mutants" / f"{file}.meta"
    if not meta.exists():
        return None
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    # The mutant's tests could not even be collected (the clean run collected them): an
    # import failed under it. pytest's 2 (a collection error), mutmut reads as "interrupted
    # by user"; 255, its forkserver worker's exit when pytest raised (a node id not found
    # in a module that failed to import: usage error), it reads as "timeout".
    return {
        name: "import error" if code in (2, 255) else status_by_exit_code[code]
        for name, code in codes.items()
        if code is not None  # not run (``--mutants``, ``--only-survivors``)
    }


def survivors_of(results: Path, files: list[str]) -> tuple[dict[str, dict[str, str]], list[str]]:
    """``results``' recorded outcomes of ``files`` and the names of their survivors; refused
    where a file is not recorded or its source changed since."""
    if not results.is_file():
        sys.exit(f"--only-survivors: no {results} (run once with --results {results})")
    recorded = json.loads(results.read_text())["files"]
    before, names = {}, []
    for file in files:
        if file not in recorded:
            sys.exit(f"--only-survivors: {results} records no run of {file}")
        if recorded[file]["sha256"] != sha256(ROOT / file):
            sys.exit(
                f"--only-survivors: {file} changed since {results} was written (a mutant's "
                "name may now be another mutation): run it whole"
            )
        before[file] = recorded[file]["status"]
        names += [n for n, s in before[file].items() if s not in KILLED]
    return before, names


def report(
    copy: Path, files: list[str], before: dict[str, dict[str, str]] | None = None
) -> tuple[list[tuple[str, int, int]], dict[str, dict[str, str]]]:
    """Each file's score and survivors, printed; ``before``: a previous run's outcomes, which
    this run's (its survivors rerun) update."""
    from mutmut.utils.format_utils import orig_function_and_class_names_from_key

    scores = []
    merged: dict[str, dict[str, str]] = {}
    for file in files:
        ran = outcomes(copy, file)
        if ran is None:
            print(f"\n{file}: no mutants (nothing mutmut mutates in it)")
            scores.append((file, 0, 0))
            continue
        status = dict(before[file]) if before and file in before else {}
        if before:
            now_killed = [n for n, s in ran.items() if s in KILLED]
            print(
                f"\n{file}: {len(ran)} survivors rerun (of {len(status)} mutants), "
                f"{len(now_killed)} killed now"
            )
        status.update(ran)
        merged[file] = status
        killed = sum(s in KILLED for s in status.values())
        counts: dict[str, int] = {}
        for s in status.values():
            counts[s] = counts.get(s, 0) + 1
        total = len(status)
        print(f"\n{file}: {killed}/{total} killed ({100 * killed / max(total, 1):.1f}%)  {counts}")
        source = (copy / file).read_text()
        lines = source.split("\n")
        rows = []
        for name, s in status.items():
            if s in KILLED:
                continue
            shown = subprocess.run(
                [str(BIN / "mutmut"), "show", name], cwd=copy, capture_output=True, text=True
            ).stdout
            function, cls = orig_function_and_class_names_from_key(name)
            line, old, new = locate(shown, lines, function_span(source, function, cls))
            rows.append((line, int(name.rpartition("_")[2]), name, s, old, new))
        for line, _, name, s, old, new in sorted(rows):
            print(f"  {file}:{line}  [{s}] {name.rpartition('.')[2]}")
            print(f"      - {old}\n      + {new}")
        scores.append((file, killed, total))
    return scores, merged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="src/proxrl/... .py files (default: changed)")
    parser.add_argument("--tests", nargs="+", help="pytest arguments run per mutant")
    parser.add_argument("--since", default="HEAD~1", help="with no files: changed since this ref")
    parser.add_argument("--max-children", type=int, default=1, help="mutants run at once")
    parser.add_argument("--fail-under", type=float, default=0.0, help="minimum score, percent")
    parser.add_argument("--keep", action="store_true", help="keep the copy (prints its path)")
    parser.add_argument("--results", type=Path, help="write each mutant's outcome here (JSON)")
    parser.add_argument(
        "--only-survivors", action="store_true", help="rerun only --results' survivors"
    )
    parser.add_argument("--mutants", nargs="+", default=[], help="run only these (names, globs)")
    parser.add_argument("--run-mutmut", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_mutmut:  # in the copy, from main() below
        run_mutmut(args.max_children, args.mutants)
        return

    files = [str(Path(f)) for f in args.files] or changed_files(args.since)
    if not files:
        sys.exit(f"no src/proxrl .py file changed since {args.since}: name FILES")
    for f in files:
        if not (ROOT / f).is_file() or not f.startswith("src/proxrl/"):
            sys.exit(f"{f}: not a file under src/proxrl (paths are relative to the repository)")
    tests = args.tests or sorted({t for f in files for t in default_tests(f)})
    print(f"mutmut on {' '.join(files)}\n  tests per mutant: {shlex.join(tests)}")
    before = None
    names = list(args.mutants)
    if names and (args.only_survivors or args.results is not None):
        sys.exit("--mutants scores the named mutants alone: not with --results/--only-survivors")
    if args.only_survivors:
        if args.results is None:
            sys.exit("--only-survivors reads --results FILE")
        before, names = survivors_of(args.results, files)
        print(f"  only the {len(names)} survivors recorded in {args.results}")
        if not names:
            sys.exit("nothing to rerun: no survivor recorded")

    copy = copy_checkout()
    try:
        configure(copy, files, tests)
        started = time.monotonic()
        run = subprocess.run(
            [
                *(sys.executable, __file__, "--run-mutmut"),
                *("--max-children", str(args.max_children)),
                *(["--mutants", *names] if names else []),
            ],
            cwd=copy,
            capture_output=True,
            text=True,
        )
        progress = run.stdout.replace("\r", "\n").strip().split("\n")
        if run.returncode != 0:
            print("\n".join(progress[-40:]), run.stderr[-4000:], sep="\n")
            sys.exit(f"mutmut run failed (exit {run.returncode})")
        rate = next((ln for ln in reversed(progress) if "mutations/second" in ln), "")
        print(f"  mutmut run: {time.monotonic() - started:.0f} s ({rate.strip()})")
        scores, merged = report(copy, files, before)
        if args.results is not None:
            recorded = {}
            if args.results.is_file():
                recorded = json.loads(args.results.read_text())["files"]
            for file, status in merged.items():
                recorded[file] = {"sha256": sha256(ROOT / file), "tests": tests, "status": status}
            args.results.parent.mkdir(parents=True, exist_ok=True)
            args.results.write_text(json.dumps({"files": recorded}, indent=1) + "\n")
            print(f"\noutcomes written to {args.results}")
    finally:
        if args.keep:
            print(f"\ncopy kept: {copy} (cd there; {BIN}/mutmut show NAME)")
        else:
            shutil.rmtree(copy, ignore_errors=True)

    killed = sum(k for _, k, _ in scores)
    total = sum(t for _, _, t in scores)
    score = 100 * killed / max(total, 1)
    print(f"\nmutation score: {killed}/{total} killed ({score:.1f}%)")
    if total and score < args.fail_under:
        sys.exit(f"under --fail-under {args.fail_under}")


if __name__ == "__main__":
    main()
