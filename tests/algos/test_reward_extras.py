"""Reward functions get what TRL's GRPOTrainer passes besides prompts, completions and the
data's columns: ``completion_ids`` (each completion's token ids) and ``trainer_state`` (where
the run is), each only to a function that takes it. A column a function needs and the data
lacks is one line before any model loads."""

from __future__ import annotations

import inspect

import pytest
from transformers import AutoTokenizer

from proxrl.algos.online import grpo
from proxrl.algos.online.placement import base as local_placement
from proxrl.data.formats import PromptExample
from proxrl.rollout.rewards import FunctionReward, TrainerState, with_extras
from proxrl.runtime.errors import ProxrlError
from tests.algos.test_online import small

PROMPTS = [PromptExample("2+2=", None, "row 0", {"answer": "4"})] * 2
COMPLETIONS = ["4", "5"]
IDS = [[7, 8, 2], [9]]
STATE = TrainerState(global_step=3, iteration=4, max_steps=10)
COLUMNS = with_extras({"answer": ["4", "4"]}, IDS, STATE)


def _given(fn) -> dict:
    seen: dict = {}

    def recording(*args, **kwargs):
        seen.update(kwargs, args=args)
        return fn(*args, **kwargs)

    recording.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    FunctionReward("m:f", recording)(PROMPTS, COMPLETIONS, COLUMNS)
    return seen


def test_a_function_that_names_them_gets_completion_ids_and_trainer_state():
    def named(completions, completion_ids, trainer_state, answer):
        return [0.0] * len(completions)

    seen = _given(named)
    assert seen["completion_ids"] == IDS
    assert seen["trainer_state"] == STATE
    assert seen["trainer_state"].global_step == 3 and seen["trainer_state"].iteration == 4


def test_trl_kwargs_get_them_too():
    def trl(completions, **kwargs):
        return [0.0] * len(completions)

    seen = _given(trl)
    assert seen["completion_ids"] == IDS and seen["trainer_state"] == STATE
    assert seen["answer"] == ["4", "4"]


def test_a_function_that_does_not_take_them_is_not_given_them():
    def answer_only(completions, answer):
        return [0.0] * len(completions)

    def positional(p, c, **columns):  # no 'completions': called by position, columns only
        return [0.0] * len(c)

    assert set(_given(answer_only)) == {"completions", "answer", "args"}
    assert set(_given(positional)) == {"answer", "args"}


def test_a_positional_function_that_names_them_gets_them():
    def positional(p, c, completion_ids, **columns):
        return [0.0] * len(c)

    seen = _given(positional)
    assert seen["completion_ids"] == IDS and "trainer_state" not in seen


RECORDED: list[tuple[list[str], list[list[int]], TrainerState]] = []


def recording_reward(completions, completion_ids, trainer_state, **kwargs):
    """Records what grpo passes (tests.algos.test_reward_extras:recording_reward)."""
    RECORDED.append((list(completions), completion_ids, trainer_state))
    return [float(len(c)) for c in completions]


def test_grpo_passes_each_completions_token_ids_and_the_iteration(
    tiny_lm,
    word_prompts,
    tmp_path,
):
    RECORDED.clear()
    grpo.train(
        small(
            grpo.Config,
            tiny_lm,
            word_prompts,
            tmp_path,
            reward_fn=("tests.algos.test_reward_extras:recording_reward",),
            iterations=2,
            group_size=2,
        )
    )
    assert [state for _, _, state in RECORDED] == [TrainerState(0, 1, 2), TrainerState(1, 2, 2)]
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm)
    for completions, ids, _ in RECORDED:
        assert len(ids) == len(completions) == 16  # 8 prompts × group_size 2
        assert all(isinstance(t, int) for row in ids for t in row)
        assert [tokenizer.decode(row, skip_special_tokens=True) for row in ids] == completions


def needs_answer(completions, answer, **kwargs):
    return [0.0] * len(completions)


def test_a_missing_column_is_one_line_before_any_model_loads(
    tiny_lm,
    word_prompts,
    tmp_path,
    monkeypatch,
):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the columns were checked")

    monkeypatch.setattr(local_placement, "load_models", no_model)
    monkeypatch.setattr(local_placement, "load_rewards", no_model)
    with pytest.raises(ProxrlError) as e:
        grpo.train(
            small(
                grpo.Config,
                tiny_lm,
                word_prompts,
                tmp_path,
                reward_fn=("tests.algos.test_reward_extras:needs_answer",),
                iterations=1,
            )
        )
    assert str(e.value).startswith(
        "reward_fn 'tests.algos.test_reward_extras:needs_answer': parameter 'answer' is not passed"
    )
    assert not (tmp_path / "metrics.jsonl").exists()
