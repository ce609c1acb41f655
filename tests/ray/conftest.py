"""tests/ray: ``placement: ray`` on a local Ray of 2 CPUs, started once per module (Ray's start
is seconds on a shared machine); without the ray package these tests are not collected."""

from __future__ import annotations

import importlib.util
import os

import pytest

from proxrl.algos.online.placement.ray_group import READY_TIMEOUT_ENV, RUN_TIMEOUT_ENV
from proxrl.models.tiny import build_tiny_lm  # noqa: E402
from tests.algos.lm_tasks import CORPUS  # noqa: E402

collect_ignore_glob = [] if importlib.util.find_spec("ray") is not None else ["test_*.py"]


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny Llama + byte-level BPE tokenizer, saved to a temp dir (as in tests/algos)."""
    return str(build_tiny_lm(tmp_path_factory.mktemp("tiny") / "lm", CORPUS))


# Every wait of a run on Ray has a deadline here, and says what it waited for: an actor's
# start (placed and loaded) and the driver's wait for the trainers. Set before ray.init, so
# the actors (whose processes the local Ray starts) read them too.
DEADLINES = {READY_TIMEOUT_ENV: "120", RUN_TIMEOUT_ENV: "240"}


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module's runs (a run joins a Ray already started, and leaves it)."""
    import ray

    saved = {key: os.environ.get(key) for key in DEADLINES}
    os.environ.update(DEADLINES)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        yield ray
    finally:
        ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
