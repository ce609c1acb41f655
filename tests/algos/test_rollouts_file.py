"""rollouts_file.py function by function (issue 54: tests that fail when the wiring breaks),
each value hand-computed: the row checks (``_check_*``) at their boundaries, the readers
(JSONL, Parquet) and their messages whole, ``iteration_rows``, and the training path
(``recorded_stage``, ``prompt_examples``, ``this_ranks_rows``, ``recorded_rollout``, with the
loop's forward passes replaced by a recorder).

Fast on purpose (a mutation run executes this module once per mutant): no trainer is
imported and no model is built; the tokenizer is a byte-level BPE trained on one character
(259 ids: pad 0, bos 1, eos 2, then the 256 byte characters; a printable ASCII character c
is id ord(c) - 30), the "model" a directory with a config.json only.

Every call that hands a function the run's options goes through ``Run`` below (the
``RolloutsFile`` record, built from an ``OnlineConfig`` by ``narrowed`` as the run builds it):
adapt them there, in one place."""

from __future__ import annotations

import json
import locale
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from proxrl.algos.online import rollouts_file as rf
from proxrl.algos.online.collect import RolloutBatch, Sampled, Scored
from proxrl.algos.online.config import OnlineConfig
from proxrl.algos.online.roles import Models
from proxrl.algos.online.rollout_settings import RolloutSettings, ScoreSettings, ScoreShaping
from proxrl.algos.online.rollouts_file import Limits, RolloutsFile, Trajectory
from proxrl.data.formats import PromptExample
from proxrl.runtime import distributed as dist
from proxrl.runtime.config import narrowed
from proxrl.runtime.errors import ProxrlError

PAD, BOS, EOS = 0, 1, 2


def ids(text: str) -> list[int]:
    """The tokenizer's ids of ``text``'s characters (printable ASCII: ord(c) - 30)."""
    return [ord(c) - 30 for c in text]


H, E, A, B, C = ids("heabc")  # 74, 71, 67, 68, 69
LIMITS = Limits(vocab_size=259, group_size=2, max_prompt_length=3, max_new_tokens=4, context=6)
GOOD = {"prompt_ids": [H, E], "response_ids": [A, B], "logprobs": [-0.5, -1.0], "reward": 1.0}


@pytest.fixture(scope="module")
def tok() -> Any:
    from proxrl.models.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer(["a"])
    assert (len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id) == (259, PAD, EOS)
    assert tokenizer.decode([H, E, A, B, C]) == "heabc"
    return tokenizer


@pytest.fixture(scope="module")
def model(tok: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A model directory that records a 6-position context, with the tokenizer beside it."""
    path = tmp_path_factory.mktemp("model")
    (path / "config.json").write_text(
        json.dumps({"model_type": "llama", "max_position_embeddings": 6})
    )
    tok.save_pretrained(path)
    return str(path)


def _jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def refused(call: Any, *args: Any) -> str:
    with pytest.raises(ProxrlError) as error:
        call(*args)
    return str(error.value)


# ---- the calls that take the run's config (one place to adapt) -------------------------------


@dataclass
class Run:
    """A grpo-like run on a rollouts file: the record the functions read (``RolloutsFile``,
    from the config as the run builds it), and the calls."""

    model: str
    rollouts_file: str
    group_size: int = 2
    rollout_batch_size: int = 1
    max_new_tokens: int = 4
    trust_remote_code: bool = False

    @property
    def file(self) -> RolloutsFile:
        config = OnlineConfig(
            model=self.model,
            rollouts_file=self.rollouts_file,
            group_size=self.group_size,
            rollout_batch_size=self.rollout_batch_size,
            max_prompt_length=3,
            max_new_tokens=self.max_new_tokens,
            trust_remote_code=self.trust_remote_code,
        )
        return narrowed(RolloutsFile, config)

    def limits(self, tokenizer: Any) -> Limits:
        return rf.limits_of(self.file, tokenizer)

    def iteration_rows(self, tokenizer: Any) -> list[Trajectory]:
        return rf.iteration_rows(self.file, tokenizer)

    def validate(self, tokenizer: Any = None) -> list[Trajectory]:
        return rf.validate_rollouts_file(self.file, tokenizer)

    def recorded_rollout(self, shaping: ScoreShaping, models: Models, timings: dict) -> Any:
        passes, old_policy = object(), object()  # handed on to evaluate, untouched
        settings = RolloutSettings(
            None,  # type: ignore[arg-type]  # the sample stage's: the file replaces it
            ScoreSettings(self.max_new_tokens, shaping, None),
            passes,  # type: ignore[arg-type]
            old_policy,  # type: ignore[arg-type]
        )
        return settings, rf.recorded_rollout(self.file, settings, models, 0.25, timings)


# ---- _check_ids ------------------------------------------------------------------------------


def test_ids_must_be_non_empty_with_or_without_limits():
    for limits in (None, LIMITS):
        assert refused(rf._check_ids, "f:1", "prompt_ids", [], limits) == (
            "f:1: prompt_ids: expected a non-empty list of token ids (integers), got an empty list"
        )
    rf._check_ids("f:1", "response_ids", [-1, 10**6], None)  # no limits: only non-empty


def test_ids_within_the_vocabulary_both_ends():
    rf._check_ids("f:1", "prompt_ids", [0, 258], LIMITS)
    for outside in (259, -1):
        assert refused(rf._check_ids, "f:1", "response_ids", [5, outside, 300], LIMITS) == (
            f"f:1: response_ids: token id {outside} is outside this tokenizer's vocabulary "
            "(0..258): ids of another tokenizer?"
        )


def test_prompt_and_response_lengths_have_their_own_limit():
    rf._check_ids("f:1", "prompt_ids", [5] * 3, LIMITS)  # max_prompt_length 3
    rf._check_ids("f:1", "response_ids", [5] * 4, LIMITS)  # max_new_tokens 4
    assert refused(rf._check_ids, "f:1", "prompt_ids", [5] * 4, LIMITS) == (
        "f:1: prompt_ids: expected at most 3 tokens (max_prompt_length), got 4"
    )
    assert refused(rf._check_ids, "f:1", "response_ids", [5] * 5, LIMITS) == (
        "f:1: response_ids: expected at most 4 tokens (max_new_tokens), got 5"
    )


# ---- _check_lengths, _check_mask, _check_logprobs, _check_rewards, _check_context ---------------


def _per_token(**columns: Any) -> SimpleNamespace:
    return SimpleNamespace(**{"response_ids": [5, 6, 7], "logprobs": [0.0] * 3} | columns)


def test_each_per_token_column_is_as_long_as_the_response():
    rf._check_lengths("f:1", _per_token(rewards=None, loss_mask=None))
    rf._check_lengths("f:1", _per_token(rewards=[0.0] * 3, loss_mask=[1] * 3))
    for field, noun in (("logprobs", "numbers"), ("rewards", "numbers"), ("loss_mask", "values")):
        for wrong in (2, 4):
            row = _per_token(rewards=None, loss_mask=None)
            setattr(row, field, [0] * wrong)
            assert refused(rf._check_lengths, "f:1", row) == (
                f"f:1: {field}: expected 3 {noun} (one per response token), got {wrong}"
            )


def test_a_mask_is_0s_and_1s_with_a_1():
    rf._check_mask("f:1", None)
    rf._check_mask("f:1", [1])
    rf._check_mask("f:1", [0, 1, 0])
    assert refused(rf._check_mask, "f:1", [1, 2, -1]) == (
        "f:1: loss_mask: expected 3 values, each 0 or 1, got 2"
    )
    assert refused(rf._check_mask, "f:1", [0, -1]) == (
        "f:1: loss_mask: expected 2 values, each 0 or 1, got -1"
    )
    assert refused(rf._check_mask, "f:1", [0, 0, 0]) == (
        "f:1: loss_mask: expected at least one 1 (a token the policy produced), got all 3 0: "
        "the row has nothing to train on"
    )


def test_a_model_tokens_log_probability_is_finite_and_at_most_the_slack():
    assert rf.LOGPROB_SLACK == 1e-6
    rf._check_logprobs("f:1", [0.0, -50.0, 1e-6], [1, 1, 1])
    rf._check_logprobs("f:1", [3.0, -0.5], [0, 1])  # loss_mask 0: any finite value
    for value in (2e-6, float("inf"), float("-inf"), float("nan")):
        assert refused(rf._check_logprobs, "f:1", [-0.5, value], [1, 1]) == (
            f"f:1: logprobs: expected finite log-probabilities <= 0, got {value}"
        )
    for value in (float("-inf"), float("nan")):
        assert refused(rf._check_logprobs, "f:1", [-0.5, 3.0, value], [1, 0, 0]) == (
            f"f:1: logprobs: expected a finite number at token 2 (loss_mask 0: any finite "
            f"value), got {value}"
        )
    with pytest.raises(ValueError):  # one mask value per log-prob, not a silent truncation
        rf._check_logprobs("f:1", [-0.5, -0.5], [1])


def _rewards(reward: Any, rewards: Any, mask: list[int] | None = None) -> SimpleNamespace:
    n = len(rewards) if rewards is not None else 2
    return SimpleNamespace(reward=reward, rewards=rewards, policy_mask=mask or [1] * n)


def test_one_finite_reward_or_per_token_rewards_off_the_observations():
    rf._check_rewards("f:1", _rewards(-3.5, None))
    rf._check_rewards("f:1", _rewards(None, [0.5, 0.0, -0.0], [1, 0, 0]))
    for reward, rewards in ((None, None), (1.0, [1.0, 0.0])):
        assert refused(rf._check_rewards, "f:1", _rewards(reward, rewards)) == (
            "f:1: reward: expected reward (a number) or rewards (per token)"
        )
    for value in (float("inf"), float("nan")):
        assert refused(rf._check_rewards, "f:1", _rewards(value, None)) == (
            f"f:1: reward: expected a finite number, got {value}"
        )
        assert refused(rf._check_rewards, "f:1", _rewards(None, [0.0, value], [1, 0])) == (
            f"f:1: rewards: expected finite numbers, got {value}"
        )
    assert refused(rf._check_rewards, "f:1", _rewards(None, [0.5, 0.0, 0.25], [1, 1, 0])) == (
        "f:1: rewards: expected 0 at token 2 (loss_mask 0: an observation); put a turn's reward "
        "on its last model token"
    )
    with pytest.raises(ValueError):  # one mask value per reward, not a silent truncation
        rf._check_rewards("f:1", _rewards(None, [0.0, 0.0], [1]))


def test_prompt_and_response_fit_the_context_exactly():
    rf._check_context("f:1", 2, 4, 6)
    rf._check_context("f:1", 300, 300, None)
    assert refused(rf._check_context, "f:1", 3, 4, 6) == (
        "f:1: response_ids: prompt_ids (3 tokens) + response_ids (4 tokens) = 7 tokens is longer "
        "than the model's context (6 positions)"
    )


def test_a_response_text_is_what_the_ids_decode_to(tok):
    rf._check_text("f:1", None, [H, E], tok)
    rf._check_text("f:1", "he", [H, E, EOS, PAD], tok)  # special tokens skipped
    long = [A] * 45
    assert refused(rf._check_text, "f:1", "b" * 45, long, tok) == (
        f"f:1: response_ids: decode to {'a' * 40!r} with this model's tokenizer, not the row's "
        f"response {'b' * 40!r}: ids of another tokenizer?"
    )


# ---- rollout_row, _type_error, _where, _trajectory ---------------------------------------------


def test_rollout_row_checks_against_the_tokenizer_and_the_limits_it_is_given(tok):
    row = {**GOOD, "group": "a", "response": "ab"}
    assert rf.rollout_row("f:1", row, tok, LIMITS).score == 1.0
    assert refused(rf.rollout_row, "f:1", {**row, "response": "ba"}, tok) == (
        "f:1: response_ids: decode to 'ab' with this model's tokenizer, not the row's response "
        "'ba': ids of another tokenizer?"
    )
    rf.rollout_row(
        "f:1",
        {
            **row,
            "prompt_ids": [5] * 3,
            "response_ids": [A] * 4,
            "logprobs": [0.0] * 4,
            "response": "x",
        },
    )
    assert refused(rf.rollout_row, "f:1", {**row, "prompt_ids": [5] * 4}, None, LIMITS) == (
        "f:1: prompt_ids: expected at most 3 tokens (max_prompt_length), got 4"
    )
    assert refused(
        rf.rollout_row,
        "f:1",
        {
            **row,
            "prompt_ids": [5] * 3,
            "response_ids": [A] * 4,
            "logprobs": [0.0] * 4,
            "response": None,
        },
        None,
        LIMITS,
    ) == (
        "f:1: response_ids: prompt_ids (3 tokens) + response_ids (4 tokens) = 7 tokens is longer "
        "than the model's context (6 positions)"
    )


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ([1, 2], "f:9: expected an object of columns, got list"),
        (
            {k: v for k, v in GOOD.items() if k != "logprobs"} | {"group": 1},
            "f:9: logprobs: expected a list of numbers (one per response token); the row has none",
        ),
        ({**GOOD, "group": 1.5}, "f:9: group: expected a string or an integer, got 1.5"),
        (
            {**GOOD, "group": "a", "response_ids": [A, "x"]},
            "f:9: response_ids: expected a non-empty list of token ids (integers), got 'x' at "
            "position 1",
        ),
        (
            {**GOOD, "group": "a", "loss_mask": [1, 0.5]},
            "f:9: loss_mask: expected a list of 0s and 1s (one per response token), got 0.5 at "
            "position 1",
        ),
    ],
    ids=["not-an-object", "missing", "type", "position", "position-2"],
)
def test_a_type_error_is_one_line_naming_the_field(record, message):
    assert refused(rf.rollout_row, "f:9", record) == message


def test_an_unknown_column_names_the_row_it_is_in():
    assert refused(rf.rollout_row, "f:9", {**GOOD, "group": "a", "rewardz": 1}) == (
        "f:9: rewardz: unknown column; did you mean reward?"
    )
    with pytest.raises(ProxrlError) as error:  # without a context: "row"
        rf.RolloutRow.model_validate({**GOOD, "group": "a", "qq": 1})
    assert str(error.value) == (
        "row: qq: unknown column; expected prompt_ids, response_ids, logprobs, group, reward, "
        "rewards, loss_mask, response"
    )


def test_a_trajectory_is_the_rows_columns_its_score_and_group_as_text(tok):
    record = {**GOOD, "group": 7, "reward": None, "rewards": [0.5, 0.0], "loss_mask": [1, 0]}
    assert rf._trajectory("f:3", record, tok, LIMITS) == Trajectory(
        "f:3", [H, E], [A, B], [-0.5, -1.0], [1, 0], 0.5, "7", [0.5, 0.0]
    )
    assert rf._trajectory("f:4", {**GOOD, "group": "g"}, tok, LIMITS) == Trajectory(
        "f:4", [H, E], [A, B], [-0.5, -1.0], None, 1.0, "g", None
    )
    with pytest.raises(ProxrlError, match=r"^f:4: prompt_ids: token id 259 is outside"):
        rf._trajectory("f:4", {**GOOD, "group": "g", "prompt_ids": [259]}, tok, LIMITS)
    with pytest.raises(ProxrlError, match=r"^f:4: response_ids: decode to 'ab'"):
        rf._trajectory("f:4", {**GOOD, "group": "g", "response": "x"}, tok, LIMITS)


# ---- the readers --------------------------------------------------------------------------------


def test_jsonl_lines_are_numbered_from_1_blank_ones_skipped(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n\n  \n{"b": 2}\n')
    assert rf._jsonl_rows(path) == [(f"{path}:1", {"a": 1}), (f"{path}:4", {"b": 2})]
    path.write_text('{"a": 1}\n\n[1]\n')
    assert refused(rf._jsonl_rows, path) == f"{path}:3: expected a JSON object, got list"
    path.write_text('{"a": 1}\n{"a": \n')
    assert refused(rf._jsonl_rows, path) == f"{path}:2: expected a JSON object (Expecting value)"
    path.write_text('{"a": "\u00e9"}\n', encoding="utf-8")
    before = locale.setlocale(locale.LC_CTYPE)
    try:  # UTF-8 whatever the locale's encoding (C: ASCII, unless Python runs in UTF-8 mode)
        locale.setlocale(locale.LC_CTYPE, "C")
        assert rf._jsonl_rows(path) == [(f"{path}:1", {"a": "\u00e9"})]
    finally:
        locale.setlocale(locale.LC_CTYPE, before)
    missing = tmp_path / "none.jsonl"
    assert refused(rf._jsonl_rows, missing) == (
        f"rollouts_file: cannot read {missing}: No such file or directory"
    )


def test_parquet_rows_are_numbered_from_0_a_null_left_out(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "r.parquet"
    pq.write_table(pa.table({"a": [1, None, 3], "b": ["x", "y", None]}), path)
    assert rf._parquet_rows(path) == [
        (f"{path}:row 0", {"a": 1, "b": "x"}),
        (f"{path}:row 1", {"b": "y"}),
        (f"{path}:row 2", {"a": 3}),
    ]
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    assert refused(rf._parquet_rows, bad).startswith(
        f"rollouts_file: cannot read {bad} as Parquet ("
    )


def _row(group: Any, **over: Any) -> dict[str, Any]:
    return {**GOOD, "group": group, **over}


def test_read_rollouts_puts_a_groups_rows_together_in_file_order(tmp_path, tok):
    path = _jsonl(
        tmp_path / "r.jsonl",
        [
            _row("a"),
            _row(2, prompt_ids=[C]),
            _row("a", reward=2.0),
            _row(2, prompt_ids=[C], reward=3.0),
        ],
    )
    rows = rf.read_rollouts(path, tok, LIMITS)
    assert [(r.where.rpartition(":")[2], r.group, r.score) for r in rows] == [
        ("1", "a", 1.0),
        ("3", "a", 2.0),
        ("2", "2", 1.0),
        ("4", "2", 3.0),
    ]
    with pytest.raises(ProxrlError, match=r"r\.jsonl:1: prompt_ids: token id 259"):
        rf.read_rollouts(_jsonl(path, [_row("a", prompt_ids=[259])]), tok, LIMITS)
    with pytest.raises(ProxrlError, match=r"r\.jsonl:1: response_ids: decode to"):
        rf.read_rollouts(_jsonl(path, [_row("a", response="z")]), tok, LIMITS)


def test_read_rollouts_reads_a_parquet_file_by_its_suffix_in_any_case(tmp_path, tok):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "R.PARQUET"
    rows = [_row("a"), _row("a", reward=None, rewards=[0.0, 0.5])]
    pq.write_table(pa.table({k: [r.get(k) for r in rows] for k in rows[1]}), path)
    assert [(r.where, r.score, r.rewards) for r in rf.read_rollouts(path, tok, LIMITS)] == [
        (f"{path}:row 0", 1.0, None),
        (f"{path}:row 1", 0.5, [0.0, 0.5]),
    ]


def test_read_rollouts_refuses_an_empty_file_a_short_group_and_a_group_of_two_prompts(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("\n")
    assert refused(rf.read_rollouts, path, None, LIMITS) == (
        f"rollouts_file: {path} holds no trajectory"
    )
    _jsonl(path, [_row("a"), _row("b"), _row("a"), _row("b"), _row("b")])
    assert refused(rf.read_rollouts, path, None, LIMITS) == (
        f"{path}:5: group: expected 2 rows (group_size) in group 'b', got 3"
    )
    _jsonl(path, [_row("a"), _row("a"), _row(5)])
    assert refused(rf.read_rollouts, path, None, LIMITS) == (
        f"{path}:3: group: expected 2 rows (group_size) in group '5', got 1"
    )
    _jsonl(path, [_row("a"), _row("a"), _row("b"), _row("b", prompt_ids=[H])])
    assert refused(rf.read_rollouts, path, None, LIMITS) == (
        f"{path}:4: prompt_ids: expected those of the group's first row ({path}:3): a group "
        "shares one prompt"
    )


# ---- limits_of, iteration_rows, validate_rollouts_file ----------------------------------------


def test_the_runs_limits_come_from_the_config_the_tokenizer_and_the_models_context(
    model, tok, tmp_path
):
    run = Run(model, str(tmp_path / "r.jsonl"), group_size=3, max_new_tokens=5)
    assert run.limits(tok) == Limits(259, 3, 3, 5, 6)


def test_iteration_rows_are_the_runs_batch(model, tok, tmp_path):
    path = _jsonl(tmp_path / "r.jsonl", [_row("a"), _row("a", reward=0.0)])
    rows = Run(model, str(path)).iteration_rows(tok)
    assert [(r.where, r.score) for r in rows] == [(f"{path}:1", 1.0), (f"{path}:2", 0.0)]
    assert refused(Run(model, str(path), rollout_batch_size=2).iteration_rows, tok) == (
        f"rollouts_file: {path} holds 2 trajectories; expected rollout_batch_size × group_size = 4"
    )
    _jsonl(path, [_row("a", prompt_ids=[H, E, A], response_ids=[A] * 4, logprobs=[0.0] * 4)] * 2)
    assert refused(Run(model, str(path)).iteration_rows, tok) == (  # the model's 6 positions
        f"{path}:1: response_ids: prompt_ids (3 tokens) + response_ids (4 tokens) = 7 tokens is "
        "longer than the model's context (6 positions)"
    )


def test_the_models_context_and_tokenizer_are_read_with_trust_remote_code(
    model, tok, tmp_path, monkeypatch
):
    """The run's trust_remote_code reaches both loaders (a model with custom code would not
    load its config or tokenizer without it)."""
    import proxrl.models.tokenizer

    contexts: list[tuple[str, bool]] = []
    tokenizers: list[tuple[str, bool]] = []
    monkeypatch.setattr(rf, "_context", lambda path, trust: contexts.append((path, trust)) or 5)
    monkeypatch.setattr(
        proxrl.models.tokenizer,
        "load_tokenizer",
        lambda path, trust_remote_code: tokenizers.append((path, trust_remote_code)) or tok,
    )
    path = _jsonl(tmp_path / "r.jsonl", [_row("a"), _row("a")])
    for trust in (True, False):
        run = Run(model, str(path), trust_remote_code=trust)
        assert run.limits(tok) == Limits(259, 2, 3, 4, 5)
        assert len(run.validate()) == 2
    assert contexts == [(model, True)] * 2 + [(model, False)] * 2
    assert tokenizers == [(model, True), (model, False)]


def test_validate_loads_the_models_tokenizer_when_given_none(model, tok, tmp_path):
    path = _jsonl(tmp_path / "r.jsonl", [_row("a", response="ab"), _row("a")])
    assert [r.response_ids for r in Run(model, str(path)).validate()] == [[A, B], [A, B]]
    assert [r.score for r in Run(model, str(path)).validate(tok)] == [1.0, 1.0]
    _jsonl(path, [_row("a", response="ba"), _row("a")])
    with pytest.raises(ProxrlError, match=r"r\.jsonl:1: response_ids: decode to 'ab'"):
        Run(model, str(path)).validate()


# ---- the training path: recorded_stage, prompt_examples, this_ranks_rows, recorded_rollout ------


def trajectory(
    where: str,
    prompt: list[int],
    response: list[int],
    logprobs: list[float],
    score: float,
    mask: list[int] | None = None,
    rewards: list[float] | None = None,
) -> Trajectory:
    return Trajectory(where, prompt, response, logprobs, mask, score, "g", rewards)


def equal(actual: torch.Tensor, expected: list[Any], dtype: torch.dtype) -> bool:
    return actual.dtype == dtype and torch.equal(actual, torch.tensor(expected, dtype=dtype))


def test_recorded_stage_without_masks_or_per_token_rewards(tok):
    rows = [
        trajectory("f:1", [BOS, H, E], [A, B, EOS], [-0.5, -0.25, -1.0], 1.0),
        trajectory("f:2", [C], [C], [-2.0], -1.0),
    ]
    sampled, scores, token_rewards = rf.recorded_stage(rows, tok, torch.device("cpu"))
    samples = sampled.samples
    assert equal(samples.response_ids, [[A, B, EOS], [C, PAD, PAD]], torch.long)
    assert equal(samples.response_mask, [[1, 1, 1], [1, 0, 0]], torch.long)
    assert equal(samples.logprobs, [[-0.5, -0.25, -1.0], [-2.0, 0.0, 0.0]], torch.float32)
    assert samples.entropy is None and samples.action_mask is None
    assert equal(sampled.prompt_ids, [[BOS, H, E], [PAD, PAD, C]], torch.long)
    assert equal(sampled.prompt_mask, [[1, 1, 1], [0, 0, 1]], torch.long)
    assert sampled.prompts == [PromptExample("he", None, "f:1"), PromptExample("c", None, "f:2")]
    assert sampled.completions == ["ab", "c"]
    assert equal(scores, [1.0, -1.0], torch.float32)
    assert token_rewards is None


def test_recorded_stage_with_a_loss_mask_and_per_token_rewards(tok):
    """Row 1's rewards at their tokens; row 2's one reward at its last model token (by the
    action mask: its loss_mask ends in an observation); log-probs 0 off the model's tokens."""
    rows = [
        trajectory("f:1", [H], [A, B, C], [-0.5, 3.0, -0.25], 0.75, [1, 0, 1], [0.25, 0.0, 0.5]),
        trajectory("f:2", [H, E], [B, C], [-1.0, 2.0], 2.0, [1, 0]),
        trajectory("f:3", [E], [A], [-0.125], -1.5),
    ]
    sampled, scores, token_rewards = rf.recorded_stage(rows, tok, torch.device("cpu"))
    samples = sampled.samples
    assert equal(samples.response_mask, [[1, 1, 1], [1, 1, 0], [1, 0, 0]], torch.long)
    assert equal(samples.action_mask, [[1, 0, 1], [1, 0, 0], [1, 0, 0]], torch.long)
    assert equal(
        samples.logprobs, [[-0.5, 0.0, -0.25], [-1.0, 0.0, 0.0], [-0.125, 0.0, 0.0]], torch.float32
    )
    assert sampled.completions == ["abc", "bc", "a"]
    assert equal(scores, [0.75, 2.0, -1.5], torch.float32)
    assert token_rewards is not None
    assert equal(
        token_rewards, [[0.25, 0.0, 0.5], [2.0, 0.0, 0.0], [-1.5, 0.0, 0.0]], torch.float64
    )


def test_recorded_stage_pays_a_single_reward_at_the_last_response_token_without_masks(tok):
    rows = [
        trajectory("f:1", [H], [A, B], [-0.5, -0.5], 0.5, None, [0.5, 0.0]),
        trajectory("f:2", [H], [B, C, A], [-1.0, -1.0, -1.0], 2.0),
    ]
    _, _, token_rewards = rf.recorded_stage(rows, tok, torch.device("cpu"))
    assert token_rewards is not None
    assert equal(token_rewards, [[0.5, 0.0, 0.0], [0.0, 0.0, 2.0]], torch.float64)


def test_recorded_stage_keeps_the_rewards_in_float64(tok):
    """0.1 and 0.3 are not float32 numbers: the per-token rewards and the scores paid at the
    last token are read into float64, not rounded through float32."""
    rows = [
        trajectory("f:1", [H], [A, B], [-0.5, -0.5], 0.1, None, [0.1, 0.0]),
        trajectory("f:2", [H], [B, C], [-1.0, -1.0], 0.3),
    ]
    _, scores, token_rewards = rf.recorded_stage(rows, tok, torch.device("cpu"))
    assert token_rewards is not None
    assert equal(token_rewards, [[0.1, 0.0], [0.0, 0.3]], torch.float64)
    assert equal(scores, [0.1, 0.3], torch.float32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the device is the point: CUDA")
def test_recorded_stage_builds_its_tensors_on_the_device(tok):
    """On a CPU-only machine every tensor is on the CPU whichever device is asked for (the
    device mutants of recorded_stage survive there): this one needs a GPU."""
    rows = [
        trajectory("f:1", [H, E], [A, B], [-0.5, 0.0], 0.5, [1, 0], [0.5, 0.0]),
        trajectory("f:2", [H], [B], [-1.0], 2.0),
    ]
    sampled, scores, token_rewards = rf.recorded_stage(rows, tok, torch.device("cuda"))
    samples = sampled.samples
    on_device = [samples.response_ids, samples.response_mask, samples.logprobs]
    on_device += [samples.action_mask, sampled.prompt_ids, sampled.prompt_mask, token_rewards]
    assert [t.device.type for t in on_device if t is not None] == ["cuda"] * 7
    assert scores.device.type == "cpu"  # with the score stage's other (B,) records


def test_prompt_examples_are_the_decoded_prompts_named_by_their_rows(tok):
    rows = [
        trajectory("f:7", [BOS, H, EOS], [A], [0.0], 0.0),
        trajectory("f:8", [E], [A], [0.0], 0),
    ]
    assert rf.prompt_examples(rows, tok) == [
        PromptExample("h", None, "f:7"),
        PromptExample("e", None, "f:8"),
    ]


@pytest.mark.parametrize(
    ("world", "rank", "expected"),
    [
        (1, 0, range(12)),
        (2, 0, range(0, 6)),
        (2, 1, range(6, 12)),
        (4, 3, range(9, 12)),
        (4, 1, range(3, 6)),
    ],
)
def test_each_rank_takes_a_contiguous_block_of_whole_groups(monkeypatch, world, rank, expected):
    monkeypatch.setattr(dist, "world_size", lambda: world)
    monkeypatch.setattr(dist, "rank", lambda: rank)
    rows = list(range(12))  # 4 groups of 3
    assert rf.this_ranks_rows(rows, 3) == list(expected)  # type: ignore[arg-type]


def test_a_ranks_block_is_whole_groups_of_the_file(monkeypatch):
    monkeypatch.setattr(dist, "world_size", lambda: 2)
    monkeypatch.setattr(dist, "rank", lambda: 1)
    assert rf.this_ranks_rows(list(range(8)), 2) == [4, 5, 6, 7]  # type: ignore[arg-type]
    assert rf.this_ranks_rows(list(range(8)), 4) == [4, 5, 6, 7]  # type: ignore[arg-type]


@pytest.fixture
def evaluated(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The loop's forward passes (``collect.evaluate``) replaced by a recorder of its
    arguments."""
    calls: list[tuple[Any, ...]] = []

    def recorder(*args: Any) -> tuple[Any, list[str], dict[str, float]]:
        calls.append(args)
        return "experience", ["completions"], {"metric": 1.0}

    monkeypatch.setattr(rf, "evaluate", recorder)
    return calls


def test_recorded_rollout_shapes_and_evaluates_this_ranks_share(
    model, tok, tmp_path, monkeypatch, evaluated
):
    """Rank 1 of 2 on two groups: the second group's rows. Row 3 did not stop (3 tokens =
    max_new_tokens, no EOS): the no-stop rule replaces its 0.75 by −1, the overlong rule adds
    0.5 · (2 − 3) / 1 = −0.5 and the clip takes −1.5 to −1.25; row 4 (2 tokens, EOS) keeps its
    1.0. The change to the sum, −2.0, lands on row 3's last model token (its loss_mask ends in
    an observation): 0.5 − 2.0."""
    monkeypatch.setattr(dist, "world_size", lambda: 2)
    monkeypatch.setattr(dist, "rank", lambda: 1)
    path = _jsonl(
        tmp_path / "r.jsonl",
        [
            _row("a", response_ids=[A, EOS]),
            _row("a", response_ids=[B], logprobs=[-1.0], reward=0.0),
            _row(
                "b",
                prompt_ids=[C],
                response_ids=[A, B, C],
                logprobs=[-0.5, -0.5, 2.0],
                loss_mask=[1, 1, 0],
                reward=None,
                rewards=[0.25, 0.5, 0.0],
            ),
            _row("b", prompt_ids=[C], response_ids=[C, EOS], logprobs=[-0.125, -0.5]),
        ],
    )
    actor = torch.nn.Linear(1, 1)
    models = Models(actor, None, None, tok)  # type: ignore[arg-type]
    shaping = ScoreShaping(-1.0, "replace", 1, 0.5, 3, 1.25)
    timings: dict[str, float] = {}
    settings, batch = Run(
        model, str(path), rollout_batch_size=2, max_new_tokens=3
    ).recorded_rollout(shaping, models, timings)
    assert len(evaluated) == 1
    passes, got_models, sampled, scored, source, kl_coef, got_timings = evaluated[0]
    assert passes is settings.passes and source is settings.old_policy
    assert got_models is models and got_timings is timings and kl_coef == 0.25
    assert isinstance(sampled, Sampled) and isinstance(scored, Scored)
    assert sampled.prompts == [
        PromptExample("c", None, f"{path}:3"),
        PromptExample("c", None, f"{path}:4"),
    ]
    assert equal(sampled.samples.response_ids, [[A, B, C], [C, EOS, PAD]], torch.long)
    assert equal(sampled.samples.action_mask, [[1, 1, 0], [1, 1, 0]], torch.long)
    assert equal(scored.raw, [0.75, 1.0], torch.float32)
    assert equal(scored.scores, [-1.25, 1.0], torch.float32)
    assert equal(scored.ended, [False, True], torch.bool)
    assert scored.parts == {} and scored.greedy_scores is None and scored.combined is None
    assert scored.token_rewards is not None
    assert equal(scored.token_rewards, [[0.25, -1.5, 0.0], [0.0, 1.0, 0.0]], torch.float64)
    assert batch == RolloutBatch(
        "experience",  # type: ignore[arg-type]
        ["completions"],
        [0, 1, 2, 3],
        {"metric": 1.0},
        prompts=[PromptExample("he", None, f"{path}:{n}") for n in (1, 2)]
        + [PromptExample("c", None, f"{path}:{n}") for n in (3, 4)],
    )


def test_recorded_rollout_on_one_process_without_a_loss_mask(model, tok, tmp_path, evaluated):
    """One process: every row. Row 1 reaches max_new_tokens (2) without an EOS, row 2 has one
    at its end: the no-stop rule subtracts 0.5 from row 1's 1.0 only, at its last response
    token (no loss_mask: the response mask's)."""
    rows = [
        _row("a", reward=None, rewards=[0.5, 0.5]),
        _row("a", response_ids=[B, EOS], reward=-2.0),
    ]
    path = _jsonl(tmp_path / "r.jsonl", rows)
    models = Models(torch.nn.Linear(1, 1), None, None, tok)  # type: ignore[arg-type]
    shaping = ScoreShaping(0.5, "subtract", 0, 1.0, 2, 0.0)
    _, batch = Run(model, str(path), max_new_tokens=2).recorded_rollout(shaping, models, {})
    sampled, scored = evaluated[0][2], evaluated[0][3]
    assert equal(sampled.samples.response_ids, [[A, B], [B, EOS]], torch.long)
    assert sampled.samples.action_mask is None
    assert equal(scored.raw, [1.0, -2.0], torch.float32)
    assert equal(scored.scores, [0.5, -2.0], torch.float32)
    assert equal(scored.ended, [False, True], torch.bool)
    assert scored.token_rewards is not None
    assert equal(scored.token_rewards, [[0.5, 0.0], [0.0, -2.0]], torch.float64)
    assert batch.rows == [0, 1] and batch.completions == ["completions"]
