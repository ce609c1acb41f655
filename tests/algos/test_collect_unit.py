"""collect.py's rollout stages called directly (issue 54's mutation check): the collaborators a
stage hands its work to (the sampler, the reward role, the policy's, reference's, teacher's and
critic's passes) replaced by recorders that answer from fixed tables, so each test sees what a
stage passed along and what it made of the answers; every number hand-computed (float64 where
compared). One test runs the real passes on a 1-layer, 8-wide Llama built here, against which the
recorders' signatures are checked. No trainer, no CLI, no Ray; about a second of tests."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from proxrl.algos.online import collect as co
from proxrl.algos.online.collect import (
    Passes,
    RolloutBatch,
    Sampled,
    Scored,
)
from proxrl.algos.online.old_policy import OldPolicySource
from proxrl.algos.online.roles import Models
from proxrl.algos.online.rollout_settings import (
    PassSettings,
    RolloutSettings,
    SampleSettings,
    ScoreSettings,
    ScoreShaping,
)
from proxrl.data.formats import PromptExample
from proxrl.rollout.experience import Experience
from proxrl.rollout.forward import PolicyOutput
from proxrl.rollout.generation import Samples, SamplingSettings
from proxrl.rollout.rewards import RewardScores

F64 = torch.float64
PAD, EOS = 1, 2

# the trainer's pass, the sampler's, and π_old's sources
TRAINER = OldPolicySource(from_sampler=False, correct=False, forward_pass=True)
SAMPLER = OldPolicySource(from_sampler=True, correct=False, forward_pass=True)
NO_PASS = OldPolicySource(from_sampler=False, correct=False, forward_pass=False)
CORRECT = OldPolicySource(from_sampler=False, correct=True, forward_pass=True)
MEASURED = OldPolicySource(from_sampler=False, correct=False, forward_pass=True, measured=True)


def f32(x: float) -> float:
    """``x`` rounded to float32 (a mean of float32 numbers)."""
    return float(torch.tensor(x, dtype=torch.float32))


def prompt(text: str, **columns: Any) -> PromptExample:
    return PromptExample(text, None, f"row {text}", dict(columns))


# ---------------------------------------------------------------------------- the records


def test_the_records_defaults():
    scored = Scored(torch.zeros(1), torch.zeros(1), torch.ones(1, dtype=torch.bool), {}, None)
    assert scored.combined is None and scored.token_rewards is None
    batch = RolloutBatch(Experience(*[torch.zeros(1, 1)] * 8), [], [], {})
    assert batch.extra_rounds == 0 and batch.prompts is None


def test_timed_records_the_blocks_seconds_under_its_key():
    timings: dict[str, float] = {"other": 5.0}
    with co.timed(timings, "time/x_s"):
        time.sleep(0.01)
    assert set(timings) == {"other", "time/x_s"} and timings["other"] == 5.0
    assert 0.01 <= timings["time/x_s"] < 1.0


# ---------------------------------------------------------------------------- prompt_columns


def test_prompt_columns_lists_each_column_in_row_order():
    prompts = [prompt("a", answer=1, tag="x"), prompt("b", answer=2), SimpleNamespace()]
    columns = co.prompt_columns(prompts)  # type: ignore[arg-type]
    assert columns == {"answer": [1, 2], "tag": ["x"]} and type(columns) is dict
    assert co.prompt_columns([]) == {} and co.prompt_columns([prompt("c")]) == {}


# ---------------------------------------------------------------------------- shaped_scores


def shaping(**over: Any) -> ScoreShaping:
    """Every rule off; ``over`` turns some on."""
    fields: dict[str, Any] = dict(
        no_stop_penalty=None,
        no_stop_mode="replace",
        overlong_buffer=0,
        overlong_penalty=1.0,
        max_new_tokens=7,
        reward_clip=0.0,
    )
    return ScoreShaping(**(fields | over))


SCORES = torch.tensor([2.0, -3.0, 0.5, 6.0], dtype=F64)
ENDED = torch.tensor([True, False, True, False])
LENGTHS = torch.tensor([3, 4, 5, 7])  # max_new_tokens 7, buffer 3: 3 and 4 unpenalised


def test_shaped_scores_with_every_rule_off_are_the_scores():
    given = SCORES.clone()
    out = co.shaped_scores(shaping(), given, ENDED, LENGTHS)
    assert torch.equal(out, SCORES) and out.dtype == F64


@pytest.mark.parametrize(
    ("mode", "penalty", "expected"),
    [
        ("replace", -1.0, [2.0, -1.0, 0.5, -1.0]),
        ("replace", 0.0, [2.0, 0.0, 0.5, 0.0]),  # a penalty of 0 is on (only None is off)
        ("subtract", 0.5, [2.0, -3.5, 0.5, 5.5]),
    ],
)
def test_the_no_stop_penalty_applies_to_the_rows_that_did_not_stop(mode, penalty, expected):
    given, rules = SCORES.clone(), shaping(no_stop_penalty=penalty, no_stop_mode=mode)
    out = co.shaped_scores(rules, given, ENDED, LENGTHS)
    assert torch.equal(out, torch.tensor(expected, dtype=F64))
    assert torch.equal(given, SCORES)  # the caller's scores are not changed


def test_the_overlong_punishment_grows_over_the_buffer_in_the_scores_dtype():
    """L_max 7, L_cache 3: lengths 3 and 4 (= 7 − 3) pay nothing, 5 pays 1/3 of the factor 1.25,
    7 all of it; a row that stopped pays as one that did not. In float64: 1/3 is not a float32."""
    out = co.shaped_scores(
        shaping(overlong_buffer=3, overlong_penalty=1.25), SCORES.clone(), ENDED, LENGTHS
    )
    expected = torch.tensor([2.0, -3.0, 0.5 - 1.25 * (1 / 3), 6.0 - 1.25], dtype=F64)
    assert torch.equal(out, expected) and out.dtype == F64


def test_clipping_bounds_the_scores_on_both_sides():
    out = co.shaped_scores(shaping(reward_clip=2.5), SCORES.clone(), ENDED, LENGTHS)
    assert torch.equal(out, torch.tensor([2.0, -2.5, 0.5, 2.5], dtype=F64))


def test_the_rules_apply_in_order_no_stop_then_overlong_then_clip():
    """Row 3 (6, did not stop, 7 tokens): 6 − 0.5 = 5.5, − 1.5 = 4, clipped to 3; row 1 (−3, did
    not stop, 4 tokens): −3.5, no overlong, clipped to −3."""
    rules = shaping(
        no_stop_penalty=0.5,
        no_stop_mode="subtract",
        overlong_buffer=3,
        overlong_penalty=1.5,
        reward_clip=3.0,
    )
    out = co.shaped_scores(rules, SCORES.clone(), ENDED, LENGTHS)
    assert torch.equal(out, torch.tensor([2.0, -3.0, 0.0, 3.0], dtype=F64))


# ---------------------------------------------------------------------------- the metrics


def rollout_experience(**over: Any) -> Experience:
    """B = 3 rows of a 2-token prompt and a 3-token response: lengths 3, 1, 2."""
    fields: dict[str, Any] = dict(
        prompt_ids=torch.tensor([[5, 6], [5, 6], [0, 8]]),
        prompt_mask=torch.tensor([[1, 1], [1, 1], [0, 1]]),
        response_ids=torch.tensor([[10, 11, 12], [13, 1, 1], [14, 15, 1]]),
        response_mask=torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]]),
        logprobs=None,
        ref_logprobs=None,
        values=torch.zeros(3, 3, dtype=F64),
        scores=torch.tensor([1.0, -2.0, 4.0], dtype=F64),
    )
    return Experience(**(fields | over))


def test_rollout_metrics_by_hand():
    """The lengths are per row (B = 3 rows of T = 4 tokens)."""
    exp = rollout_experience(
        response_ids=torch.tensor([[10, 11, 12, 1], [13, 1, 1, 1], [14, 15, 1, 1]]),
        response_mask=torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]]),
        action_mask=torch.tensor([[1, 0, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]]),
    )
    raw = torch.tensor([3.0, 0.0, 4.5], dtype=F64)
    ended = torch.tensor([True, False, False])
    metrics = co.rollout_metrics(exp, raw, ended, 0.125, TRAINER)
    assert metrics == {
        "objective/scores": 2.5,
        "objective/scores_after_penalty": 1.0,
        "response/length_mean": f32(5 / 3),  # the model's tokens (action_mask): 2, 1, 2
        "response/eos_rate": f32(1 / 3),
        "policy/kl_coef": 0.125,
        "perf/old_logprobs_pass": 1.0,
    }
    assert all(type(v) is float for v in metrics.values())


@pytest.mark.parametrize(
    ("source", "ran"), [(TRAINER, 1.0), (SAMPLER, 0.0), (NO_PASS, 0.0), (CORRECT, 1.0)]
)
def test_the_old_logprobs_pass_is_one_where_the_trainer_ran_it(source, ran):
    exp = rollout_experience()
    raw, ended = torch.zeros(3), torch.ones(3, dtype=torch.bool)
    value = co.rollout_metrics(exp, raw, ended, 0.0, source)["perf/old_logprobs_pass"]
    assert value == ran and type(value) is float


def test_mismatch_metrics_in_float64_over_the_model_tokens_and_rows():
    """ρ = exp(trainer − sampler) at the model's tokens; k3 = ρ − 1 − log ρ, k1 = −log ρ. The
    trainer's float32 numbers are read as they are (0.1 in float32), then in float64."""
    trainer = torch.tensor([[-0.1, -1.0, -7.0], [-0.5, -9.0, -9.0], [-2.0, -0.25, 0.0]])
    sampler = torch.tensor([[-0.5, -0.5, 0.0], [-0.5, 0.0, 0.0], [-1.0, -0.75, 0.0]], dtype=F64)
    exp = rollout_experience(action_mask=torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 0]]))

    def expected(logs: list[float]) -> dict[str, float]:
        ratios = [math.exp(d) for d in logs]
        return {
            "rollout/mismatch_kl": sum(math.expm1(d) - d for d in logs) / len(logs),
            "rollout/mismatch_kl_k1": sum(-d for d in logs) / len(logs),
            "rollout/is_ratio_mean": sum(ratios) / len(ratios),
            "rollout/is_ratio_min": min(ratios),
            "rollout/is_ratio_max": max(ratios),
        }

    t = f32(-0.1)  # -0.10000000149011612
    every = co.mismatch_metrics(trainer, sampler, exp)
    assert every == pytest.approx(expected([t + 0.5, -0.5, 0.0, -1.0, 0.5]), rel=1e-14, abs=0)
    assert (
        every["rollout/mismatch_kl_k1"]
        != expected([-0.1 + 0.5, -0.5, 0.0, -1.0, 0.5])["rollout/mismatch_kl_k1"]
    )
    assert all(type(v) is float for v in every.values())
    rows = torch.tensor([False, True, True])
    some = co.mismatch_metrics(trainer, sampler, exp, rows)
    assert some == pytest.approx(expected([0.0, -1.0, 0.5]), rel=1e-14, abs=0)


def test_distill_metrics_by_hand():
    """Model tokens (1, 1), (1, 0): k1 = [0.5, −1, −1], the teacher's [−1.5, −1, −2], agreement
    2 of 3 (the padding's agreement left out)."""
    exp = rollout_experience(
        response_ids=torch.tensor([[10, 11], [12, 0]]),
        response_mask=torch.tensor([[1, 1], [1, 0]]),
        logprobs=torch.tensor([[-1.0, -2.0], [-3.0, -4.0]], dtype=F64),
        teacher_logprobs=torch.tensor([[-1.5, -1.0], [-2.0, -9.0]], dtype=F64),
        teacher_argmax=torch.tensor([[10, 3], [12, 0]]),
    )
    expected = {
        "distill/reverse_kl": -0.5,
        "distill/teacher_logprob": -1.5,
        "distill/teacher_argmax_agreement": f32(2 / 3),  # a float32 mean, whatever the default
    }
    assert co.distill_metrics(exp) == expected
    default = torch.get_default_dtype()
    torch.set_default_dtype(F64)
    try:
        assert co.distill_metrics(exp) == expected
    finally:
        torch.set_default_dtype(default)


@pytest.mark.parametrize("missing", ["teacher_logprobs", "teacher_argmax", "logprobs"])
def test_distill_metrics_needs_the_teachers_numbers_and_pi_old(missing):
    exp = rollout_experience(
        logprobs=torch.zeros(3, 3, dtype=F64),
        teacher_logprobs=torch.zeros(3, 3, dtype=F64),
        teacher_argmax=torch.zeros(3, 3, dtype=torch.long),
    )
    setattr(exp, missing, None)
    with pytest.raises(AssertionError):
        co.distill_metrics(exp)


@pytest.mark.parametrize("tracks_kl", [True, False])
def test_old_policy_metrics_by_hand(tracks_kl):
    """Sequence k1 KLs [0.5 + 0.5, −0.5] (the padding's 1 left out), β 0.5: the RLHF reward
    mean([2 − 0.5, 4 + 0.25]) = 2.875; entropy mean(1, 2, 3) = 2; the KL's mean 0.25."""
    logprobs = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]], dtype=F64)
    ref = torch.tensor([[-1.5, -2.5], [-2.5, -5.0]], dtype=F64)
    entropy = torch.tensor([[1.0, 2.0], [3.0, 100.0]], dtype=F64)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    scores = torch.tensor([2.0, 4.0], dtype=F64)
    metrics = co.old_policy_metrics(logprobs, ref, entropy, scores, mask, 0.5, tracks_kl)
    expected = {"objective/rlhf_reward": 2.875, "objective/entropy": 2.0}
    assert metrics == (expected | {"objective/kl": 0.25} if tracks_kl else expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_old_policy_metrics_reads_cpu_scores_beside_gpu_log_probs():
    """(B,) scores on the CPU, the log-probs on the GPU: the scores go to the KL's device."""
    logprobs = torch.tensor([[-1.0, -2.0]], dtype=F64, device="cuda")
    ref, entropy = torch.zeros_like(logprobs), torch.ones_like(logprobs)
    mask = torch.ones(1, 2, device="cuda")
    scores = torch.tensor([4.0, 4.0], dtype=F64)  # (2,): not a CPU scalar that any device takes
    logprobs, ref, entropy, mask = (t.expand(2, 2) for t in (logprobs, ref, entropy, mask))
    metrics = co.old_policy_metrics(logprobs, ref, entropy, scores, mask, 0.5, True)
    assert metrics == {"objective/rlhf_reward": 5.5, "objective/entropy": 1.0, "objective/kl": -3.0}


# ---------------------------------------------------------------------------- fakes


class Tokenizer:
    pad_token_id, eos_token_id = PAD, EOS

    def __init__(self) -> None:
        self.decoded: list[tuple[torch.Tensor, bool]] = []

    def batch_decode(self, ids: torch.Tensor, skip_special_tokens: bool = False) -> list[str]:
        self.decoded.append((ids.clone(), skip_special_tokens))
        return ["-".join(str(int(t)) for t in row) for row in ids]


class Engine:
    def __init__(self) -> None:
        self.wholes: list[Any] = []

    def sampler(self, whole: Any) -> tuple[str, Any]:
        self.wholes.append(whole)
        return ("sampler of", whole)


class Actor(nn.Module):
    """The policy: one float64 weight (its device is read); as the reference (LoRA, the adapters
    off) its log-probs are ADAPTERLESS."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, dtype=F64))


class Frozen:
    """A reference or a teacher: its log-probs are ``table``'s rows."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table


class Critic:
    """V(s_t) = VALUES' rows; the calls recorded."""

    def __init__(self, needs_hidden: bool = False) -> None:
        self.needs_hidden = needs_hidden
        self.calls: list[dict[str, Any]] = []

    def values(self, input_ids, attention_mask, prompt_length, hidden):  # type: ignore[no-untyped-def]
        self.calls.append(dict(ids=input_ids, mask=attention_mask, P=prompt_length, hidden=hidden))
        return VALUES[input_ids[:, 0]]


def models(**over: Any) -> Models:
    fields: dict[str, Any] = dict(
        actor=Actor(), reference=None, critic=Critic(), tokenizer=Tokenizer(), tracks_kl=True
    )
    return Models(**(fields | over))


class Rewards:
    """The reward role: ``total`` whatever it is asked; the calls recorded."""

    def __init__(self, total: torch.Tensor, parts: dict[str, float] | None = None) -> None:
        self.total, self.parts = total, parts or {"reward/a": 0.5}
        self.calls: list[tuple] = []

    def scores(self) -> RewardScores:
        per_source = torch.stack([self.total, 2 * self.total], 1)
        return RewardScores(self.total, per_source, (1.0, 0.5), self.parts)


def record_scoring(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """``score_responses`` → the role's scores, its arguments recorded."""
    calls: list[tuple] = []

    def score_responses(samples, rewards, prompts, completions, columns):  # type: ignore[no-untyped-def]
        calls.append((samples, rewards, prompts, completions, columns))
        return rewards.scores()

    monkeypatch.setattr(co, "score_responses", score_responses)
    return calls


def record_sampling(monkeypatch: pytest.MonkeyPatch, samples: Samples) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def sample_responses(episodes, sampler, tokenizer, prompts, ids, mask, settings, with_logprobs):  # type: ignore[no-untyped-def]
        calls.append(
            dict(
                episodes=episodes,
                sampler=sampler,
                tokenizer=tokenizer,
                prompts=prompts,
                ids=ids,
                mask=mask,
                settings=settings,
                with_logprobs=with_logprobs,
            )
        )
        return samples

    monkeypatch.setattr(co, "sample_responses", sample_responses)
    return calls


DISTRIBUTION = SamplingSettings(max_new_tokens=3, temperature=0.7, top_k=5, top_p=0.9, min_p=0.05)
EPISODES = object()  # what the sampler is handed as the episodes' settings


# ---------------------------------------------------------------------------- sample


def test_sample_repeats_each_prompt_g_times_left_padded_and_decodes(monkeypatch):
    """Two prompts, G = 2: four rows, prompt 1 padded with the pad id (1) on the left, its mask
    0 there; the completions are the responses with the pad id after each one's end."""
    samples = Samples(
        response_ids=torch.tensor([[3, 4, 2], [3, 9, 9], [5, 2, 7], [6, 6, 6]]),
        response_mask=torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]]),
    )
    calls = record_sampling(monkeypatch, samples)
    m, engine = models(), Engine()
    settings = SampleSettings(group_size=2, distribution=DISTRIBUTION, episodes=EPISODES)  # type: ignore[arg-type]
    prompts = [prompt("a"), prompt("b")]
    sampled = co.sample(settings, m, engine, prompts, [[5, 6, 7], [8]], True)
    (call,) = calls
    assert call["episodes"] is EPISODES and call["settings"] is DISTRIBUTION
    assert call["tokenizer"] is m.tokenizer and call["with_logprobs"] is True
    assert engine.wholes == [m.actor] and call["sampler"] == ("sampler of", m.actor)
    assert call["prompts"] == [prompts[0], prompts[0], prompts[1], prompts[1]]
    ids = torch.tensor([[5, 6, 7], [5, 6, 7], [1, 1, 8], [1, 1, 8]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [0, 0, 1], [0, 0, 1]])
    assert torch.equal(call["ids"], ids) and torch.equal(call["mask"], mask)
    assert sampled.prompts == call["prompts"] and sampled.samples is samples
    assert torch.equal(sampled.prompt_ids, ids) and torch.equal(sampled.prompt_mask, mask)
    ((decoded, skip),) = m.tokenizer.decoded
    assert skip is True
    assert decoded.tolist() == [[3, 4, 2], [3, 1, 1], [5, 2, 1], [6, 6, 6]]
    assert sampled.completions == ["3-4-2", "3-1-1", "5-2-1", "6-6-6"]
    assert samples.response_mask.tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]]


def test_sample_gives_an_empty_response_its_first_token(monkeypatch):
    samples = Samples(
        response_ids=torch.tensor([[3, 4], [7, 9]]), response_mask=torch.tensor([[1, 1], [0, 0]])
    )
    record_sampling(monkeypatch, samples)
    m = models()
    settings = SampleSettings(group_size=1, distribution=DISTRIBUTION, episodes=None)
    sampled = co.sample(settings, m, Engine(), [prompt("a"), prompt("b")], [[5], [6]], False)
    assert samples.response_mask.tolist() == [[1, 1], [1, 0]]
    assert sampled.completions == ["3-4", "7-1"]


# ---------------------------------------------------------------------------- score


def scored_batch(
    monkeypatch: pytest.MonkeyPatch, settings: ScoreSettings, combine: Any = None, **over: Any
) -> tuple[Scored, list[tuple], Rewards, Sampled]:
    """Four responses, max_new_tokens 3: row 0 ends with EOS at the third token (stopped), row
    1 is cut at 3 (not stopped), row 2 stops after one token, row 3 after two (EOS)."""
    samples = Samples(
        response_ids=torch.tensor([[3, 4, 2], [3, 4, 5], [3, 1, 1], [4, 2, 1]]),
        response_mask=torch.tensor([[1, 1, 1], [1, 1, 1], [1, 0, 0], [1, 1, 0]]),
    )
    prompts = [prompt("a", answer=1)] * 2 + [prompt("b", answer=2)] * 2
    sampled = Sampled(prompts, torch.zeros(4, 1), torch.ones(4, 1), samples, ["w", "x", "y", "z"])
    calls = record_scoring(monkeypatch)
    rewards = Rewards(torch.tensor([1.0, 2.0, -4.0, 8.0], dtype=F64))
    algo = SimpleNamespace(combine_sources=combine)
    m = over.pop("models", models())
    out = co.score(settings, algo, m, over.pop("engine", Engine()), rewards, sampled, [[5], [6]])  # type: ignore[arg-type]
    return out, calls, rewards, sampled


def test_score_shapes_the_sources_total_by_who_stopped_and_the_lengths(monkeypatch):
    """The no-stop penalty (replace by −1) on row 1 alone (row 0's EOS at the last position
    the budget allows still stops it); the overlong punishment (buffer 2, factor 1) on the
    lengths 3, 3, 1, 2: −1, −1, 0, −0.5."""
    rules = shaping(no_stop_penalty=-1.0, overlong_buffer=2, max_new_tokens=3)
    settings = ScoreSettings(max_new_tokens=3, shaping=rules, greedy=None)
    out, calls, rewards, sampled = scored_batch(monkeypatch, settings)
    ((samples, role, prompts, completions, columns),) = calls
    assert samples is sampled.samples and role is rewards and prompts is sampled.prompts
    assert completions is sampled.completions and columns == {"answer": [1, 1, 2, 2]}
    assert out.ended.tolist() == [True, False, True, True] and out.ended.device.type == "cpu"
    assert torch.equal(out.raw, torch.tensor([1.0, 2.0, -4.0, 8.0], dtype=F64))
    assert torch.equal(out.scores, torch.tensor([0.0, -2.0, -4.0, 7.5], dtype=F64))
    assert out.parts == {"reward/a": 0.5}
    assert out.greedy_scores is None and out.combined is None and out.token_rewards is None


def test_score_hands_the_sources_to_the_algorithms_combination(monkeypatch):
    got: list[tuple] = []

    def combine(per_source, weights):  # type: ignore[no-untyped-def]
        got.append((per_source, weights))
        return per_source.sum(1)

    settings = ScoreSettings(max_new_tokens=3, shaping=shaping(), greedy=None)
    out, _, _, _ = scored_batch(monkeypatch, settings, combine)
    ((per_source, weights),) = got
    assert torch.equal(per_source[:, 1], torch.tensor([2.0, 4.0, -8.0, 16.0], dtype=F64))
    assert weights == [1.0, 0.5] and type(weights) is list
    assert torch.equal(out.combined, torch.tensor([3.0, 6.0, -12.0, 24.0], dtype=F64))


def test_score_decodes_each_prompt_greedily_once_and_spreads_its_score(monkeypatch):
    got: list[tuple] = []

    def greedy_baseline(greedy, models_, engine, rewards, prompts, prompt_ids, columns):  # type: ignore[no-untyped-def]
        got.append((greedy, models_, engine, rewards, prompts, prompt_ids, columns))
        return torch.tensor([0.5, -1.5], dtype=F64)

    monkeypatch.setattr(co, "greedy_baseline", greedy_baseline)
    greedy = SampleSettings(group_size=2, distribution=DISTRIBUTION, episodes=None)
    settings = ScoreSettings(max_new_tokens=3, shaping=shaping(), greedy=greedy)
    m, engine = models(), Engine()
    out, _, rewards, sampled = scored_batch(monkeypatch, settings, models=m, engine=engine)
    ((g, m_, e, role, prompts, ids, columns),) = got
    assert g is greedy and m_ is m and e is engine and role is rewards and ids == [[5], [6]]
    assert prompts == [sampled.prompts[0], sampled.prompts[2]]
    assert columns == {"answer": [1, 2]}
    assert torch.equal(out.greedy_scores, torch.tensor([0.5, 0.5, -1.5, -1.5], dtype=F64))


# ---------------------------------------------------------------------------- greedy_baseline


def test_greedy_baseline_decodes_and_scores_each_prompt_once(monkeypatch):
    decoded = Samples(
        response_ids=torch.tensor([[3, 2], [4, 1]]), response_mask=torch.tensor([[1, 1], [1, 0]])
    )
    calls = record_sampling(monkeypatch, decoded)
    scoring = record_scoring(monkeypatch)
    greedy = SampleSettings(group_size=3, distribution=DISTRIBUTION, episodes=EPISODES)  # type: ignore[arg-type]
    m, engine = models(), Engine()
    rewards = Rewards(torch.tensor([0.25, 0.75], dtype=F64))
    prompts = [prompt("a"), prompt("b")]
    columns = {"answer": [1, 2]}
    out = co.greedy_baseline(greedy, m, engine, rewards, prompts, [[5, 6], [7]], columns)  # type: ignore[arg-type]
    (call,) = calls
    assert call["episodes"] is EPISODES and call["settings"] is DISTRIBUTION
    assert call["with_logprobs"] is False and call["tokenizer"] is m.tokenizer
    assert engine.wholes == [m.actor] and call["sampler"] == ("sampler of", m.actor)
    assert call["prompts"] is prompts
    assert call["ids"].tolist() == [[5, 6], [1, 7]] and call["mask"].tolist() == [[1, 1], [0, 1]]
    ((ids, skip),) = m.tokenizer.decoded
    assert torch.equal(ids, decoded.response_ids) and skip is True
    ((samples, role, scored_prompts, text, cols),) = scoring
    assert samples is decoded and role is rewards and scored_prompts is prompts
    assert text == ["3-2", "4-1"] and cols is columns
    assert torch.equal(out, torch.tensor([0.25, 0.75], dtype=F64))


# ---------------------------------------------------------------------------- forward_passes

# B = 4 rows of a 2-token prompt (its first token: the row's index, which the recorders read)
# and a 3-token response; lengths 3, 5, 4, 5 with the prompt.
PROMPT_IDS = torch.tensor([[0, 7], [1, 7], [2, 7], [3, 7]])
RESPONSE_IDS = torch.tensor([[20, 1, 1], [21, 22, 23], [24, 25, 1], [26, 27, 28]])
RESPONSE_MASK = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1]])


def table(base: float, dtype: torch.dtype = F64) -> torch.Tensor:
    """(4, 3) distinct numbers, exact in binary: base − row − column / 4."""
    rows = torch.arange(4, dtype=F64)[:, None]
    cols = torch.arange(3, dtype=F64)[None, :]
    return (base - rows - cols / 4).to(dtype)


PASS_LP, PASS_ENTROPY, ADAPTERLESS = table(-0.5), table(9.0), table(-20.0)
REF_LP, TEACHER_LP = table(-40.0), table(-60.0)
TEACHER_ARGMAX = torch.tensor([[20, 5, 5], [5, 22, 23], [24, 5, 5], [26, 5, 28]])
SAMPLER_LP, SAMPLER_ENTROPY = table(-80.0, torch.float32), table(90.0, torch.float32)
HIDDEN = table(100.0)[:, :, None]
VALUES = table(200.0, torch.float32)


class Forwards:
    """``policy_forward`` and ``frozen_pass`` replaced: the policy's log-probs are PASS_LP's
    rows (in ``dtype``), its entropy PASS_ENTROPY's, its hidden state HIDDEN's; a frozen role's
    its ``table`` (the actor's, as the reference under LoRA: ADAPTERLESS); every call's
    arguments recorded, by name, with the real functions' defaults."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype = F64, logprobs: Any = PASS_LP
    ) -> None:
        self.policy: list[dict[str, Any]] = []
        self.frozen: list[dict[str, Any]] = []
        self.dtype, self.logprobs = dtype, logprobs
        monkeypatch.setattr(co, "policy_forward", self.policy_forward)
        monkeypatch.setattr(co, "frozen_pass", self.frozen_pass)

    def policy_forward(  # type: ignore[no-untyped-def]
        self, model, input_ids, attention_mask, prompt_length, temperature, with_entropy=False,
        with_hidden=False, top_k=0, top_p=1.0, min_p=0.0, packed=False, with_argmax=False,
        with_logits=False, shared_prefix=False,
    ):  # fmt: skip
        call = dict(locals())
        del call["self"]
        self.policy.append(call)
        rows = input_ids[:, 0]
        return PolicyOutput(
            self.logprobs[rows].to(self.dtype),
            PASS_ENTROPY[rows].to(self.dtype) if with_entropy else None,
            HIDDEN[rows] if with_hidden else None,
        )

    def frozen_pass(  # type: ignore[no-untyped-def]
        self, frozen, input_ids, attention_mask, prompt_length, temperature, truncation, packed,
        with_argmax=False, shared_prefix=False,
    ):  # fmt: skip
        call = dict(locals())
        del call["self"]
        self.frozen.append(call)
        rows = input_ids[:, 0]
        logprobs = (ADAPTERLESS if isinstance(frozen, Actor) else frozen.table)[rows]
        return logprobs, TEACHER_ARGMAX[rows] if with_argmax else None


def pass_settings(**over: Any) -> PassSettings:
    """Micro-batches of 2 rows packed by a budget of 2 × the longest row (10 tokens): rows
    [1, 3] then [0, 2] (best-fit decreasing), so the rows come back out of order."""
    fields: dict[str, Any] = dict(
        micro_batch_size=2,
        token_budget=None,
        shares_prefix=True,
        distribution=DISTRIBUTION,
        rollout_correction="tis",
        rollout_correction_low=0.5,
        rollout_correction_cap=4.0,
    )
    return PassSettings(**(fields | over))


def batch(action_mask: torch.Tensor | None = None, **samples_over: Any) -> Sampled:
    fields: dict[str, Any] = dict(
        response_ids=RESPONSE_IDS,
        response_mask=RESPONSE_MASK,
        logprobs=SAMPLER_LP,
        entropy=SAMPLER_ENTROPY,
        action_mask=action_mask,
    )
    samples = Samples(**(fields | samples_over))
    prompts = [prompt(str(i)) for i in range(4)]
    return Sampled(prompts, PROMPT_IDS, torch.ones(4, 2, dtype=torch.long), samples, ["c"] * 4)


def scored(**over: Any) -> Scored:
    fields: dict[str, Any] = dict(
        raw=torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=F64),
        scores=torch.tensor([0.5, -1.0, 3.0, 4.0], dtype=F64),
        ended=torch.tensor([True, False, True, False]),
        parts={"reward/a": 2.5},
        greedy_scores=None,
    )
    return Scored(**(fields | over))


def passes_of(
    monkeypatch: pytest.MonkeyPatch,
    source: OldPolicySource,
    settings: PassSettings | None = None,
    sampled: Sampled | None = None,
    score: Scored | None = None,
    dtype: torch.dtype = F64,
    logprobs: torch.Tensor = PASS_LP,
    **model_over: Any,
) -> tuple[Passes, Forwards, Models]:
    forwards = Forwards(monkeypatch, dtype, logprobs)
    m = models(**model_over)
    out = co.forward_passes(
        settings or pass_settings(), m, sampled or batch(), score or scored(), source
    )
    return out, forwards, m


def test_the_trainers_pass_gives_pi_old_and_entropy_in_the_updates_micro_batches(monkeypatch):
    out, forwards, m = passes_of(monkeypatch, TRAINER, reference=Frozen(REF_LP))
    exp = out.experience
    full = torch.cat([PROMPT_IDS, RESPONSE_IDS], 1)
    mask = torch.cat([torch.ones(4, 2, dtype=torch.long), RESPONSE_MASK], 1)
    assert [c["input_ids"][:, 0].tolist() for c in forwards.policy] == [[1, 3], [0, 2]]
    for call, rows in zip(forwards.policy, ([1, 3], [0, 2]), strict=True):
        assert call["model"] is m.actor and call["prompt_length"] == 2
        assert torch.equal(call["input_ids"], full[rows])
        assert torch.equal(call["attention_mask"], mask[rows])
        assert {k: call[k] for k in call if k not in ("model", "input_ids", "attention_mask")} == {
            "prompt_length": 2,
            "temperature": 0.7,
            "with_entropy": True,
            "with_hidden": False,
            "top_k": 5,
            "top_p": 0.9,
            "min_p": 0.05,
            "packed": True,
            "with_argmax": False,
            "with_logits": False,
            "shared_prefix": True,
        }
    assert torch.equal(exp.logprobs, PASS_LP) and torch.equal(out.entropy, PASS_ENTROPY)
    assert torch.equal(exp.ref_logprobs, REF_LP)
    assert [c["frozen"] for c in forwards.frozen] == [m.reference] * 2
    for call, rows in zip(forwards.frozen, ([1, 3], [0, 2]), strict=True):
        assert torch.equal(call["input_ids"], full[rows])
        assert torch.equal(call["attention_mask"], mask[rows])
        assert {k: call[k] for k in call if k not in ("frozen", "input_ids", "attention_mask")} == {
            "prompt_length": 2,
            "temperature": 0.7,
            "truncation": {"top_k": 5, "top_p": 0.9, "min_p": 0.05},
            "packed": True,
            "with_argmax": False,
            "shared_prefix": True,
        }
    assert [c["P"] for c in m.critic.calls] == [2, 2]
    assert [c["hidden"] for c in m.critic.calls] == [None, None]
    assert torch.equal(m.critic.calls[0]["ids"], full[[1, 3]])
    assert torch.equal(m.critic.calls[0]["mask"], mask[[1, 3]])
    assert out.correction == {} and out.correction_tokens == 0.0
    assert exp.rollout_weights is None and exp.sampler_logprobs is None


def test_the_experience_carries_the_batch_and_the_scores(monkeypatch):
    """V_old is 0 off the model's tokens (action_mask); truncated is ``not ended``; greedy,
    combined scores and token rewards pass through."""
    action = torch.tensor([[1, 0, 0], [1, 0, 1], [1, 1, 0], [0, 1, 1]])
    token_rewards = torch.arange(12, dtype=F64).view(4, 3)
    score = scored(
        greedy_scores=torch.tensor([7.0, 7.0, 8.0, 8.0], dtype=F64),
        combined=torch.tensor([0.0, 1.0, 0.0, -1.0], dtype=F64),
        token_rewards=token_rewards,
    )
    sampled = batch(action)
    out, _, _ = passes_of(monkeypatch, TRAINER, sampled=sampled, score=score)
    exp = out.experience
    assert exp.prompt_ids is PROMPT_IDS and exp.prompt_mask is sampled.prompt_mask
    assert exp.response_ids is RESPONSE_IDS and exp.response_mask is RESPONSE_MASK
    assert exp.action_mask is action
    assert torch.equal(exp.values, VALUES * action) and exp.values.dtype == torch.float32
    assert torch.equal(exp.scores, score.scores)
    assert torch.equal(exp.greedy_scores, score.greedy_scores)
    assert torch.equal(exp.combined_scores, score.combined)
    assert torch.equal(exp.token_rewards, token_rewards)
    assert exp.truncated.tolist() == [False, True, False, True]
    assert exp.teacher_logprobs is None and exp.teacher_argmax is None
    assert exp.rewards is None and exp.advantages is None and exp.returns is None


def test_values_are_zero_after_the_responses_end(monkeypatch):
    out, _, _ = passes_of(monkeypatch, TRAINER, pass_settings(token_budget=0, micro_batch_size=3))
    assert torch.equal(out.experience.values, VALUES * RESPONSE_MASK)


def test_padded_micro_batches_take_consecutive_rows(monkeypatch):
    settings = pass_settings(token_budget=0, micro_batch_size=3, shares_prefix=False)
    out, forwards, _ = passes_of(monkeypatch, TRAINER, settings)
    assert [c["input_ids"][:, 0].tolist() for c in forwards.policy] == [[0, 1, 2], [3]]
    assert {(c["packed"], c["shared_prefix"]) for c in forwards.policy} == {(False, False)}
    assert {(c["packed"], c["shared_prefix"]) for c in forwards.frozen} == {(False, False)}
    assert torch.equal(out.experience.logprobs, PASS_LP)


def test_a_half_precision_pass_is_kept_in_float32(monkeypatch):
    out, _, _ = passes_of(monkeypatch, TRAINER, dtype=torch.bfloat16)
    assert out.experience.logprobs.dtype == torch.float32 == out.entropy.dtype
    assert torch.equal(out.experience.logprobs, PASS_LP.to(torch.bfloat16).float())
    assert torch.equal(out.entropy, PASS_ENTROPY.to(torch.bfloat16).float())


def test_the_samplers_logprobs_stand_in_for_pi_old_with_no_pass(monkeypatch):
    out, forwards, m = passes_of(monkeypatch, SAMPLER, reference=Frozen(REF_LP))
    assert forwards.policy == []
    assert torch.equal(out.experience.logprobs, SAMPLER_LP)
    assert torch.equal(out.entropy, SAMPLER_ENTROPY)
    assert torch.equal(out.experience.ref_logprobs, REF_LP)
    assert [c["hidden"] for c in m.critic.calls] == [None, None]
    assert out.experience.sampler_logprobs is None


def test_a_sampler_without_entropy_gives_nan(monkeypatch):
    out, _, _ = passes_of(monkeypatch, SAMPLER, sampled=batch(entropy=None))
    assert out.entropy.shape == (4, 3) and out.entropy.isnan().all()
    assert out.entropy.dtype == SAMPLER_LP.dtype


def test_a_value_head_gets_the_pass_hidden_state_with_the_samplers_pi_old(monkeypatch):
    out, forwards, m = passes_of(monkeypatch, SAMPLER, critic=Critic(needs_hidden=True))
    assert [(c["with_entropy"], c["with_hidden"]) for c in forwards.policy] == [(False, True)] * 2
    assert torch.equal(out.experience.logprobs, SAMPLER_LP)
    assert torch.equal(out.entropy, SAMPLER_ENTROPY)
    assert [c["hidden"] for c in m.critic.calls][0].tolist() == HIDDEN[[1, 3]].tolist()
    assert torch.equal(m.critic.calls[1]["hidden"], HIDDEN[[0, 2]])


def test_a_value_head_with_the_trainers_pass_reads_its_hidden_state(monkeypatch):
    out, forwards, m = passes_of(monkeypatch, TRAINER, critic=Critic(needs_hidden=True))
    assert [(c["with_entropy"], c["with_hidden"]) for c in forwards.policy] == [(True, True)] * 2
    assert torch.equal(m.critic.calls[1]["hidden"], HIDDEN[[0, 2]])
    assert torch.equal(out.experience.logprobs, PASS_LP)


def test_without_a_pass_pi_old_is_left_to_the_update(monkeypatch):
    out, forwards, m = passes_of(monkeypatch, NO_PASS, critic=Critic(needs_hidden=True))
    assert forwards.policy == [] and [c["hidden"] for c in m.critic.calls] == [None, None]
    assert out.experience.logprobs is None and out.entropy is None
    assert torch.equal(out.experience.ref_logprobs, ADAPTERLESS)  # the KL still tracked
    out, forwards, m = passes_of(monkeypatch, NO_PASS, tracks_kl=False)
    assert forwards.frozen == [] and out.experience.ref_logprobs is None


def test_the_adapters_off_actor_is_the_reference_under_lora(monkeypatch):
    out, forwards, m = passes_of(monkeypatch, TRAINER)
    assert [c["frozen"] for c in forwards.frozen] == [m.actor] * 2
    assert torch.equal(out.experience.ref_logprobs, ADAPTERLESS)


def test_without_a_kl_pi_ref_is_pi_old_and_no_reference_pass_runs(monkeypatch):
    out, forwards, _ = passes_of(monkeypatch, TRAINER, reference=Frozen(REF_LP), tracks_kl=False)
    assert forwards.frozen == []
    assert torch.equal(out.experience.ref_logprobs, PASS_LP)
    out, _, _ = passes_of(monkeypatch, SAMPLER, reference=Frozen(REF_LP), tracks_kl=False)
    assert torch.equal(out.experience.ref_logprobs, SAMPLER_LP)


def test_a_teacher_scores_the_samples_with_its_argmax(monkeypatch):
    teacher = Frozen(TEACHER_LP)
    out, forwards, _ = passes_of(monkeypatch, TRAINER, teacher=teacher, tracks_kl=False)
    assert [c["frozen"] for c in forwards.frozen] == [teacher] * 2
    assert {(c["with_argmax"], c["shared_prefix"], c["packed"]) for c in forwards.frozen} == {
        (True, True, True)
    }
    assert {c["temperature"] for c in forwards.frozen} == {0.7}
    assert forwards.frozen[0]["truncation"] == {"top_k": 5, "top_p": 0.9, "min_p": 0.05}
    assert forwards.frozen[0]["prompt_length"] == 2
    assert torch.equal(forwards.frozen[1]["attention_mask"][:, 2:], RESPONSE_MASK[[0, 2]])
    assert torch.equal(out.experience.teacher_logprobs, TEACHER_LP)
    assert torch.equal(out.experience.teacher_argmax, TEACHER_ARGMAX)


def test_a_measured_engines_logprobs_are_kept_beside_the_trainers(monkeypatch):
    out, _, _ = passes_of(monkeypatch, MEASURED)
    assert torch.equal(out.experience.sampler_logprobs, SAMPLER_LP)
    assert torch.equal(out.experience.logprobs, PASS_LP) and out.correction == {}


# log π_old − log π_sampler at each token (9.0: padding, never read); with the action mask
# below the token (3, 1) is an observation's.
LOG_RATIO = torch.tensor(
    [[0.0, 9.0, 9.0], [-1.5, 0.75, 2.5], [-0.5, -1.0, 9.0], [0.25, 1.5, 0.0]], dtype=F64
)
ACTION = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 1]])


@pytest.mark.parametrize(
    ("name", "weight", "masked", "truncated"),
    [
        # icepop [0.5, 4]: ρ 0.22, 0.37 below, 12.2 above
        ("icepop", lambda r: r if 0.5 <= r <= 4.0 else 0.0, 3 / 8, 0.0),
        ("tis", lambda r: min(r, 4.0), 0.0, 1 / 8),  # 12.2 cut to 4
    ],
)
def test_a_rollout_correction_weighs_the_trainers_pi_old_against_the_samplers(
    monkeypatch, name, weight, masked, truncated
):
    pass_lp = SAMPLER_LP.double() + LOG_RATIO
    settings = pass_settings(rollout_correction=name)
    out, _, _ = passes_of(monkeypatch, CORRECT, settings, batch(ACTION), logprobs=pass_lp)
    exp = out.experience
    assert torch.equal(exp.logprobs, pass_lp)
    valid = ACTION.bool()
    logs = LOG_RATIO[valid].tolist()
    ratios = [math.exp(d) for d in logs]
    expected = torch.zeros(4, 3, dtype=F64)
    expected[valid] = torch.tensor([weight(r) for r in ratios], dtype=F64)
    assert torch.allclose(exp.rollout_weights, expected, rtol=1e-13, atol=0)
    assert exp.rollout_weights.dtype == F64
    assert out.correction == pytest.approx(
        {
            "mismatch_kl": sum(math.expm1(d) - d for d in logs) / 8,
            "mismatch_kl_k1": -sum(logs) / 8,
            "is_ratio_mean": sum(ratios) / 8,
            "is_ratio_min": min(ratios),
            "is_ratio_max": max(ratios),
            "masked_share": masked,
            "truncated_share": truncated,
        },
        rel=1e-13,
        abs=0,
    )
    assert all(type(v) is float for v in out.correction.values())
    assert out.correction_tokens == 8.0 and type(out.correction_tokens) is float
    assert torch.equal(out.entropy, PASS_ENTROPY) and exp.sampler_logprobs is None


# ---------------------------------------------------------------------------- devices


class MetaActor(nn.Module):
    """A policy on the meta device: what a stage moves to the policy's device lands there (on
    CPU alone a missing move would go unseen)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, device="meta"))


def test_the_stages_put_their_tensors_on_the_policys_device(monkeypatch):
    m = models(actor=MetaActor(), tracks_kl=False)
    samples = Samples(torch.tensor([[3, 2]]), torch.tensor([[1, 1]]))
    calls = record_sampling(monkeypatch, samples)
    settings = SampleSettings(group_size=1, distribution=DISTRIBUTION, episodes=None)
    sampled = co.sample(settings, m, Engine(), [prompt("a")], [[5]], False)
    assert sampled.prompt_ids.device.type == "meta" == sampled.prompt_mask.device.type
    assert calls[-1]["ids"].device.type == "meta" == calls[-1]["mask"].device.type
    record_scoring(monkeypatch)
    rewards = Rewards(torch.tensor([1.0], dtype=F64))
    co.greedy_baseline(settings, m, Engine(), rewards, [prompt("a")], [[5]], {})  # type: ignore[arg-type]
    assert calls[-1]["ids"].device.type == "meta" == calls[-1]["mask"].device.type
    monkeypatch.setattr(co, "greedy_baseline", lambda *args: torch.tensor([0.5, 1.5]))
    greedy = SampleSettings(group_size=2, distribution=DISTRIBUTION, episodes=None)
    scoring = ScoreSettings(max_new_tokens=3, shaping=shaping(), greedy=greedy)
    out, _, _, _ = scored_batch(monkeypatch, scoring, models=m)
    assert out.greedy_scores.device.type == "meta" and out.ended.device.type == "cpu"
    score = scored(combined=torch.zeros(4, dtype=F64), token_rewards=torch.zeros(4, 3, dtype=F64))
    Forwards(monkeypatch)
    exp = co.forward_passes(pass_settings(), m, batch(), score, TRAINER).experience
    moved = (exp.scores, exp.combined_scores, exp.truncated, exp.token_rewards)
    assert [t.device.type for t in moved] == ["meta"] * 4


# ---------------------------------------------------------------------------- evaluate


def experience_of(sampled: Sampled, score: Scored, **over: Any) -> Experience:
    s = sampled.samples
    fields: dict[str, Any] = dict(
        prompt_ids=sampled.prompt_ids,
        prompt_mask=sampled.prompt_mask,
        response_ids=s.response_ids,
        response_mask=s.response_mask,
        logprobs=None,
        ref_logprobs=None,
        values=torch.zeros(4, 3),
        scores=score.scores,
    )
    return Experience(**(fields | over))


def record_passes(monkeypatch: pytest.MonkeyPatch, passes: Passes) -> list[tuple]:
    calls: list[tuple] = []

    def forward_passes(settings, models_, sampled, score, source):  # type: ignore[no-untyped-def]
        calls.append((settings, models_, sampled, score, source))
        return passes

    monkeypatch.setattr(co, "forward_passes", forward_passes)
    return calls


def test_evaluate_joins_the_stages_metrics(monkeypatch):
    sampled, score = batch(), scored()
    exp = experience_of(
        sampled,
        score,
        logprobs=PASS_LP,
        ref_logprobs=REF_LP,
        teacher_logprobs=TEACHER_LP,
        teacher_argmax=TEACHER_ARGMAX,
        sampler_logprobs=SAMPLER_LP.double(),
    )
    passes = Passes(exp, PASS_ENTROPY, {"mismatch_kl": 0.125}, 9.0)
    calls = record_passes(monkeypatch, passes)
    m, settings, timings = models(tracks_kl=False), pass_settings(), {}
    out, completions, metrics = co.evaluate(settings, m, sampled, score, TRAINER, 0.5, timings)
    assert calls == [(settings, m, sampled, score, TRAINER)]
    assert out is exp and completions is sampled.completions and set(timings) == {"time/forward_s"}
    mask = RESPONSE_MASK.float()
    assert metrics == (
        co.rollout_metrics(exp, score.raw, score.ended, 0.5, TRAINER)
        | {"reward/a": 2.5, "rollout/mismatch_kl": 0.125}
        | co.distill_metrics(exp)
        | co.mismatch_metrics(PASS_LP, SAMPLER_LP.double(), exp)
        | co.old_policy_metrics(PASS_LP, REF_LP, PASS_ENTROPY, score.scores, mask, 0.5, False)
    )


def test_evaluate_without_pi_old_logs_the_scores_alone(monkeypatch):
    sampled, score = batch(), scored()
    exp = experience_of(sampled, score, sampler_logprobs=SAMPLER_LP.double())
    record_passes(monkeypatch, Passes(exp, None, {}, 0.0))
    _, _, metrics = co.evaluate(pass_settings(), models(), sampled, score, NO_PASS, 0.5, {})
    assert metrics == co.rollout_metrics(exp, score.raw, score.ended, 0.5, NO_PASS) | {
        "reward/a": 2.5
    }


def test_evaluate_over_several_processes_gathers_every_ranks_rows(monkeypatch):
    sampled, score = batch(), scored()
    exp = experience_of(sampled, score)
    record_passes(monkeypatch, Passes(exp, None, {"mismatch_kl": 0.125}, 9.0))
    gathered, reduced, combined = [], [], []
    merged = experience_of(sampled, score, scores=torch.tensor([0.0, 1.0, 2.0, 3.0]))
    raw, ended = torch.tensor([4.0, 0.0, 0.0, 0.0]), torch.tensor([True, True, True, False])

    def gather_rollout(experience, raw_, ended_, entropy, completions, pad_id):  # type: ignore[no-untyped-def]
        gathered.append((experience, raw_, ended_, entropy, completions, pad_id))
        return merged, raw, ended, entropy, ["all"]

    def all_reduce_mean(x):  # type: ignore[no-untyped-def]
        reduced.append(x)
        return {"reward/a": 1.0}

    def gathered_correction_stats(stats, tokens):  # type: ignore[no-untyped-def]
        combined.append((stats, tokens))
        return {"mismatch_kl": 0.25}

    monkeypatch.setattr(co.dist, "world_size", lambda: 2)
    monkeypatch.setattr(co.dist, "all_reduce_mean", all_reduce_mean)
    monkeypatch.setattr(co, "gather_rollout", gather_rollout)
    monkeypatch.setattr(co, "gathered_correction_stats", gathered_correction_stats)
    out, completions, metrics = co.evaluate(
        pass_settings(), models(), sampled, score, NO_PASS, 0.5, {}
    )
    ((e, r, d, entropy, texts, pad),) = gathered
    assert e is exp and r is score.raw and d is score.ended and texts is sampled.completions
    assert torch.equal(entropy, torch.zeros(4, 3)) and pad == PAD
    assert reduced == [{"reward/a": 2.5}] and combined == [({"mismatch_kl": 0.125}, 9.0)]
    assert out is merged and completions == ["all"]
    assert metrics == co.rollout_metrics(merged, raw, ended, 0.5, NO_PASS) | {
        "reward/a": 1.0,
        "rollout/mismatch_kl": 0.25,
    }


# ---------------------------------------------------------------------------- collect_rollout


def test_collect_rollout_runs_the_stages_in_order_with_their_settings(monkeypatch):
    calls: list[tuple] = []

    def stage(name: str, result: Any):  # type: ignore[no-untyped-def]
        def run(*args):  # type: ignore[no-untyped-def]
            calls.append((name, args))
            return result

        return run

    sampled, score, result = object(), object(), (None, [], {})
    monkeypatch.setattr(co, "sample", stage("sample", sampled))
    monkeypatch.setattr(co, "score", stage("score", score))
    monkeypatch.setattr(co, "evaluate", stage("evaluate", result))
    sampling = SampleSettings(group_size=2, distribution=DISTRIBUTION, episodes=None)
    scoring = ScoreSettings(max_new_tokens=3, shaping=shaping(), greedy=None)
    settings = RolloutSettings(sampling, scoring, pass_settings(), MEASURED)
    algo, m, rewards, engine = object(), models(), object(), Engine()
    prompts, ids, timings = [prompt("a")], [[5]], {}
    out = co.collect_rollout(settings, algo, m, rewards, prompts, ids, 0.25, timings, engine)  # type: ignore[arg-type]
    assert out is result and set(timings) == {"time/rollout_s", "time/score_s"}
    assert calls == [
        ("sample", (sampling, m, engine, prompts, ids, True)),  # MEASURED asks for them
        ("score", (scoring, algo, m, engine, rewards, sampled, ids)),
        ("evaluate", (settings.passes, m, sampled, score, MEASURED, 0.25, timings)),
    ]


# ---------------------------------------------------------------------------- a real model


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoModelForCausalLM

    from proxrl.models.tiny import build_tiny_lm

    path = tmp_path_factory.mktemp("lm") / "lm"
    build_tiny_lm(path, ["ab"], hidden_size=8, num_layers=1, num_heads=2, max_positions=64)
    return AutoModelForCausalLM.from_pretrained(path, torch_dtype=F64).eval()


def test_the_passes_on_a_real_model_match_one_forward_of_the_whole_batch(lm):
    """The recorders' signatures are the real functions': packed, out-of-order micro-batches
    give the log-probs, entropy and reference log-probs of one padded forward over all rows."""
    from proxrl.algos.online.critic import NoCritic
    from proxrl.rollout.forward import policy_forward

    ids = torch.tensor([[3, 4], [5, 6], [7, 8], [9, 10]])
    sampled = batch()
    sampled.prompt_ids = ids
    m = models(actor=lm, critic=NoCritic(), reference=lm)
    out = co.forward_passes(pass_settings(shares_prefix=False), m, sampled, scored(), TRAINER)
    whole = policy_forward(
        lm,
        torch.cat([ids, RESPONSE_IDS], 1),
        torch.cat([torch.ones(4, 2, dtype=torch.long), RESPONSE_MASK], 1),
        2,
        0.7,
        with_entropy=True,
        **DISTRIBUTION.truncation,
    )
    exp = out.experience
    assert exp.logprobs.dtype == F64
    assert torch.allclose(exp.logprobs, whole.logprobs, rtol=0, atol=1e-12)
    assert torch.allclose(out.entropy, whole.entropy, rtol=0, atol=1e-12)
    assert torch.allclose(exp.ref_logprobs, whole.logprobs, rtol=0, atol=1e-12)
    assert torch.equal(exp.values, torch.zeros(4, 3))
