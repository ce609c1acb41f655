"""Tokenizer loading with the checks RLHF needs.

- The pad token is distinct from EOS. When a tokenizer has no pad token, or reuses EOS as pad,
  ``<|pad|>`` is added: with pad == EOS, a collator's attention mask and a reward model's
  "last non-pad token" both confuse the real end of a response with padding.
- Padding side is a choice made where padding happens: right for training (this module leaves
  the tokenizer on the right), left for batched generation (``padding_side("left")``).
- A tokenizer is judged on the run's own data (``data.encoding.check_round_trip`` on the first
  rows' texts), not on a fixed English sentence that a domain- or
  language-specific tokenizer need not cover. transformers 5.x can load a tokenizer that
  encodes any text to nothing (seen with a custom tokenizer saved beside a Qwen2-type config);
  training on empty sequences would then "work" and learn nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket  # noqa: F401  (tests reach the resolver through it)
from collections.abc import Iterator
from typing import TYPE_CHECKING

from proxrl.models.lora import adapter_base
from proxrl.runtime import objects
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.hub import (  # noqa: F401  (also this module's public names)
    PROXY_VARIABLES,
    looks_like_local_path,
    unreachable_hub_host,
    use_hub_cache_only,
)

if TYPE_CHECKING:  # transformers loads with the first model or tokenizer, not with a config
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

PAD_TOKEN = "<|pad|>"


TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")
MODEL_FILES = ("config.json", "adapter_config.json", *TOKENIZER_FILES)


def check_model_source(name_or_path: str) -> None:
    """Fail with one line when a local model path does not exist, is a file, or is a directory
    that holds no model (instead of a hub lookup or a loader's traceback)."""
    if not name_or_path:
        raise ProxrlError("model: expected a hub id or a local directory, got an empty string")
    if objects.is_handle(name_or_path):
        return
    path = os.path.expanduser(name_or_path)
    if os.path.isfile(path):
        raise ProxrlError(
            f"model path '{name_or_path}' is a file; "
            "expected a model directory (with config.json) or a hub id"
        )
    if looks_like_local_path(name_or_path) and not os.path.isdir(path):
        raise ProxrlError(f"model path '{name_or_path}' does not exist (or is not a directory)")
    if os.path.isdir(path) and not any(os.path.isfile(os.path.join(path, f)) for f in MODEL_FILES):
        raise ProxrlError(
            f"model directory '{name_or_path}' has no config.json (nor tokenizer files); "
            "expected a directory written by save_pretrained"
        )
    if not os.path.isdir(path):
        check_hub_model_reachable(name_or_path)


def check_hub_model_reachable(repo_id: str) -> None:
    """When the hub's host does not even resolve (an air-gapped machine), every download would
    retry for ~50 s before giving up: a hub id in the local cache is then loaded from it alone
    (Hugging Face's offline mode, for this process), and one that is not fails now, in one line."""
    from huggingface_hub import try_to_load_from_cache

    host = unreachable_hub_host()
    if host is None:
        return
    try:
        cached = any(isinstance(try_to_load_from_cache(repo_id, f), str) for f in MODEL_FILES)
    except ValueError:  # not a valid repo id: transformers' own message says why
        return
    if cached:
        use_hub_cache_only(host, repo_id)
        return
    raise ProxrlError(
        f"hub model '{repo_id}' is neither a local directory nor in the Hugging Face cache, "
        f"and {host} cannot be reached from here; download it on a connected machine "
        "(hf download) or pass a local directory"
    )


def load_tokenizer(
    name_or_path: str,
    *,
    trust_remote_code: bool = False,
    revision: str | None = None,
) -> PreTrainedTokenizerBase:
    """Load a tokenizer, give it a pad token distinct from EOS and pad on the right (the data's
    encoding then checks it on the run's own texts: ``check_round_trip``). Embeddings of a model
    used with it must then be resized with ``resize_for_tokenizer``. For a model given to the
    Python API (a ``runtime.objects`` handle): a copy of the tokenizer given with it, else the
    one its ``name_or_path`` names."""
    tokenizer = objects.tokenizer_of(name_or_path) if objects.is_handle(name_or_path) else None
    if tokenizer is None:
        if objects.is_handle(name_or_path):
            name_or_path = tokenizer_source(name_or_path)
        tokenizer = _from_pretrained(name_or_path, trust_remote_code, revision)
    ensure_pad_token(tokenizer)
    tokenizer.padding_side = "right"
    return tokenizer


def _from_pretrained(
    name_or_path: str, trust_remote_code: bool, revision: str | None
) -> PreTrainedTokenizerBase:
    check_model_source(name_or_path)
    path = os.path.expanduser(name_or_path)
    base = adapter_base(path) if os.path.isdir(path) else None
    if base and not any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES):
        try:  # an adapter saved without its tokenizer uses its base's
            return load_tokenizer(base, trust_remote_code=trust_remote_code, revision=revision)
        except ProxrlError as exc:
            message = f"model '{name_or_path}' is a LoRA adapter on '{base}': {exc}"
            raise ProxrlError(message) from exc
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(
            path,
            trust_remote_code=trust_remote_code,
            revision=revision,
        )
    except (OSError, ValueError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ProxrlError(
            f"cannot load a tokenizer from '{name_or_path}' (not a local directory, and the hub "
            f"lookup failed): {first_line}"
        ) from exc


def tokenizer_source(handle: str) -> str:
    """Where the tokenizer of a model given without one comes from: its ``name_or_path``."""
    source = getattr(objects.lookup(handle), "name_or_path", "") or ""
    field = handle.removeprefix(objects.PREFIX)
    if not source:
        raise ProxrlError(
            f"{field}: a model passed as an object needs its tokenizer "
            f"(pass tokenizer=..., or load the model from a directory or hub id)"
        )
    return str(source)


def ensure_pad_token(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Add ``<|pad|>`` when the pad token is missing or equal to EOS. Returns True if added."""
    if tokenizer.pad_token_id is not None and tokenizer.pad_token_id != tokenizer.eos_token_id:
        return False
    tokenizer.add_special_tokens({"pad_token": PAD_TOKEN})
    log.info(
        "tokenizer: added pad token %s (id %d), distinct from EOS",
        PAD_TOKEN,
        tokenizer.pad_token_id,
    )
    return True


def tokenizer_difference(
    policy: PreTrainedTokenizerBase, other: PreTrainedTokenizerBase
) -> str | None:
    """How ``other`` would read the policy's token ids differently, in a few words; None when
    it reads them as the policy does: the same token → id map (added tokens included), the
    same special tokens and ids (EOS, BOS, pad, unk, the rest), and the same chat template (or
    neither has one; compared even for plain-string prompts, where it does not matter)."""
    mine, theirs = policy.get_vocab(), other.get_vocab()
    if mine != theirs:
        differ = sum(theirs.get(token) != index for token, index in mine.items())
        return (
            f"another vocabulary ({len(theirs)} vs {len(mine)} tokens, {differ} of the "
            "policy's mapped to another id or missing)"
        )
    for role in ("eos", "bos", "pad", "unk"):
        ids = getattr(policy, f"{role}_token_id"), getattr(other, f"{role}_token_id")
        if ids[0] != ids[1]:
            return f"another {role.upper()} token (id {ids[1]} vs the policy's {ids[0]})"
    if set(policy.all_special_ids) != set(other.all_special_ids):
        return "other special tokens"
    if getattr(policy, "chat_template", None) != getattr(other, "chat_template", None):
        return "another chat template"
    return None


def resize_for_tokenizer(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Grow the embeddings when the tokenizer has tokens the model lacks (e.g. an added pad
    token) and record the pad id in the model config, where sequence classifiers read it."""
    embeddings = model.get_input_embeddings()
    if embeddings is not None and len(tokenizer) > embeddings.weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))
    model.config.pad_token_id = tokenizer.pad_token_id
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        generation_config.pad_token_id = tokenizer.pad_token_id


@contextlib.contextmanager
def padding_side(
    tokenizer: PreTrainedTokenizerBase, side: str
) -> Iterator[PreTrainedTokenizerBase]:
    """Temporarily pad on ``side`` ("left" for batched generation), then restore."""
    previous = tokenizer.padding_side
    tokenizer.padding_side = side
    try:
        yield tokenizer
    finally:
        tokenizer.padding_side = previous


def save_tokenizer(
    tokenizer: PreTrainedTokenizerBase, output_dir: str | os.PathLike[str], side: str
) -> None:
    """``save_pretrained`` with ``padding_side`` written as ``side`` (transformers writes only
    the options the tokenizer was created with, so the side goes into those too), the
    tokenizer itself left as it was."""
    init_kwargs = tokenizer.init_kwargs
    before = dict(init_kwargs)
    init_kwargs["padding_side"] = side
    try:
        with padding_side(tokenizer, side):
            tokenizer.save_pretrained(output_dir)
    finally:
        init_kwargs.clear()
        init_kwargs.update(before)
