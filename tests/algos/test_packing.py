"""Padding-free packed micro-batches (``max_tokens_per_micro_batch``, ``rollout.packing``).

1. The planning: best-fit-decreasing bins by hand, micro-batches by token budget, the packed
   layout of a small batch (ids, positions restarting per row, where each token went).
2. The packed forwards (policy log-probs, entropy, hidden state; a separate critic's values; a
   reward model's scores) equal the padded ones at every real token, float64, on rows of very
   different lengths packed several to a line.
3. The update with packed micro-batches gives the padded update's weight change (SGD, learning
   rate 1: minus the gradient) and losses to round-off, for ppo (policy + separate critic,
   policy + value head) and grpo (several losses and aggregations, and without log π_old).
4. A whole rollout (reference, π_old, separate critic, reward model) gives the same Experience.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

from proxrl.algos.online import grpo, ppo, samplers
from proxrl.algos.online.advantages import estimate
from proxrl.algos.online.micro_batches import PassLayout, packs, token_budget
from proxrl.algos.online.roles import load_models, load_prompts, load_rewards, role_settings
from proxrl.algos.online.run_settings import run_settings
from proxrl.algos.online.update import UpdateStep, update
from proxrl.data.batching import pack_lengths
from proxrl.models.scalar_head import sequence_scores
from proxrl.rollout.experience import Experience
from proxrl.rollout.forward import critic_forward, packed_sequence_scores, policy_forward
from proxrl.rollout.packing import micro_batch_plan, pack_batch
from proxrl.runtime import distributed as dist
from proxrl.runtime.config import narrowed
from proxrl.runtime.guard import NonFiniteGuard
from tests.algos.collected import rollout_of
from tests.algos.test_old_logprobs import _config as old_logprobs_config

# Rows of very different lengths: left-padded prompts, right-padded responses.
PROMPT_LENGTHS = [3, 1, 5, 2, 5, 4, 1, 3]
RESPONSE_LENGTHS = [1, 12, 2, 9, 1, 3, 12, 5]
REL_TOL = 1e-10


def test_pack_lengths_by_hand():
    """Capacity 10, lengths [5, 3, 8, 2, 4, 6], placed longest first into the fullest bin that
    still has room: 8 → A (room 2); 6 → B (room 4); 5 → C (room 5); 4 → B (room 0); 3 → C
    (room 2); 2 → A, the first of the rooms of 2 (room 0). A = {2, 3}, B = {4, 5}, C = {0, 1}:
    10, 10 and 8 tokens. A 12 alone exceeds the capacity and gets a bin of its own."""
    assert pack_lengths([5, 3, 8, 2, 4, 6], 10) == [[2, 3], [4, 5], [0, 1]]
    assert pack_lengths([12, 3], 10) == [[0], [1]]


def test_micro_batch_plan_by_rows_and_by_tokens():
    mask = torch.zeros(5, 8, dtype=torch.long)
    for row, n in enumerate([2, 7, 3, 4, 1]):
        mask[row, :n] = 1
    by_rows = micro_batch_plan(mask, 2, 0)
    assert [b.tolist() for b in by_rows] == [[0, 1], [2, 3], [4]]
    # Budget 8: 7 → A (room 1); 4 → B (room 4); 3 → B (room 1); 2 → C (room 6); 1 → A.
    by_tokens = micro_batch_plan(mask, 2, 8)
    assert [b.tolist() for b in by_tokens] == [[1, 4], [2, 3], [0]]

    # No budget given: micro_batch_size × the longest row, 2 × 7 = 14: 7 → A (room 7); 4 → A
    # (room 3); 3 → A (room 0); 2 → B (room 12); 1 → B.
    by_lengths = micro_batch_plan(mask, 2, None)
    assert [b.tolist() for b in by_lengths] == [[1, 2, 3], [0, 4]]


def test_pack_batch_layout_by_hand():
    """Rows of 2 (left-padded), 3 and 1 real tokens: capacity 3 (the longest row) packs the
    rows of 2 and 1 into one line, the row of 3 into another; the filler after a line's end
    restarts its positions at 0."""
    ids = torch.tensor([[0, 11, 12], [21, 22, 23], [31, 0, 0]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [1, 0, 0]])
    packed = pack_batch(ids, mask)
    assert packed.input_ids.tolist() == [[21, 22, 23], [11, 12, 31]]
    assert packed.position_ids.tolist() == [[0, 1, 2], [0, 1, 0]]
    assert packed.lines.tolist() == [1, 1, 0, 0, 0, 1]
    assert packed.slots.tolist() == [0, 1, 0, 1, 2, 2]
    # Response from column 1: the tokens after a real token of their row, and who predicts them.
    rows, columns, lines, slots = packed.predictions(1)
    assert rows.tolist() == [0, 1, 1] and columns.tolist() == [1, 0, 1]
    assert lines.tolist() == [1, 0, 0] and slots.tolist() == [0, 0, 1]
    assert [x.tolist() for x in packed.last_tokens(3)] == [[1, 0, 1], [1, 2, 2]]


def _batch(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    g = torch.Generator().manual_seed(seed)
    P, T = max(PROMPT_LENGTHS), max(RESPONSE_LENGTHS)
    prompt = (torch.arange(P)[None] >= P - torch.tensor(PROMPT_LENGTHS)[:, None]).long()
    response = (torch.arange(T)[None] < torch.tensor(RESPONSE_LENGTHS)[:, None]).long()
    mask = torch.cat([prompt, response], 1)
    return torch.randint(3, vocab, mask.shape, generator=g) * mask, mask, P


def _tiny_llama(cls, **extra):
    config = LlamaConfig(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        pad_token_id=0,
        **extra,
    )
    torch.manual_seed(0)
    return cls(config).double().eval()


def test_packed_forwards_equal_the_padded_ones():
    model = _tiny_llama(LlamaForCausalLM)
    ids, mask, P = _batch(40)
    lines = pack_batch(ids, mask).input_ids.shape[0]
    assert lines < len(PROMPT_LENGTHS)  # several rows share a line: the mask must separate them
    real = mask[:, P:].double()
    for truncation in ({}, {"top_k": 5, "top_p": 0.9}):
        padded, packed = (
            policy_forward(
                model, ids, mask, P, 0.7, True, True, **truncation, packed=packed
            )  # fmt: skip
            for packed in (False, True)
        )
        for name in ("logprobs", "entropy"):
            a, b = getattr(padded, name) * real, getattr(packed, name) * real
            assert torch.allclose(a, b, rtol=1e-12, atol=1e-12), name
        assert torch.allclose(padded.hidden * real[..., None], packed.hidden, atol=1e-12)
        assert float(packed.logprobs.detach().abs().sum()) > 1.0
    critic = _tiny_llama(LlamaForSequenceClassification, num_labels=1)
    values = [critic_forward(critic, ids, mask, P, packed=p) * real for p in (False, True)]
    assert float(values[0].detach().abs().sum()) > 1e-3
    assert torch.allclose(values[0], values[1], rtol=1e-12, atol=1e-14)
    # A reward model reads right-padded rows at their last real token.
    lengths = mask.sum(1)
    right = (torch.arange(mask.shape[1])[None] < lengths[:, None]).long()
    right_ids = ids[mask.bool()].split(lengths.tolist())
    right_ids = torch.stack(
        [torch.nn.functional.pad(r, (0, mask.shape[1] - len(r))) for r in right_ids]
    )
    scores = [f(critic, right_ids, right) for f in (sequence_scores, packed_sequence_scores)]
    assert torch.allclose(scores[0], scores[1], rtol=1e-12, atol=1e-14)
    assert len(set(scores[0].tolist())) == len(lengths)


def test_a_reward_model_packs_its_rows_by_default_and_scores_them_as_padded(
    reward_model, monkeypatch
):
    """``RewardModelReward``'s unset budget packs each call's rows (64 × the longest row's real
    tokens a forward), 0 pads them in batches; float64, the same scores to 1e-12."""
    from proxrl.data.formats import PromptExample
    from proxrl.models.scalar_head import load_score_model
    from proxrl.models.tokenizer import load_tokenizer
    from proxrl.rollout import rewards

    model = load_score_model(reward_model).double().eval()
    tokenizer = load_tokenizer(reward_model)
    prompts = [PromptExample(f"say: {w} ->", None, f"row {i}") for i, w in enumerate(WORDS[:5])]
    completions = ["a", "abc def ghi jkl", "", "mno pqr", "stu vwx abc def ghi jkl mno"]
    packed_calls = []
    real = rewards.packed_sequence_scores

    def counted(*args, **kwargs):
        packed_calls.append(args[1].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(rewards, "packed_sequence_scores", counted)
    by_default = rewards.RewardModelReward(model, tokenizer)(prompts, completions, {})
    assert [shape[0] for shape in packed_calls] == [5]  # one packed forward, all five rows
    padded = rewards.RewardModelReward(model, tokenizer, max_tokens=0)(prompts, completions, {})
    assert len(packed_calls) == 1  # 0: the padded batches
    assert torch.allclose(by_default.double(), padded.double(), rtol=1e-12, atol=1e-12)
    assert len(set(padded.tolist())) == 5


# ---------------------------------------------------------------- the update

WORDS = ["abc", "def", "ghi", "jkl", "mno", "pqr", "stu", "vwx"]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in WORDS))
    return str(path)


def _config(module, tiny_lm: str, prompts: str, out: Path, **overrides):
    """test_old_logprobs' tiny ppo/grpo config, with room for responses of up to 12 tokens,
    padded micro-batches unless ``overrides`` say otherwise."""
    fields = {"max_new_tokens": 12, "max_tokens_per_micro_batch": 0}
    return old_logprobs_config(module, tiny_lm, prompts, out, **(fields | overrides))


def _experience(actor, token_advantages: bool, observations: bool = False) -> Experience:
    """The rows of ``_batch``, log π_old the policy's own (float64) plus noise, π_ref apart.
    ``observations``: response tokens 2–3 of the longer rows are an observation (in the attention,
    out of every loss), as a multi-turn episode's are."""
    ids, mask, P = _batch(actor.config.vocab_size, seed=1)
    g = torch.Generator().manual_seed(2)
    B, T = mask.shape[0], mask.shape[1] - P
    with torch.no_grad():
        lp = policy_forward(actor, ids, mask, P, 1.0).logprobs
    action_mask = mask[:, P:].clone()
    if observations:  # in the rows of 5 tokens or more: an episode ends on a model token
        action_mask[action_mask.sum(-1) >= 5, 2:4] = 0
    fmask = action_mask.double()

    def noise() -> torch.Tensor:
        return torch.randn(B, T, generator=g, dtype=torch.float64)

    advantages = (
        noise() if token_advantages else torch.randn(B, 1, generator=g, dtype=torch.float64)
    ) * fmask
    values = noise() * fmask
    return Experience(
        prompt_ids=ids[:, :P],
        prompt_mask=mask[:, :P],
        response_ids=ids[:, P:],
        response_mask=mask[:, P:],
        logprobs=(lp + 0.05 * noise()) * fmask,
        ref_logprobs=(lp + 0.5 * noise()) * fmask,
        values=values,
        scores=torch.randn(B, generator=g, dtype=torch.float64),
        rewards=torch.zeros(B, T, dtype=torch.float64),
        advantages=advantages,
        returns=(advantages + values) * fmask,
        action_mask=action_mask if observations else None,
    )


def _step(module, cfg, without_old: bool = False, observations: bool = False):
    """(weights after one SGD step of learning rate 1 − before, flattened; the stats)."""
    algo = module.build(cfg)
    torch.manual_seed(cfg.seed)
    models = load_models(role_settings(cfg).models, algo)
    params = [p for p in models.actor.parameters() if p.requires_grad]
    params += list(models.critic.parameters())
    before = [p.detach().clone() for p in params]
    experience = _experience(
        models.actor, token_advantages=module is ppo, observations=observations
    )
    if without_old:
        experience = replace(experience, logprobs=None)
    stats = update(
        run_settings(cfg, algo, models.critic).updating,
        algo,
        models,
        experience,
        [torch.optim.SGD(params, lr=1.0)],
        UpdateStep(cfg.kl_coef, True, 1),
        torch.Generator().manual_seed(1),
        NonFiniteGuard(),
    )
    assert stats["steps"] == 1.0
    delta = torch.cat([(p.detach() - b).flatten() for p, b in zip(params, before, strict=True)])
    return delta, stats


CASES = [
    (ppo, {"critic": "separate"}, False),
    (ppo, {"critic": "head", "entropy_coef": 0.01}, False),
    (grpo, {"entropy_coef": 0.01}, False),
    (grpo, {"loss_aggregation": "seq-mean-token-mean", "policy_loss": "gspo", "clip": 0.05}, False),
    (grpo, {"loss_aggregation": "dr_grpo", "policy_loss": "cispo"}, False),
    (grpo, {}, True),  # no log π_old: the update's packed forward gives it
]
BUDGET = 36  # real tokens per micro-batch: rows of 4 to 13 tokens, 2 micro-batches


def _shares_a_line(mask: torch.Tensor, budget: int | None, rows: int) -> bool:
    """Some packed micro-batch of ``mask`` (B, L) lays two rows in one line (so the per-row
    attention blocks matter)."""
    plan = micro_batch_plan(mask, rows, budget)
    return any(pack_batch(mask[b], mask[b]).input_ids.shape[0] < len(b) for b in plan)


@pytest.mark.parametrize(("module", "overrides", "without_old"), CASES)
def test_packed_update_equals_the_padded_one(
    module, overrides, without_old, tiny_lm, prompts, tmp_path
):
    padded_cfg = _config(module, tiny_lm, prompts, tmp_path, **overrides)
    packed_cfg = replace(padded_cfg, max_tokens_per_micro_batch=BUDGET)
    mask = _batch(40)[1]
    assert _shares_a_line(mask, BUDGET, 8) and len(micro_batch_plan(mask, 8, BUDGET)) == 2
    padded, padded_stats = _step(module, padded_cfg, without_old)
    packed, packed_stats = _step(module, packed_cfg, without_old)
    scale = float(padded.abs().max())
    diff = float((packed - padded).abs().max())
    print(f"{module.__name__} {overrides}: max |Δ| {diff:.2e} of {scale:.2e}")
    assert scale > 1e-4  # the step moved the weights
    # A value head computes in float32 (``models.value_head``), so its gradient sums carry
    # float32 rounding, which the two splits into micro-batches round differently.
    assert diff <= (1e-6 if overrides.get("critic") == "head" else REL_TOL) * scale
    for key in ("loss", "policy_loss", "value_loss", "entropy", "objective/kl"):
        if key in padded_stats:
            assert packed_stats[key] == pytest.approx(padded_stats[key], rel=1e-10, abs=1e-13)


def _layout(cfg):  # type: ignore[no-untyped-def]
    """The run's ``PassLayout``, as ``run_settings`` builds it when the run opens."""
    return narrowed(PassLayout, cfg, prefix_off=cfg.prefix_off())


def test_packed_by_default_where_no_prompt_is_shared(tiny_lm, prompts, tmp_path, monkeypatch):
    """max_tokens_per_micro_batch left unset: packed by the batch's own lengths, except where
    the shared prefix runs (a group's prompt once), a distill loss reads padded logits, or FSDP
    needs as many forwards on every rank; a value the user gives is kept (0: padded)."""

    def cfg(module, **options):  # type: ignore[no-untyped-def]
        return _layout(old_logprobs_config(module, tiny_lm, prompts, tmp_path, **options))

    assert token_budget(cfg(ppo, group_size=1)) is None
    assert token_budget(cfg(grpo, shared_prefix=False)) is None
    assert token_budget(cfg(grpo, gradient_checkpointing=True)) is None
    assert token_budget(cfg(grpo)) == 0  # the shared prefix saves the prompts
    gjsd = {"teacher_model": tiny_lm, "distill_loss": "gjsd"}
    assert token_budget(cfg(grpo, shared_prefix=False, **gjsd)) == 0
    assert token_budget(cfg(ppo, group_size=1, max_tokens_per_micro_batch=0)) == 0
    assert token_budget(cfg(ppo, group_size=1, max_tokens_per_micro_batch=50)) == 50
    monkeypatch.setattr(dist, "is_sharded", lambda: True)
    assert token_budget(cfg(ppo, group_size=1)) == 0


def test_packed_by_default_update_equals_the_padded_one(tiny_lm, prompts, tmp_path):
    """PPO with a separate critic, one response per prompt, the option left unset: the rows of
    4 to 17 tokens go packed (several to a line) and the step is the padded one's."""
    default_cfg = old_logprobs_config(
        ppo, tiny_lm, prompts, tmp_path, max_new_tokens=12, critic="separate", group_size=1
    )
    padded_cfg = replace(default_cfg, max_tokens_per_micro_batch=0)
    assert packs(_layout(default_cfg)) and _shares_a_line(_batch(40)[1], None, 8)
    padded, padded_stats = _step(ppo, padded_cfg)
    packed, packed_stats = _step(ppo, default_cfg)
    scale = float(padded.abs().max())
    assert scale > 1e-4
    assert float((packed - padded).abs().max()) <= REL_TOL * scale
    for key in ("loss", "policy_loss", "value_loss"):
        assert packed_stats[key] == pytest.approx(padded_stats[key], rel=1e-10, abs=1e-13)


@pytest.mark.parametrize("module", [ppo, grpo])
def test_packed_update_of_multi_turn_rows_equals_the_padded_one(module, tiny_lm, prompts, tmp_path):
    """Observation tokens inside the responses (attended to, out of every loss): packing lays
    them into the lines as the padded path attends to them, so the step is the same; and they
    matter, since the same rows without observations step elsewhere."""
    overrides = {"critic": "separate"} if module is ppo else {}
    padded_cfg = _config(module, tiny_lm, prompts, tmp_path, **overrides)
    packed_cfg = replace(padded_cfg, max_tokens_per_micro_batch=BUDGET)
    padded, _ = _step(module, padded_cfg, observations=True)
    packed, _ = _step(module, packed_cfg, observations=True)
    single_turn, _ = _step(module, padded_cfg)
    scale = float(padded.abs().max())
    assert float((packed - padded).abs().max()) <= REL_TOL * scale
    assert float((single_turn - padded).abs().max()) > 1e-3 * scale


# ---------------------------------------------------------------- the rollout


def test_packed_rollout_equals_the_padded_one(
    tiny_lm, prompts, reward_model, tmp_path, monkeypatch
):
    """π_old, π_ref, a separate critic's values and a reward model's scores: the same rollout,
    on responses cut to very different lengths."""
    make_engine = samplers.make_engine

    def cut(settings, tokenizer):
        engine = make_engine(settings, tokenizer)
        plain = engine.sampler

        class Cut:
            def __init__(self, model):
                self.sampler = plain(model)

            def sample(self, *args, **kwargs):
                samples = self.sampler.sample(*args, **kwargs)
                width = samples.response_mask.shape[1]
                keep = torch.tensor(RESPONSE_LENGTHS)[:, None] > torch.arange(width)[None]
                samples.response_mask = samples.response_mask * keep.to(samples.response_mask)
                samples.response_ids = torch.where(
                    keep, samples.response_ids, tokenizer.pad_token_id
                )
                return samples

        engine.sampler = Cut
        return engine

    monkeypatch.setattr(samplers, "make_engine", cut)
    experiences = []
    for budget in (0, 30, 200):
        cfg = _config(
            ppo,
            tiny_lm,
            prompts,
            tmp_path,
            reward_fn=(),
            reward_model=(reward_model,),
            max_tokens_per_micro_batch=budget,
            grad_accum=2,
        )
        algo = ppo.build(cfg)
        torch.manual_seed(cfg.seed)
        models = load_models(role_settings(cfg).models, algo)
        examples, ids = load_prompts(role_settings(cfg).prompts, models.tokenizer)
        experience, _, metrics = rollout_of(
            cfg,
            algo,
            models,
            load_rewards(role_settings(cfg).rewards),
            examples[:2],
            ids[:2],
            0.1,
            {},
        )
        experiences.append((estimate(algo, experience, 0.1), metrics))
    (padded, padded_metrics), *packed_runs = experiences
    # 30: rows out of order over several micro-batches; 200: one, several rows to a line.
    assert len(micro_batch_plan(padded.attention_mask, 4, 30)) > 2
    assert _shares_a_line(padded.attention_mask, 200, 4)
    for packed, packed_metrics in packed_runs:
        _same_rollout(padded, packed, padded_metrics, packed_metrics)


def _same_rollout(padded, packed, padded_metrics, packed_metrics) -> None:
    assert torch.equal(padded.response_ids, packed.response_ids)
    mask = padded.response_mask.double()
    assert len(set(mask.sum(1).tolist())) > 4  # very different lengths
    assert torch.allclose(padded.scores, packed.scores, rtol=1e-12, atol=1e-12)
    for name in ("logprobs", "ref_logprobs", "values", "rewards", "advantages", "returns"):
        a, b = getattr(padded, name) * mask, getattr(packed, name) * mask
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12), name
    assert float(padded.values.abs().sum()) > 1e-3  # the critic starts from the reward model
    for key in ("objective/kl", "objective/entropy", "objective/rlhf_reward"):
        assert packed_metrics[key] == pytest.approx(padded_metrics[key], rel=1e-10, abs=1e-13)
