"""The calculator task: the tool, the exact reward, the demonstrations as TRL tool-use rows
rendered through the task's chat template and masked as SFT trains them (the same tokens a
rollout appends), and the environment answering scripted model turns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxrl.data.encoding import encode_sft
from proxrl.data.formats import load_sft_examples
from proxrl.demo import calculator
from proxrl.models.tokenizer import load_tokenizer
from proxrl.rollout.environment import tool_schemas
from proxrl.rollout.multiturn import observation_ids

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "372*48"}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    base = calculator.build_base(
        tmp_path_factory.mktemp("calc") / "base", seed=0, hidden_size=8, num_heads=2
    )
    return load_tokenizer(str(base))


def test_the_calculator_multiplies_adds_and_subtracts_whole_numbers():
    assert calculator.calculator("372*48") == "17856"
    assert calculator.calculator(" 2+3*4 ") == "14"  # precedence, surrounding spaces
    assert calculator.calculator("10-25") == "-15"


@pytest.mark.parametrize("expression", ["2/3", "2**8", "__import__('os')", "1.5*2", "x*2"])
def test_the_calculator_refuses_anything_but_whole_numbers_and_plus_minus_times(expression):
    with pytest.raises((ValueError, SyntaxError)):
        calculator.calculator(expression)


def test_the_tool_schema_comes_from_the_signature_and_docstring():
    (schema,) = calculator.tool_schemas()
    function = schema["function"]
    assert function["name"] == "calculator"
    assert function["parameters"]["required"] == ["expression"]
    assert function["parameters"]["properties"]["expression"]["type"] == "string"
    assert function["description"] == "Evaluate an arithmetic expression of whole numbers."


def test_the_reward_is_exact_up_to_surrounding_whitespace():
    row = {"answer": "17856"}
    assert calculator.final_answer_reward(row, " 17856\n") == 1.0
    assert calculator.final_answer_reward(row, "17857") == 0.0
    assert calculator.final_answer_reward(row, "1785") == 0.0
    assert calculator.final_answer_reward(row, "17856 17856") == 0.0
    assert calculator.exact(["", ""], ["17856", "17865"], answer=["17856", "17856"]) == [1.0, 0.0]


def test_a_tool_trace_trains_on_the_call_and_the_answer_never_on_the_result(tokenizer, tmp_path):
    path = calculator.write_jsonl(tmp_path / "sft.jsonl", [calculator.tool_trace("372*48")])
    (example,) = load_sft_examples(str(path))
    (encoded,) = encode_sft([example], tokenizer, max_length=96)
    ids, mask = encoded.input_ids, encoded.loss_mask

    def text(keep: int) -> str:
        return tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m == keep])

    assert text(1) == CALL + "<|eos|>" + "17856<|eos|>"
    assert (
        text(0)
        == "<|system|>tools: calculator<|user|>372*48<|assistant|><|tool|>17856<|assistant|>"
    )
    # every digit is its own token: a number is read and copied digit by digit
    assert [tokenizer.decode([i]) for i in ids[-6:]] == ["1", "7", "8", "5", "6", "<|eos|>"]


def test_sft_masks_exactly_the_observation_tokens_a_rollout_appends(tokenizer, tmp_path):
    """The tool result between the two assistant turns is tokenised as the episode runner
    tokenises an observation: SFT and RL see the same tokens."""
    trace = calculator.tool_trace("372*48")
    path = calculator.write_jsonl(tmp_path / "sft.jsonl", [trace])
    (encoded,) = encode_sft(load_sft_examples(str(path)), tokenizer, max_length=96)
    ids, mask = encoded.input_ids, encoded.loss_mask
    hole = [i for i in range(encoded.prompt_length, len(ids)) if mask[i] == 0]
    conversation = [*trace["messages"][:1], {"role": "assistant", "content": CALL}]
    observation = observation_ids(
        tokenizer, conversation, trace["messages"][2:3], tool_schemas(calculator.TOOLS)
    )
    assert [ids[i] for i in hole] == observation
    assert hole == list(range(hole[0], hole[0] + len(observation)))  # one contiguous piece


def test_a_direct_answer_trains_on_the_answer_alone(tokenizer, tmp_path):
    path = calculator.write_jsonl(tmp_path / "sft.jsonl", [calculator.direct_trace("12*34")])
    (encoded,) = encode_sft(load_sft_examples(str(path)), tokenizer, max_length=96)
    trained = [i for i, m in zip(encoded.input_ids, encoded.loss_mask, strict=True) if m]
    assert tokenizer.decode(trained) == "408<|eos|>"


def test_the_environment_answers_a_correct_call_then_scores_the_final_answer():
    environment = calculator.environment()
    assert environment.tools == [calculator.calculator]
    environment.reset({"messages": calculator.prompt_messages("372*48"), "answer": "17856"})
    turn = environment.step(CALL)
    assert (turn.done, turn.reward, turn.tool_calls, turn.malformed_calls) == (False, 0.0, 1, 0)
    assert turn.messages == [{"role": "tool", "name": "calculator", "content": "17856"}]
    final = environment.step("17856")
    assert (final.done, final.reward, final.messages) == (True, 1.0, [])


def test_the_environment_answers_a_malformed_call_with_an_error_and_a_wrong_answer_with_0():
    environment = calculator.environment()
    environment.reset({"answer": "17856"})
    turn = environment.step('<tool_call>{"name": "calculator", "arguments": {"expression": "37')
    assert (turn.done, turn.malformed_calls) == (False, 1)
    assert turn.messages[0]["content"].startswith("error:")
    bad_expression = environment.step(CALL.replace("372*48", "372/48"))
    assert bad_expression.messages[0]["content"].startswith("error: ValueError")
    wrong = environment.step("17855")
    assert (wrong.done, wrong.reward, wrong.messages) == (True, 0.0, [])


def test_without_the_tool_a_call_is_an_error_and_the_answer_is_final():
    environment = calculator.environment_without_tool()
    assert environment.tools == []
    environment.reset({"answer": "17856"})
    assert environment.step(CALL).messages[0]["content"].startswith("error: no tool named")
    assert environment.step("17856").reward == 1.0


def test_the_splits_are_disjoint_and_the_annotator_uses_the_tool_at_its_rate(tmp_path):
    sizes = calculator.TaskSizes(sft=400, rl=100, eval=50, tool_use=0.35)
    paths = calculator.generate(tmp_path, sizes, seed=3)
    rows = {
        n: [json.loads(line) for line in Path(p).read_text().splitlines()] for n, p in paths.items()
    }
    expressions = {
        n: {r["messages"][0]["content"] for r in rows[n]}
        for n in ("sft", "rl_prompts", "eval_prompts")
    }
    assert [len(e) for e in expressions.values()] == [400, 100, 50]
    assert not expressions["sft"] & expressions["eval_prompts"]
    assert not expressions["rl_prompts"] & (expressions["sft"] | expressions["eval_prompts"])
    uses = sum("tool_calls" in r["messages"][1] for r in rows["sft"]) / 400
    assert 0.30 < uses < 0.40
    others = [r for r in rows["sft"] if "tool_calls" not in r["messages"][1]]
    assert all(r["messages"][1]["content"] == calculator.GIVE_UP for r in others)
    assert all("tools" in r for r in rows["sft"])
    assert all("tools" not in r for r in rows["sft_no_tool"])
    assert all(  # the ablation's demonstrations: the same expressions, each product stated
        r["messages"][1]["content"] == calculator.calculator(r["messages"][0]["content"])
        for r in rows["sft_no_tool"]
    )
    assert all(
        r["answer"] == calculator.calculator(r["messages"][0]["content"])
        for r in rows["eval_prompts"]
    )
    a, b = next(iter(expressions["eval_prompts"])).split("*")
    assert (len(a), len(b)) == (3, 2)
