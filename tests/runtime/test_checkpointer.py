"""Checkpointer: what a trainer registers is saved and restored whole (weights, optimizer,
controllers, RNGs, generators, counters), the newest N are kept, and a checkpoint that does not
fit the model is a one-line error."""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest
import torch

from proxrl.core import AdaptiveKL
from proxrl.runtime.checkpoint import CheckpointManager
from proxrl.runtime.checkpointer import Accessors, Checkpointer, GlobalRNG, TrainableWeights
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.guard import NonFiniteGuard


class Trainer:
    """Everything a small trainer owns, built from one seed."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)
        )
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.1)
        self.kl = AdaptiveKL(0.5, target=0.01)
        self.guard = NonFiniteGuard(3)
        self.generator = torch.Generator().manual_seed(seed)
        self.box = {"x": 0}  # state read and written through two functions

    def checkpointer(self, run, keep: int = 3) -> Checkpointer:
        return Checkpointer(run, keep=keep).track(
            model=self.model,
            optimizer=self.optimizer,
            kl=self.kl,
            guard=self.guard,
            rng=GlobalRNG(),
            generator=self.generator,
            box=Accessors(lambda: dict(self.box), self.box.update),
        )

    def step(self) -> None:
        loss = self.model(torch.randn(5, 3, generator=self.generator)).pow(2).sum()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.kl.update(1.0)  # far above target: β doubles
        self.box["x"] += 1

    def draws(self) -> list[float]:
        """One draw from every generator the checkpoint must carry."""
        return [
            random.random(),
            float(np.random.rand()),
            float(torch.rand(1)),
            float(torch.rand(1, generator=self.generator)),
        ]


def test_save_then_restore_into_fresh_objects_continues_bit_identically(tmp_path):
    a = Trainer(seed=0)
    for _ in range(3):
        a.step()
    a.guard.skipped = 2
    saved = a.checkpointer(tmp_path).save(3, iteration=3, recent=[1.5, 2.5])
    a.step()
    expected_draws, expected_weights = (
        a.draws(),
        {k: v.clone() for k, v in a.model.state_dict().items()},
    )

    b = Trainer(seed=1)  # other weights, optimizer moments, β, generators
    restored = b.checkpointer(tmp_path).restore()
    assert restored.path == saved and restored.step == 3
    assert restored.counters == {"iteration": 3, "recent": [1.5, 2.5]}
    assert b.kl.value == a.kl.value / 2 and b.guard.skipped == 2 and b.box == {"x": 3}
    b.step()
    assert b.draws() == expected_draws
    for key, value in b.model.state_dict().items():
        assert torch.equal(value, expected_weights[key]), key


def test_keeps_the_newest_n(tmp_path):
    trainer = Trainer(seed=0)
    checkpointer = trainer.checkpointer(tmp_path, keep=2)
    for step in (1, 2, 3, 4):
        checkpointer.save(step)
    assert [p.name for p in CheckpointManager(tmp_path).checkpoints()] == [
        "step_000000003",
        "step_000000004",
    ]


def test_the_format_is_the_managers_groups_and_state(tmp_path):
    """Weights are safetensors groups, states and counters sit in state.pt under their names:
    the layout trainers wrote before, so their checkpoints still resume."""
    trainer = Trainer(seed=0)
    path = trainer.checkpointer(tmp_path).save(5, iteration=5)
    tensors, state = CheckpointManager(tmp_path).load(path)
    assert (
        list(tensors) == ["model"] and tensors["model"].keys() == trainer.model.state_dict().keys()
    )
    assert set(state) == {"optimizer", "kl", "guard", "rng", "generator", "box", "iteration"}
    assert state["kl"] == {"value": 0.5} and state["iteration"] == 5


def test_trainable_weights_save_only_what_trains_and_load_over_the_rest(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    model[0].requires_grad_(False)  # frozen, as a LoRA base is
    path = Checkpointer(tmp_path).track(model=TrainableWeights(model)).save(1)
    assert CheckpointManager(tmp_path).load(path)[0]["model"].keys() == {"1.weight", "1.bias"}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    Checkpointer(tmp_path).track(model=TrainableWeights(model)).restore()
    assert torch.equal(
        model[0].weight, before["0.weight"] + 1.0
    )  # not in the checkpoint: left alone
    assert torch.equal(model[1].weight, before["1.weight"]) and torch.equal(
        model[1].bias, before["1.bias"]
    )


def test_a_checkpoint_of_another_model_is_one_line_naming_a_tensor(tmp_path):
    CheckpointManager(tmp_path).save(4, {"model": {"encoder.weight": torch.zeros(2)}}, {"step": 4})
    with pytest.raises(ProxrlError) as info:
        Checkpointer(tmp_path).track(model=TrainableWeights(torch.nn.Linear(2, 2))).restore()
    assert str(info.value) == (
        f"checkpoint {tmp_path / 'checkpoints' / 'step_000000004'} does not match this run's model "
        "(another model or lora_r?): found 1 unknown tensors such as 'encoder.weight'"
    )


def test_no_checkpoint_is_refused_and_a_missing_entry_keeps_its_state(tmp_path, caplog):
    trainer = Trainer(seed=0)
    with pytest.raises(
        ProxrlError, match="--resume: no complete checkpoint in .*checkpoints; it stopped before"
    ):
        trainer.checkpointer(tmp_path).restore()
    Checkpointer(tmp_path).track(model=trainer.model).save(1)
    with caplog.at_level(logging.WARNING, logger="proxrl.runtime.checkpointer"):
        trainer.checkpointer(tmp_path).restore()
    assert "holds no 'kl'; it keeps its fresh state" in caplog.text
    assert trainer.kl.value == 0.5


def test_registration_refuses_duplicates_and_stateless_objects(tmp_path):
    checkpointer = Checkpointer(tmp_path).track(kl=AdaptiveKL(0.1, 0.01))
    with pytest.raises(ValueError, match="'kl' is registered twice"):
        checkpointer.track(kl=AdaptiveKL(0.1, 0.01))
    with pytest.raises(TypeError, match="int has no state_dict"):
        checkpointer.track(count=3)
    with pytest.raises(ValueError, match="clash"):
        checkpointer.save(1, kl=2)
