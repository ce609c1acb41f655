"""Every row of docs/errors.md: the bad input gets exit code 2, exactly the documented one-line
message, no traceback, and leaves the workspace as it was. The table is generated from the same
cases, and a test checks docs/errors.md is up to date."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest

from proxrl.cli import main
from tests.algos.errors_cases import CASES, build_workspace, live_run, render
from tests.runtime.test_read_only_dir import _read_only

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors.md"


@pytest.fixture(scope="module")
def master_workspace(tiny_lm, tmp_path_factory) -> Path:
    return build_workspace(tmp_path_factory.mktemp("errors") / "ws", tiny_lm)


def _snapshot(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in root.rglob("*")
    }


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=pytest.mark.xfail(reason=c.xfail, strict=True)) if c.xfail else c
        for c in CASES
    ],
    ids=[c.what for c in CASES],
)
def test_bad_input_gets_its_documented_message(
    case, master_workspace, tmp_path, monkeypatch, capsys
):
    workspace = tmp_path / "ws"
    shutil.copytree(master_workspace, workspace)
    monkeypatch.chdir(workspace)
    for name, value in case.env:
        monkeypatch.setenv(name, value)
    if case.read_only:
        _read_only(monkeypatch, Path(case.read_only))  # relative, as the command line names it
    with live_run(workspace / case.locked) if case.locked else contextlib.nullcontext():
        before = _snapshot(workspace)
        code = main(list(case.argv))

    err = capsys.readouterr().err
    assert code == 2
    expected = case.message.replace("<cwd>", str(workspace)).splitlines()
    assert err.strip().splitlines()[-len(expected) :] == expected
    assert "Traceback" not in err
    assert _snapshot(workspace) == before, "the workspace changed"


def test_debug_shows_the_traceback(master_workspace, tmp_path, monkeypatch, capsys):
    shutil.copytree(master_workspace, tmp_path / "ws")
    monkeypatch.chdir(tmp_path / "ws")
    assert main(["sft", "--model", "model", "--data", "data/malformed.jsonl", "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith(
        "proxrl sft: error: data/malformed.jsonl:2:"
    )


def test_docs_errors_md_is_generated_from_these_cases():
    assert DOC.read_text() == render(), "run: python tests/algos/errors_cases.py > docs/errors.md"
