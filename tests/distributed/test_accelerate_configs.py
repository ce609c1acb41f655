"""The shipped accelerate configs (configs/accelerate/*.yaml) load with accelerate's own config
class (which rejects unknown top-level keys), every FSDP / DeepSpeed option is one
``accelerate launch`` knows, and each says the strategy its name promises. No DeepSpeed config
ships: proxrl refuses DeepSpeed in one line (docs/errors.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from accelerate.commands.config.config_args import ClusterConfig
from accelerate.commands.launch import launch_command_parser
from accelerate.utils import DistributedType

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "accelerate"
EXPECTED = {
    "single_gpu.yaml": (DistributedType.NO, 1),
    "multi_gpu_ddp.yaml": (DistributedType.MULTI_GPU, 8),
    "fsdp.yaml": (DistributedType.FSDP, 8),
    "cpu_gloo_2proc.yaml": (DistributedType.MULTI_GPU, 2),  # see its header: torchrun + gloo
    "cpu_fsdp_2proc.yaml": (DistributedType.FSDP, 2),  # proxrl applies fully_shard on the CPU
}


def _launch_options() -> set[str]:
    return {
        opt.lstrip("-")
        for action in launch_command_parser()._actions
        for opt in action.option_strings
    }


def test_every_shipped_config_is_listed():
    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_loads_and_names_its_strategy(name):
    config = ClusterConfig.from_yaml_file(str(CONFIGS / name))
    kind, processes = EXPECTED[name]
    assert config.distributed_type == kind
    assert config.num_processes == processes
    assert config.num_machines == 1 and config.machine_rank == 0
    options = _launch_options()
    assert not config.deepspeed_config
    for key in config.fsdp_config:
        assert key in options, f"{name}: {key} is not an accelerate launch option"
    if kind == DistributedType.FSDP:
        assert config.fsdp_config["fsdp_version"] == 2
        assert config.fsdp_config["fsdp_reshard_after_forward"] is True  # fully sharded
        assert config.fsdp_config["fsdp_offload_params"] is False  # refused: docs/errors.md
        assert config.fsdp_config["fsdp_cpu_ram_efficient_loading"] is False  # see fsdp.yaml
