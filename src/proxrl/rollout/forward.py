"""Forward passes over prompt + response that every online algorithm needs.

Positions are computed from the attention mask, as ``generate`` does for left-padded prompts, so
the log-probs recomputed here are those the sampler drew from (a plain forward would number a
left-padded row's tokens from the padding and shift every position). ``packed=True`` runs the
same forward padding-free (``rollout.packing``) and returns the same padded tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.parallel import DataParallel, DistributedDataParallel

from proxrl.core import processed_entropy, processed_logprobs, token_logprobs, truncates
from proxrl.models.scalar_head import (
    apply_head,
    backbone,
    score_head,
    without_offset,
)
from proxrl.rollout.generation import cache_keyword
from proxrl.rollout.packing import pack_batch, unpack
from proxrl.rollout.packing import real_positions as position_ids
from proxrl.rollout.prefix import (
    can_share,
    response_inputs,
    shared_prefix_inputs,
)


@dataclass
class PolicyOutput:
    logprobs: Tensor  # (B, T) log π(a_t|s_t) of the response tokens under the processed
    # distribution (temperature, top-k, top-p, min-p: ``core.processed_logprobs``), 0 at the
    # response padding (``attention_mask`` 0; with_logits: every position's)
    entropy: Tensor | None  # (B, T) entropy of that processed π(·|s_t), when asked for (0 at
    # the padding, as logprobs)
    hidden: Tensor | None  # (B, T, d) last hidden state at s_t, when asked for (value head)
    argmax: Tensor | None = None  # (B, T) int64 likeliest token at s_t, when asked for (a
    # teacher; 0 at the padding, as logprobs)
    logits: Tensor | None = None  # (B, T, V) the raw logits at s_t, when asked for (a
    # full-vocabulary distillation loss; the padded forward only)


def output_head(model: nn.Module) -> nn.Module | None:
    """The module that turns a causal LM's last hidden states into logits (``lm_head``, tied or
    not, LoRA-wrapped or not), looking through data-parallel and peft wrappers; None when the
    model names none."""
    while isinstance(model, DataParallel | DistributedDataParallel):
        model = model.module
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if isinstance(head, nn.Module) else None


def logits_at(
    model: nn.Module,
    select: Callable[[Tensor], Tensor],
    sequence_shape: tuple[int, ...],
    **inputs: Any,
) -> tuple[Any, Tensor]:
    """The model's forward over ``inputs`` and its logits at the positions ``select`` picks: a
    function of a (B, L, ...) tensor that indexes its first two dimensions (``sequence_shape``
    is (B, L)). → (the model's output, ``select(logits)``).

    The output head (``output_head``) is applied to ``select(hidden states)`` only: the
    vocabulary projection is ~28% of Qwen2-0.5B's FLOPs per token and the prompt positions
    predict nothing that is scored. Whatever the model does after its head (Gemma-2's soft-cap,
    Cohere's and Granite's logit scales) is position-wise, so it applies unchanged. The head's
    input is narrowed by a forward pre-hook for the one call, which serves models without
    ``logits_to_keep`` and the packed forward's per-line positions alike. A model whose head
    is not found, or not called on (B, L, d) hidden states, computes every position's logits,
    and ``select`` picks from those: the same values either way."""
    head = output_head(model)
    narrowed: list[bool] = []

    def only_selected(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        hidden = args[0] if args else None
        if narrowed or not isinstance(hidden, Tensor) or hidden.shape[:2] != sequence_shape:
            return None
        narrowed.append(True)
        return (select(hidden), *args[1:])

    handle = head.register_forward_pre_hook(only_selected) if head is not None else None
    try:
        output = model(**inputs)
    finally:
        if handle is not None:
            handle.remove()
    return output, output.logits if narrowed else select(output.logits)


def policy_forward(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    prompt_length: int,
    temperature: float,
    with_entropy: bool = False,
    with_hidden: bool = False,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    packed: bool = False,
    with_argmax: bool = False,
    with_logits: bool = False,
    shared_prefix: bool = False,
) -> PolicyOutput:
    """Log-probs of the response tokens ``input_ids[:, P:]`` given everything before them,
    under the distribution the sampler drew from (its temperature, top-k, top-p and min-p).

    ``logits[:, P−1+t]`` predicts response token t: only the logits of the positions that
    predict a real response token (``attention_mask[:, P + t]`` 1) are computed
    (``logits_at``, as one (1, N, V) set), never the prompt's, the last token's or the
    response padding's; log-probs, entropy and argmax are 0 at the padding (``with_logits``,
    whose caller reads the whole (B, T, V), computes every response position's). ``packed``:
    the padding-free forward, the same outputs. ``shared_prefix``: rows with the same prompt
    forward it once (``rollout.prefix``), the same outputs to float rounding (the padded
    forward; where no two rows share a prompt, the repeated one).
    """
    if packed:
        if with_logits:
            raise ValueError("with_logits: the padded forward only")
        return _packed_policy_forward(
            model, input_ids, attention_mask, prompt_length, temperature, with_entropy,
            with_hidden, top_k, top_p, min_p, with_argmax,
        )  # fmt: skip
    P = prompt_length
    shape = (input_ids.shape[0], input_ids.shape[1] - P)
    scored = (  # the positions whose logits are computed: (B, T) bool
        torch.ones(shape, dtype=torch.bool, device=input_ids.device)
        if with_logits
        else attention_mask[:, P:] != 0
    )
    rows, columns = scored.nonzero(as_tuple=True)
    found = None
    if shared_prefix and can_share(model):
        found = _shared_prefix_logits(
            model, input_ids, attention_mask, P, with_hidden, rows, columns
        )
    if found is None:
        output, logits = logits_at(
            model,
            lambda x: x[rows, columns + (P - 1)].unsqueeze(0),
            input_ids.shape,
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids(attention_mask),
            output_hidden_states=with_hidden,
            use_cache=False,
        )  # logits (1, N, V): logits[0, n] predicts input_ids[rows[n], P + columns[n]]
        hidden = output.hidden_states[-1][:, P - 1 : -1] if with_hidden else None
        # (squeeze, not [0]: a view in the backward too, not a (1, N, V) copy of the gradient)
        found = [ScoredPositions(logits.squeeze(0), rows, columns)], hidden
    pieces, hidden = found
    return _scores(
        pieces, input_ids[:, P:], shape, temperature, (top_k, top_p, min_p), with_entropy,
        with_argmax, with_logits, hidden,
    )  # fmt: skip


@dataclass(frozen=True)
class ScoredPositions:
    """Logits at some response positions: ``logits[n]`` (V,) predicts response token
    ``columns[n]`` of row ``rows[n]``."""

    logits: Tensor  # (n, V)
    rows: Tensor  # (n,) int64
    columns: Tensor  # (n,) int64


def _scores(
    pieces: list[ScoredPositions],
    response: Tensor,
    shape: tuple[int, int],
    temperature: float,
    truncation: tuple[int, float, float],
    with_entropy: bool,
    with_argmax: bool,
    with_logits: bool,
    hidden: Tensor | None,
) -> PolicyOutput:
    """``policy_forward``'s outputs from the logits at the scored positions: each piece's
    log-probs (entropy, argmax) computed on its own (every one is position-wise) and written
    to (B, T), 0 where no piece scores (``unpack``)."""
    rows = torch.cat([p.rows for p in pieces])
    columns = torch.cat([p.columns for p in pieces])

    step = max(shape[1], 1)  # T positions at a time: the (T, V) temporaries of the padded
    # rows' loop, not (N, V)

    def per_position(score: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
        # ``split``, not slices: the backward of k slices of a piece's (n, V) logits is k
        # zero-filled (n, V) gradients summed; of a split, the k chunks' gradients put side by
        # side once (the same values)
        values = [
            score(chunk[None], tokens[None])[0]
            for p in pieces
            for chunk, tokens in zip(
                p.logits.split(step), response[p.rows, p.columns].split(step), strict=True
            )  # (an empty piece: one empty chunk)
        ]
        return unpack(torch.cat(values), rows, columns, shape)

    logits = None
    if with_logits:
        vocabulary = pieces[0].logits.shape[-1]
        if len(pieces) == 1:  # every position in row order: the (B, T, V) view
            logits = pieces[0].logits.view(*shape, vocabulary)
        else:
            logits = unpack(torch.cat([p.logits for p in pieces]), rows, columns, shape)
    if truncates(*truncation):
        logprobs = per_position(
            lambda x, tokens: processed_logprobs(x, tokens, temperature, *truncation)
        )
    else:  # the same values and gradient, no (n, V) buffer in the backward (token_logprobs)
        values = [
            # the gradient over the logits themselves, unless the caller reads them
            token_logprobs(
                p.logits, response[p.rows, p.columns], temperature, step, not with_logits
            )
            for p in pieces
        ]
        logprobs = unpack(torch.cat(values), rows, columns, shape)
    return PolicyOutput(
        logprobs=logprobs,
        entropy=(
            per_position(lambda x, _: processed_entropy(x.detach(), temperature, *truncation))
            if with_entropy
            else None
        ),
        hidden=hidden,
        argmax=per_position(lambda x, _: x.argmax(-1)) if with_argmax else None,
        logits=logits,
    )


def _shared_prefix_logits(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    P: int,
    with_hidden: bool,
    rows: Tensor,
    columns: Tensor,
) -> tuple[list[ScoredPositions], Tensor | None] | None:
    """``policy_forward``'s logits at the response positions (``rows``, ``columns``) (each
    predicted from position P−1+column) and (with_hidden) the (B, T, d) last hidden states at
    positions P−1 … P+T−2, each distinct prompt forwarded once: column 0 from the prompt's call
    (its last position, once per prompt), the rest from the responses' call over its cache.
    None where no two rows share a prompt or the model keeps no cache."""
    positions = position_ids(attention_mask)
    found = shared_prefix_inputs(input_ids, attention_mask, positions, P)
    if found is None:
        return None
    groups, prefix = found
    first, T = groups.firsts, input_ids.shape[1] - P
    prefix_out, last = logits_at(
        model, lambda x: x[:, -1:], (len(first), P), **prefix, output_hidden_states=with_hidden
    )
    cache = getattr(prefix_out, cache_keyword(model), None)
    if cache is None:
        return None
    inputs = response_inputs(model, cache, groups, input_ids, attention_mask, positions, P)
    at_start = columns == 0
    rows0, rows1, columns1 = rows[at_start], rows[~at_start], columns[~at_start]
    out, rest = logits_at(
        model,
        lambda x: x[rows1, columns1 - 1].unsqueeze(0),
        (len(input_ids), T),
        **inputs,
        output_hidden_states=with_hidden,
    )
    pieces = [
        ScoredPositions(last[groups.inverse[rows0], 0], rows0, columns[at_start]),
        ScoredPositions(rest.squeeze(0), rows1, columns1),  # (a view in the backward too)
    ]
    if not with_hidden:
        return pieces, None
    last_hidden = prefix_out.hidden_states[-1][:, -1:][groups.inverse]
    return pieces, torch.cat([last_hidden, out.hidden_states[-1][:, :-1]], 1)


def _packed_policy_forward(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    prompt_length: int,
    temperature: float,
    with_entropy: bool,
    with_hidden: bool,
    top_k: int,
    top_p: float,
    min_p: float,
    with_argmax: bool = False,
) -> PolicyOutput:
    """``policy_forward`` on the packed rows. The logits are computed only at the M (line,
    slot) positions that predict a response token (``logits_at``), as one (1, M, V) sequence:
    the positions are picked from the hidden states by one gather, whose backward writes one
    (R, W, d) gradient (a chunk-by-chunk gather of logits rows costs a zero-filled
    logits-sized gradient per chunk, which made the packed backward slower than the padded
    one). Prompts, line starts and filler get no logits."""
    packed = pack_batch(input_ids, attention_mask)
    rows, columns, lines, slots = packed.predictions(prompt_length)
    shape = (input_ids.shape[0], input_ids.shape[1] - prompt_length)
    output, logits = logits_at(
        model,
        lambda x: x[lines, slots].unsqueeze(0),
        packed.input_ids.shape,
        **packed.model_inputs(),
        output_hidden_states=with_hidden,
    )  # logits (1, M, V): logits[0, m] predicts packed token (lines[m], slots[m] + 1)
    next_tokens = packed.input_ids[lines, slots + 1].unsqueeze(0)
    logprobs = processed_logprobs(logits, next_tokens, temperature, top_k, top_p, min_p)[0]
    entropy = (
        processed_entropy(logits.detach(), temperature, top_k, top_p, min_p)[0]
        if with_entropy
        else None
    )
    return PolicyOutput(
        logprobs=unpack(logprobs, rows, columns, shape),
        entropy=None if entropy is None else unpack(entropy, rows, columns, shape),
        hidden=unpack(output.hidden_states[-1][lines, slots], rows, columns, shape)
        if with_hidden
        else None,
        argmax=unpack(logits[0].argmax(-1), rows, columns, shape) if with_argmax else None,
    )


def at_least_float32(x: Tensor) -> Tensor:
    """Half-precision log-probs in float32; float64 ones (a float64 model's) kept, so that
    π_old and π_ref carry the precision the update's own forward has."""
    return x if x.dtype == torch.float64 else x.float()


def frozen_pass(
    frozen: Any,
    input_ids: Tensor,
    attention_mask: Tensor,
    prompt_length: int,
    temperature: float,
    truncation: dict[str, Any],
    packed: bool,
    with_argmax: bool = False,
    shared_prefix: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """A frozen role's pass (the reference's, a distillation teacher's): (B, P + T) ids and mask
    → (B, T) log π of the response tokens under the processed distribution (``policy_forward``:
    temperature, then ``truncation``'s top-k / top-p / min-p; ``packed``: its padding-free
    forward; ``shared_prefix``: a group's prompt once), at least float32, and ``with_argmax``
    the (B, T) int64 likeliest token at each position (None without); both on the caller's
    device.

    Computed where the role lives: a module of this process (on the CPU under
    offload_frozen_roles), or a stand-in for one placed elsewhere (placement ray's
    ``RemoteFrozen``), whose actor runs this same function on its model and sends back these
    B × T numbers, never the (B, P + T, V) logits."""
    if isinstance(frozen, nn.Module):
        device = next(frozen.parameters()).device
        out = policy_forward(
            frozen,
            input_ids.to(device),
            attention_mask.to(device),
            prompt_length,
            temperature,
            **truncation,
            packed=packed,
            with_argmax=with_argmax,
            shared_prefix=shared_prefix,
        )
        logprobs, argmax = at_least_float32(out.logprobs), out.argmax
    else:
        logprobs, argmax = frozen.logprobs(
            input_ids, attention_mask, prompt_length, temperature, truncation, packed, with_argmax
        )
    here = input_ids.device
    return logprobs.to(here), None if argmax is None else argmax.to(here)


def response_logits(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, prompt_length: int
) -> Tensor:
    """(B, P + T) ids and mask → (B, T, V) the logits that predict each response token (only
    those computed: ``logits_at``), on the caller's device: the teacher's whole distribution
    for a full-vocabulary distillation loss. Run it under ``torch.no_grad`` for a frozen model."""
    device = next(model.parameters()).device
    _, logits = logits_at(
        model,
        lambda x: x[:, prompt_length - 1 : -1],
        input_ids.shape,
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        position_ids=position_ids(attention_mask).to(device),
        use_cache=False,
    )
    return logits.to(input_ids.device)


def critic_forward(
    critic: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    prompt_length: int,
    packed: bool = False,
    shared_prefix: bool = False,
) -> Tensor:
    """V(s_t) for every response token from a separate critic (a ``num_labels=1`` sequence
    classifier): its head on the hidden state that precedes token t. → (B, T). ``packed``: the
    padding-free forward (0 where no real token precedes); ``shared_prefix``: a group's prompt
    forwarded once (``rollout.prefix``)."""
    if packed:
        batch = pack_batch(input_ids, attention_mask)
        hidden = backbone(critic)(**batch.model_inputs()).last_hidden_state
        rows, columns, lines, slots = batch.predictions(prompt_length)
        values = apply_head(score_head(critic), hidden[lines, slots]).squeeze(-1).float()
        return unpack(
            values, rows, columns, (input_ids.shape[0], input_ids.shape[1] - prompt_length)
        )
    hidden = None
    if shared_prefix and can_share(critic):
        hidden = _shared_prefix_hidden(backbone(critic), input_ids, attention_mask, prompt_length)
    if hidden is None:
        hidden = backbone(critic)(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids(attention_mask),
        ).last_hidden_state[:, prompt_length - 1 : -1]
    return apply_head(score_head(critic), hidden).squeeze(-1).float()


def _shared_prefix_hidden(
    body: nn.Module, input_ids: Tensor, attention_mask: Tensor, P: int
) -> Tensor | None:
    """A transformer body's (B, T, d) last hidden states at positions P−1 … P+T−2, each
    distinct prompt forwarded once (as ``_shared_prefix_logits``); None where no two rows share
    a prompt or the body keeps no cache."""
    positions = position_ids(attention_mask)
    found = shared_prefix_inputs(input_ids, attention_mask, positions, P)
    if found is None:
        return None
    groups, prefix = found
    prefix_out = body(**prefix)
    cache = getattr(prefix_out, cache_keyword(body), None)
    if cache is None:
        return None
    inputs = response_inputs(body, cache, groups, input_ids, attention_mask, positions, P)
    rest = body(**inputs).last_hidden_state[:, :-1]
    return torch.cat([prefix_out.last_hidden_state[:, -1:][groups.inverse], rest], 1)


def packed_sequence_scores(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, normalize: bool = False
) -> Tensor:
    """``models.scalar_head.sequence_scores`` on the packed rows: (B, L) → (B,) the head at each
    row's last real token (minus the stored ``reward_offset`` when ``normalize``)."""
    batch = pack_batch(input_ids, attention_mask)
    hidden = backbone(model)(**batch.model_inputs()).last_hidden_state
    lines, slots = batch.last_tokens(input_ids.shape[0])
    scores = apply_head(score_head(model), hidden[lines, slots]).squeeze(-1)
    return without_offset(model, scores) if normalize else scores


def shared_prefix_sequence_scores(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    prompt_length: int,
    normalize: bool = False,
) -> Tensor | None:
    """``models.scalar_head.sequence_scores`` with each distinct prompt forwarded once: (B,
    P + T) rows, their prompts left-padded in the first P columns and their responses
    right-padded after (the policy's layout), → (B,) the head at each row's last real token
    (minus the stored ``reward_offset`` when ``normalize``). The responses run against their
    prompt's keys and values (``rollout.prefix``), so the scores are those of the whole rows'
    forward up to float rounding. None where it cannot apply: no two rows share a prompt, a
    row has no response token, the model keeps no cache or may not share (``can_share``)."""
    P = prompt_length
    lengths = attention_mask[:, P:].sum(-1)  # the responses' real tokens (right-padded)
    if not can_share(model) or bool((lengths == 0).any()):
        return None
    body = backbone(model)
    positions = position_ids(attention_mask)
    found = shared_prefix_inputs(input_ids, attention_mask, positions, P)
    if found is None:
        return None
    groups, prefix = found
    cache = getattr(body(**prefix), cache_keyword(body), None)
    if cache is None:
        return None
    inputs = response_inputs(body, cache, groups, input_ids, attention_mask, positions, P)
    hidden = body(**inputs).last_hidden_state  # (B, T, d) at positions P … P + T − 1
    rows = torch.arange(len(input_ids), device=input_ids.device)
    scores = apply_head(score_head(model), hidden[rows, lengths - 1]).squeeze(-1)
    return without_offset(model, scores) if normalize else scores
