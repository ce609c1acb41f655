"""Where scores come from: a learned reward model, a Python function (verifiable rewards), or
a weighted sum of several.

A reward function is named ``module:function`` and is imported only from there. It is called
as ``fn(prompts, completions, **columns)`` — ``prompts`` as the data holds them (a string, or
for a conversational row its list of messages, as TRL passes them), ``completions`` the
generated strings, ``columns`` the prompt file's other fields, one list entry per completion —
and returns one finite float per completion. Anything else
stops the run with a message naming the function and the first bad prompt index.
"""

from __future__ import annotations

import importlib
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from proxrl.data.batching import pack_lengths, pad_right
from proxrl.data.encoding import check_round_trip, encode_prompt_text, encode_response_text
from proxrl.data.formats import PromptExample
from proxrl.models.scalar_head import sequence_scores
from proxrl.rollout.forward import packed_sequence_scores
from proxrl.runtime import objects
from proxrl.runtime.errors import ProxrlError

RewardFn = Callable[..., Sequence[float]]


def load_reward_function(spec: str) -> RewardFn:
    """``"package.module:function"`` → the function (``import_function``, for ``reward_fn``)."""
    return import_function(spec, "reward_fn")


def import_function(spec: str, field: str) -> Callable[..., Any]:
    """``"package.module:function"`` → the function; a one-line error naming ``field`` when it
    is not there. A handle of a function given to the Python API (``runtime.objects``) is that
    function.

    The module is looked up on the import path and then in the working directory, so a local
    ``myreward.py`` loads under the ``proxrl`` console script as under ``python -m proxrl`` (the
    working directory is appended, not put first: it never shadows an installed package)."""
    if objects.is_handle(spec):
        return objects.lookup(spec)  # type: ignore[no-any-return]
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ProxrlError(f"{field}: expected 'module:function', got '{spec}'")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and f"{module_name}.".startswith(f"{exc.name}."):
            raise ProxrlError(
                f"{field}: no module named '{exc.name}' on the import path (the working "
                f"directory {cwd}, PYTHONPATH, the installed packages)"
            ) from None
        raise ProxrlError(f"{field}: cannot import module '{module_name}' ({exc})") from exc
    except ImportError as exc:
        raise ProxrlError(f"{field}: cannot import module '{module_name}' ({exc})") from exc
    fn = getattr(module, attribute, None)
    if not callable(fn):
        raise ProxrlError(f"{field}: module '{module_name}' has no function '{attribute}'")
    return fn  # type: ignore[no-any-return]


@dataclass
class FunctionReward:
    """Scores from a Python function."""

    spec: str
    fn: RewardFn

    @property
    def name(self) -> str:
        return self.spec.rpartition(":")[2]

    def __call__(
        self, prompts: list[PromptExample], completions: list[str], columns: dict[str, list[Any]]
    ) -> Tensor:
        texts = [p.prompt if p.messages is None else p.messages for p in prompts]
        try:
            values = list(self.fn(texts, completions, **columns))
        except Exception as exc:
            raise ProxrlError(
                f"reward_fn '{self.spec}' raised {type(exc).__name__}: {exc}"
            ) from exc
        if len(values) != len(completions):
            raise ProxrlError(
                f"reward_fn '{self.spec}' returned {len(values)} scores "
                f"for {len(completions)} completions"
            )
        for index, value in enumerate(values):
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ProxrlError(
                    f"reward_fn '{self.spec}' returned {value!r} for prompt index {index} "
                    f"({prompts[index].where}); expected a finite number"
                )
        return torch.tensor(values, dtype=torch.float32)


@dataclass
class RewardModelReward:
    """Scores from a ``num_labels=1`` sequence classifier. The text is re-encoded with the
    reward model's own tokenizer exactly as the reward model was trained (prompt, response,
    EOS), so a reward model need not share the policy's tokenizer."""

    model: nn.Module
    tokenizer: Any
    normalize: bool = True
    batch_size: int = 64
    checked: bool = False  # its tokenizer judged on the run's first prompts
    max_tokens: int = 0  # > 0: padding-free forwards of at most this many real tokens each

    name = "reward_model"

    @torch.no_grad()
    def __call__(
        self, prompts: list[PromptExample], completions: list[str], columns: dict[str, list[Any]]
    ) -> Tensor:
        if not self.checked:
            check_round_trip(self.tokenizer, [t for p in prompts[:8] for t in p.texts()])
            self.checked = True
        device = next(self.model.parameters()).device
        rows = [
            encode_prompt_text(self.tokenizer, p.prompt, p.messages)
            + encode_response_text(self.tokenizer, c)
            for p, c in zip(prompts, completions, strict=True)
        ]
        plan = (
            pack_lengths([len(r) for r in rows], self.max_tokens)
            if self.max_tokens
            else [
                list(range(i, min(i + self.batch_size, len(rows))))
                for i in range(0, len(rows), self.batch_size)
            ]
        )
        score = packed_sequence_scores if self.max_tokens else sequence_scores
        scores = torch.zeros(len(rows))
        for indices in plan:
            chunk = [rows[i] for i in indices]
            ids = pad_right(chunk, self.tokenizer.pad_token_id).to(device)
            mask = pad_right([[1] * len(r) for r in chunk], 0).to(device)
            scores[indices] = score(self.model, ids, mask, normalize=self.normalize).float().cpu()
        return scores


@dataclass
class WeightedRewards:
    """``Σ_k w_k · score_k``; each source's mean is logged as ``reward/<name>``."""

    sources: list[Any]
    weights: list[float]

    def __call__(
        self, prompts: list[PromptExample], completions: list[str], columns: dict[str, list[Any]]
    ) -> tuple[Tensor, dict[str, float]]:
        total = torch.zeros(len(completions))
        parts = {}
        for source, weight in zip(self.sources, self.weights, strict=True):
            scores = source(prompts, completions, columns)
            parts[f"reward/{source.name}"] = scores.mean().item()
            parts.update(getattr(source, "last_parts", {}))  # an ensemble's members and spread
            total = total + weight * scores
        return total, parts
