"""The one policy for options that changed on --resume (runtime.resume): refused with one line
naming each changed option and both values, accepted and logged with --resume-with-changes,
nothing to say when only the always-free options changed."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from proxrl.runtime.config import free_on_resume, save_config_file
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.resume import changed_options, check_resume
from proxrl.runtime.run_config import RunConfig


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
    session = {"resume", "overwrite", "resume_with_changes", "progress", "output_dir"}
    assert session | {"save_every", "keep_checkpoints"} <= free_on_resume(Config)
    assert free_on_resume(Config, session_only=True) == session  # a redeclared default keeps it


def test_the_marks_sit_on_the_commands_fields():
    """Which options may change on resume is field metadata (``FREE_ON_RESUME``,
    ``SESSION_OPTION``) on the config that declares the option, not a list in runtime/."""
    from proxrl.algos.online.grpo import Config as GrpoConfig
    from proxrl.classic.config import ClassicConfig

    assert "stop_at_step" in free_on_resume(ClassicConfig, session_only=True)
    free = free_on_resume(GrpoConfig)
    assert {"vllm_gpu_memory_utilization", "ray_address", "push_to_hub", "report_to"} <= free
    assert not {"learning_rate", "iterations", "sampler"} & free
    from proxrl.demo.pipeline import Config as DemoConfig

    assert {"threads", "vllm_gpu_memory_utilization"} <= free_on_resume(DemoConfig)
    assert "threads" not in free_on_resume(DemoConfig, session_only=True)


def test_the_vllm_memory_share_may_change_on_resume_and_the_sampler_may_not(tmp_path):
    """After an out-of-memory, a run is resumed with a smaller engine share: that is free. The
    sampler itself decides what is decoded, so changing it is refused."""
    from proxrl.algos.online.config import OnlineConfig

    run = tmp_path / "run"
    run.mkdir()
    cfg = OnlineConfig(output_dir=str(run), sampler="vllm", vllm_gpu_memory_utilization=0.3)
    save_config_file(cfg, run / "config.yaml")
    resumed = dataclasses.replace(cfg, resume=True, vllm_gpu_memory_utilization=0.1)
    assert check_resume(resumed) == {}
    with pytest.raises(ProxrlError, match="sampler is 'cached'"):
        check_resume(dataclasses.replace(resumed, sampler="cached"))


def test_the_ray_cluster_address_may_change_on_resume(tmp_path):
    """A cluster address belongs to the invocation: a run started on one Ray cluster resumes on
    another (issue 40: --ray-address was refused as a changed option)."""
    from proxrl.algos.online.config import OnlineConfig

    run = tmp_path / "run"
    run.mkdir()
    cfg = OnlineConfig(output_dir=str(run), placement="ray", ray_address="10.0.0.1:6379")
    save_config_file(cfg, run / "config.yaml")
    assert check_resume(dataclasses.replace(cfg, resume=True, ray_address="10.0.0.2:6379")) == {}


def test_nothing_to_compare_without_resume_or_without_a_saved_config(tmp_path):
    cfg = _run(tmp_path)
    assert check_resume(dataclasses.replace(cfg, resume=False, seed=9)) == {}
    (tmp_path / "run" / "config.yaml").unlink()
    assert check_resume(dataclasses.replace(cfg, seed=9)) == {}


def test_only_options_in_both_are_compared():
    saved = {"a": 1, "gone": 2, "resume": False}
    now = {"a": 1, "new": 3, "resume": True}
    assert changed_options(saved, now, free={"resume"}) == {}
    assert changed_options(saved, {"a": 2}) == {"a": (1, 2)}
    assert changed_options(saved, {"a": 2}, free={"a"}) == {}


# -- the saved config as the starting point of a resumed run (runtime.config.parse_config) ----


def test_a_resumed_run_starts_from_its_saved_config(tmp_path):
    """Saved options fill what the command line leaves out; a --config file and flags come on
    top (the policy then judges them); options of the session (overwrite, progress...) and
    keys this version does not know are never taken from the saved file."""
    from proxrl.runtime.config import parse_config

    run = tmp_path / "run"
    run.mkdir()
    saved = Config(output_dir="elsewhere", learning_rate=0.25, schedule="cosine", seed=9)
    save_config_file(
        dataclasses.replace(saved, overwrite=True, progress=False), run / "config.yaml"
    )
    with (run / "config.yaml").open("a") as f:
        f.write("an_option_since_renamed: 3\n")
    (tmp_path / "layers.yaml").write_text("layers: [2]\nseed: 4\n")

    cfg = parse_config(Config, ["--output-dir", str(run), "--resume"], prog="t")
    assert (cfg.learning_rate, cfg.schedule, cfg.seed) == (0.25, "cosine", 9)
    assert (cfg.output_dir, cfg.resume, cfg.overwrite, cfg.progress) == (
        str(run),
        True,
        False,
        True,
    )

    argv = ["--config", str(tmp_path / "layers.yaml"), "--output-dir", str(run), "--resume=true"]
    cfg = parse_config(Config, [*argv, "--seed", "5"], prog="t")
    assert (cfg.learning_rate, cfg.layers, cfg.seed) == (0.25, (2,), 5)

    # not resuming, or nothing saved: the defaults as before
    assert parse_config(Config, ["--output-dir", str(run)], prog="t").learning_rate == 1e-3
    fresh = parse_config(Config, ["--output-dir", str(tmp_path / "new"), "--resume"], prog="t")
    assert fresh.learning_rate == 1e-3
    assert (
        parse_config(Config, ["--output-dir", str(run), "--resume", "--no-resume"], prog="t").seed
        == 1
    )


def test_a_bad_value_in_the_saved_config_names_the_file(tmp_path):
    from proxrl.runtime.config import parse_config

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("learning_rate: fast\n")
    with pytest.raises(ProxrlError) as info:
        parse_config(Config, ["--output-dir", str(run), "--resume"], prog="t")
    assert str(info.value) == (
        f"config file {run / 'config.yaml'}: field learning_rate expects float, found str 'fast'"
    )
    # a flag that replaces it: the saved value is not read
    cfg = parse_config(
        Config, ["--output-dir", str(run), "--resume", "--learning-rate", "2"], prog="t"
    )
    assert cfg.learning_rate == 2.0
