"""The way into ppo and grpo (``launch``): the config checked once, before the algorithm is
built; the placement the config names builds the placement the driver is handed; the driver
starts at opening the run and fits one screen. No model loads here."""

from __future__ import annotations

import inspect

import pytest

from proxrl.algos.online import grpo, launch, ppo
from proxrl.algos.online.loop import train_online
from proxrl.algos.online.placement.base import LocalPlacement
from proxrl.algos.online.placement_fields import PLACEMENTS
from proxrl.runtime.errors import ProxrlError

REWARD = "tests.algos.online_rewards:target_fraction"


def test_every_placement_has_a_launcher():
    assert set(launch.LAUNCHERS) == set(PLACEMENTS.names())


@pytest.mark.parametrize("command", [grpo, ppo])
def test_a_bad_config_is_refused_before_the_algorithm_is_built(command, tmp_path, monkeypatch):
    built = []
    monkeypatch.setattr(command, "build", built.append)
    cfg = command.Config(model="m", prompts="p", reward_fn=REWARD, output_dir=str(tmp_path / "r"))
    cfg.learning_rate = -1.0
    with pytest.raises(ProxrlError, match="learning_rate"):
        command.train(cfg)
    assert built == []
    assert not (tmp_path / "r").exists()


def test_the_command_hands_the_driver_a_local_placement_and_a_checked_config(tmp_path, monkeypatch):
    handed = []

    def driver(cfg, algo, placement):
        handed.append((cfg, algo, placement))
        return {"done": 1.0}

    monkeypatch.setattr(launch, "train_online", driver)
    cfg = grpo.Config(model="m", prompts="p", reward_fn=REWARD, output_dir=str(tmp_path / "r"))
    assert grpo.train(cfg) == {"done": 1.0}
    [(given, algo, placement)] = handed
    assert given is cfg and algo.name == "grpo"
    assert isinstance(placement, LocalPlacement)


def test_the_driver_opens_the_run_first_and_fits_one_screen():
    source = inspect.getsource(train_online)
    body = source[source.index('"""', source.index('"""') + 3) + 3 :].strip().splitlines()
    code = [line for line in body if not line.strip().startswith("#")]
    assert code[0].strip().startswith("run = open_run(")
    assert len(source.splitlines()) <= 50
