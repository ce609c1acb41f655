"""Reward functions are called as TRL's GRPOTrainer calls them, by keyword (``prompts=``,
``completions=``, the data's columns), so TRL's ``def f(completions, **kwargs)`` and
``def f(completions, answer, **kwargs)`` work unchanged; a function with no parameter named
``completions`` keeps the positional call ``fn(prompts, completions, **columns)``. A function
that cannot take the call is refused in one line, naming it and the parameter, before any
sampling; numpy arrays, torch tensors and TRL's ``None`` ("not applicable") are accepted."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from proxrl.algos.online import grpo
from proxrl.data.formats import PromptExample
from proxrl.rollout.rewards import EPISODE_MESSAGES, FunctionReward, WeightedRewards
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.metrics import read_metrics
from tests.algos.test_online import small

PROMPTS = [
    PromptExample("2+2=", None, "row 0", {"answer": "4", "level": 1}),
    PromptExample("3+3=", None, "row 1", {"answer": "6", "level": 2}),
]
COMPLETIONS = ["4", "5"]
COLUMNS = {"answer": ["4", "6"], "level": [1, 2]}


def _score(fn, columns=COLUMNS) -> list[float]:
    return FunctionReward("m:f", fn)(PROMPTS, COMPLETIONS, columns).tolist()


def trl_kwargs_only(completions, **kwargs):
    return [float(c == a) for c, a in zip(completions, kwargs["answer"], strict=True)]


def trl_named_column(completions, answer, **kwargs):
    assert kwargs["prompts"] == ["2+2=", "3+3="]
    return [float(c == a) for c, a in zip(completions, answer, strict=True)]


def trl_no_kwargs(completions, answer):
    return [float(c == a) for c, a in zip(completions, answer, strict=True)]


def keyword_only(*, prompts, completions, level, **kwargs):
    return [float(n) for n in level]


def positional(p, c, **columns):
    assert p == ["2+2=", "3+3="] and c == COMPLETIONS
    return [float(x == a) for x, a in zip(c, columns["answer"], strict=True)]


def project_style(prompts, completions, **columns):
    return [float(c == a) for c, a in zip(completions, columns["answer"], strict=True)]


@pytest.mark.parametrize(
    "fn", [trl_kwargs_only, trl_named_column, trl_no_kwargs, positional, project_style]
)
def test_each_call_shape_scores_the_same(fn):
    assert _score(fn) == [1.0, 0.0]


USER = {"role": "user", "content": "2+2="}


def trl_conversational(completions, answer, **kwargs):
    """TRL's own style for conversational data (its accuracy_reward, think_format_reward)."""
    return [float(c[0]["content"] == a) for c, a in zip(completions, answer, strict=True)]


def test_a_conversational_prompt_gets_its_completion_as_messages_as_in_trl():
    """GRPOTrainer passes ``[{"role": "assistant", "content": text}]`` per completion when the
    prompt is a list of messages (a string otherwise), so TRL's ``completion[0]["content"]``
    scores; proxrl used to pass the string, and indexing it raised TypeError."""
    seen = []

    def record(completions, **kwargs):
        seen.extend(completions)
        return [0.0] * len(completions)

    prompts = [PromptExample("", [USER], "row 0"), PromptExample("", [USER], "row 1")]
    score = FunctionReward("m:f", trl_conversational)(prompts, ["4", "5"], COLUMNS)
    assert score.tolist() == [1.0, 0.0]
    mixed = [PROMPTS[0], prompts[1]]  # each row in its own layout, as its prompt is passed
    FunctionReward("m:f", record)(mixed, ["4", "6"], COLUMNS)
    assert seen == ["4", [{"role": "assistant", "content": "6"}]]


def test_an_episode_passes_its_turns_after_the_prompt_and_nothing_else():
    """With an environment, a completion is the episode's messages (TRL's tool loop: assistant,
    tool, assistant); the private column that carries them reaches no function's kwargs."""
    turns = [
        [{"role": "assistant", "content": "call"}, {"role": "tool", "content": "4"}],
        [{"role": "assistant", "content": "6"}],
    ]
    got = {}

    def record(completions, **kwargs):
        got.update(kwargs, completions=completions)
        return [0.0, 0.0]

    prompts = [PromptExample("", [USER], "row 0"), PromptExample("", [USER], "row 1")]
    FunctionReward("m:f", record)(prompts, ["call 4", "6"], COLUMNS | {EPISODE_MESSAGES: turns})
    assert got["completions"] == turns and EPISODE_MESSAGES not in got


def test_a_column_named_as_a_positional_parameter_is_not_passed_twice():
    def f(answer, c, **columns):  # by position: answer is the prompts here
        return [float(x == a) for x, a in zip(c, columns["level"], strict=True)]

    assert _score(f) == [0.0, 0.0]


def test_keyword_only_parameters_get_their_column():
    assert _score(keyword_only) == [1.0, 2.0]


def test_a_lambda_and_a_callable_object():
    class Scorer:
        def __call__(self, completions, **kwargs):
            return [len(c) for c in completions]

    assert _score(Scorer()) == [1.0, 1.0]
    assert _score(lambda prompts, completions, **kw: [0.5] * len(completions)) == [0.5, 0.5]


def test_a_missing_column_is_named_before_the_call():
    called = []

    def needs_solution(completions, solution, **kwargs):
        called.append(1)
        return [0.0] * len(completions)

    source = FunctionReward("mod:needs_solution", needs_solution)
    rewards = WeightedRewards([source], [1.0])
    with pytest.raises(ProxrlError) as e:
        rewards.check_columns(["answer", "level"])
    assert str(e.value) == (
        "reward_fn 'mod:needs_solution': parameter 'solution' is not passed (proxrl passes "
        "prompts, completions, completion_ids, trainer_state and the prompt data's columns: "
        "answer, level)"
    )
    with pytest.raises(ProxrlError, match="parameter 'solution' is not passed"):
        rewards(PROMPTS, COMPLETIONS, COLUMNS)  # unchecked: the first call checks
    assert not called


def test_a_function_that_cannot_take_completions_is_refused_when_loaded():
    def one_argument(text):
        return [0.0]

    with pytest.raises(ProxrlError) as e:
        FunctionReward("mod:one_argument", one_argument)
    assert str(e.value) == (
        "reward_fn 'mod:one_argument': has no parameter named 'completions' and cannot take "
        "(prompts, completions) by position; expected def f(completions, **kwargs) (TRL's) or "
        "def f(prompts, completions, **columns)"
    )


@pytest.mark.parametrize(
    "returned",
    [
        np.array([1.0, 0.0]),
        np.array([1.0, 0.0], dtype=np.float32),
        torch.tensor([1.0, 0.0]),
        torch.tensor([1.0, 0.0], dtype=torch.bfloat16),
        [True, False],
        (np.float32(1.0), 0),
    ],
    ids=["numpy64", "numpy32", "torch", "torch-bf16", "bools", "numpy-scalars"],
)
def test_arrays_and_tensors_are_scores(returned):
    assert _score(lambda completions, **kw: returned) == [1.0, 0.0]


def test_a_2d_tensor_is_refused_in_one_line():
    with pytest.raises(ProxrlError, match="returned \\[1.0\\] for prompt index 0"):
        _score(lambda completions, **kw: torch.tensor([[1.0], [0.0]]))


def test_none_is_not_applicable_as_in_trl():
    """TRL: None → NaN, summed with nansum across functions; its mean leaves it out."""

    def math_only(completions, level, **kwargs):
        return [1.0 if n == 1 else None for n in level]

    def code_only(completions, level, **kwargs):
        return [None if n == 1 else 0.25 for n in level]

    rewards = WeightedRewards(
        [FunctionReward("m:math_only", math_only), FunctionReward("m:code_only", code_only)],
        [1.0, 2.0],
    )
    scored = rewards(PROMPTS, COMPLETIONS, COLUMNS)
    assert scored.total.tolist() == [1.0, 0.5]
    assert scored.parts == {"reward/math_only": 1.0, "reward/code_only": 0.25}
    # what GDPO combines itself: each source's scores (None as 0) and the weights
    assert scored.per_source.tolist() == [[1.0, 0.0], [0.0, 0.25]]
    assert scored.weights == (1.0, 2.0)


def test_none_everywhere_scores_zero_and_nan_is_still_refused():
    scored = WeightedRewards([FunctionReward("m:f", lambda completions, **kw: [None] * 2)], [1.0])(
        PROMPTS, COMPLETIONS, COLUMNS
    )
    assert scored.total.tolist() == [0.0, 0.0] and scored.parts == {}
    with pytest.raises(ProxrlError, match="returned nan for prompt index 0"):
        _score(lambda completions, **kw: [math.nan, 0.0])


def test_none_warns_once_and_no_source_never_warns(caplog):
    """An environment's reward alone (no source) is not 'every function returned None'."""
    with caplog.at_level("WARNING", logger="proxrl"):
        scored = WeightedRewards([], [])(PROMPTS, COMPLETIONS, COLUMNS)
        assert scored.total.tolist() == [0.0, 0.0] and "returned None" not in caplog.text
        assert scored.per_source.shape == (2, 0)
        rewards = WeightedRewards(
            [FunctionReward("m:f", lambda completions, **kw: [None] * 2)], [1.0]
        )
        rewards(PROMPTS, COMPLETIONS, COLUMNS)
        rewards(PROMPTS, COMPLETIONS, COLUMNS)
    assert caplog.text.count("returned None") == 1


def test_a_trl_style_function_trains_grpo(tiny_lm, word_prompts, tmp_path):
    grpo.train(
        small(
            grpo.Config,
            tiny_lm,
            word_prompts,
            tmp_path,
            reward_fn=("tests.algos.online_rewards:trl_echoes_word",),
            iterations=1,
            group_size=2,
            mini_batch_size=16,
        )
    )
    assert "reward/trl_echoes_word" in read_metrics(tmp_path)[0]


def test_a_missing_column_stops_before_the_first_update(tiny_lm, word_prompts, tmp_path):
    with pytest.raises(ProxrlError) as e:
        grpo.train(
            small(
                grpo.Config,
                tiny_lm,
                word_prompts,
                tmp_path,
                reward_fn=("tests.algos.online_rewards:trl_needs_answer",),
                iterations=1,
                group_size=2,
            )
        )
    assert str(e.value) == (
        "reward_fn 'tests.algos.online_rewards:trl_needs_answer': parameter 'answer' is not "
        "passed (proxrl passes prompts, completions, completion_ids, trainer_state and the "
        "prompt data's columns: word)"
    )
    assert not (tmp_path / "metrics.jsonl").exists()  # (checked before the run starts)


def test_an_episodes_reward_is_one_more_source_of_weight_one():
    """An environment's reward joins the record as a source: added to the total, a column of
    per_source with weight 1 (GDPO normalises it apart), its mean and the episode's metrics
    logged."""
    scored = WeightedRewards([FunctionReward("m:f", lambda completions, **kw: [1.0, 3.0])], [0.5])(
        PROMPTS, COMPLETIONS, COLUMNS
    )
    both = scored.with_source("environment", torch.tensor([2.0, 0.0]), {"episode/turns_mean": 2})
    assert both.total.tolist() == [2.5, 1.5]
    assert both.per_source.tolist() == [[1.0, 2.0], [3.0, 0.0]]
    assert both.weights == (0.5, 1.0)
    assert both.parts == {"reward/f": 2.0, "reward/environment": 1.0, "episode/turns_mean": 2}
