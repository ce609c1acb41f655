"""The training client's pair losses (issue 38): one ``forward_backward(pairs, "dpo")`` and
``optim_step`` on a tiny model is one step of ``proxrl dpo`` to the bit (float64, same seed, same
pairs in the same order), and a batch that is not the client's pairs is refused in one line."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from proxrl.algos.offline import dpo
from proxrl.algos.online.client import TrainingClient
from proxrl.data.batching import bucket_batches
from proxrl.runtime.errors import ProxrlError
from tests.algos.lm_tasks import preference_rows, write_jsonl

SEED, LR = 3, 3e-3


def client(tiny_lm: str, grad_accum: int = 1) -> TrainingClient:
    return TrainingClient(
        tiny_lm,
        dtype="float64",
        learning_rate=LR,
        lr_schedule="constant",
        track_kl=True,  # loads the reference model (the starting weights, as proxrl dpo's)
        rollout_batch_size=4,
        group_size=2,
        mini_batch_size=8,
        grad_accum=grad_accum,  # micro_batch_size 8 // grad_accum pairs a forward pass
        seed=SEED,
    )


@pytest.mark.parametrize(
    ("loss", "n_pairs", "grad_accum"),
    [
        ("dpo", 8, 1),
        ("ipo", 8, 1),
        ("simpo", 8, 1),
        ("dpo", 6, 2),
    ],  # the last: micro-batches of 4 and 2 pairs
)
def test_one_client_step_is_one_step_of_proxrl_dpo(tiny_lm, tmp_path, loss, n_pairs, grad_accum):
    rows = preference_rows(n_pairs, seed=0)
    size = 8 // grad_accum
    cfg = dpo.Config(
        model=tiny_lm,
        data=write_jsonl(tmp_path / "pairs.jsonl", rows),
        output_dir=str(tmp_path / "dpo"),
        loss="sigmoid" if loss == "dpo" else loss,
        beta=0.5,
        batch_size=size,
        grad_accum=grad_accum,
        epochs=1,
        learning_rate=LR,
        lr_schedule="constant",
        dtype="float64",
        seed=SEED,
        progress=False,
    )
    metrics = dpo.train(cfg)

    trainer = client(tiny_lm, grad_accum)
    # proxrl dpo's one step takes its micro-batches in its bucketed order: the client gets the
    # pairs in that order, and splits them into the same micro-batches (a full one first).
    lengths = [len(item) for item in trainer.pairs(rows, loss).items]
    micro = bucket_batches(lengths, size, seed=SEED, epoch=0)
    assert [len(m) for m in micro] == ([size, n_pairs - size] if grad_accum > 1 else [n_pairs])
    pairs = trainer.pairs([rows[i] for m in micro for i in m], loss)
    stats = trainer.forward_backward(pairs, loss, beta=0.5)
    step = trainer.optim_step()
    trainer.save_model(tmp_path / "client")
    trainer.close()

    assert step["stepped"] == 1.0
    assert stats["loss"] == metrics["train/loss"]
    built_in = load_file(tmp_path / "dpo" / "model.safetensors")
    ours = load_file(tmp_path / "client" / "model.safetensors")
    assert built_in.keys() == ours.keys()
    start = load_file(f"{tiny_lm}/model.safetensors")
    assert any(not torch.equal(start[k], built_in[k]) for k in built_in)  # the step moved them
    assert all(torch.equal(built_in[k], ours[k]) for k in built_in)


def test_a_batch_that_is_not_the_clients_pairs_is_refused_in_one_line(tiny_lm):
    trainer = client(tiny_lm)
    rows = preference_rows(2, seed=0)
    with pytest.raises(ProxrlError, match=r"batch: a pair loss .* got list") as raised:
        trainer.forward_backward(rows, "dpo")  # rows, not TrainingClient.pairs(rows)
    assert "\n" not in str(raised.value)
    with pytest.raises(ProxrlError, match=r"batch: .* for loss=dpo, not ipo"):
        trainer.forward_backward(trainer.pairs(rows, "dpo"), "ipo")
    with pytest.raises(ProxrlError, match=r"rows\[1\]: expected a dict"):
        trainer.pairs([rows[0], "chosen"], "dpo")
    with pytest.raises(ProxrlError, match=r"rows\[0\].*rejected"):
        trainer.pairs([{"prompt": "p", "chosen": " a"}], "dpo")
    trainer.close()
