"""Reward model: learns a held-out preference task, reloads in plain transformers with the
same scores, normalises its scores, trains on K-way rankings, accumulates exactly."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from proxrl.algos.offline import reward
from proxrl.algos.offline.loop import accumulate_gradients
from proxrl.data.batching import collate_pairs
from proxrl.data.encoding import encode_preferences
from proxrl.data.formats import load_preference_examples
from proxrl.models.scalar_head import load_score_model, sequence_scores
from proxrl.models.tokenizer import load_tokenizer
from tests.algos.lm_tasks import preference_rows, write_jsonl


def _config(tiny_lm: str, tmp_path: Path, **overrides) -> reward.Config:
    fields = dict(
        model=tiny_lm,
        data=write_jsonl(tmp_path / "train.jsonl", preference_rows(192, seed=0)),
        eval_data=write_jsonl(tmp_path / "eval.jsonl", preference_rows(64, seed=1)),
        output_dir=str(tmp_path / "run"),
        batch_size=16,
        learning_rate=3e-3,
        epochs=2,
        progress=False,
    )
    return reward.Config(**(fields | overrides))


def test_reward_model_learns_and_plain_transformers_gives_the_same_scores(tiny_lm, tmp_path):
    cfg = _config(tiny_lm, tmp_path)
    metrics = reward.train(cfg)
    assert metrics["eval/accuracy"] >= 0.95
    assert metrics["eval/margin_mean"] > 1.0
    assert {
        "train/accuracy",
        "train/margin_mean",
        "train/chosen_mean",
        "train/rejected_mean",
    } <= metrics.keys()

    # Plain transformers, no proxrl code: the classifier's logits are our raw scores.
    plain = AutoModelForSequenceClassification.from_pretrained(cfg.output_dir).eval()
    ours = load_score_model(cfg.output_dir).eval()
    tokenizer = load_tokenizer(cfg.output_dir)
    pairs = encode_preferences(load_preference_examples(cfg.eval_data), tokenizer, 512)
    batch = collate_pairs(pairs, tokenizer.pad_token_id).sequences
    with torch.no_grad():
        hf_scores = plain(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[
            :, 0
        ]
        raw = sequence_scores(ours, batch.input_ids, batch.attention_mask)
        normalized = sequence_scores(ours, batch.input_ids, batch.attention_mask, normalize=True)
    torch.testing.assert_close(raw, hf_scores, rtol=1e-5, atol=1e-5)
    n = len(pairs)
    assert (hf_scores[:n] > hf_scores[n:]).float().mean().item() >= 0.95

    # Normalisation: mean/std of the training scores stored; normalised scores centred on it.
    config = json.loads((Path(cfg.output_dir) / "config.json").read_text())
    assert config["reward_offset"] == config["reward_mean"] and config["reward_std"] > 0
    torch.testing.assert_close(normalized, raw - config["reward_mean"], rtol=0, atol=1e-6)
    train_pairs = encode_preferences(load_preference_examples(cfg.data), tokenizer, 512)
    train_batch = collate_pairs(train_pairs, tokenizer.pad_token_id).sequences
    with torch.no_grad():
        train_scores = sequence_scores(
            ours, train_batch.input_ids, train_batch.attention_mask, normalize=True
        )
    assert abs(train_scores.double().mean().item()) < 1e-5
    assert train_scores.double().std().item() == pytest.approx(config["reward_std"], rel=1e-4)


def test_scores_are_read_at_the_last_real_token_under_any_padding(tiny_lm):
    model = load_score_model(tiny_lm, dtype="float64").eval()
    tokenizer = load_tokenizer(tiny_lm)
    pad = tokenizer.pad_token_id
    short, long = tokenizer("ab")["input_ids"], tokenizer("abcd efgh ijk")["input_ids"]
    with torch.no_grad():
        alone = [
            sequence_scores(model, torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long))
            for s in (short, long)
        ]
        width = len(long)
        right = torch.tensor([short + [pad] * (width - len(short)), long])
        left = torch.tensor([[pad] * (width - len(short)) + short, long])
        right_scores = sequence_scores(model, right, (right != pad).long())
        left_scores = sequence_scores(model, left, (left != pad).long())
    torch.testing.assert_close(right_scores, torch.cat(alone), rtol=1e-10, atol=1e-12)
    # Left padding shifts positions (RoPE is relative) and masks the pads: same scores.
    torch.testing.assert_close(left_scores, torch.cat(alone), rtol=1e-8, atol=1e-10)


def _ranking_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        letters = ["abcd", "mnop", "wxyz"]  # best to worst
        order = rng.sample(range(3), 3)
        responses = [
            " " + "".join(rng.choice(letters[k]) for _ in range(rng.randint(3, 6))) + "."
            for k in order
        ]
        rows.append({"prompt": "rank ->", "responses": responses, "ranking": order})
    return rows


def test_k_way_rankings_train_on_all_pairs(tiny_lm, tmp_path):
    cfg = _config(
        tiny_lm,
        tmp_path,
        data=write_jsonl(tmp_path / "rank.jsonl", _ranking_rows(128, seed=0)),
        eval_data=write_jsonl(tmp_path / "rank_eval.jsonl", _ranking_rows(32, seed=1)),
        epochs=3,
    )
    metrics = reward.train(cfg)
    assert (
        metrics["train/pairs"] == 16 * 3
    )  # C(3,2) ordered pairs per ranking, summed over the step
    assert metrics["eval/accuracy"] >= 0.9


def test_grad_accumulation_1x8_equals_8x1(tiny_lm):
    tokenizer = load_tokenizer(tiny_lm)
    rows = preference_rows(8, seed=5)
    for i, row in enumerate(rows):
        row["margin"] = 0.25 * i
    from proxrl.data.formats import parse_preference
    from proxrl.data.readers import Row

    pairs = encode_preferences(
        [parse_preference(Row(r, str(i))) for i, r in enumerate(rows)], tokenizer, 512
    )
    pad = tokenizer.pad_token_id

    def loss_fn(model, batch):
        return reward.reward_loss(model, batch, center_coef=0.1)

    def grads(micro_batches):
        model = load_score_model(tiny_lm, dtype="float64")
        torch.nn.init.normal_(
            model.score.weight, std=0.1, generator=torch.Generator().manual_seed(0)
        )
        stats = accumulate_gradients(model, micro_batches, loss_fn, reward.comparison_units)
        return stats, {n: p.grad.clone() for n, p in model.named_parameters()}

    one_stats, one = grads([collate_pairs(pairs, pad)])
    eight_stats, eight = grads([collate_pairs([p], pad) for p in pairs])
    for key in ("loss", "accuracy", "margin_mean", "chosen_mean"):
        assert one_stats[key] == pytest.approx(eight_stats[key], rel=1e-10, abs=1e-12)
    for name in one:
        torch.testing.assert_close(eight[name], one[name], rtol=1e-9, atol=1e-12)


def test_lora_reward_model_is_saved_merged_with_its_adapter_beside_it(tiny_lm, tmp_path):
    cfg = _config(tiny_lm, tmp_path, lora_r=4, epochs=1, learning_rate=1e-2)
    metrics = reward.train(cfg)
    out = Path(cfg.output_dir)
    assert (out / "model.safetensors").exists() and (
        out / "adapter" / "adapter_model.safetensors"
    ).exists()
    merged = AutoModelForSequenceClassification.from_pretrained(out).eval()
    assert not any("lora" in name for name, _ in merged.named_parameters())
    tokenizer = load_tokenizer(str(out))
    pairs = encode_preferences(load_preference_examples(cfg.eval_data), tokenizer, 512)
    batch = collate_pairs(pairs, tokenizer.pad_token_id).sequences
    with torch.no_grad():
        scores = merged(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, 0]
    n = len(pairs)
    accuracy = (scores[:n] > scores[n:]).float().mean().item()
    assert accuracy == pytest.approx(metrics["eval/accuracy"], abs=1e-9)
    assert accuracy >= 0.9


def test_an_accuracy_of_one_is_logged_as_exactly_one():
    """Unit-weighted means of ten one-unit batches: summing the fractions 1/10 gives
    0.9999999999999999 (three thirds of a different split give 1.0000000000000002); the loop
    divides the weighted sum once, so a perfect accuracy reads 1.0 (eval and train)."""
    from proxrl.algos.offline.loop import evaluate_batches

    model = torch.nn.Linear(1, 1)

    def loss_fn(m, batch):
        loss = m.weight.sum() * 0 + 0.5
        return loss, {"accuracy": torch.tensor(1.0), "pairs": torch.tensor(1.0)}

    batches = list(range(10))
    assert sum([0.1] * 10) != 1.0  # the rounding the old accumulation showed
    evaluated = evaluate_batches(model, batches, loss_fn, lambda b: 1)
    trained = accumulate_gradients(model, batches, loss_fn, lambda b: 1)
    for stats in (evaluated, trained):
        assert stats["accuracy"] == 1.0 and stats["pairs"] == 10.0
        assert stats["loss"] == 0.5
