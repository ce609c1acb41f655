"""CheckpointManager: round trip, tied tensors, retention, verification, atomicity, and the
output-directory guard."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from proxrl.runtime.checkpoint import CheckpointManager, CorruptCheckpointWarning
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.run_dir import RUN_MARKER, check_output_dir, prepare_output_dir


def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False))
    model[1].weight = model[0].weight  # tied, as LM embeddings and heads are
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.tensor([1, 2])).sum().backward()
    opt.step()
    return model, opt


def test_round_trip_keeps_values_ties_and_optimizer_state(tmp_path):
    model, opt = _model_and_optimizer()
    manager = CheckpointManager(tmp_path)
    state = {
        "optimizer": opt.state_dict(),
        "step": 7,
        "name": "x",
        "pair": (1, 2.5),
        "nested": {"k": [torch.arange(3)]},
    }
    path = manager.save(7, {"model": model.state_dict()}, state)
    tensors, loaded = manager.load(path)
    sd = tensors["model"]
    assert torch.equal(sd["0.weight"], model[0].weight.detach())
    assert sd["0.weight"].data_ptr() == sd["1.weight"].data_ptr()  # still tied
    assert loaded["step"] == 7 and loaded["name"] == "x" and loaded["pair"] == (1, 2.5)
    assert torch.equal(loaded["nested"]["k"][0], torch.arange(3))
    opt2 = torch.optim.Adam(model.parameters(), lr=0.1)
    opt2.load_state_dict(loaded["optimizer"])
    exp_avg = next(iter(opt.state_dict()["state"].values()))["exp_avg"]
    assert torch.equal(next(iter(opt2.state_dict()["state"].values()))["exp_avg"], exp_avg)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["step"] == 7 and set(manifest["sha256"]) == {"model.safetensors", "state.pt"}


def test_keeps_last_k_and_latest_is_newest(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    for step in (1, 2, 3):
        manager.save(step, {"w": {"x": torch.full((2,), float(step))}}, {"step": step})
    assert [p.name for p in manager.checkpoints()] == ["step_000000002", "step_000000003"]
    latest = manager.latest()
    assert latest is not None and manager.step_of(latest) == 3


def test_corrupt_and_torn_checkpoints_are_skipped_with_a_warning(tmp_path):
    manager = CheckpointManager(tmp_path, keep=5)
    for step in (1, 2, 3):
        manager.save(step, {"w": {"x": torch.full((4,), float(step))}}, {"step": step})
    data = bytearray((manager.root / "step_000000003" / "w.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (manager.root / "step_000000003" / "w.safetensors").write_bytes(bytes(data))
    (manager.root / "step_000000002" / "manifest.json").unlink()  # torn: manifest never written
    with pytest.warns(CorruptCheckpointWarning) as record:
        latest = manager.latest()
    assert latest is not None and manager.step_of(latest) == 1
    messages = " ".join(str(w.message) for w in record)
    assert "does not match its sha256" in messages and "no manifest.json" in messages
    with pytest.raises(ProxrlError, match="corrupt"):
        manager.load(manager.root / "step_000000003")


def test_leftover_temporary_directory_is_ignored_and_cleaned(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, {"w": {"x": torch.zeros(1)}}, {})
    stale = manager.root / ".tmp-step_000000002-999999"
    stale.mkdir()
    (stale / "w.safetensors").write_bytes(b"half")
    assert manager.step_of(manager.latest()) == 1
    manager.save(2, {"w": {"x": torch.ones(1)}}, {})
    assert not stale.exists()


def test_state_that_weights_only_cannot_load_is_refused_at_save(tmp_path):
    import numpy as np

    with pytest.raises(TypeError, match="ndarray"):
        CheckpointManager(tmp_path).save(1, {}, {"rng": np.zeros(3)})


def test_output_dir_guard(tmp_path):
    run = tmp_path / "run"
    assert prepare_output_dir(run, resume=False, overwrite=False) == run
    (run / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(ProxrlError, match="already holds a run; pass --resume"):
        prepare_output_dir(run, resume=False, overwrite=False)
    assert prepare_output_dir(run, resume=True, overwrite=False) == run
    assert (run / "metrics.jsonl").exists()
    prepare_output_dir(run, resume=False, overwrite=True)
    assert not (run / "metrics.jsonl").exists()
    with pytest.raises(ProxrlError, match="holds no run to resume"):
        prepare_output_dir(tmp_path / "fresh", resume=True, overwrite=False)
    other = tmp_path / "other"
    other.mkdir()
    (other / "thesis.tex").write_text("precious")
    with pytest.raises(ProxrlError, match="not empty and holds no proxrl run"):
        prepare_output_dir(other, resume=False, overwrite=True)
    assert (other / "thesis.tex").exists()


def test_check_output_dir_raises_what_prepare_would_and_touches_nothing(tmp_path):
    from proxrl.runtime.run_dir import check_output_dir

    run = prepare_output_dir(tmp_path / "run", resume=False, overwrite=False)
    (run / "metrics.jsonl").write_text("{}\n")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(ProxrlError, match="already holds a run; pass --resume"):
        check_output_dir(run, resume=False, overwrite=False)
    check_output_dir(run, resume=False, overwrite=True)  # allowed, but deletes nothing yet
    check_output_dir(run, resume=True, overwrite=False)
    check_output_dir(tmp_path / "fresh", resume=False, overwrite=False)  # creates nothing
    with pytest.raises(ProxrlError, match="holds no run to resume"):
        check_output_dir(tmp_path / "fresh", resume=True, overwrite=False)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_run_that_stopped_before_its_first_step_holds_no_work(tmp_path):
    """Marker, config, an empty metrics file, TensorBoard's empty events and a save's leftovers
    are what a first iteration that failed leaves: a new start may replace them. A checkpoint,
    a logged row or any other file is work, and the directory stays protected."""
    from proxrl.runtime.run_dir import holds_work

    run = prepare_output_dir(tmp_path / "run", resume=False, overwrite=False)
    (run / "config.yaml").write_text("seed: 1\n")
    (run / "metrics.jsonl").write_text("\n")
    (run / "tensorboard").mkdir()
    (run / "tensorboard" / "events.out.tfevents.1").write_bytes(b"\0")
    (run / "checkpoints" / ".tmp-step_000000001-1").mkdir(parents=True)
    assert not holds_work(run)
    check_output_dir(run, resume=False, overwrite=False)  # no error
    assert prepare_output_dir(run, resume=False, overwrite=False) == run
    assert sorted(p.name for p in run.iterdir()) == [RUN_MARKER]

    for work in ("metrics.jsonl", "model.safetensors", "sub/notes.txt"):
        shutil.rmtree(run)
        prepare_output_dir(run, resume=False, overwrite=False)
        (run / work).parent.mkdir(parents=True, exist_ok=True)
        (run / work).write_text('{"step": 1, "loss": 0.5}\n')
        assert holds_work(run), work
        with pytest.raises(ProxrlError, match="already holds a run"):
            check_output_dir(run, resume=False, overwrite=False)
    shutil.rmtree(run)
    CheckpointManager(prepare_output_dir(run, False, False)).save(1, {}, {"step": 1})
    assert holds_work(run)
