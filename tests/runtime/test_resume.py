"""The one policy for options that changed on --resume (runtime.resume): refused with one line
naming each changed option and both values, accepted and logged with --resume-with-changes,
nothing to say when only the always-free options changed."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from proxrl.runtime.config import RunConfig, save_config_file
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.resume import RESUME_FREE, changed_options, check_resume


@dataclasses.dataclass
class Config(RunConfig):
    learning_rate: float = 1e-3
    schedule: str = "linear"
    layers: tuple[int, ...] = (4, 4)
    progress: bool = True


def _run(tmp_path, **fields) -> Config:
    cfg = Config(output_dir=str(tmp_path / "run"), **fields)
    (tmp_path / "run").mkdir()
    save_config_file(cfg, tmp_path / "run" / "config.yaml")
    return dataclasses.replace(cfg, resume=True)


def test_changed_options_are_refused_naming_each_with_both_values(tmp_path):
    cfg = _run(tmp_path)
    changed = dataclasses.replace(cfg, learning_rate=0.5, layers=(8,), seed=7)
    with pytest.raises(ProxrlError) as info:
        check_resume(changed)
    assert str(info.value) == (
        f"--resume: seed is 7 but the run in {tmp_path / 'run'} ran with 1, "
        "learning_rate is 0.5 (was 0.001), "
        "layers is [8] (was [4, 4]); pass --resume-with-changes to continue with the new values"
    )


def test_with_resume_with_changes_the_changes_are_logged_and_returned(tmp_path, caplog):
    cfg = _run(tmp_path)
    changed = dataclasses.replace(cfg, schedule="constant", resume_with_changes=True)
    with caplog.at_level(logging.WARNING, logger="proxrl.runtime.resume"):
        assert check_resume(changed) == {"schedule": ("linear", "constant")}
    assert "--resume-with-changes: schedule changed from 'linear' to 'constant'" in caplog.text


def test_the_same_options_and_the_free_ones_pass(tmp_path):
    cfg = _run(tmp_path, save_every=5, progress=True)
    assert check_resume(cfg) == {}  # tuples compare as the lists YAML holds
    free = dataclasses.replace(
        cfg, save_every=1, keep_checkpoints=9, progress=False, output_dir=cfg.output_dir + "/"
    )
    assert check_resume(free) == {}
    assert {
        "resume",
        "overwrite",
        "resume_with_changes",
        "progress",
        "stop_at_step",
        "save_every",
        "keep_checkpoints",
    } <= RESUME_FREE


def test_nothing_to_compare_without_resume_or_without_a_saved_config(tmp_path):
    cfg = _run(tmp_path)
    assert check_resume(dataclasses.replace(cfg, resume=False, seed=9)) == {}
    (tmp_path / "run" / "config.yaml").unlink()
    assert check_resume(dataclasses.replace(cfg, seed=9)) == {}


def test_only_options_in_both_are_compared():
    saved = {"a": 1, "gone": 2, "resume": False}
    now = {"a": 1, "new": 3, "resume": True}
    assert changed_options(saved, now) == {}
    assert changed_options(saved, {"a": 2}) == {"a": (1, 2)}
    assert changed_options(saved, {"a": 2}, free={"a"}) == {}
