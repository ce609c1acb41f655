"""DPO family: separable pairs are learned, the reference is the starting policy (or the
adapter-disabled model under LoRA), IPO and SimPO train, accumulation is exact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel

from proxrl.algos.offline import dpo
from proxrl.algos.offline.loop import accumulate_gradients
from proxrl.data.batching import collate_pairs
from proxrl.data.encoding import encode_preferences
from proxrl.data.formats import parse_preference
from proxrl.data.readers import Row
from proxrl.models.causal_lm import load_causal_lm
from proxrl.models.tokenizer import load_tokenizer
from tests.algos.lm_tasks import preference_rows, write_jsonl


def _config(tiny_lm: str, tmp_path: Path, **overrides) -> dpo.Config:
    fields = dict(
        model=tiny_lm,
        data=write_jsonl(tmp_path / "train.jsonl", preference_rows(128, seed=0)),
        eval_data=write_jsonl(tmp_path / "eval.jsonl", preference_rows(64, seed=1)),
        output_dir=str(tmp_path / "run"),
        batch_size=16,
        learning_rate=1e-3,
        epochs=1,
        progress=False,
    )
    return dpo.Config(**(fields | overrides))


def _pairs(tiny_lm: str, n: int, seed: int):
    tokenizer = load_tokenizer(tiny_lm)
    rows = preference_rows(n, seed)
    return tokenizer, encode_preferences(
        [parse_preference(Row(r, str(i))) for i, r in enumerate(rows)], tokenizer, 512
    )


def test_dpo_raises_reward_accuracy_on_a_separable_task(tiny_lm, tmp_path):
    cfg = _config(tiny_lm, tmp_path)
    metrics = dpo.train(cfg)
    rows = [
        json.loads(x) for x in (Path(cfg.output_dir) / "metrics.jsonl").read_text().splitlines()
    ]
    # Step 1 runs at the reference point: every implicit reward is exactly 0.
    assert rows[0]["rewards/chosen"] == pytest.approx(0.0, abs=1e-6)
    assert rows[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-6)
    assert rows[0]["train/loss"] == pytest.approx(0.693147, abs=1e-5)  # log 2
    assert metrics["eval/rewards/accuracies"] > 0.9
    assert metrics["rewards/accuracies"] > 0.9
    assert metrics["eval/rewards/margins"] > 0
    assert metrics["eval/loss"] < 0.69


@pytest.mark.parametrize("loss", ["ipo", "simpo"])
def test_ipo_and_simpo_learn_the_same_task(tiny_lm, tmp_path, loss):
    beta = 0.1 if loss == "ipo" else 2.0
    metrics = dpo.train(_config(tiny_lm, tmp_path, loss=loss, beta=beta))
    assert metrics["eval/rewards/accuracies"] > 0.9
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())


def test_reference_logps_are_the_starting_policy(tiny_lm):
    tokenizer, pairs = _pairs(tiny_lm, 6, seed=2)
    model = load_causal_lm(tiny_lm, dtype="float64")
    ref_c, ref_r = dpo.reference_logps(
        model, pairs, batch_size=4, pad_id=tokenizer.pad_token_id, average=False
    )
    for i, pair in enumerate(pairs):
        one = collate_pairs([pair], tokenizer.pad_token_id)
        with torch.no_grad():
            logps = dpo.response_logps(model, one.sequences, average=False)
        torch.testing.assert_close(torch.stack([ref_c[i], ref_r[i]]), logps, rtol=1e-10, atol=1e-10)
    assert torch.all(ref_c < 0) and torch.all(ref_r < 0)


def test_grad_accumulation_1x8_equals_8x1(tiny_lm):
    tokenizer, pairs = _pairs(tiny_lm, 8, seed=4)
    pad = tokenizer.pad_token_id
    cfg = dpo.Config(model=tiny_lm, data="unused", beta=0.5, label_smoothing=0.1)
    ref = (
        torch.linspace(-30, -20, 8, dtype=torch.float64),
        torch.linspace(-25, -35, 8, dtype=torch.float64),
    )

    def grads(groups):
        model = load_causal_lm(tiny_lm, dtype="float64")
        batches = [dpo.make_batch(pairs, g, ref, pad, torch.float64) for g in groups]
        stats = accumulate_gradients(
            model, batches, lambda m, b: dpo.preference_loss(m, b, cfg), lambda b: b.pairs.num_pairs
        )
        return stats, {n: p.grad.clone() for n, p in model.named_parameters()}

    one_stats, one = grads([list(range(8))])
    eight_stats, eight = grads([[i] for i in range(8)])
    for key in ("loss", "rewards/margins", "rewards/accuracies"):
        assert one_stats[key] == pytest.approx(eight_stats[key], rel=1e-10, abs=1e-12)
    for name in one:
        torch.testing.assert_close(eight[name], one[name], rtol=1e-9, atol=1e-12)


def test_lora_dpo_uses_the_disabled_adapter_as_reference_and_saves_the_adapter(tiny_lm, tmp_path):
    """(The reference when the start is itself a LoRA model: tests/algos/test_lora_chain.py.)"""
    cfg = _config(tiny_lm, tmp_path, lora_r=8, learning_rate=1e-2)
    metrics = dpo.train(cfg)
    assert metrics["eval/rewards/accuracies"] > 0.9
    out = Path(cfg.output_dir)
    assert (out / "model.safetensors").exists() and (
        out / "adapter" / "adapter_model.safetensors"
    ).exists()
    tokenizer, pairs = _pairs(tiny_lm, 4, seed=9)
    batch = collate_pairs(pairs, tokenizer.pad_token_id).sequences
    base = load_causal_lm(tiny_lm)
    adapted = PeftModel.from_pretrained(load_causal_lm(tiny_lm), str(out / "adapter"))
    with torch.no_grad():
        base_logps = dpo.response_logps(base, batch, average=False)
        with adapted.disable_adapter():
            disabled = dpo.response_logps(adapted, batch, average=False)
        trained = dpo.response_logps(adapted, batch, average=False)
    torch.testing.assert_close(disabled, base_logps, rtol=1e-6, atol=1e-6)
    n = len(pairs)
    # The adapter moved chosen log-probs up relative to rejected ones.
    assert torch.all((trained[:n] - base_logps[:n]) > (trained[n:] - base_logps[n:]))


def test_an_explicit_reference_model_sets_the_reference_point(tiny_lm, tmp_path):
    """With ref_model = the policy's own starting point the run is unchanged; with a different
    reference, step 1's implicit rewards are policy − reference, not 0."""
    from proxrl.models.tiny import build_tiny_lm

    other = str(build_tiny_lm(tmp_path / "other", ["abcdefghijklmnopqrstuvwxyz =.:->" * 3], seed=7))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    same = dpo.train(_config(tiny_lm, tmp_path / "a", ref_model=tiny_lm, max_steps=2))
    default = dpo.train(_config(tiny_lm, tmp_path / "b", max_steps=2))
    timing = {"perf/tokens_per_s"}
    assert same.keys() == default.keys()
    for key in same.keys() - timing:
        assert same[key] == pytest.approx(default[key], rel=1e-9, abs=1e-12), key
    (tmp_path / "c").mkdir()
    cfg = _config(tiny_lm, tmp_path / "c", ref_model=other, max_steps=1)
    dpo.train(cfg)
    first = json.loads((Path(cfg.output_dir) / "metrics.jsonl").read_text().splitlines()[0])
    assert abs(first["rewards/chosen"]) > 1e-3


@pytest.mark.parametrize("loss", ["sigmoid", "ipo", "simpo"])
def test_packed_pairs_give_the_padded_loss_and_gradient(tiny_lm, loss):
    """``packing``: chosen and rejected rows of different lengths several to a line, the same
    loss, statistics, gradient (float64) and reference log-probs as the padded batch."""
    from proxrl.rollout.packing import pack_batch

    tokenizer = load_tokenizer(tiny_lm)
    rows = preference_rows(8, seed=4)
    for i, row in enumerate(rows):  # responses 1, 4 or 7 words long, chosen and rejected apart
        row["chosen"] *= 1 + 3 * (i % 3)
        row["rejected"] *= 1 + 3 * ((i + 1) % 3)
    pairs = encode_preferences(
        [parse_preference(Row(r, str(i))) for i, r in enumerate(rows)], tokenizer, 512
    )
    pad = tokenizer.pad_token_id
    lengths = {len(p.chosen) for p in pairs} | {len(p.rejected) for p in pairs}
    assert len(lengths) > 4  # very different lengths
    model = load_causal_lm(tiny_lm, dtype="float64")
    refs = [
        dpo.reference_logps(model, pairs, 4, pad, dpo.uses_average(loss), packed)
        for packed in (False, True)
    ]
    for padded_ref, packed_ref in zip(*refs, strict=True):
        torch.testing.assert_close(packed_ref, padded_ref, rtol=1e-12, atol=1e-12)
    batch = dpo.make_batch(pairs, list(range(8)), refs[0], pad, torch.float64)
    sequences = batch.pairs.sequences
    assert pack_batch(sequences.input_ids, sequences.attention_mask).input_ids.shape[0] < 16
    perturbed = dpo.DPOBatch(batch.pairs, batch.ref_chosen - 0.3, batch.ref_rejected + 0.2)

    def loss_and_grads(packing: bool):
        model.zero_grad()
        cfg = dpo.Config(model=tiny_lm, data="unused", loss=loss, beta=0.5, packing=packing)
        value, stats = dpo.preference_loss(model, perturbed, cfg)
        value.backward()
        return value.detach(), stats, {n: p.grad.clone() for n, p in model.named_parameters()}

    padded_loss, padded_stats, padded_grads = loss_and_grads(False)
    packed_loss, packed_stats, packed_grads = loss_and_grads(True)
    torch.testing.assert_close(packed_loss, padded_loss, rtol=1e-12, atol=1e-14)
    for key, value in padded_stats.items():
        torch.testing.assert_close(packed_stats[key], value, rtol=1e-10, atol=1e-12)
    scale = max(float(g.abs().max()) for g in padded_grads.values())
    assert scale > 1e-3
    for name, grad in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=0, atol=1e-10 * scale)
