"""A multi-turn task that needs a tool: multiply two numbers with a ``calculator``.

A prompt is the user's ``"372*48"``; the answer is ``"17856"``. The tiny model of ``proxrl
demo`` cannot multiply a three-digit number by a two-digit one in a single forward pass (the
no-tool ablation of benchmarks/calculator_task.py measures it), but it can learn to *copy*:
the expression from the prompt into a tool call, and the tool's result into its answer. An
episode is three messages::

    assistant  <tool_call>{"name": "calculator", "arguments": {"expression": "372*48"}}</tool_call>
    tool       17856
    assistant  17856

- The tool is a plain typed Python function with a docstring (``calculator``): its JSON schema
  comes from ``transformers.utils.get_json_schema``, as a chat template's ``tools=`` takes it.
- The reward is exact: 1 when the final answer, stripped of whitespace, is the product.
- Demonstrations (SFT rows) are TRL conversational rows: the assistant's message carries
  ``tool_calls``, the tool's result is a role ``"tool"`` message, a ``tools`` column holds the
  schemas. The annotator is sloppy in the demo's way: a share ``tool_use`` of the demonstrations
  use the calculator, the others give up (``GIVE_UP``: no answer). SFT learns both habits, and
  with ``tool_use`` under one half its greedy policy gives up; RL with the exact reward learns
  which habit pays. (Demonstrations that state the product from memory instead are noise a tiny
  model cannot fit; among the tool traces they slow its learning to copy, on some seeds past
  the SFT budget, so the annotator gives up rather than guessing. They are the ablation.)
- The tiny tokenizer keeps every digit its own token (its corpus never puts two digits side by
  side, so BPE learns no digit merges) and has a chat template that renders tools, tool calls
  (Hermes/Qwen ``<tool_call>`` JSON) and tool messages.
"""

from __future__ import annotations

import ast
import json
import operator
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from transformers.utils import get_json_schema

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
GIVE_UP = "unknown"  # what the sloppy annotator answers when it does not use the calculator
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>")

# Hermes/Qwen style, made small: the tools' names on a system line, each tool call as
# <tool_call>{"name": ..., "arguments": {...}}</tool_call>, every assistant turn closed by EOS
# (the sampler stops there and the observation follows), a tool result as its own turn.
CHAT_TEMPLATE = (
    "{%- if tools %}<|system|>tools:"
    "{%- for t in tools %} {{ (t.function if t.function is defined else t).name }}{% endfor %}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}<|assistant|>{{ m.content or '' }}"
    "{%- for call in m.tool_calls or [] %}"
    "{%- set f = call.function if call.function is defined else call %}"
    '<tool_call>{"name": "{{ f.name }}", "arguments": '
    "{%- if f.arguments is string %} {{ f.arguments }}{% else %} {{ f.arguments | tojson }}"
    "{%- endif %}}</tool_call>"
    "{%- endfor %}<|eos|>"
    "{%- else %}<|{{ m.role }}|>{{ m.content }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif %}"
)

_OPERATORS: Mapping[type, Callable[[int, int], int]] = MappingProxyType(
    {
        ast.Add: operator.add,
        ast.Sub: operator.sub,
        ast.Mult: operator.mul,
    }
)


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of whole numbers.

    Args:
        expression: whole numbers joined by +, - and *, e.g. "372*48".
    """
    return str(_evaluate(ast.parse(expression.strip(), mode="eval").body))


def _evaluate(node: ast.expr) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError("expected whole numbers joined by +, - and *")


TOOLS = (calculator,)


def tool_schemas(tools: list[Callable[..., Any]] | None = None) -> list[dict[str, Any]]:
    """The JSON schemas a chat template's ``tools=`` takes (from signature + docstring)."""
    return [get_json_schema(t) for t in (list(TOOLS) if tools is None else tools)]


def answer_of(expression: str) -> str:
    return calculator(expression)


def final_answer_reward(row: Any, completion: str) -> float:
    """The episode's reward (``ToolEnvironment``'s ``reward_fn``): 1 when the final turn, stripped
    of whitespace, is the row's ``answer``, else 0."""
    return float(completion.strip() == str(row["answer"]))


def exact(prompts: list[Any], completions: list[Any], **columns: list) -> list[float]:
    """The same exact reward as a single-turn reward function (``proxrl.demo.calculator:exact``):
    the no-tool ablation's RL reward. A conversational prompt's completion comes as TRL's list of
    messages: its last one is the final answer."""
    finals = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float(c.strip() == str(a)) for c, a in zip(finals, columns["answer"], strict=True)]


def environment() -> Any:
    """An Environment for one episode (``environment: proxrl.demo.calculator:environment``): the
    ``calculator`` tool, the exact final-answer reward."""
    from proxrl.rollout.environment import ToolEnvironment

    return ToolEnvironment(list(TOOLS), final_answer_reward)


def environment_without_tool() -> Any:
    """The ablation's Environment: no tool is offered, so the first answer is the final one."""
    from proxrl.rollout.environment import ToolEnvironment

    return ToolEnvironment([], final_answer_reward)


# --- data ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskSizes:
    sft: int = 64
    rl: int = 1000
    eval: int = 200
    digits_a: int = 3
    digits_b: int = 2
    tool_use: float = 0.4
    """Share of demonstrations that call the calculator (the rest give up)."""


def _expression(rng: random.Random, digits_a: int, digits_b: int) -> str:
    a = rng.randrange(10 ** (digits_a - 1), 10**digits_a)
    b = rng.randrange(10 ** (digits_b - 1), 10**digits_b)
    return f"{a}*{b}"


def _unique_expressions(rng: random.Random, n: int, sizes: TaskSizes, taken: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        e = _expression(rng, sizes.digits_a, sizes.digits_b)
        if e not in taken:
            taken.add(e)
            out.append(e)
    return out


def prompt_messages(expression: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": expression}]


def tool_trace(expression: str) -> dict[str, Any]:
    """A demonstration that uses the calculator: a TRL conversational row with ``tool_calls``,
    a role ``"tool"`` result and the final answer, and the ``tools`` column."""
    result = calculator(expression)
    call = {
        "type": "function",
        "function": {"name": "calculator", "arguments": {"expression": expression}},
    }
    return {
        "messages": [
            *prompt_messages(expression),
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "calculator", "content": result},
            {"role": "assistant", "content": result},
        ],
        "tools": tool_schemas(),
    }


def give_up_trace(expression: str) -> dict[str, Any]:
    """A demonstration that neither calls the tool nor answers (the tool is offered)."""
    return {
        "messages": [*prompt_messages(expression), {"role": "assistant", "content": GIVE_UP}],
        "tools": tool_schemas(),
    }


def direct_trace(expression: str, with_tools: bool = True) -> dict[str, Any]:
    """A demonstration that states the product without calling the tool (``tools`` offered or
    not): the no-tool ablation's."""
    row: dict[str, Any] = {
        "messages": [
            *prompt_messages(expression),
            {"role": "assistant", "content": calculator(expression)},
        ]
    }
    if with_tools:
        row["tools"] = tool_schemas()
    return row


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def generate(data_dir: Path, sizes: TaskSizes, seed: int) -> dict[str, Path]:
    """Write the splits under ``data_dir``; returns their paths by name: ``sft`` (the sloppy
    annotator: tool traces and give-ups), ``sft_no_tool`` (the same expressions, every one
    answered directly, no tool offered: the ablation), ``rl_prompts`` and ``eval_prompts``
    ({messages, answer}). No expression is in two splits; eval is drawn first."""
    rng = random.Random(seed)
    seeds = {name: rng.randrange(2**31) for name in ("eval", "sft", "rl", "annotator")}
    taken: set[str] = set()
    eval_e = _unique_expressions(random.Random(seeds["eval"]), sizes.eval, sizes, taken)
    sft_e = _unique_expressions(random.Random(seeds["sft"]), sizes.sft, sizes, taken)
    rl_e = _unique_expressions(random.Random(seeds["rl"]), sizes.rl, sizes, taken)
    annotator = random.Random(seeds["annotator"])
    uses_tool = [annotator.random() < sizes.tool_use for _ in sft_e]

    def prompts(expressions: list[str]) -> list[dict[str, Any]]:
        return [{"messages": prompt_messages(e), "answer": answer_of(e)} for e in expressions]

    rows = {
        "sft": [
            tool_trace(e) if t else give_up_trace(e) for e, t in zip(sft_e, uses_tool, strict=True)
        ],
        "sft_no_tool": [direct_trace(e, with_tools=False) for e in sft_e],
        "rl_prompts": prompts(rl_e),
        "eval_prompts": prompts(eval_e),
    }
    return {name: write_jsonl(data_dir / f"{name}.jsonl", r) for name, r in rows.items()}


# --- tokenizer and base model --------------------------------------------------------------


def tokenizer_corpus() -> list[str]:
    """What the tiny BPE is trained on: the template's fixed text and each digit alone (never two
    digits side by side, so no digit merges: every number is read digit by digit)."""
    call = '{"name": "calculator", "arguments": {"expression": "'
    return [
        call,
        '"}}',
        "tools: calculator",
        GIVE_UP,
        "*",
        "+",
        "-",
        "\n",
        *map(str, range(10)),
    ] * 20


def build_base(
    output_dir: str | Path,
    *,
    seed: int,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    max_positions: int = 128,
) -> Path:
    """The tiny Llama and its tokenizer (``models.tiny``) with this task's chat template and its
    role and tool-call markers as added tokens (kept when a turn is decoded)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from proxrl.models.tiny import build_tiny_lm

    path = build_tiny_lm(
        output_dir,
        tokenizer_corpus(),
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        vocab_size=300,
        max_positions=max_positions,
        seed=seed,
    )
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.add_tokens([*ROLE_TOKENS, TOOL_CALL_OPEN, TOOL_CALL_CLOSE])
    tokenizer.chat_template = CHAT_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def main(argv: list[str] | None = None) -> None:
    """``python -m proxrl.demo.calculator [output_dir] [seed]``: the splits under
    ``output_dir/data`` and the tiny base model in ``output_dir/base`` (what
    configs/examples/calculator_*.yaml read)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "runs/calculator")
    seed = int(args[1]) if len(args) > 1 else 1
    paths = generate(out / "data", TaskSizes(sft=1500), seed)
    build_base(out / "base", seed=seed)
    print("\n".join(f"{name}: {path}" for name, path in paths.items()))
    print(f"base model: {out / 'base'}")


if __name__ == "__main__":
    main()
