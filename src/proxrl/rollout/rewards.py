"""Where scores come from: a learned reward model, a Python function (verifiable rewards), or
a weighted sum of several.

A reward function is named ``module:function`` and is imported only from there. It is called as
TRL's ``GRPOTrainer`` calls one, by keyword: ``fn(prompts=..., completions=..., **columns)`` —
``prompts`` as the data holds them (a string, or for a conversational row its list of messages,
as TRL passes them), ``completions`` the generated strings (for a conversational row, as TRL's,
a list of messages: ``[{"role": "assistant", "content": text}]``, and with an environment the
episode's turns after the prompt: the assistant's and the observations'), ``columns`` the prompt
file's other fields, one list entry per completion, and as TRL also ``completion_ids`` (each
completion's token ids, a list of lists of ints) and ``trainer_state`` (``TrainerState``: the
iteration, ``global_step``, ``max_steps``). A function is passed only what it names (all of it
when it takes ``**kwargs``), so TRL's ``def f(completions, **kwargs)`` and ``def f(completions,
answer, **kwargs)`` work as they are; a function with no parameter named ``completions`` is
called by position, ``fn(prompts, completions, **columns)``, and gets ``completion_ids`` /
``trainer_state`` only when it names them. Its signature is checked when it is loaded, and its
columns against the prompt data before any model loads (``check_reward_columns``): one line
names the parameter it would miss. It returns one number per completion (a list, a numpy array
or a torch tensor); ``None`` means "not applicable" as in TRL (it counts 0 in the weighted sum,
and is left out of the function's logged mean). Anything else stops the run with a message
naming the function and the first bad prompt index.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import math
import numbers
import os
import sys
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from proxrl.data.batching import pack_lengths, pad_left, pad_right
from proxrl.data.encoding import (
    check_round_trip,
    encode_prompt_text,
    encode_response_text,
    response_ids_with_eos,
)
from proxrl.data.formats import PromptExample
from proxrl.models.lora import adapter_disabled
from proxrl.models.scalar_head import sequence_scores
from proxrl.rollout.forward import packed_sequence_scores, shared_prefix_sequence_scores
from proxrl.runtime import objects
from proxrl.runtime.errors import ProxrlError

RewardFn = Callable[..., Sequence[float | None]]

log = logging.getLogger(__name__)

PASSED = ("prompts", "completions")
"""What proxrl passes every reward function by name, besides the data's columns."""

EXTRAS = ("completion_ids", "trainer_state")
"""What proxrl passes besides, as TRL does, to a function that takes it: by name, or through
``**kwargs`` when the function takes ``completions`` by keyword. They ride in the ``columns``
mapping the reward sources get (``with_extras``), so every placement carries them."""


@dataclass(frozen=True)
class TrainerState:
    """A reward function's ``trainer_state``: where the run is, as TRL's ``TrainerState``
    (its ``global_step`` and ``max_steps``)."""

    global_step: int = 0  # iterations (policy updates) finished before these completions
    iteration: int = 1  # the iteration the completions were sampled in, from 1 as logged
    max_steps: int = 0  # the run's iterations


EPISODE_MESSAGES = "_episode_messages"
"""Where an episode's messages after its prompt ride in ``columns`` to the reward functions
(never passed to one under this name): the text alone has lost where each turn began."""


def with_extras(
    columns: dict[str, Any],
    completion_ids: list[list[int]],
    trainer_state: TrainerState,
    episode_messages: list[list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """The data's ``columns`` plus ``EXTRAS``: what the reward sources are called with."""
    extras = {"completion_ids": completion_ids, "trainer_state": trainer_state}
    if episode_messages:
        extras[EPISODE_MESSAGES] = episode_messages
    return {**columns, **extras}


def trl_completions(
    prompts: Sequence[PromptExample],
    completions: Sequence[str],
    episode_messages: Sequence[list[dict[str, Any]]] | None = None,
) -> list[Any]:
    """The ``completions`` a reward function gets, as TRL's GRPOTrainer builds them: the string
    for a standard prompt; for a conversational one a list of messages,
    ``[{"role": "assistant", "content": text}]`` (so TRL's ``completion[0]["content"]`` works),
    or an episode's messages after its prompt (TRL's tool loop: assistant, tool, assistant…)."""
    return [
        c
        if p.messages is None
        else list(episode_messages[i])
        if episode_messages is not None
        else [{"role": "assistant", "content": c}]
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True))
    ]


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


@dataclass(frozen=True)
class CallShape:
    """How a reward function takes its arguments: by keyword (TRL's convention) or by position
    (``fn(prompts, completions, **columns)``); which names it takes; which it requires."""

    by_keyword: bool
    names: frozenset[str]  # the parameters that can be passed by name
    required: tuple[str, ...]  # names it needs besides what PASSED covers (data columns)
    any_keyword: bool  # it takes **kwargs
    taken: frozenset[str] = frozenset()  # by position: the names of prompts and completions

    def accepts(self, name: str) -> bool:
        return name not in self.taken and (self.any_keyword or name in self.names)


def call_shape(fn: Callable[..., Any], spec: str) -> CallShape:
    """``fn``'s calling convention, or a one-line error naming ``spec`` and the parameter it
    could not be given. A function whose signature cannot be read is called by position."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return CallShape(False, frozenset(), (), True)
    kinds = inspect.Parameter
    taken: frozenset[str] = frozenset()
    any_keyword = any(p.kind is kinds.VAR_KEYWORD for p in parameters)
    named = [p for p in parameters if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)]
    by_keyword = any(p.name == "completions" for p in named)
    if not by_keyword:
        positional = [
            p for p in parameters if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
        ]
        if len(positional) < 2 and not any(p.kind is kinds.VAR_POSITIONAL for p in parameters):
            raise ProxrlError(
                f"reward_fn '{spec}': has no parameter named 'completions' and cannot take "
                "(prompts, completions) by position; expected def f(completions, **kwargs) "
                "(TRL's) or def f(prompts, completions, **columns)"
            )
        named = [p for p in named if p not in positional[:2]]
        taken = frozenset(p.name for p in positional[:2])
    names = frozenset(p.name for p in named)
    required = tuple(
        p.name
        for p in parameters
        if p.default is kinds.empty
        and (p.kind is kinds.KEYWORD_ONLY or p in named)
        and not (by_keyword and p.name in PASSED)
        and p.name not in EXTRAS
    )
    if any(p.kind is kinds.POSITIONAL_ONLY for p in parameters) and by_keyword:
        first = next(p for p in parameters if p.kind is kinds.POSITIONAL_ONLY)
        raise ProxrlError(
            f"reward_fn '{spec}': parameter '{first.name}' is positional-only; proxrl calls a "
            "function that names 'completions' by keyword, as TRL does"
        )
    return CallShape(by_keyword, names, required, any_keyword, taken)


@dataclass
class FunctionReward:
    """Scores from a Python function."""

    spec: str
    fn: RewardFn
    shape: CallShape | None = None  # None: read from fn's signature
    columns_checked: bool = False

    def __post_init__(self) -> None:
        if self.shape is None:
            self.shape = call_shape(self.fn, self.spec)

    @property
    def name(self) -> str:
        return self.spec.rpartition(":")[2]

    def check_columns(self, columns: Sequence[str]) -> None:
        """A one-line error when the function requires a parameter that is neither passed nor a
        column of the data (``columns``: its names)."""
        assert self.shape is not None
        for name in self.shape.required:
            if name not in columns:
                have = ", ".join(sorted(columns)) or "none"
                raise ProxrlError(
                    f"reward_fn '{self.spec}': parameter '{name}' is not passed (proxrl passes "
                    f"prompts, completions, completion_ids, trainer_state and the prompt data's "
                    f"columns: {have})"
                )
        self.columns_checked = True

    def call(
        self, prompts: list[Any], completions: list[Any], columns: dict[str, list[Any]]
    ) -> Any:
        """``fn`` called in its own convention with what it accepts."""
        shape = self.shape
        assert shape is not None
        if not self.columns_checked:
            self.check_columns([k for k in columns if k not in EXTRAS])
        extra = {
            k: v
            for k, v in columns.items()
            if shape.accepts(k) and k not in PASSED and (shape.by_keyword or k not in EXTRAS)
        }
        extra |= {k: columns[k] for k in EXTRAS if k in columns and k in shape.names}
        if not shape.by_keyword:
            return self.fn(prompts, completions, **extra)
        passed = {"prompts": prompts, "completions": completions}
        return self.fn(**{k: v for k, v in passed.items() if shape.accepts(k)}, **extra)

    def __call__(
        self, prompts: list[PromptExample], completions: list[str], columns: dict[str, list[Any]]
    ) -> Tensor:
        texts = [p.prompt if p.messages is None else p.messages for p in prompts]
        columns = dict(columns)
        passed = trl_completions(prompts, completions, columns.pop(EPISODE_MESSAGES, None))
        try:
            returned = self.call(texts, passed, columns)
            values = list(returned.tolist() if hasattr(returned, "tolist") else returned)
        except ProxrlError:
            raise
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
            if value is None:  # TRL's "not applicable"
                continue
            if not is_number(value) or not math.isfinite(value):
                raise ProxrlError(
                    f"reward_fn '{self.spec}' returned {value!r} for prompt index {index} "
                    f"({prompts[index].where}); expected a finite number or None"
                )
        return torch.tensor([math.nan if v is None else float(v) for v in values])


def is_number(value: Any) -> bool:
    """A real number: int, float, bool, numpy's scalars (not a string, not a nested list)."""
    return isinstance(value, numbers.Real)


REENCODED_MISMATCH = "reward/reencoded_mismatch"
"""The share of responses whose text does not encode back to the sampled ids (the policy's
tokenizer), logged where a reward model scores text: it judged something else for those."""
MISMATCH_WARN_SHARE = 0.01  # above this share of a batch, warned once


def reencoded_mismatch(
    tokenizer: Any, completions: Sequence[str], completion_ids: Sequence[Sequence[int]]
) -> Tensor:
    """(B,) True where ``completions[i]`` (the decoded response) does not encode back, under
    the policy's ``tokenizer``, to ``completion_ids[i]`` (the sampled ids): both ended with EOS
    as a reward model reads them, so a response cut before its EOS is not counted for that. A
    byte token that is not UTF-8 alone (a cut multi-byte character) decodes to U+FFFD and
    encodes back to other bytes; a sampled special token is dropped by the decode."""
    eos = tokenizer.eos_token_id
    return torch.tensor(
        [
            encode_response_text(tokenizer, text) != response_ids_with_eos(ids, eos)
            for text, ids in zip(completions, completion_ids, strict=True)
        ],
        dtype=torch.bool,
    )


@dataclass
class RewardModelReward:
    """Scores from a ``num_labels=1`` sequence classifier, on each row as the reward model was
    trained on it: the prompt's text encoded with its tokenizer, then the response, then EOS.

    The response is its sampled ids (``completion_ids``) when ``reads_ids``: the reward model's
    tokenizer is the policy's (``models.tokenizer.tokenizer_difference``, decided once where the
    roles are loaded), so it scores what was sampled (as TRL's PPO) and is spared a decode and
    an encode. Otherwise its text, re-encoded with the reward model's own tokenizer (so a
    reward model need not share the policy's), and, given the ``policy_tokenizer``, the share
    of responses whose text is not the sampled ids is logged (``REENCODED_MISMATCH``). An
    episode (with an environment: observation turns among the ids) is scored as text.

    ``shared_prefix``: the rows of a forward that share a prompt (a group's responses) run it
    once and their responses against its keys and values
    (``forward.shared_prefix_sequence_scores``): the scores of the whole rows' forward up to
    float rounding. Where no two rows of a forward share a prompt, or it cannot apply there,
    the rows are scored whole (packed or padded, as ``max_tokens`` says)."""

    model: nn.Module
    tokenizer: Any
    normalize: bool = True
    batch_size: int = 64
    checked: bool = False  # its tokenizer judged on the run's first prompts
    max_tokens: int | None = None  # real tokens per padding-free forward (None: batch_size × the
    # batch's longest row, as many rows as a padded batch at most; 0: padded batches)
    adapter_disabled: bool = False  # ``model`` is a LoRA critic whose base is this reward
    # model (``roles.share_reward_model``): scored with its adapters (and trained head) off
    policy_tokenizer: Any = None  # the policy's (None: not known, nothing counted)
    reads_ids: bool = False  # its tokenizer is the policy's: the sampled ids are scored
    shared_prefix: bool = True  # a prompt shared by rows forwarded once (the run's switch)
    last_parts: dict[str, float] = field(default_factory=dict)  # REENCODED_MISMATCH, if measured

    name = "reward_model"

    def response_rows(self, completions: list[str], columns: dict[str, Any]) -> list[list[int]]:
        """Each response's ids as scored (see the class docstring); sets ``last_parts``."""
        ids = columns.get("completion_ids")
        self.last_parts = {}
        if ids is None or EPISODE_MESSAGES in columns:
            return [encode_response_text(self.tokenizer, c) for c in completions]
        if self.reads_ids:
            return [response_ids_with_eos(r, self.tokenizer.eos_token_id) for r in ids]
        if self.policy_tokenizer is not None:
            mismatch = reencoded_mismatch(self.policy_tokenizer, completions, ids)
            self.last_parts[REENCODED_MISMATCH] = mismatch.float().mean().item()
        return [encode_response_text(self.tokenizer, c) for c in completions]

    @torch.no_grad()
    def __call__(
        self, prompts: list[PromptExample], completions: list[str], columns: dict[str, list[Any]]
    ) -> Tensor:
        if not self.checked:
            check_round_trip(self.tokenizer, [t for p in prompts[:8] for t in p.texts()])
            self.checked = True
        device = next(self.model.parameters()).device
        prompt_rows = [encode_prompt_text(self.tokenizer, p.prompt, p.messages) for p in prompts]
        responses = self.response_rows(completions, columns)
        rows = [p + r for p, r in zip(prompt_rows, responses, strict=True)]
        budget = self.max_tokens
        if budget is None:
            budget = self.batch_size * max(map(len, rows), default=0)
        plan = (
            pack_lengths([len(r) for r in rows], budget)
            if budget
            else [
                list(range(i, min(i + self.batch_size, len(rows))))
                for i in range(0, len(rows), self.batch_size)
            ]
        )
        score = packed_sequence_scores if budget else sequence_scores
        scores = torch.zeros(len(rows))
        with adapter_disabled(self.model) if self.adapter_disabled else nullcontext():
            for indices in plan:
                found = (
                    self.shared_scores(
                        [prompt_rows[i] for i in indices], [responses[i] for i in indices], device
                    )
                    if self.shared_prefix
                    else None
                )
                if found is None:  # the rows scored whole
                    chunk = [rows[i] for i in indices]
                    ids = pad_right(chunk, self.tokenizer.pad_token_id).to(device)
                    mask = pad_right([[1] * len(r) for r in chunk], 0).to(device)
                    found = score(self.model, ids, mask, normalize=self.normalize)
                scores[indices] = found.float().cpu()
        return scores

    def shared_scores(
        self, prompts: list[list[int]], responses: list[list[int]], device: torch.device
    ) -> Tensor | None:
        """The rows' scores with each distinct prompt forwarded once, prompts left-padded and
        responses right-padded (the policy's layout, ``shared_prefix_sequence_scores``); None
        where no two rows share a prompt or it cannot apply (the caller scores them whole)."""
        if len({tuple(p) for p in prompts}) == len(prompts) or not all(prompts):
            return None
        pad = self.tokenizer.pad_token_id
        ids = torch.cat([pad_left(prompts, pad), pad_right(responses, pad)], 1)
        mask = torch.cat(
            [
                pad_left([[1] * len(p) for p in prompts], 0),
                pad_right([[1] * len(r) for r in responses], 0),
            ],
            1,
        )
        return shared_prefix_sequence_scores(
            self.model, ids.to(device), mask.to(device), max(map(len, prompts)), self.normalize
        )


@dataclass(frozen=True)
class RewardScores:
    """What the reward sources give a batch of B responses: the one record every reward role
    returns, local or remote (an estimator that combines the sources itself, GDPO, reads
    ``per_source`` and ``weights`` from it, never from the role)."""

    total: Tensor  # (B,) Σ_k w_k · score_k, a function's None counting 0
    per_source: Tensor  # (B, K) each source's scores, None as 0; (B, 0) with no source
    weights: tuple[float, ...]  # (K,) w_k
    parts: dict[str, float]  # logged: reward/<name> means, an ensemble's members and spread

    def cpu(self) -> RewardScores:
        return replace(self, total=self.total.cpu(), per_source=self.per_source.cpu())

    def with_source(self, name: str, scores: Tensor, parts: dict[str, float]) -> RewardScores:
        """One more source of weight 1 (an episode's reward from its environment): (B,)
        ``scores`` added to the total and as a column, its mean logged as ``reward/<name>``."""
        return RewardScores(
            self.total + scores,
            torch.cat([self.per_source, scores[:, None]], dim=1),
            (*self.weights, 1.0),
            self.parts | {f"reward/{name}": scores.mean().item()} | parts,
        )


class RewardRole(Protocol):
    """What the loop calls to score a batch, wherever the sources live: ``WeightedRewards`` in
    the trainer's process, ``placement.ray_roles.RemoteRewards`` in a Ray actor. Both return a
    ``RewardScores``, so a stage cannot read from one what the other lacks."""

    trainer_state: TrainerState  # set each iteration; reaches reward functions via the columns

    def __call__(
        self, prompts: list[PromptExample], completions: list[str], columns: dict[str, list[Any]]
    ) -> RewardScores: ...


@dataclass
class WeightedRewards:
    """``Σ_k w_k · score_k``; each source's mean is logged as ``reward/<name>``. A function's
    ``None`` (NaN here) counts 0 in the sum and is left out of its mean, as TRL's ``nansum``."""

    sources: list[Any]
    weights: list[float]
    warned_none: bool = False
    warned_mismatch: bool = False  # REENCODED_MISMATCH over MISMATCH_WARN_SHARE, warned
    trainer_state: TrainerState = field(default_factory=TrainerState)  # set each iteration

    def check_columns(self, columns: Sequence[str]) -> None:
        """Each reward function's parameters against the data's column names, before training."""
        for source in self.sources:
            if isinstance(source, FunctionReward):
                source.check_columns(columns)

    def __call__(
        self, prompts: list[PromptExample], completions: list[str], columns: dict[str, list[Any]]
    ) -> RewardScores:
        total = torch.zeros(len(completions))
        scored = torch.zeros(len(completions), dtype=torch.bool)
        parts, per_source = {}, []
        for source, weight in zip(self.sources, self.weights, strict=True):
            scores = source(prompts, completions, columns)
            applies = ~scores.isnan()
            if applies.any():
                parts[f"reward/{source.name}"] = scores[applies].mean().item()
            parts.update(getattr(source, "last_parts", {}))  # an ensemble's members and spread
            total = total + weight * scores.nan_to_num(0.0)
            scored |= applies
            per_source.append(scores.nan_to_num(0.0))
        self.warn_mismatch(parts.get(REENCODED_MISMATCH, 0.0), len(completions))
        if self.sources and not scored.all() and not self.warned_none:
            self.warned_none = True
            log.warning(
                "every reward function returned None for %d of %d completions (first: prompt "
                "index %d); they score 0",
                int((~scored).sum()),
                len(completions),
                int((~scored).nonzero()[0]),
            )
        # (B, 0) with no source: an environment's reward alone
        stacked = torch.stack(per_source, dim=1) if per_source else total[:, None][:, :0]
        return RewardScores(total, stacked, tuple(self.weights), parts)

    def warn_mismatch(self, share: float, batch: int) -> None:
        """Once per run: the reward model judged text that is not what was sampled for more
        than ``MISMATCH_WARN_SHARE`` of a batch of ``batch`` responses."""
        if share > MISMATCH_WARN_SHARE and not self.warned_mismatch:
            self.warned_mismatch = True
            log.warning(
                "the reward model scored %.0f%% of %d responses as other token ids than were "
                "sampled: their text does not encode back to them (%s); a reward model with the "
                "policy's tokenizer scores the sampled ids",
                100 * share,
                batch,
                REENCODED_MISMATCH,
            )


def check_reward_columns(specs: Sequence[str], prompts: Sequence[PromptExample]) -> None:
    """Each reward function in ``specs`` (``module:function``) against the columns of the
    ``prompts`` data: a parameter it requires that is neither passed nor a column is one line,
    before any model loads (the first reward call would find it only after start-up)."""
    columns = sorted({key for p in prompts for key in p.columns})
    for spec in specs:
        FunctionReward(spec, load_reward_function(spec)).check_columns(columns)
