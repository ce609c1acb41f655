"""A read-only output directory (sft, grpo, ``--resume``, ``report``) is one line naming it
(``runtime.run_dir.not_writable``), not a traceback. The file system is made read-only by
patching the calls that write (the tests may run as root, whom permissions do not stop)."""

from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from proxrl.runtime import run_dir as run_dir_module
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.run import Run


@dataclass
class Cfg:
    output_dir: str
    resume: bool = False
    overwrite: bool = False
    resume_with_changes: bool = False
    keep_checkpoints: int = 3
    max_consecutive_skips: int = 5
    report_to: tuple[str, ...] = ("none",)
    progress: bool = False


def _read_only(monkeypatch, under: Path) -> None:
    """Every write under ``under`` fails as on a read-only file system."""
    real_open, real_mkdir = os.open, Path.mkdir

    def opened(path, flags, *args, **kwargs):
        if str(path).startswith(str(under)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kwargs)

    def made(self, *args, **kwargs):
        if str(self).startswith(str(under)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(run_dir_module.os, "open", opened)
    monkeypatch.setattr(Path, "mkdir", made)


@pytest.mark.parametrize("resume", [False, True], ids=["fresh", "resume"])
def test_a_read_only_output_dir_is_one_line(tmp_path, monkeypatch, resume):
    out = tmp_path / "run"
    if resume:  # a run to resume, on a file system that became read-only
        out.mkdir()
        (out / ".proxrl-run").write_text(json.dumps({"planned_steps": 2}))
        (out / "metrics.jsonl").write_text('{"step": 1}\n')
    _read_only(monkeypatch, tmp_path)
    with pytest.raises(ProxrlError) as refused:
        Run(Cfg(str(out), resume=resume)).prepare()
    assert str(refused.value) == (
        f"cannot write in {out}: Read-only file system; choose a writable directory"
    )


def test_report_of_a_read_only_run_dir_is_one_line(tmp_path, monkeypatch):
    from proxrl.report import write_report

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "train/loss": 1.0}\n')
    _read_only(monkeypatch, tmp_path)
    with pytest.raises(ProxrlError) as refused:
        write_report(tmp_path)
    assert str(refused.value) == (
        f"cannot write in {tmp_path}: Read-only file system; choose a writable directory"
    )
