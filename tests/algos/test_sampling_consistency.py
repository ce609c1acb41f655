"""The same distribution on both sides: every sampler draws from, and the trainer scores, the
processed distribution (temperature 0.7, top-k 5, top-p 0.9, min-p) — checked against an
independent float64 reference over the tiny model's vocabulary."""

from __future__ import annotations

import json
import math

import pytest
import torch

from proxrl.algos.online import grpo
from proxrl.algos.online.roles import load_models, load_prompts, load_rewards, role_settings
from proxrl.rollout.forward import policy_forward, position_ids
from proxrl.rollout.generation import CachedSampler, HFSampler, SamplingSettings
from proxrl.runtime.metrics import read_metrics
from tests.algos.collected import rollout_of

TRUNCATED = SamplingSettings(24, temperature=0.7, top_k=5, top_p=0.9, min_p=0.05)


def reference(logits: list[float], token: int, s: SamplingSettings) -> tuple[float, set[int]]:
    """log π̃(token) and the kept set, in plain float64 Python: temperature, the k largest,
    the shortest most-probable prefix reaching top_p, then p_i ≥ min_p·p_max."""
    scaled = [v / s.temperature for v in logits]
    order = sorted(range(len(scaled)), key=lambda i: -scaled[i])
    kept = order[: s.top_k] if s.top_k else order
    z = sum(math.exp(scaled[i]) for i in kept)
    nucleus, mass = [], 0.0
    for i in kept:
        if mass >= s.top_p:
            break
        nucleus.append(i)
        mass += math.exp(scaled[i]) / z
    top = max(scaled[i] for i in nucleus)
    final = {i for i in nucleus if math.exp(scaled[i] - top) >= s.min_p}
    log_z = math.log(sum(math.exp(scaled[i]) for i in final | {token}))
    return scaled[token] - log_z, final


@pytest.fixture(scope="module")
def policy(tiny_lm):
    from proxrl.data.batching import pad_left
    from proxrl.models.causal_lm import load_causal_lm
    from proxrl.models.tokenizer import load_tokenizer

    tokenizer, model = load_tokenizer(tiny_lm), load_causal_lm(tiny_lm)
    ids = [tokenizer(f"say: {w} ->")["input_ids"] for w in ["abc", "de fg", "x", "hij kl mn"]] * 4
    return (
        model,
        tokenizer,
        pad_left(ids, tokenizer.pad_token_id),
        pad_left([[1] * len(r) for r in ids], 0),
    )


def hand_values(model, ids, mask, samples, settings):
    """(B, T) reference log-probs of the sampled tokens and whether each lies in its kept set,
    from one full forward pass's logits in float64."""
    input_ids = torch.cat([ids, samples.response_ids], 1)
    attention = torch.cat([mask, samples.response_mask], 1)
    with torch.no_grad():
        logits = model(
            input_ids=input_ids, attention_mask=attention, position_ids=position_ids(attention)
        ).logits[:, ids.shape[1] - 1 : -1]
    logits = logits.double().tolist()
    expected = torch.zeros(samples.response_ids.shape, dtype=torch.float64)
    inside = torch.ones(samples.response_ids.shape, dtype=torch.bool)
    for b, row in enumerate(samples.response_ids.tolist()):
        for i, token in enumerate(row):
            if samples.response_mask[b, i]:
                expected[b, i], kept = reference(logits[b][i], token, settings)
                inside[b, i] = token in kept
    return expected, inside


@pytest.mark.parametrize("sampler", ["cached", "compiled", "hf"])
def test_sampler_and_trainer_logprobs_equal_hand_values(sampler, policy):
    """Each sampler's own log-probs and the trainer's (policy_forward) of every sampled token
    equal the truncated-and-renormalised float64 values; every drawn token lies in the kept set
    (for ``generate``, that its processors cut the same set in the same order)."""
    model, tokenizer, ids, mask = policy
    torch.manual_seed(0)
    chosen = (
        HFSampler(model, tokenizer)
        if sampler == "hf"
        else CachedSampler(model, tokenizer, compile_step=sampler == "compiled")
    )
    s = chosen.sample(ids, mask, TRUNCATED, with_logprobs=True)
    expected, inside = hand_values(model, ids, mask, s, TRUNCATED)
    valid = s.response_mask.bool()
    assert valid.sum() > 100 and bool(inside.all())
    torch.testing.assert_close(s.logprobs[valid].double(), expected[valid], rtol=0, atol=1e-5)
    with torch.no_grad():
        trainer = policy_forward(
            model,
            torch.cat([ids, s.response_ids], 1),
            torch.cat([mask, s.response_mask], 1),
            ids.shape[1],
            0.7,
            with_entropy=True,
            **TRUNCATED.truncation,
        )
    torch.testing.assert_close(trainer.logprobs[valid].double(), expected[valid], rtol=0, atol=1e-5)
    # the equivalence of the untruncated case, extended: sampler = trainer to float rounding
    torch.testing.assert_close(s.logprobs[valid], trainer.logprobs[valid], rtol=0, atol=1e-5)
    torch.testing.assert_close(s.entropy[valid], trainer.entropy[valid], rtol=0, atol=1e-5)
    # truncation matters here: the untruncated log-probs are far from these
    untruncated = policy_forward(
        model,
        torch.cat([ids, s.response_ids], 1),
        torch.cat([mask, s.response_mask], 1),
        ids.shape[1],
        0.7,
    ).logprobs.detach()
    assert (untruncated[valid].double() - expected[valid]).abs().max() > 1e-2


def test_generate_processes_logits_as_core_does(policy):
    """transformers' processed scores (after its warpers) and core.truncate_logits of its raw
    logits keep the same tokens with the same values, step by step."""
    from proxrl.core import truncate_logits

    model, tokenizer, ids, mask = policy
    torch.manual_seed(1)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=12,
        do_sample=True,
        temperature=0.7,
        top_k=5,
        top_p=0.9,
        min_p=0.05,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        return_dict_in_generate=True,
        output_logits=True,
        output_scores=True,
    )
    for raw, processed in zip(out.logits, out.scores, strict=True):
        ours = truncate_logits(raw.float() / 0.7, 5, 0.9, 0.05)
        assert torch.equal(torch.isfinite(ours), torch.isfinite(processed))
        kept = torch.isfinite(ours)
        torch.testing.assert_close(ours[kept], processed[kept].float(), rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    words = ["abc", "def", "ghi", "jkl", "mno", "pqr", "stu", "vwx"]
    path.write_text(
        "".join(json.dumps({"prompt": f"say: {w} ->", "word": w}) + "\n" for w in words)
    )
    return str(path)


def grpo_config(tiny_lm, prompts, out, **overrides):
    fields = dict(
        model=tiny_lm,
        prompts=prompts,
        reward_fn=("tests.algos.online_rewards:target_fraction",),
        output_dir=str(out),
        iterations=2,
        rollout_batch_size=4,
        group_size=2,
        max_new_tokens=12,
        temperature=0.7,
        top_k=5,
        top_p=0.9,
        min_p=0.05,
        mini_batch_size=8,
        learning_rate=3e-3,
        progress=False,
        seed=3,
        # π_old, π_ref and the update's π equal to the bit, as the repeated forward gives them;
        # a shared prefix gives them to float rounding (the reference's weights take no
        # gradient, which changes torch's CPU kernels), checked in test_shared_prefix
        shared_prefix=False,
    )
    return grpo.Config(**(fields | overrides))


def test_rollout_pi_old_and_reference_score_the_truncated_distribution(tiny_lm, prompts, tmp_path):
    """The rollout's π_old (trainer forward, not the sampler's) and π_ref of every sampled token
    are the truncated-and-renormalised hand values; the reference goes through the same function,
    so before any update its KL to the policy is exactly 0. The π_old pass is kept on: with it
    skipped the update scores π_old itself (covered by the next test's first-iteration KL)."""
    cfg = grpo_config(tiny_lm, prompts, tmp_path, kl_coef=0.05, skip_old_logprobs_pass=False)
    algo = grpo.build(cfg)
    models = load_models(role_settings(cfg).models, algo)
    examples, ids = load_prompts(role_settings(cfg).prompts, models.tokenizer)
    torch.manual_seed(0)
    experience, _, metrics = rollout_of(
        cfg, algo, models, load_rewards(role_settings(cfg).rewards), examples[:4], ids[:4], 0.05, {}
    )
    settings = SamplingSettings(12, 0.7, 5, 0.9, min_p=0.05)
    expected, inside = hand_values(
        models.actor, experience.prompt_ids, experience.prompt_mask, experience, settings
    )
    valid = experience.response_mask.bool()
    assert bool(inside.all())
    torch.testing.assert_close(
        experience.logprobs[valid].double(), expected[valid], rtol=0, atol=1e-5
    )
    assert torch.equal(experience.ref_logprobs, experience.logprobs)
    assert metrics["objective/kl"] == 0.0


def test_first_iteration_kl_is_exactly_zero_with_truncation(tiny_lm, prompts, tmp_path):
    grpo.train(grpo_config(tiny_lm, prompts, tmp_path, kl_coef=0.05))
    rows = read_metrics(tmp_path)
    assert rows[0]["objective/kl"] == 0.0 and rows[1]["objective/kl"] != 0.0


@pytest.mark.parametrize(
    ("top_k", "top_p", "min_p"), [(5, 0.9, 0.05), (0, 0.8, 0.3), (20, 0.7, 0.2)]
)
def test_generate_processors_cut_the_same_set_in_the_same_order(policy, top_k, top_p, min_p):
    """The processors ``generate`` builds for these settings (transformers' own list, through
    its private ``_get_logits_processor``) and core.truncate_logits keep the same tokens over
    4,096 random rows, settings where applying min-p before top-p (vLLM's order) would differ."""
    from transformers import GenerationConfig

    from proxrl.core import truncate_logits

    model = policy[0]
    config = GenerationConfig(
        do_sample=True, temperature=0.7, top_k=top_k or None, top_p=top_p, min_p=min_p
    )
    processors = model._get_logits_processor(generation_config=config, input_ids_seq_length=1)
    logits = torch.randn(4096, 50, generator=torch.Generator().manual_seed(0))
    theirs = processors(torch.zeros(4096, 1, dtype=torch.long), logits.clone())
    ours = truncate_logits(logits / 0.7, top_k, top_p, min_p)
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))
    kept = torch.isfinite(ours)
    torch.testing.assert_close(ours[kept], theirs[kept], rtol=1e-6, atol=1e-6)
    swapped = truncate_logits(truncate_logits(logits / 0.7, top_k, 1.0, min_p), 0, top_p, 0.0)
    assert not torch.equal(torch.isfinite(swapped), torch.isfinite(ours))
