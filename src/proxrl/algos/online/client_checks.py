"""The training client's checks of what its user hands it (``client.TrainingClient``): a wrong
call is refused in one line naming the argument (``TrainingClient.sample: n: expected an int
>= 1, got 0``), never a torch traceback deep in a stage and never a silent success.

A config value reaches the client two ways, both read as a YAML file's are
(``config_from_mapping``: pydantic against the field's type, an unknown name refused with the
closest one) and range-checked (``checked_config``): the constructor's options (or ``config=``)
and a call's overrides (``sample``'s sampling options, ``forward_backward``'s loss name, a pair
loss's options). The client's own arguments (prompts, ``n``, a batch, a learning rate) are
checked here against what the client holds: its tokenizer's vocabulary and the batch's shape.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from numbers import Real
from typing import Any

from torch import Tensor

from proxrl.data.formats import PromptExample, parse_prompt
from proxrl.data.readers import Row
from proxrl.models.options import ModelRunConfig
from proxrl.rollout.experience import Experience
from proxrl.runtime import objects
from proxrl.runtime.config import check_knobs, config_from_mapping
from proxrl.runtime.errors import ProxrlError

OPEN_CHOICES = ("policy_loss",)
"""The choice fields a client's call picks (``forward_backward``'s loss): their knobs apply."""


def checked_config(cls: type, values: Mapping[str, Any], where: str, base: Any = None) -> Any:
    """``base`` (or a new ``cls``) with ``values`` (field → value) replaced, each read as a YAML
    value is (``config_from_mapping``), then checked as the command checks its options
    (``ModelRunConfig.validate``: every field's range, the dtype and precision; an online
    config's ``validate_options``: the rules between options, a knob of an entry not selected
    refused, the policy loss open since each call picks it; else ``check_knobs``); ``base``'s
    attached Python objects (a model given as a model) kept. A refusal starts with ``where``.

    Not the command's full ``validate()``: its input checks (prompts or a rollouts file, a
    reward source, an environment that loads, a model and data) are for what a client's user
    brings to each call instead."""
    cfg = config_from_mapping(cls, dict(values), where, validate=False, base=base)
    try:
        ModelRunConfig.validate(cfg)  # every field's range (check_ranges), dtype, precision
        if hasattr(cfg, "validate_options"):
            cfg.validate_options(OPEN_CHOICES)
        else:
            check_knobs(cfg)
    except ProxrlError as e:
        raise ProxrlError(f"{where}: {e}") from None
    if base is not None:
        objects.attach(cfg, objects.attached(base))
    return cfg


def _kind(value: Any) -> str:
    name = type(value).__name__
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


def prompt_examples(prompts: Any, where: str) -> list[PromptExample]:
    """``sample``'s prompts: a non-empty list (or tuple) of non-empty strings, message lists
    (read as a data file's ``prompt`` field is: ``formats.parse_prompt``) or ``PromptExample``s."""
    if not isinstance(prompts, list | tuple):
        raise ProxrlError(f"{where}: prompts: expected a list of prompts, got {_kind(prompts)}")
    if not prompts:
        raise ProxrlError(f"{where}: prompts: expected at least one prompt, got an empty list")
    return [_example(prompt, f"prompts[{i}]", where) for i, prompt in enumerate(prompts)]


def _example(prompt: Any, name: str, where: str) -> PromptExample:
    if isinstance(prompt, PromptExample):
        if prompt.messages is None and not prompt.prompt.strip():
            raise ProxrlError(
                f"{where}: {name}: expected a non-empty prompt, got {prompt.prompt!r}"
            )
        return prompt
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ProxrlError(f"{where}: {name}: expected a non-empty prompt, got {prompt!r}")
        return PromptExample(prompt, None, name)
    if isinstance(prompt, list):
        try:
            return parse_prompt(Row({"prompt": prompt}, name))
        except ProxrlError as e:
            raise ProxrlError(f"{where}: {e}") from None
    raise ProxrlError(
        f"{where}: {name}: expected a string or a list of messages, got {_kind(prompt)}"
    )


def count(value: Any, name: str, where: str) -> int:
    """An int ≥ 1 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProxrlError(f"{where}: {name}: expected an int >= 1, got {_kind(value)}")
    if value < 1:
        raise ProxrlError(f"{where}: {name}: expected an int >= 1, got {value}")
    return value


def flag(value: Any, name: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise ProxrlError(f"{where}: {name}: expected True or False, got {value!r}")
    return value


def learning_rate(value: Any, name: str, where: str) -> float | None:
    """None (the config's), or a finite number > 0: a negative rate would step up the loss, a
    non-finite one would make every weight NaN."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ProxrlError(f"{where}: {name}: expected a number > 0, got {_kind(value)}")
    if not math.isfinite(value) or value <= 0:
        raise ProxrlError(f"{where}: {name}: expected a finite number > 0, got {value}")
    return float(value)


def check_token_ids(ids: Any, name: str, vocabulary: int, where: str) -> None:
    """``ids`` a (B, L) integer tensor of ids this client's model embeds (0 ≤ id <
    ``vocabulary``): a batch from another tokenizer is refused here, not by an IndexError."""
    integer = isinstance(ids, Tensor) and not (ids.dtype.is_floating_point or ids.is_complex())
    if not integer or ids.dim() != 2:
        shape = tuple(ids.shape) if isinstance(ids, Tensor) else _kind(ids)
        raise ProxrlError(f"{where}: {name}: expected a (B, L) tensor of token ids, got {shape}")
    if ids.numel() == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocabulary:
        raise ProxrlError(
            f"{where}: {name}: token id {low if low < 0 else high} is outside this client's "
            f"vocabulary (0 to {vocabulary - 1}); was it made with another tokenizer?"
        )


def check_experience(batch: Any, vocabulary: int, where: str) -> None:
    """``batch`` an ``Experience`` whose prompt and response ids are this client's and agree on
    the number of rows."""
    if not isinstance(batch, Experience):
        raise ProxrlError(
            f"{where}: batch: expected an Experience (TrainingClient.logprobs) or the "
            f"PreferencePairs of TrainingClient.pairs, got {_kind(batch)}"
        )
    check_token_ids(batch.prompt_ids, "batch: prompt_ids", vocabulary, where)
    check_token_ids(batch.response_ids, "batch: response_ids", vocabulary, where)
    if batch.prompt_ids.shape[0] != batch.response_ids.shape[0]:
        raise ProxrlError(
            f"{where}: batch: {batch.prompt_ids.shape[0]} rows of prompt_ids but "
            f"{batch.response_ids.shape[0]} of response_ids"
        )


def token_values(value: Any, name: str, mask: Tensor, where: str, per_row: bool) -> Tensor:
    """``value`` as a (B, T) float tensor on ``mask``'s device: (B, T) as given, or (``per_row``)
    one value per row, (B,), spread over the row's loss tokens (0 at the others). No other shape
    is broadcast: a (T,) or (B, 1) tensor is refused, even where torch would broadcast it."""
    rows, length = mask.shape
    wanted = f"(B, T) = {(rows, length)}" + (f" or (B,) = ({rows},)" if per_row else "")
    if not isinstance(value, Tensor):
        raise ProxrlError(
            f"{where}: batch: {name}: expected a tensor of shape {wanted}, got {_kind(value)}"
        )
    if value.dtype.is_complex:
        raise ProxrlError(f"{where}: batch: {name}: expected real values, got {value.dtype}")
    value = value.to(mask.device)
    value = value if value.dtype.is_floating_point else value.float()
    if per_row and value.shape == (rows,):
        return value[:, None] * mask.to(value.dtype)
    if value.shape != (rows, length):
        raise ProxrlError(
            f"{where}: batch: {name}: expected shape {wanted}, got {tuple(value.shape)}"
        )
    return value
