"""SFT: learns a held-out copy task, masks the prompt, accumulates exactly, saves plain
transformers / peft artefacts, and resumes to the same weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from proxrl.algos.offline import sft
from proxrl.algos.offline.loop import accumulate_gradients
from proxrl.data.batching import collate
from proxrl.data.encoding import encode_sft
from proxrl.data.formats import load_sft_examples
from proxrl.models.causal_lm import load_causal_lm
from proxrl.models.tokenizer import load_tokenizer
from tests.algos.lm_tasks import sft_rows, write_jsonl


def _config(tiny_lm: str, tmp_path: Path, **overrides) -> sft.Config:
    data = write_jsonl(tmp_path / "train.jsonl", sft_rows(192, seed=0))
    eval_data = write_jsonl(tmp_path / "eval.jsonl", sft_rows(48, seed=1))
    fields = dict(
        model=tiny_lm,
        data=data,
        eval_data=eval_data,
        output_dir=str(tmp_path / "run"),
        batch_size=16,
        learning_rate=3e-3,
        epochs=2,
        progress=False,
    )
    return sft.Config(**(fields | overrides))


def _eval_loss(model, tokenizer, eval_path: str) -> float:
    items = encode_sft(load_sft_examples(eval_path), tokenizer, 512)
    return sft.eval_metrics(model, sft.make_batches(items, 16, tokenizer.pad_token_id))["eval/loss"]


def test_sft_lowers_heldout_loss_and_saves_a_plain_transformers_model(tiny_lm, tmp_path):
    cfg = _config(tiny_lm, tmp_path)
    tokenizer = load_tokenizer(tiny_lm)
    before = _eval_loss(load_causal_lm(tiny_lm), tokenizer, cfg.eval_data)

    metrics = sft.train(cfg)

    # Untrained: ≈ log(V) = log(311) ≈ 5.74 nats per token; the copy task is learnable.
    assert before > 5.0
    assert metrics["eval/loss"] < before - 1.5
    assert metrics["eval/perplexity"] == pytest.approx(
        torch.tensor(metrics["eval/loss"]).exp().item(), rel=1e-6
    )
    rows = [
        json.loads(line)
        for line in (Path(cfg.output_dir) / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == list(range(1, 25))  # 192 / 16 × 2 epochs, one row per step
    assert {"train/loss", "train/lr", "perf/nonpad_share", "perf/tokens_per_s"} <= rows[0].keys()
    assert all(0 < r["perf/nonpad_share"] <= 1 for r in rows)
    assert list((Path(cfg.output_dir) / "tensorboard").iterdir())
    # The saved directory is an ordinary transformers model that gives the logged eval loss.
    reloaded = AutoModelForCausalLM.from_pretrained(cfg.output_dir)
    assert _eval_loss(reloaded, tokenizer, cfg.eval_data) == pytest.approx(
        metrics["eval/loss"], rel=1e-6
    )


def test_prompt_tokens_are_left_out_of_the_loss(tiny_lm):
    """The gradient of the loss w.r.t. the logits is exactly zero at every position whose next
    token is prompt or padding, and the loss is the mean NLL of the completion tokens only."""
    tokenizer = load_tokenizer(tiny_lm)
    examples = load_sft_examples_from_rows(
        [
            {"prompt": "copy: abc =", "completion": " abc"},
            {"prompt": "copy: abcdefg =", "completion": " ab"},
        ]
    )
    items = encode_sft(examples, tokenizer, 512)
    batch = collate(items, tokenizer.pad_token_id)
    for item in items:
        prompt_ids = tokenizer("copy: abc =" if item is items[0] else "copy: abcdefg =")[
            "input_ids"
        ]
        assert item.input_ids[: item.prompt_length] == prompt_ids
        assert item.loss_mask == [0] * item.prompt_length + [1] * (len(item) - item.prompt_length)
        assert item.input_ids[-1] == tokenizer.eos_token_id

    vocab = len(tokenizer)
    logits = torch.randn(*batch.input_ids.shape, vocab, dtype=torch.float64, requires_grad=True)

    class FixedLogits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))

        def forward(self, input_ids, **kwargs):
            return type("Out", (), {"logits": logits})()

    loss, _ = sft.completion_loss(FixedLogits(), batch)
    loss.backward()
    targets = batch.loss_mask[:, 1:].bool()
    grad_norm = logits.grad[:, :-1].abs().sum(-1)
    assert torch.all(grad_norm[~targets] == 0)
    assert torch.all(grad_norm[targets] > 0)
    assert torch.all(logits.grad[:, -1] == 0)
    log_probs = torch.log_softmax(logits.detach()[:, :-1], -1)
    nll = -log_probs.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    expected = nll[targets].mean()
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-12, atol=0)


def load_sft_examples_from_rows(rows):
    from proxrl.data.formats import parse_sft
    from proxrl.data.readers import Row

    return [parse_sft(Row(r, f"rows:{i}")) for i, r in enumerate(rows)]


def test_grad_accumulation_1x8_equals_8x1(tiny_lm):
    """Same 8 examples of different lengths: one micro-batch of 8 vs 8 micro-batches of 1
    give the same loss and gradients (float64, so differences are rounding only)."""
    tokenizer = load_tokenizer(tiny_lm)
    items = encode_sft(load_sft_examples_from_rows(sft_rows(8, seed=3)), tokenizer, 512)
    assert len({len(i) for i in items}) > 1  # padding really differs between the two layouts
    pad = tokenizer.pad_token_id

    def grads(micro_batches):
        model = load_causal_lm(tiny_lm, dtype="float64")
        stats = accumulate_gradients(
            model, micro_batches, sft.completion_loss, sft.completion_tokens
        )
        return stats, {n: p.grad.clone() for n, p in model.named_parameters()}

    one_stats, one = grads([collate(items, pad)])
    eight_stats, eight = grads([collate([i], pad) for i in items])
    assert one_stats["loss"] == pytest.approx(eight_stats["loss"], rel=1e-12)
    assert one_stats["tokens"] == eight_stats["tokens"] == sum(sum(i.loss_mask) for i in items)
    for name in one:
        torch.testing.assert_close(eight[name], one[name], rtol=1e-9, atol=1e-12)


def test_lora_run_saves_the_merged_model_and_an_adapter_peft_loads(tiny_lm, tmp_path):
    cfg = _config(tiny_lm, tmp_path, lora_r=4, epochs=1, max_steps=12, learning_rate=1e-2)
    metrics = sft.train(cfg)
    out = Path(cfg.output_dir)
    assert (out / "model.safetensors").exists() and not (out / "adapter_config.json").exists()
    assert json.loads((out / "adapter" / "adapter_config.json").read_text())["r"] == 4
    base = load_causal_lm(tiny_lm)
    tokenizer = load_tokenizer(tiny_lm)
    base_loss = _eval_loss(base, tokenizer, cfg.eval_data)
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert _eval_loss(merged, tokenizer, cfg.eval_data) == pytest.approx(
        metrics["eval/loss"], rel=1e-6
    )
    adapted = PeftModel.from_pretrained(load_causal_lm(tiny_lm), str(out / "adapter"))
    loss = _eval_loss(adapted, tokenizer, cfg.eval_data)
    assert loss == pytest.approx(metrics["eval/loss"], rel=1e-6)
    assert loss < base_loss - 0.1  # the adapter changed the model
    with adapted.disable_adapter():  # the base weights did not move
        assert _eval_loss(adapted, tokenizer, cfg.eval_data) == pytest.approx(base_loss, rel=1e-9)


@pytest.mark.parametrize("lora_r", [0, 4])
def test_resumed_run_equals_uninterrupted_run(tiny_lm, tmp_path, lora_r):
    common = dict(lr_schedule="constant", epochs=2, save_every=2, lora_r=lora_r)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    straight = _config(tiny_lm, tmp_path / "a", max_steps=5, **common)
    sft.train(straight)
    first = _config(tiny_lm, tmp_path / "b", max_steps=2, **common)
    sft.train(first)
    # extending the run changes max_steps: a changed option, so --resume-with-changes
    sft.train(
        _config(
            tiny_lm, tmp_path / "b", max_steps=5, resume=True, resume_with_changes=True, **common
        )
    )
    weights = "adapter/adapter_model.safetensors" if lora_r else "model.safetensors"
    a = load_file(str(Path(straight.output_dir) / weights))
    b = load_file(str(Path(first.output_dir) / weights))
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-6, atol=1e-7)
    rows = [
        json.loads(x) for x in (Path(first.output_dir) / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]


def test_padded_equals_packed(tiny_lm):
    """The same 8 examples, right-padded in one batch or packed end to end into rows of at most
    40 tokens: equal loss and gradients (attention never crosses an example boundary)."""
    from proxrl.data.batching import collate_packed, pack_sequences

    tokenizer = load_tokenizer(tiny_lm)
    rows = sft_rows(8, seed=7) + [{"prompt": "", "completion": "abc abc"}]  # no prompt at all
    items = encode_sft(load_sft_examples_from_rows(rows), tokenizer, 512)
    packed_rows = pack_sequences(items, max_length=40)
    assert len(packed_rows) < len(items) and any(len(r.sequences) > 1 for r in packed_rows)
    pad = tokenizer.pad_token_id

    def grads(batch):
        model = load_causal_lm(tiny_lm, dtype="float64")
        stats = accumulate_gradients(model, [batch], sft.completion_loss, sft.completion_tokens)
        return stats, {n: p.grad.clone() for n, p in model.named_parameters()}

    padded_stats, padded = grads(collate(items, pad))
    packed_batch = collate_packed(packed_rows, pad)
    packed_stats, packed = grads(packed_batch)
    assert packed_stats["tokens"] == padded_stats["tokens"]
    assert packed_stats["loss"] == pytest.approx(padded_stats["loss"], rel=1e-12)
    for name in padded:
        torch.testing.assert_close(packed[name], padded[name], rtol=1e-9, atol=1e-12)


def test_packed_sft_run_learns(tiny_lm, tmp_path):
    cfg = _config(tiny_lm, tmp_path, packing=True, max_length=64, batch_size=4, epochs=3)
    metrics = sft.train(cfg)
    assert metrics["eval/loss"] < 4.2  # from ≈ 5.75 untrained
    rows = [
        json.loads(x) for x in (Path(cfg.output_dir) / "metrics.jsonl").read_text().splitlines()
    ]
    # 192 examples of ~14 tokens packed 4 to a row of <= 64: 12 steps of 4 rows per epoch.
    assert len(rows) == 3 * 12
