"""Every command reads every TRL dataset type it can use, standard and conversational, from the
command line: sft (language modelling, prompt-completion), rm and dpo (preference with an
explicit or implicit prompt, unpaired preference), ppo and grpo (any row with a prompt). One
file per command mixes the layouts row by row; each run trains on every row."""

from __future__ import annotations

import json
import logging

import pytest

from proxrl.cli import main
from proxrl.runtime.metrics import read_metrics

USER = {"role": "user", "content": "copy: abc ="}
SYSTEM = {"role": "system", "content": "copy the word"}
GOOD = {"role": "assistant", "content": "abc"}
BAD = {"role": "assistant", "content": "xyz"}

SFT_ROWS = [
    {"text": "copy: abc = abc"},
    {"messages": [SYSTEM, USER, GOOD]},
    {"prompt": "copy: def =", "completion": " def"},
    {"prompt": [USER], "completion": [GOOD]},
]
PAIR_ROWS = [
    {"prompt": "copy: abc =", "chosen": " abc", "rejected": " xyz"},
    {"prompt": [SYSTEM, USER], "chosen": [GOOD], "rejected": [BAD]},
    {"chosen": "copy: def = def", "rejected": "copy: def = xyz"},
    {"chosen": [USER, GOOD], "rejected": [USER, BAD]},
]
UNPAIRED_ROWS = [
    {"prompt": "copy: abc =", "completion": " abc", "label": True},
    {"prompt": "copy: abc =", "completion": " xyz", "label": False},
    {"prompt": [USER], "completion": [GOOD], "label": True},
    {"prompt": [USER], "completion": [BAD], "label": False},
]
PROMPT_ROWS = [
    {"prompt": "copy: abc ="},
    {"prompt": [USER]},
    {"messages": [SYSTEM, USER]},
    {"prompt": "copy: def =", "completion": " def"},
    {"prompt": [USER], "chosen": [GOOD], "rejected": [BAD]},
    {"chosen": "copy: ghi = ghi", "rejected": "copy: ghi = xyz"},
    {"chosen": [SYSTEM, USER, GOOD], "rejected": [SYSTEM, USER, BAD]},
    {"prompt": "copy: jkl =", "completion": " jkl", "label": True},
]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _offline(command, tiny_lm, data, out, *extra):
    return [
        command,
        "--model",
        tiny_lm,
        "--data",
        data,
        "--output-dir",
        str(out),
        "--batch-size",
        "4",
        "--max-steps",
        "1",
        "--progress",
        "false",
        *extra,
    ]


@pytest.mark.parametrize(
    ("command", "rows", "logged"),
    [
        ("sft", SFT_ROWS, "sft: 4 training and 0 eval examples"),
        ("rm", PAIR_ROWS, "rm: 4 training and 0 eval comparisons"),
        ("rm", UNPAIRED_ROWS, "rm: 2 training and 0 eval comparisons"),
        ("dpo", PAIR_ROWS, "dpo: 4 training and 0 eval pairs"),
        ("dpo", UNPAIRED_ROWS, "dpo: 2 training and 0 eval pairs"),
    ],
    ids=["sft", "rm-pairs", "rm-unpaired", "dpo-pairs", "dpo-unpaired"],
)
def test_offline_commands_train_on_every_layout(command, rows, logged, tiny_lm, tmp_path, caplog):
    data = _write(tmp_path / "data.jsonl", rows)
    with caplog.at_level(logging.INFO):
        assert main(_offline(command, tiny_lm, data, tmp_path / "run")) == 0
    assert logged in caplog.text
    assert "does not round-trip" not in caplog.text
    assert [row["step"] for row in read_metrics(tmp_path / "run")][-1] == 1


@pytest.mark.parametrize("command", ["ppo", "grpo"])
def test_online_commands_take_prompts_from_every_layout(command, tiny_lm, tmp_path, caplog):
    prompts = _write(tmp_path / "prompts.jsonl", PROMPT_ROWS)
    argv = [
        command,
        "--model",
        tiny_lm,
        "--prompts",
        prompts,
        "--reward-fn",
        "tests.algos.online_rewards:target_fraction",
        "--output-dir",
        str(tmp_path / "run"),
        "--iterations",
        "1",
        "--rollout-batch-size",
        "8",
        "--max-new-tokens",
        "4",
        "--progress",
        "false",
        "--sample-every",
        "1",
    ]
    with caplog.at_level(logging.WARNING):
        assert main(argv) == 0
    assert "longer than max_prompt_length" not in caplog.text  # all 8 prompts were kept
    assert len(read_metrics(tmp_path / "run")) == 1
    samples = (tmp_path / "run" / "samples.jsonl").read_text().splitlines()
    written = [json.loads(line)["prompt"] for line in samples]
    assert len(written) % 8 == 0 and all(written)  # every row, each as often
    conversations = [p for p in written if isinstance(p, list)]  # their messages
    assert len(conversations) == len(written) // 2  # 4 of the 8 rows are conversations
    assert all(m["role"] in ("system", "user") for p in conversations for m in p)


def test_reward_functions_get_a_conversational_prompt_as_its_messages():
    """As TRL passes them: a standard prompt as its string, a conversational one as its list of
    messages (proxrl used to pass an empty string for the latter)."""
    from proxrl.data.formats import PromptExample
    from proxrl.rollout.rewards import FunctionReward

    seen = []

    def score(prompts, completions, **columns):
        seen.extend(prompts)
        return [1.0] * len(completions)

    reward = FunctionReward("m:score", score)
    prompts = [PromptExample("copy: abc =", None, "p:1"), PromptExample("", [USER], "p:2")]
    assert reward(prompts, [" abc", "abc"], {}).tolist() == [1.0, 1.0]
    assert seen == ["copy: abc =", [USER]]
