"""An online run's stages read the settings records built once when it opens, never the config
(docs/architecture.md; issue 52 item 2): ``benchmarks/cfg_travel.py``'s walk from the driver,
``loop.train_online``, reaches no stage with the config nor with an object holding it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import proxrl

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "cfg_travel.py"
_spec = importlib.util.spec_from_file_location("cfg_travel", _PATH)
assert _spec is not None and _spec.loader is not None
cfg_travel = importlib.util.module_from_spec(_spec)
sys.modules["cfg_travel"] = cfg_travel  # dataclasses look their module up there
_spec.loader.exec_module(cfg_travel)

SRC = Path(proxrl.__file__).resolve().parents[1]
STAGES = (
    "advantages",
    "algorithm",
    "collect",
    "dapo",
    "episodes",
    "gather",
    "heldout",
    "micro_batches",
    "mismatch",
    "old_policy",
    "prompts",
    "rollout_settings",
    "rollouts_file",
    "update",
)
"""The modules of ``algos/online`` whose functions are a run's stages (or what they call)."""


def _reached(src: Path) -> tuple[set[str], dict[str, str]]:
    walk = cfg_travel.Walk(cfg_travel.Source(src))
    walk.run()
    return {callee for _, callee in walk.edges}, walk.holders


def test_no_stage_receives_the_config():
    """Only the run's opening (``run``, ``run_settings``) and what it hands the config to on
    purpose (the roles, the placement, the run context) receive it; the loop's stages, the
    rollout's, the update's, the held-out evaluation's do not, nor holds ``OnlineRun`` it."""
    reached, holders = _reached(SRC)
    online = "proxrl.algos.online."
    stages = sorted(
        q
        for q in reached
        if q.startswith(online)
        and (q.split(".")[3] in STAGES or (q.split(".")[3] == "loop" and q != cfg_travel.DRIVER))
    )
    assert stages == []
    assert online + "run.OnlineRun" not in holders
    assert online + "run_settings.run_settings" in reached  # (the walk does reach the opening)


def test_the_walk_finds_a_stage_that_reads_the_config_from_the_run(tmp_path):
    """A driver whose run holds the config (``OnlineRun(cfg)``) and a stage reading
    ``run.cfg``: the walk reaches the stage, through the holder, and the run's class holds it."""
    package = tmp_path / "proxrl" / "algos" / "online"
    package.mkdir(parents=True)
    for init in (tmp_path / "proxrl", package.parent, package):
        (init / "__init__.py").write_text("")
    (package / "run.py").write_text(
        "from dataclasses import dataclass\n\n\n"
        "@dataclass\nclass OnlineRun:\n    cfg: object\n    n: int = 0\n\n\n"
        "def open_run(cfg) -> OnlineRun:\n    return OnlineRun(cfg)\n"
    )
    (package / "collect.py").write_text(
        "def sample(seed: int) -> int:\n    return seed\n\n\n"
        "def stage(run) -> int:\n    return sample(run.cfg.seed) + len(str(run.cfg))\n"
    )
    (package / "loop.py").write_text(
        "from proxrl.algos.online.collect import stage\n"
        "from proxrl.algos.online.run import open_run\n\n\n"
        "def train_online(cfg) -> int:\n    run = open_run(cfg)\n    return stage(run)\n"
    )
    reached, holders = _reached(tmp_path)
    assert reached == {
        "proxrl.algos.online.run.open_run",
        "proxrl.algos.online.run.OnlineRun",
        "proxrl.algos.online.collect.stage",
    }
    assert holders == {"proxrl.algos.online.run.OnlineRun": "cfg"}
