"""``--resume`` with another command than the one that made the run is refused in one line
naming both (the run marker records the command); a run directory without the record (older
proxrl) is accepted."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated

import pytest

from proxrl.runtime.config import SESSION_OPTION
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.resume import command_of_config
from proxrl.runtime.run import Run
from proxrl.runtime.run_dir import RUN_MARKER


@dataclass
class Cfg:
    output_dir: Annotated[str, SESSION_OPTION]  # marked as RunConfig marks them
    resume: Annotated[bool, SESSION_OPTION] = False
    overwrite: Annotated[bool, SESSION_OPTION] = False
    resume_with_changes: Annotated[bool, SESSION_OPTION] = False
    keep_checkpoints: int = 3
    max_consecutive_skips: int = 5
    report_to: tuple[str, ...] = ("none",)
    progress: Annotated[bool, SESSION_OPTION] = False


def _finished_run(out, command: str) -> None:
    """A run of 2 steps made by ``command``, complete."""
    run = Run(Cfg(str(out)), command=command)
    run.check(2)
    run.prepare()
    run.start(2)
    run.save(2, step=2)
    run.close()
    run.release()


@pytest.mark.timeout(60)
def test_resume_with_another_command_is_refused_naming_both(tmp_path):
    out = tmp_path / "run"
    _finished_run(out, "grpo")
    assert json.loads((out / RUN_MARKER).read_text())["command"] == "grpo"
    other = Run(Cfg(str(out), resume=True), command="ppo")
    for check in (other.check, lambda: other.check_not_finished(2), other.prepare):
        with pytest.raises(ProxrlError) as refused:  # not "already finished"
            check()
        assert str(refused.value) == (
            f"--resume: the run in {out} was made by proxrl grpo, not proxrl ppo; resume it "
            "with proxrl grpo, or start a new one in another directory"
        )
    same = Run(Cfg(str(out), resume=True), command="grpo")
    with pytest.raises(ProxrlError, match="already finished"):
        same.check(2)


@pytest.mark.timeout(60)
def test_a_run_without_a_recorded_command_resumes(tmp_path):
    out = tmp_path / "run"
    _finished_run(out, "grpo")
    (out / RUN_MARKER).write_text(json.dumps({"planned_steps": 2}) + "\n")  # older proxrl
    with pytest.raises(ProxrlError, match="already finished"):
        Run(Cfg(str(out), resume=True), command="ppo").check(2)


def test_commands_are_named_from_the_config_module():
    from proxrl.algos.offline import reward, sft
    from proxrl.algos.online import grpo, ppo
    from proxrl.classic.config import ClassicConfig
    from proxrl.demo.pipeline import Config as DemoConfig

    named = {
        command_of_config(object.__new__(c))
        for c in (sft.Config, reward.Config, ppo.Config, grpo.Config, ClassicConfig, DemoConfig)
    }
    assert named == {"sft", "rm", "ppo", "grpo", "classic", "demo"}
