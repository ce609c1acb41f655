"""The README's and docs/' code blocks run as written (issue 51: the GRPO examples asked the
demo's 64-position model for 64 new tokens, the PPO snippet used an undefined ``kl_coef``).

A fenced ``python``, ``bash`` or ``yaml`` block is marked on the line before it:
``<!-- runnable -->`` (anything may follow, e.g. what the block needs from the blocks above) or
``<!-- not runnable: why -->``; a block with neither fails ``test_every_block_is_marked``, so a
new one cannot slip through. The runnable blocks of a file run in order, from a directory holding
``make demo``'s ``runs/demo/sft`` and ``runs/demo/data``: the python blocks in one namespace (a
later block may use an earlier one's names, as in a notebook), the bash blocks with ``bash -e``.

To stay within seconds the test changes the words of ``SHRINK`` only (each must still be in the
blocks, or the table is stale), and ``runs/demo/sft`` is the demo's base model (its tokenizer and
tiny Llama, random weights): the demo's SFT policy has the same shape and takes its SFT stage to
train."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from proxrl.demo import pipeline, task

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CHECKED = {"python", "py", "bash", "sh", "shell", "console", "yaml", "yml"}
"""Info strings of the blocks that must be marked (a bare fence is a diagram or a synopsis)."""
RUNS = {"python", "bash"}
FENCE = re.compile(r"^(?P<indent> *)```(?P<info>\S*)\s*$")
MARK = re.compile(r"^ *<!-- (?P<mark>runnable|not runnable)(?P<rest>.*?)-->\s*$")
SHRINK = {
    "--iterations 50": "--iterations 2",
    "iterations=50": "iterations=2",
    "range(50)": "range(2)",
}
"""What the test changes in the runnable blocks: training length only."""


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, from 1
    info: str
    mark: str | None  # "runnable", "not runnable", None
    reason: str  # the mark's text after it
    code: str  # dedented

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """Every fenced block of a markdown file, with the mark on the line before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = MARK.match(before)
        code = textwrap.dedent("\n".join(lines[i + 1 : end])) + "\n"
        found.append(
            Block(
                path,
                i + 1,
                fence["info"],
                mark["mark"] if mark else None,
                mark["rest"].strip(" :") if mark else "",
                code,
            )
        )
        i = end + 1
    return found


def runnable(path: Path) -> list[Block]:
    return [b for b in blocks(path) if b.mark == "runnable"]


def test_every_block_is_marked():
    """Each python/bash/yaml block says whether it runs; one that does not says why; only
    python and bash blocks are run."""
    wrong = []
    for b in (b for path in DOCS for b in blocks(path) if b.info in CHECKED):
        if b.mark is None:
            wrong.append(f"{b.where}: {b.info} block without a runnable / not runnable mark")
        elif b.mark == "not runnable" and not b.reason:
            wrong.append(f"{b.where}: <!-- not runnable --> without a reason")
        elif b.mark == "runnable" and b.info not in RUNS:
            wrong.append(f"{b.where}: {b.info} block marked runnable (only {sorted(RUNS)} run)")
    assert not wrong, "\n".join(wrong)


def test_the_shrink_table_is_current():
    code = "".join(b.code for path in DOCS for b in runnable(path))
    assert [old for old in SHRINK if old not in code] == []


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``make demo``'s ``runs/demo/data`` (its own sizes and seed) and its model as
    ``runs/demo/sft``."""
    root = tmp_path_factory.mktemp("docs")
    cfg = pipeline.Config()
    task.generate(root / "runs" / "demo" / "data", cfg.task_sizes, cfg.seed)
    pipeline.build_base_model(cfg, root / "runs" / "demo" / "sft")
    return root


def shrunk(code: str) -> str:
    for old, new in SHRINK.items():
        code = code.replace(old, new)
    return code


@pytest.mark.parametrize(
    "path", [p for p in DOCS if runnable(p)], ids=lambda p: str(p.relative_to(ROOT))
)
def test_the_runnable_blocks_run(path, workspace, monkeypatch):
    monkeypatch.chdir(workspace)
    env = os.environ | {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    namespace: dict = {"__name__": "__docs__"}
    for b in runnable(path):
        code = shrunk(b.code)
        if b.info == "bash":
            done = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", code],
                cwd=workspace,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, f"{b.where}: exit {done.returncode}\n{done.stderr[-3000:]}"
        else:
            try:
                exec(compile(code, b.where, "exec"), namespace)  # noqa: S102 (the docs' own code)
            except Exception as e:
                raise AssertionError(f"{b.where}: {type(e).__name__}: {e}") from e
