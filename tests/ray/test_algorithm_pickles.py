"""What the driver hands the trainer actor (``TrainerActor.train(cfg, algo, loop)``) crosses to
another process: Ray pickles it with cloudpickle, and a closure naming a module global that
cannot be pickled (a ContextVar, a lock) fails every ``placement: ray`` run at its start. Cheap:
no Ray is started."""

from __future__ import annotations

import pytest

from proxrl.algos.online import grpo, ppo
from proxrl.algos.online.loop import train_online


@pytest.mark.parametrize(
    ("command", "options"),
    [
        (grpo, {}),
        (grpo, {"policy_loss": "cispo", "off_policy_mask": "opsm"}),
        (grpo, {"policy_loss": "clip_cov"}),
        (ppo, {"critic": "separate"}),
        (ppo, {"critic": "head"}),
    ],
)
def test_the_algorithm_and_loop_pickle_for_the_trainer_actor(command, options):
    from ray import cloudpickle

    cfg = command.Config(model="m", prompts="p", placement="ray", **options)
    for value in (cfg, command.build(cfg), train_online):
        cloudpickle.loads(cloudpickle.dumps(value))
