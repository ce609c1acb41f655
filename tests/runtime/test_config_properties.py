"""Property-based: any YAML mapping, any YAML text and any flag values either load into a
config or raise ProxrlError with a one-line message, never another exception (nor tyro's
usage dump and SystemExit)."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Literal

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxrl.algos.offline import dpo, reward, sft
from proxrl.algos.online import grpo, ppo
from proxrl.classic.config import ClassicConfig
from proxrl.runtime.config import load_config_file, parse_config
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.run_config import RunConfig

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclasses.dataclass
class Demo(RunConfig):
    batch_size: int = 8
    """Samples per step."""
    lr: float = 1e-3
    """Learning rate."""
    mode: Literal["fast", "slow"] = "fast"
    """How to run."""
    target: float | None = None
    """Optional target."""
    names: list[str] = dataclasses.field(default_factory=lambda: ["a"])
    """A list of names."""
    pair: tuple[int, ...] = (1, 2)
    """A tuple of ints."""


CONFIGS = [Demo, sft.Config, reward.Config, dpo.Config, ppo.Config, grpo.Config, ClassicConfig]
FIELDS = sorted({f.name for c in CONFIGS for f in dataclasses.fields(c)})

yaml_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True)
    | st.text(max_size=12)
    | st.sampled_from(["fast", "slow", "1e-3", "none", "true", "~", "-1", "0"])
)
yaml_values = st.recursive(
    yaml_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
keys = st.sampled_from(FIELDS) | st.text(max_size=10) | st.integers()
mappings = st.dictionaries(keys, yaml_values, max_size=5)
flag_names = (
    st.sampled_from(FIELDS).map(lambda f: "--" + f)
    | st.sampled_from(FIELDS).map(lambda f: "--no-" + f.replace("_", "-"))
    | st.text(max_size=8)
)
flag_values = st.sampled_from(
    ["", "1", "-1", "0.5", "nan", "inf", "true", "no", "None", "fast", "x", "--", "-"]
) | st.text(max_size=8)
argvs = st.lists(st.one_of(flag_names, flag_values), max_size=8)


def _loads_or_clean_error(fn, *args):
    try:
        return fn(*args)
    except ProxrlError as exc:
        assert str(exc) and "\n" not in str(exc)
        return None


@FAST
@given(config=st.sampled_from(CONFIGS), mapping=mappings)
def test_any_yaml_mapping_loads_or_gets_a_clean_error(config, mapping):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.yaml"
        path.write_text(yaml.safe_dump(mapping))
        cfg = _loads_or_clean_error(load_config_file, config, path, False)
    if cfg is not None:
        assert isinstance(cfg, config)
        for key, value in mapping.items():  # every key made it in, with its value
            if isinstance(value, (bool, str)):
                assert getattr(cfg, str(key).replace("-", "_")) == value


@FAST
@given(config=st.sampled_from(CONFIGS), text=st.text(max_size=60))
def test_any_yaml_text_loads_or_gets_a_clean_error(config, text):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.yaml"
        path.write_text(text, encoding="utf-8")
        cfg = _loads_or_clean_error(load_config_file, config, path, False)
    assert cfg is None or isinstance(cfg, config)


@FAST
@given(config=st.sampled_from(CONFIGS), argv=argvs)
def test_any_flags_parse_or_get_a_clean_error(config, argv):
    argv = [a for a in argv if a not in ("-h", "--help")]  # --help prints and exits 0 on purpose
    cfg = _loads_or_clean_error(parse_config, config, argv, "t")
    assert cfg is None or isinstance(cfg, config)
