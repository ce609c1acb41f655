"""`proxrl <command> --help` and a typo are answered before transformers (or peft) is imported:
the modules a command's config needs import them where a model or tokenizer is loaded, so the
answer costs the import of torch at most, not torch plus transformers (issue 40: 12–29 s)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from proxrl.api import COMMANDS

HEAVY = ("transformers", "peft", "datasets", "accelerate")

# In a fresh interpreter: --help, then a misspelt option, through the console script's main;
# prints the exit codes and which of HEAVY were imported by then.
PROBE = """
import contextlib, io, json, sys
from proxrl.cli import main
codes, out = [], io.StringIO()
for argv in ([{command!r}, "--help"], [{command!r}, "--lerning-rate", "1"]):
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            codes.append(main(argv))
        except SystemExit as e:
            codes.append(e.code)
heavy = [m for m in {heavy!r} if m in sys.modules]
print(json.dumps({{"codes": codes, "heavy": heavy, "help": out.getvalue()}}))
"""


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_and_a_typo_answer_before_transformers_is_imported(command: str) -> None:
    probe = PROBE.format(command=command, heavy=HEAVY)
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=100, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["codes"] == [0, 2]
    assert answer["heavy"] == [], f"imported before the answer: {answer['heavy']}"
    # the options every command takes are listed too (--config where the command has a config)
    for flag in ("--debug", "--quiet"):
        assert flag in answer["help"]
    if command != "classic-eval":
        assert "--config FILE" in answer["help"]
