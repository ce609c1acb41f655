"""The vLLM sampler against the trainer's numbers: its log-probs are those of the distribution it
sampled from (temperature, top-k, top-p, renormalised), and after an update the engine holds the
policy's new weights (full and LoRA)."""

from __future__ import annotations

import copy
import logging
import weakref

import pytest
import torch

from proxrl.core import processed_entropy
from proxrl.models.lora import apply_lora
from proxrl.models.tokenizer import load_tokenizer
from proxrl.rollout import vllm_sampler
from proxrl.rollout.forward import policy_forward
from proxrl.rollout.generation import CachedSampler, SamplingSettings
from proxrl.rollout.vllm_sampler import (
    RELOAD_LOGGER,
    EngineOptions,
    VLLMSampler,
    sleep_supported,
    start_engine,
    sync_weights,
)
from proxrl.runtime.errors import ProxrlError

PROMPTS = ["say: abc ->", "copy: de =", "say: x ->", "abc"]


@pytest.fixture(scope="module")
def setup(tiny_lm, engines):
    from transformers import AutoModelForCausalLM

    engine = engines.get(EngineOptions(tiny_lm, gpu_memory_utilization=0.02)).llm
    tokenizer = load_tokenizer(tiny_lm)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm, dtype=torch.float32)
    sync_weights(engine, model)  # the module's other tests may have changed the engine's
    return engine, tokenizer, model


def _prompts(tokenizer):
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    width = max(map(len, ids))
    prompt_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in ids])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids])
    return prompt_ids, mask


def _logits(model, prompt_ids, mask, response_ids, response_mask):
    from proxrl.rollout.forward import position_ids

    input_ids = torch.cat([prompt_ids, response_ids], 1)
    attention = torch.cat([mask, response_mask], 1)
    with torch.no_grad():
        logits = model(
            input_ids=input_ids, attention_mask=attention, position_ids=position_ids(attention)
        ).logits
    return logits[:, prompt_ids.shape[1] - 1 : -1].double()


def _truncated_logprob(logits, token, temperature, top_k, top_p):
    """log p of ``token`` under softmax(logits / T) cut to the top-k, then to the smallest
    nucleus of mass ≥ top_p (the token that crosses it kept), renormalised: float64, by hand."""
    scaled = logits / temperature
    order = torch.argsort(scaled, descending=True)
    kept = order[:top_k].tolist()
    probs = torch.softmax(scaled[kept], -1)
    nucleus, mass = [], 0.0
    for index, p in zip(kept, probs.tolist(), strict=True):
        nucleus.append(index)
        mass += p
        if mass >= top_p:
            break
    assert token in nucleus, "a token outside the truncated set was sampled"
    return float(torch.log_softmax(scaled[nucleus], -1)[nucleus.index(token)])


def test_logprobs_are_of_the_truncated_renormalised_distribution(setup):
    engine, tokenizer, model = setup
    prompt_ids, mask = _prompts(tokenizer)
    settings = SamplingSettings(max_new_tokens=12, temperature=0.7, top_k=5, top_p=0.9)
    torch.manual_seed(0)
    samples = VLLMSampler(engine, tokenizer).sample(prompt_ids, mask, settings, with_logprobs=True)
    logits = _logits(model, prompt_ids, mask, samples.response_ids, samples.response_mask)
    checked = 0
    for b in range(len(PROMPTS)):
        for t in range(samples.response_ids.shape[1]):
            if not samples.response_mask[b, t]:
                assert samples.logprobs[b, t] == 0
                continue
            token = int(samples.response_ids[b, t])
            expected = _truncated_logprob(logits[b, t], token, 0.7, 5, 0.9)
            assert abs(float(samples.logprobs[b, t]) - expected) < 1e-4, (b, t)
            checked += 1
    assert checked >= 20
    # the truncation is visible: untruncated log-probs are lower for some token
    untruncated = torch.log_softmax(logits / 0.7, -1).gather(-1, samples.response_ids[..., None])
    gap = (samples.logprobs.double() - untruncated.squeeze(-1)) * samples.response_mask
    assert gap.max() > 1e-2


def test_entropy_estimate_centres_on_the_processed_entropy(setup):
    """``Samples.entropy`` is −log π̃ of the sampled token; over 256 responses its mean sits
    within 4 standard errors of the mean exact entropy of the processed (T 0.7, top-k 5, top-p
    0.9) distribution at the same positions, and the untruncated distribution's entropy is
    many standard errors away (so the check tells the two apart)."""
    engine, tokenizer, model = setup
    prompt_ids, mask = _prompts(tokenizer)
    prompt_ids, mask = prompt_ids.repeat(64, 1), mask.repeat(64, 1)
    settings = SamplingSettings(max_new_tokens=12, temperature=0.7, top_k=5, top_p=0.9)
    torch.manual_seed(3)
    samples = VLLMSampler(engine, tokenizer).sample(prompt_ids, mask, settings, with_logprobs=True)
    valid = samples.response_mask.bool()
    logits = _logits(model, prompt_ids, mask, samples.response_ids, samples.response_mask)
    exact = processed_entropy(logits, 0.7, top_k=5, top_p=0.9)[valid]
    untruncated = processed_entropy(logits, 0.7)[valid]
    error = samples.entropy.double()[valid] - exact
    standard_error = float(error.std()) / error.numel() ** 0.5
    print(
        f"entropy estimate − exact: {float(error.mean()):+.4f} (standard error "
        f"{standard_error:.4f}, {error.numel()} tokens); untruncated − exact "
        f"{float((untruncated - exact).mean()):.3f}"
    )
    assert error.numel() > 2000
    assert abs(float(error.mean())) < 4 * standard_error
    assert float((untruncated - exact).mean()) > 10 * standard_error
    assert torch.equal(samples.entropy, -samples.logprobs)  # 0 at padding, as the log-probs


def _perturbed(model, scale=0.05, seed=1):
    moved = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * scale)
    return moved


def _engine_vs_trainer(engine, tokenizer, model):
    prompt_ids, mask = _prompts(tokenizer)
    settings = SamplingSettings(max_new_tokens=10, temperature=0.7)
    torch.manual_seed(1)
    samples = VLLMSampler(engine, tokenizer).sample(prompt_ids, mask, settings, with_logprobs=True)
    with torch.no_grad():
        trainer = policy_forward(
            model,
            torch.cat([prompt_ids, samples.response_ids], 1),
            torch.cat([mask, samples.response_mask], 1),
            prompt_ids.shape[1],
            0.7,
        ).logprobs
    return ((samples.logprobs - trainer) * samples.response_mask).abs().max().item()


def test_after_an_update_the_engine_scores_as_the_trainer(setup):
    engine, tokenizer, model = setup
    assert _engine_vs_trainer(engine, tokenizer, model) < 1e-4
    updated = _perturbed(model)
    assert _engine_vs_trainer(engine, tokenizer, updated) > 1e-2  # stale weights: detectable
    seconds = sync_weights(engine, updated)
    assert seconds > 0
    assert _engine_vs_trainer(engine, tokenizer, updated) < 1e-4
    sync_weights(engine, model)


def test_a_lora_policy_reaches_the_engine_merged(setup):
    engine, tokenizer, model = setup
    policy = _lora_policy(model)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    assert _engine_vs_trainer(engine, tokenizer, policy) > 1e-2
    sync_weights(engine, policy)
    assert _engine_vs_trainer(engine, tokenizer, policy) < 1e-4
    after = policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # never merged in place
    sync_weights(engine, model)


def _lora_policy(model):
    policy = apply_lora(copy.deepcopy(model), r=4)
    with torch.no_grad():  # B starts at 0: move it so that the adapter changes the model
        generator = torch.Generator().manual_seed(2)
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=generator) * 0.2)
    return policy


def test_a_lora_sync_merges_and_sends_one_layer_at_a_time(setup, monkeypatch):
    """Under LoRA the merged weights are made as vLLM reads them: the merged tensors alive at
    once never exceed one decoder layer's (a list of them all is every layer's at once), and
    the synced engine scores as the merged policy."""
    engine, tokenizer, model = setup
    policy = _lora_policy(model)
    own = {t.untyped_storage().data_ptr() for t in policy.state_dict().values()}
    merge = vllm_sampler.merged_weights
    live: dict[int, tuple[weakref.ref, int]] = {}  # id → (the merged tensor, its bytes)
    per_layer: dict[str, int] = {}  # "model.layers.0" → bytes merged there
    peak = [0]

    def tracked(module, deltas=True):
        for name, tensor in merge(module, deltas):
            if tensor.untyped_storage().data_ptr() not in own:  # made by the merge
                key, size = id(tensor), tensor.nbytes
                live[key] = (weakref.ref(tensor, lambda _, k=key: live.pop(k, None)), size)
                layer = name.split(".self_attn")[0].split(".mlp")[0]
                per_layer[layer] = per_layer.get(layer, 0) + size
                peak[0] = max(peak[0], sum(n for _, n in live.values()))
            yield name, tensor

    monkeypatch.setattr(vllm_sampler, "merged_weights", tracked)
    sync_weights(engine, policy)
    monkeypatch.undo()
    assert len(per_layer) >= 2, per_layer  # the adapter is on several layers
    assert 0 < peak[0] <= max(per_layer.values()), (peak, per_layer)
    assert _engine_vs_trainer(engine, tokenizer, policy) < 1e-4
    sync_weights(engine, model)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_sync_does_not_warn_about_the_rotary_embedding(setup):
    """vLLM's "RotaryEmbedding: Failed to load weights" (its cos/sin cache is in no checkpoint
    and is kept as it was: test_after_an_update_the_engine_scores_as_the_trainer) is not logged
    at every sync; vLLM's reload logger still passes every other record."""
    engine, tokenizer, model = setup
    records = _Records()
    logger = logging.getLogger(RELOAD_LOGGER)
    logger.addHandler(records)
    try:
        sync_weights(engine, _perturbed(model))
        sync_weights(engine, model)
        logger.warning("%s: Failed to load weights", "LlamaMLP")
    finally:
        logger.removeHandler(records)
    assert records.messages == ["LlamaMLP: Failed to load weights"], records.messages


def test_request_seeds_follow_torch_seed(setup):
    engine, tokenizer, _ = setup
    prompt_ids, mask = _prompts(tokenizer)
    settings = SamplingSettings(max_new_tokens=10, temperature=1.0)
    sampler = VLLMSampler(engine, tokenizer)
    runs = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        runs.append(sampler.sample(prompt_ids, mask, settings).response_ids)
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


def test_greedy_matches_the_cached_sampler(setup):
    engine, tokenizer, model = setup
    prompt_ids, mask = _prompts(tokenizer)
    settings = SamplingSettings(max_new_tokens=10, greedy=True)
    ours = VLLMSampler(engine, tokenizer).sample(prompt_ids, mask, settings)
    cached = CachedSampler(model, tokenizer).sample(prompt_ids, mask, settings)
    width = cached.response_ids.shape[1]
    assert torch.equal(ours.response_mask[:, :width], cached.response_mask)
    assert torch.equal(ours.response_ids[:, :width], cached.response_ids)


def test_sleep_is_skipped_on_the_cpu(setup, engines, tiny_lm):
    engine, tokenizer, model = setup
    assert not sleep_supported()
    held = engines.get(EngineOptions(tiny_lm, gpu_memory_utilization=0.02))
    held.sleep()  # a no-op here: the engine stays awake and still samples
    assert held.llm is engine and not held.asleep
    prompt_ids, mask = _prompts(tokenizer)
    samples = VLLMSampler(engine, tokenizer).sample(prompt_ids, mask, SamplingSettings(4))
    assert samples.response_mask.sum() > 0


def test_unsupported_head_dim_and_length_are_one_line_errors(tmp_path, tiny_lm):
    from proxrl.models.tiny import build_tiny_lm

    narrow = build_tiny_lm(tmp_path / "narrow", ["abc def"] * 4, hidden_size=64, num_heads=4)
    with pytest.raises(ProxrlError, match=r"does not support head_dim 16 .* supports 32, 64"):
        start_engine(EngineOptions(str(narrow)))
    with pytest.raises(
        ProxrlError,
        match=r"vllm_max_model_length: 999 is beyond the model's max_position_embeddings 256",
    ):
        start_engine(EngineOptions(tiny_lm, max_model_length=999))


def test_a_policy_with_another_vocabulary_is_a_one_line_error(setup):
    engine, _, model = setup
    bigger = copy.deepcopy(model)
    bigger.resize_token_embeddings(model.config.vocab_size + 1)
    with pytest.raises(ProxrlError, match=r"policy's vocabulary \(\d+\) differs"):
        sync_weights(engine, bigger)
