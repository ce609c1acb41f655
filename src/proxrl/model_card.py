"""The saved model directory as other tools expect it: a model card (``README.md`` with the
Hugging Face hub's YAML metadata, the run's config and final metrics, how to use the model) and,
when asked, the push to the hub.

The card's metadata is the hub's (``huggingface_hub.ModelCardData``): ``base_model`` (when the
run started from a hub id), ``datasets`` (the hub datasets it read), ``library_name``
(``transformers``, or ``peft`` for a LoRA adapter), ``pipeline_tag`` and ``tags``
(``proxrl``, ``rlhf``, the command and its method: ``ppo``, ``grpo``, ``rloo``, ``dpo`` …).
A policy's tokenizer is saved padding on the left, so a batched ``generate`` is right; a reward
model's card says how its scores are read (``reward_usage``), since transformers alone scores
the last token of whatever text it is given.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import yaml

from proxrl.runtime import objects
from proxrl.runtime.config import config_to_dict
from proxrl.runtime.errors import ProxrlError

log = logging.getLogger(__name__)

CARD_FILE = "README.md"
NOT_UPLOADED = (
    "checkpoints/*",
    "checkpoints/**",
    "tensorboard/**",
    "wandb/**",
    "mlruns/**",
    "trackio/**",
    "*.tmp",
)
"""What ``push_to_hub`` leaves out of the upload: resumable state and tracker files."""


def method_tags(command: str, cfg: Any) -> list[str]:
    """``rlhf`` and the command, plus the method a command's option picks (grpo's estimator,
    dpo's loss)."""
    tags = ["proxrl", "rlhf" if command != "sft" else "sft", command]
    for option in ("estimator", "loss"):
        value = getattr(cfg, option, None)
        if isinstance(value, str) and value not in tags:
            tags.append({"sigmoid": "dpo"}.get(value, value))
    if command == "rm":
        tags.append("reward-model")
    return list(dict.fromkeys(tags))


def _hub_id(source: Any) -> str | None:
    """The hub repository ``source`` names (``org/name``, or a dataset's ``name:split``), or
    None for a local path, a Python object without a hub name, or nothing."""
    from proxrl.models.tokenizer import looks_like_local_path

    if isinstance(source, str) and objects.is_handle(source):
        source = getattr(objects.lookup(source), "name_or_path", "") or ""
    if not isinstance(source, str) or not source or source.startswith(objects.PREFIX):
        return None
    if Path(source).expanduser().exists() or looks_like_local_path(source):
        return None
    name = source.partition(":")[0]
    return name if re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name) else None


def _started_from(source: str) -> str:
    if objects.is_handle(source):
        name = getattr(objects.lookup(source), "name_or_path", "") or ""
        return f"a model passed from Python ({name})" if name else "a model passed from Python"
    return source


def card_text(command: str, cfg: Any, metrics: dict[str, Any], output_dir: Path) -> str:
    """The model card of the run ``cfg`` of ``command`` that ended with ``metrics``."""
    from huggingface_hub import ModelCardData

    adapter = (output_dir / "adapter_config.json").is_file()
    data_sources = [getattr(cfg, n, None) for n in ("data", "eval_data", "prompts")]
    data = ModelCardData(
        base_model=_hub_id(getattr(cfg, "model", None)),
        datasets=[d for s in data_sources if (d := _hub_id(s))] or None,
        library_name="peft" if adapter else "transformers",
        pipeline_tag="text-classification" if command == "rm" else "text-generation",
        tags=method_tags(command, cfg),
    )
    title = output_dir.resolve().name
    lines = [
        f"# {title}",
        "",
        f"Trained with proxrl `{command}` from "
        f"{_started_from(str(getattr(cfg, 'model', '')))}."
        + (" This directory holds a LoRA adapter (load it with peft)." if adapter else "")
        + (
            " A LoRA run: this directory holds the merged model; the adapter alone is in"
            " `adapter/` (peft, on the model the run started from)."
            if (output_dir / "adapter" / "adapter_config.json").is_file()
            else ""
        ),
        "",
        "## How to use",
        "",
        reward_usage(cfg) if command == "rm" else policy_usage(adapter),
        "",
        "## Final metrics",
        "",
        "| metric | value |",
        "|---|---|",
        *[f"| `{k}` | {v:.6g} |" for k, v in sorted(metrics.items()) if _is_number(v)],
        "",
        "## Training configuration",
        "",
        f"`proxrl {command} --config config.yaml` with the following"
        + (
            " (`python:…` values name objects passed from Python: models, rows, functions):"
            if objects.PREFIX in yaml.safe_dump(config_to_dict(cfg))
            else ":"
        ),
        "",
        "```yaml",
        yaml.safe_dump(config_to_dict(cfg), sort_keys=False).rstrip(),
        "```",
        "",
    ]
    return f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def policy_usage(adapter: bool) -> str:
    load = (
        "from peft import AutoPeftModelForCausalLM\n"
        "model = AutoPeftModelForCausalLM.from_pretrained(path)"
        if adapter
        else "from transformers import AutoModelForCausalLM\n"
        "model = AutoModelForCausalLM.from_pretrained(path)"
    )
    return (
        "The tokenizer pads on the left, so a batch of prompts generates as each would alone:\n\n"
        "```python\n"
        "from transformers import AutoTokenizer\n"
        f"{load}\n"
        "tokenizer = AutoTokenizer.from_pretrained(path)\n"
        'batch = tokenizer(["prompt one", "a longer prompt two"], return_tensors="pt", '
        "padding=True)\n"
        "out = model.generate(**batch, max_new_tokens=32, do_sample=False)\n"
        'print(tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], '
        "skip_special_tokens=True))\n"
        "```"
    )


def conversational_data(cfg: Any) -> bool:
    """Whether the run's training data (``cfg.data``) is conversational: its first row's
    ``prompt``, ``chosen`` or ``responses`` is a list of messages (rows are one form
    throughout: ``data.formats`` refuses a mix)."""
    from proxrl.data.readers import read_rows

    source = getattr(cfg, "data", None)
    if not isinstance(source, str) or not source:
        return False
    rows = read_rows(source)
    if not rows:
        return False
    first = rows[0].data
    for name in ("chosen", "prompt"):
        if isinstance(first.get(name), list):
            return True
    responses = first.get("responses")
    return isinstance(responses, list) and any(isinstance(r, list) for r in responses)


STANDARD_IDS = (
    "The text encoded as in training: the prompt with the tokenizer's special tokens, the "
    "response without, then `eos_token_id`",
    'ids = (tokenizer(prompt)["input_ids"]\n'
    '       + tokenizer(response, add_special_tokens=False)["input_ids"]\n'
    "       + [tokenizer.eos_token_id])\n",
)
CHAT_IDS_TEXT = (
    "The data was conversational, so the text is the chat template's, encoded as in training: "
    '`prompt` is the conversation before the reply (a list of `{"role", "content"}` '
    "messages) rendered with the generation prompt, the reply is what the template adds for the "
    "assistant's message `response` after it (each part encoded without special tokens), then "
    "`eos_token_id` unless the template already ended with it"
)
CHAT_RENDER = (
    "prompt_text = tokenizer.apply_chat_template(prompt, tokenize=False, "
    "add_generation_prompt=True)\n"
    "full_text = tokenizer.apply_chat_template(\n"
    '    prompt + [{"role": "assistant", "content": response}], tokenize=False)\n'
)
PLAIN_RENDER = (  # data.encoding.render_conversation without a template
    "def render(messages, generation_prompt):  # the tokenizer has no chat template\n"
    "    text = \"\".join(f\"{m['role']}: {m['content']}\\n\" for m in messages)\n"
    '    return text + ("assistant: " if generation_prompt else "")\n'
    "prompt_text = render(prompt, True)\n"
    'full_text = render(prompt + [{"role": "assistant", "content": response}], False)\n'
)
CHAT_IDS = (
    'ids = (tokenizer(prompt_text, add_special_tokens=False)["input_ids"]\n'
    '       + tokenizer(full_text[len(prompt_text):], add_special_tokens=False)["input_ids"])\n'
    "if ids[-1] != tokenizer.eos_token_id:\n"
    "    ids.append(tokenizer.eos_token_id)\n"
)


def has_chat_template(output_dir: Path) -> bool:
    """Whether the tokenizer saved in ``output_dir`` carries a chat template."""
    if (output_dir / "chat_template.jinja").is_file():
        return True
    config = output_dir / "tokenizer_config.json"
    return config.is_file() and bool(
        json.loads(config.read_text(encoding="utf-8")).get("chat_template")
    )


def encoding_usage(cfg: Any) -> tuple[str, str]:
    """(how the text is encoded, in words; the code that encodes it) for the card."""
    if not conversational_data(cfg):
        return STANDARD_IDS
    if has_chat_template(Path(cfg.output_dir)):
        return CHAT_IDS_TEXT, CHAT_RENDER + CHAT_IDS
    words = CHAT_IDS_TEXT.replace(
        "the chat template's", "proxrl's `role: content` lines (the tokenizer has no template)"
    ).replace("the template adds", "the lines add")
    return words, PLAIN_RENDER + CHAT_IDS


def reward_usage(cfg: Any) -> str:
    centred = getattr(cfg, "normalize", True)
    how, encode = encoding_usage(cfg)
    return (
        "An `AutoModelForSequenceClassification` (`num_labels=1`). The score of a response is "
        "the head's output at the **last token of prompt + response + EOS**. "
        f"{how} (without the EOS, transformers scores another token and gives "
        "other numbers). The tokenizer pads on the right; the classifier reads the last "
        "non-pad token.\n\n"
        "```python\n"
        "import torch\n"
        "from transformers import AutoModelForSequenceClassification, AutoTokenizer\n"
        "model = AutoModelForSequenceClassification.from_pretrained(path).eval()\n"
        "tokenizer = AutoTokenizer.from_pretrained(path)\n"
        f"{encode}"
        "with torch.no_grad():\n"
        "    raw = model(torch.tensor([ids])).logits[0, 0].item()\n"
        'score = raw - getattr(model.config, "reward_offset", 0.0)  # proxrl\'s score\n'
        "```\n\n"
        + (
            "Scale: Bradley–Terry log-odds. σ(score_a − score_b) is the model's probability "
            "that response a is preferred to b; scores are centred so that the training "
            "responses average 0 (`reward_offset` in config.json is that mean of the raw "
            "scores, `reward_std` their spread: divide by it for unit scale)."
            if centred
            else "Scale: Bradley–Terry log-odds (σ(score_a − score_b) is the probability that "
            "a is preferred); the scores were not centred (normalize: false)."
        )
    )


def write_card(command: str, cfg: Any, metrics: dict[str, Any]) -> Path:
    path = Path(cfg.output_dir) / CARD_FILE
    path.write_text(card_text(command, cfg, metrics, Path(cfg.output_dir)), encoding="utf-8")
    return path


def push_to_hub(output_dir: Path, repo_id: str, private: bool = False) -> str:
    """Upload the saved model, its tokenizer, card, config and metrics to ``repo_id`` (created if
    missing); checkpoints and tracker files stay local. Returns the commit URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        commit = api.upload_folder(
            repo_id=repo_id,
            folder_path=str(output_dir),
            repo_type="model",
            commit_message="proxrl: upload the trained model",
            ignore_patterns=list(NOT_UPLOADED),
        )
    except Exception as exc:  # network, authentication, permissions: one line, model kept
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ProxrlError(
            f"push_to_hub: uploading {output_dir} to {repo_id} failed ({first}); the model is "
            "saved there, push it later with `hf upload`"
        ) from exc
    return str(getattr(commit, "commit_url", commit))


def publish(command: str, cfg: Any, metrics: dict[str, Any]) -> None:
    """After a model-producing command: the card (rank 0), then the push when asked."""
    from proxrl.runtime import distributed as dist

    if not dist.is_main():
        return
    write_card(command, cfg, metrics)
    if getattr(cfg, "push_to_hub", False):
        repo_id = cfg.hub_model_id or Path(cfg.output_dir).resolve().name
        url = push_to_hub(Path(cfg.output_dir), repo_id, private=cfg.hub_private)
        log.info("pushed %s to %s", cfg.output_dir, url)


def load_saved_model(output_dir: str | Path, reward: bool = False) -> Any:
    """The model a run saved, loaded with plain transformers (peft for an adapter)."""
    path = Path(output_dir)
    if (path / "adapter_config.json").is_file():
        from peft import AutoPeftModelForCausalLM, AutoPeftModelForSequenceClassification

        peft_cls = AutoPeftModelForSequenceClassification if reward else AutoPeftModelForCausalLM
        return peft_cls.from_pretrained(path)
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    auto = AutoModelForSequenceClassification if reward else AutoModelForCausalLM
    return auto.from_pretrained(path)
