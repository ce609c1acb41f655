"""Tokenizer loading with the checks RLHF needs.

- The pad token is distinct from EOS. When a tokenizer has no pad token, or reuses EOS as pad,
  ``<|pad|>`` is added: with pad == EOS, a collator's attention mask and a reward model's
  "last non-pad token" both confuse the real end of a response with padding.
- Padding side is a choice made where padding happens: right for training (this module leaves
  the tokenizer on the right), left for batched generation (``padding_side("left")``).
- Every loaded tokenizer must round-trip a sample text. transformers 5.x can load a tokenizer
  that encodes any text to nothing (seen with a custom tokenizer saved beside a Qwen2-type
  config); training on empty sequences would then "work" and learn nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator

from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from proxrl.runtime import objects
from proxrl.runtime.errors import ProxrlError

log = logging.getLogger(__name__)

PAD_TOKEN = "<|pad|>"
ROUND_TRIP_SAMPLE = "The quick brown fox jumps over the lazy dog. 0123456789"


def looks_like_local_path(name_or_path: str) -> bool:
    """A string the user meant as a directory rather than a hub id (``org/name``): absolute,
    ``./`` or ``~``-relative, deeper than ``org/name``, or under a directory that exists here
    (``runs/sft`` when ``runs/`` exists). Such a string is never sent to the hub, whose
    offline retries take about a minute to fail."""
    return (
        os.path.isabs(name_or_path)
        or name_or_path.startswith((".", "~"))
        or name_or_path.count("/") > 1
        or ("/" in name_or_path and os.path.isdir(name_or_path.split("/", 1)[0]))
    )


MODEL_FILES = ("config.json", "adapter_config.json", "tokenizer_config.json", "tokenizer.json")


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


PROXY_VARIABLES = (
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
)


def check_hub_model_reachable(repo_id: str) -> None:
    """When the hub's host does not even resolve (an air-gapped machine), every download would
    retry for ~50 s before giving up: a hub id in the local cache is then loaded from it alone
    (Hugging Face's offline mode, for this process), and one that is not fails now, in one line."""
    from urllib.parse import urlparse

    from huggingface_hub import constants, try_to_load_from_cache

    if constants.HF_HUB_OFFLINE:
        return  # transformers reads the cache only, and fails at once without it
    if any(os.environ.get(name) for name in PROXY_VARIABLES):
        return  # behind a proxy the hub's name need not resolve here: let the download try
    host = urlparse(constants.ENDPOINT).hostname or constants.ENDPOINT
    if host_resolves(host):
        return
    try:
        cached = any(isinstance(try_to_load_from_cache(repo_id, f), str) for f in MODEL_FILES)
    except ValueError:  # not a valid repo id: transformers' own message says why
        return
    if cached:
        log.warning(
            "%s cannot be reached: loading %s from the local Hugging Face cache (offline mode)",
            host,
            repo_id,
        )
        constants.HF_HUB_OFFLINE = True
        os.environ["HF_HUB_OFFLINE"] = "1"  # and for the processes this one starts
        return
    raise ProxrlError(
        f"hub model '{repo_id}' is neither a local directory nor in the Hugging Face cache, "
        f"and {host} cannot be reached from here; download it on a connected machine "
        "(huggingface-cli download) or pass a local directory"
    )


def host_resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return False
    return True


def load_tokenizer(
    name_or_path: str,
    *,
    trust_remote_code: bool = False,
    revision: str | None = None,
) -> PreTrainedTokenizerBase:
    """Load a tokenizer, give it a pad token distinct from EOS, pad on the right, and check that
    it round-trips text. Embeddings of a model used with it must then be resized with
    ``resize_for_tokenizer``. For a model given to the Python API (a ``runtime.objects``
    handle): a copy of the tokenizer given with it, else the one its ``name_or_path`` names."""
    tokenizer = objects.tokenizer_of(name_or_path) if objects.is_handle(name_or_path) else None
    if tokenizer is None:
        if objects.is_handle(name_or_path):
            name_or_path = tokenizer_source(name_or_path)
        tokenizer = _from_pretrained(name_or_path, trust_remote_code, revision)
    ensure_pad_token(tokenizer)
    tokenizer.padding_side = "right"
    check_round_trip(tokenizer, source=name_or_path)
    return tokenizer


def _from_pretrained(
    name_or_path: str, trust_remote_code: bool, revision: str | None
) -> PreTrainedTokenizerBase:
    check_model_source(name_or_path)
    try:
        return AutoTokenizer.from_pretrained(
            os.path.expanduser(name_or_path),
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


def check_round_trip(
    tokenizer: PreTrainedTokenizerBase, text: str = ROUND_TRIP_SAMPLE, source: str = "tokenizer"
) -> None:
    """Raise if ``text`` encodes to no tokens or decodes to nothing; warn if it changes."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) == 0:
        raise ProxrlError(
            f"tokenizer from '{source}' encodes the sample text {text!r} to zero tokens; "
            "it is broken (transformers may have loaded it with the wrong tokenizer class)"
        )
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    if not decoded.strip():
        raise ProxrlError(
            f"tokenizer from '{source}' decodes {len(ids)} sample tokens to empty text"
        )
    if decoded.strip() != text.strip():
        log.warning(
            "tokenizer from '%s' does not round-trip exactly: %r -> %r", source, text, decoded
        )


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
