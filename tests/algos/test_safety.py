"""Safety: nothing untrusted is unpickled (every torch.load in src/ has weights_only=True, no
pickle), remote code is off by default in every command's config and never switched on in
code, and the offline trainers write weights as safetensors only."""

from __future__ import annotations

import ast
import dataclasses
import importlib
from pathlib import Path

import pytest
import torch

from proxrl.cli import COMMANDS, main
from tests.algos.lm_tasks import preference_rows, sft_rows, write_jsonl

SRC = Path(__file__).resolve().parents[2] / "src" / "proxrl"
PY_FILES = sorted(SRC.rglob("*.py"))


def _calls(path: Path) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(n, ast.Call)]


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"


def _keyword(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def test_the_source_tree_is_scanned():
    assert len(PY_FILES) > 40 and SRC / "runtime" / "checkpoint.py" in PY_FILES


def _torch_loads(source: str) -> list[tuple[int, bool]]:
    """(line, has weights_only=True) of every ``torch.load(...)`` call in ``source``."""
    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)]
    out = []
    for call in calls:
        if _dotted(call.func) == "torch.load":
            flag = _keyword(call, "weights_only")
            out.append((call.lineno, isinstance(flag, ast.Constant) and flag.value is True))
    return out


def test_the_torch_load_check_catches_an_unsafe_call():
    source = (
        "import torch\n"
        "x = torch.load(p, weights_only=True)\n"
        "y = torch.load(p)\n"
        "z = torch.load(p, weights_only=False)\n"
    )
    assert _torch_loads(source) == [(2, True), (3, False), (4, False)]


def test_every_torch_load_in_src_has_weights_only_true():
    found = {path: _torch_loads(path.read_text()) for path in PY_FILES}
    offenders = [
        f"{p.relative_to(SRC)}:{line}" for p, calls in found.items() for line, ok in calls if not ok
    ]
    assert offenders == []
    assert sum(len(c) for c in found.values()) >= 1  # the checkpoint module's state.pt load
    # and no other spelling sneaks past the check
    assert not [p for p in PY_FILES if "from torch import load" in p.read_text()]


def test_nothing_in_src_unpickles():
    offenders = [
        f"{path.relative_to(SRC)}:{call.lineno}"
        for path in PY_FILES
        for call in _calls(path)
        if _dotted(call.func)
        in ("pickle.load", "pickle.loads", "cloudpickle.load", "dill.load", "numpy.load", "np.load")
        and not (
            isinstance(_keyword(call, "allow_pickle"), ast.Constant)
            and _keyword(call, "allow_pickle").value is False
        )
    ]
    assert offenders == []


def test_trust_remote_code_is_never_switched_on_in_code():
    offenders = [
        f"{path.relative_to(SRC)}:{call.lineno}"
        for path in PY_FILES
        for call in _calls(path)
        if isinstance(_keyword(call, "trust_remote_code"), ast.Constant)
        and _keyword(call, "trust_remote_code").value is not False
    ]
    assert offenders == []


@pytest.mark.parametrize(
    "command", [c for c in COMMANDS if c not in ("report", "demo", "classic-eval")]
)
def test_trust_remote_code_is_off_by_default_in_every_config(command):
    module = importlib.import_module(COMMANDS[command][0])
    config = module.Config
    fields = {f.name: f for f in dataclasses.fields(config)}
    if command == "classic":  # gymnasium: no hub models, so no such switch
        assert "trust_remote_code" not in fields
        return
    assert fields["trust_remote_code"].default is False
    assert config.__dataclass_fields__["trust_remote_code"].type in (bool, "bool")


def _weight_files(run: Path) -> dict[str, list[str]]:
    suffixes: dict[str, list[str]] = {}
    for path in run.rglob("*"):
        if path.is_file() and "tensorboard" not in path.parts:
            suffixes.setdefault(path.suffix, []).append(str(path.relative_to(run)))
    return suffixes


@pytest.mark.parametrize(
    ("command", "extra"),
    [
        ("sft", []),
        ("sft", ["--lora-r", "4"]),
        ("rm", []),
        ("rm", ["--lora-r", "4"]),
        ("dpo", []),
        ("dpo", ["--lora-r", "4"]),
    ],
)
def test_offline_trainers_write_weights_as_safetensors_only(command, extra, tiny_lm, tmp_path):
    rows = sft_rows(16, seed=0) if command == "sft" else preference_rows(16, seed=0)
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    run = tmp_path / "run"
    argv = [
        command,
        "--model",
        tiny_lm,
        "--data",
        data,
        "--output-dir",
        str(run),
        "--max-steps",
        "2",
        "--save-every",
        "1",
        "--batch-size",
        "8",
        "--no-progress",
        *extra,
    ]
    assert main(argv) == 0
    files = _weight_files(run)
    assert files.get(".safetensors")  # the final weights (model or adapter)
    pickles = {
        s: f for s, f in files.items() if s in (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
    }
    # The only torch-serialised file is each checkpoint's state.pt (optimizer, RNG, counters:
    # tensors and plain values), which loads with weights_only=True.
    assert set(pickles) <= {".pt"}
    assert all(
        Path(f).name == "state.pt" and Path(f).parts[0] == "checkpoints"
        for f in pickles.get(".pt", [])
    )
    for name in pickles.get(".pt", []):
        assert isinstance(torch.load(run / name, weights_only=True), dict)
