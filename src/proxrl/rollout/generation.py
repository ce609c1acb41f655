"""Sampling responses, behind one small interface.

``Sampler.sample`` takes left-padded prompt ids and returns response ids, the mask of valid
response tokens (anything after the stop, EOS or a stop string, is masked) and, on request,
the sampler's own log-probs. The Hugging Face
implementation uses ``generate`` with the KV cache; a vLLM backend for GPUs implements the same
method and no algorithm changes.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from proxrl.core import entropy_from_logprobs, truncate_logits, truncates
from proxrl.runtime.errors import ProxrlError


@dataclass(frozen=True)
class SamplingSettings:
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    stop_strings: tuple[str, ...] = ()
    greedy: bool = False
    min_p: float = 0.0  # 0: off

    @property
    def truncation(self) -> dict[str, Any]:
        """top_k, top_p and min_p as keywords of ``core.processed_logprobs``."""
        return {"top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p}


@dataclass
class Samples:
    response_ids: Tensor  # (B, T) sampled tokens, pad after the stop
    response_mask: Tensor  # (B, T) 1 up to and including the stop token
    logprobs: Tensor | None = None  # (B, T) log π(a_t|s_t) of the processed distribution the
    # sampler drew from (temperature, top-k, top-p, min-p: ``core.processed_logprobs``)
    entropy: Tensor | None = None  # (B, T) entropy of that processed distribution
    action_mask: Tensor | None = None  # (B, T) 1 at the tokens the model sampled, 0 at an
    # episode's observation tokens and padding; None for single-turn responses (all sampled)


class Sampler(Protocol):
    def sample(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        settings: SamplingSettings,
        with_logprobs: bool = False,
    ) -> Samples:
        """(B, P) left-padded prompts → the sampled responses, and with ``with_logprobs`` the
        sampler's own log-probs of them (so no second forward pass is needed)."""
        ...


def response_mask_after_stop(response_ids: Tensor, eos_token_id: int, pad_token_id: int) -> Tensor:
    """(B, T) → (B, T) mask: 1 up to and including the first EOS (or, without one, up to the
    last non-pad token), 0 after it.

    A pad token the model happened to sample inside a response stays valid: the sampler
    attended to it, so dropping it would shift every later position and log-prob. Only the
    padding after a response's end is masked. The pad id must differ from EOS
    (``models.tokenizer`` guarantees it).
    """
    is_eos = response_ids == eos_token_id
    after_eos = (is_eos.cumsum(-1) - is_eos.long()) > 0
    before_trailing_pad = (response_ids != pad_token_id).long().flip(-1).cumsum(-1).flip(-1) > 0
    return (~after_eos & before_trailing_pad).long()


def stopped(
    response_mask: Tensor, response_ids: Tensor, eos_token_id: int, max_new_tokens: int
) -> Tensor:
    """(B,) True for responses that ended by themselves: an EOS, or a stop string (which ends a
    response before ``max_new_tokens``); False for those cut off at the length limit."""
    has_eos = ((response_ids == eos_token_id) & response_mask.bool()).any(-1)
    return has_eos | (response_mask.sum(-1) < max_new_tokens)


class HFSampler:
    """``model.generate`` with the KV cache on CPU or GPU."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer

    @torch.no_grad()
    def sample(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        settings: SamplingSettings,
        with_logprobs: bool = False,
    ) -> Samples:
        kwargs: dict[str, Any] = {
            "max_new_tokens": settings.max_new_tokens,
            "pad_token_id": self.tokenizer.pad_token_id,
            "eos_token_id": self.tokenizer.eos_token_id,
            "use_cache": True,
            "return_dict_in_generate": True,
            "output_logits": with_logprobs,
            # transformers turns ``synced_gpus`` on for any FSDP module on several ranks: an
            # all-reduce per step, which ``gathered_for_generation``'s whole weights make
            # unneeded (ranks may stop at different steps) and which left gloo's process group
            # alive past ``destroy_process_group``.
            "synced_gpus": False,
        }
        if settings.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(
                do_sample=True,
                temperature=settings.temperature,
                top_k=settings.top_k or None,
                top_p=settings.top_p if settings.top_p < 1.0 else None,
                min_p=settings.min_p or None,
            )
        if settings.stop_strings:
            kwargs.update(stop_strings=list(settings.stop_strings), tokenizer=self.tokenizer)
        was_training = self.model.training
        self.model.eval()
        output = self.model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, **kwargs)
        self.model.train(was_training)
        response_ids = output.sequences[:, prompt_ids.shape[1] :]
        mask = response_mask_after_stop(
            response_ids, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        )
        response_ids = torch.where(mask.bool(), response_ids, self.tokenizer.pad_token_id)
        samples = Samples(response_ids, mask)
        if with_logprobs:
            # Raw logits (``output_logits`` are taken before generate's processors), one (B, V)
            # step at a time: processed as the trainer does, never stacking a (B, T, V) copy.
            temperature = 1.0 if settings.greedy else settings.temperature
            truncation = {} if settings.greedy else settings.truncation
            logprobs, entropy = [], []
            for t, step_logits in enumerate(output.logits):
                log_p = torch.log_softmax(
                    truncate_logits(step_logits.float() / temperature, **truncation), dim=-1
                )
                logprobs.append(log_p.gather(-1, response_ids[:, t : t + 1]).squeeze(-1))
                entropy.append(entropy_from_logprobs(log_p))
            # where, not × mask: a pad token outside top-k / top-p has log-prob −inf
            samples.logprobs = torch.stack(logprobs, 1).where(mask.bool(), 0.0)
            samples.entropy = torch.stack(entropy, 1).where(mask.bool(), 0.0)
        return samples


def draw_tokens(probs: Tensor, uniform: Tensor | None = None) -> Tensor:
    """(B, V) probabilities (rows need not sum exactly to 1) → (B,) one token per row, drawn by
    inverting the row's CDF with one uniform number: ``uniform`` (B, 1) float64 in [0, 1), or
    drawn here.

    ``torch.multinomial`` draws V exponentials per row: on a CPU that is 0.16 ms a step at
    V = 311 and 15 ms at V = 32,000, more than a small model's forward pass; this is 0.01 and
    0.4 ms. The CDF is summed in float64 and the uniform scaled by its total, so a token of zero
    probability (top-k, top-p) is never drawn.
    """
    cdf = probs.double().cumsum(-1)
    if not bool(torch.isfinite(cdf[:, -1]).all()):
        raise ValueError(
            "draw_tokens: non-finite probabilities (the policy's logits hold NaN or inf)"
        )
    if uniform is None:
        uniform = torch.rand(cdf.shape[0], 1, dtype=torch.float64, device=probs.device)
    u = uniform * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_max(probs.shape[-1] - 1)


def distinct_rows(prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor] | None:
    """(B, P) left-padded prompts → ``(first, inverse)``: ``first`` (U,) the first row of each
    distinct prompt (same ids and mask), in the order they appear, and ``inverse`` (B,) each
    row's index into ``first``, so ``x[first][inverse]`` is ``x`` for anything that depends on
    the prompt alone. None when every row is distinct (nothing to share)."""
    keys = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
    unique, inverse = torch.unique(keys, dim=0, return_inverse=True)
    if unique.shape[0] == keys.shape[0]:
        return None
    rows = torch.arange(keys.shape[0], device=keys.device)
    first = torch.full_like(rows[: unique.shape[0]], keys.shape[0])
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")
    order = first.argsort()  # torch.unique sorts by value: back to the batch's order
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=keys.device)
    return first[order], rank[inverse]


def cache_keyword(model: Any) -> str:
    """The name ``model``'s forward takes and returns its KV cache by: transformers renamed
    ``past_key_values`` to ``cache`` in 5.x (peft looked through)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def static_cache(model: Any, length: int) -> Any:
    """transformers' ``StaticCache`` of ``length`` positions for ``model`` (peft looked through);
    a ``ProxrlError`` naming ``compile_sampler`` for a model that has none."""
    from transformers import StaticCache

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return StaticCache(config=base.config, max_cache_len=length)
    except Exception as error:  # transformers raises several types for configs it cannot cache
        raise ProxrlError(
            f"compile_sampler: {type(base).__name__} has no static KV cache ({error}); "
            "set compile_sampler false"
        ) from error


class CachedSampler:
    """A lean decoding loop over the model's KV cache: one forward per token and nothing else
    (``generate``'s per-step machinery costs more than a small model's forward on a CPU).

    Same distribution as ``HFSampler`` (temperature, top-k, top-p, min-p, EOS: the processed
    distribution of ``core.sampling``, which the trainer scores too), with positions taken
    from the attention mask as ``generate`` does for left padding. Stop strings need
    ``generate``'s text matching: use ``HFSampler`` for them.

    ``drop_stopped=True``: rows that have stopped leave the decoding batch (their KV-cache rows
    dropped, ``batch_select_indices``, once an eighth of the batch has stopped), so on a batch
    whose responses differ in length the later steps compute only the rows still running.
    Every step still draws one uniform number per row of the whole batch, so the tokens are
    those of the loop that decodes every row to the end (``drop_stopped=False``).

    ``compile_step=True``: the decoding step goes through ``torch.compile`` over a static KV
    cache (its length rounded up to a multiple of ``CACHE_BUCKET`` so that prompts of other
    lengths reuse the compiled step). One compile per batch size and bucket — seconds on a CPU —
    then every step is cheaper: it pays on long runs of small models, where per-step overhead
    rules. Past torch's recompile limit (8 shapes) dynamo runs the step uncompiled, with a warning.

    ``shared_prefill=True``: rows with the same prompt (ids and mask: a GRPO group's G copies)
    are prefilled once and the KV cache and first logits expanded to every row
    (``distinct_rows``), so the prefill costs the distinct prompts, not the batch. The rows
    then decode as before: the same positions, the same uniform per row per step. Exact up to
    the float rounding of a smaller matmul. Only on the dynamic cache: with ``compile_step`` the
    static cache's fixed buffers are allocated by the prefill, and every row is prefilled.
    """

    CACHE_BUCKET = 64

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        compile_step: bool = False,
        drop_stopped: bool = True,
        shared_prefill: bool = True,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.compile_step = compile_step
        self.drop_stopped = drop_stopped
        self.shared_prefill = shared_prefill

    @torch.no_grad()
    def sample(
        self,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        settings: SamplingSettings,
        with_logprobs: bool = False,
    ) -> Samples:
        if settings.stop_strings:
            raise ValueError("CachedSampler does not match stop strings; use HFSampler")
        was_training = self.model.training
        self.model.eval()
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        batch, prompt_length = prompt_ids.shape
        attention = prompt_mask.long()
        positions = (attention.cumsum(-1) - 1).clamp_min(0)
        cache_name = cache_keyword(self.model)
        step = self.model
        prefill: dict[str, Any] = {}
        if self.compile_step:
            # Every step then has the same shapes: the cache and the mask span the whole bucket
            # (the cache tracks how far it is filled and the causal mask hides the rest), so one
            # compiled graph serves every step.
            length = (
                -(-(prompt_length + settings.max_new_tokens) // self.CACHE_BUCKET)
                * self.CACHE_BUCKET
            )
            attention = torch.cat(
                [attention, attention.new_ones(batch, length - prompt_length)], dim=1
            )
            prefill = {cache_name: static_cache(self.model, length)}
            step = torch.compile(self.model.forward, dynamic=False)
        # Without ``compile_step`` the model builds the cache type it needs (sliding-window and
        # hybrid models differ) and the mask grows by one column a step.
        shared = (
            distinct_rows(prompt_ids, attention)
            if self.shared_prefill and not self.compile_step
            else None
        )
        first, inverse = shared if shared is not None else (slice(None), None)
        output = self.model(
            input_ids=prompt_ids[first],
            attention_mask=attention[first],
            position_ids=positions[first],
            use_cache=True,
            logits_to_keep=1,
            **prefill,
        )
        cache, logits = getattr(output, cache_name), output.logits[:, -1]
        if inverse is not None:  # each distinct prompt's cache and logits to its rows
            logits = logits[inverse]
            cache.reorder_cache(inverse)  # every layer type's row gather (a hybrid's states too)
        drops = self.drop_stopped and hasattr(cache, "batch_select_indices")
        next_position = positions[:, -1:] + 1
        device = prompt_ids.device
        finished = torch.zeros(batch, dtype=torch.bool, device=device)
        rows = torch.arange(batch, device=device)  # (b,) the batch row of each decoding row
        tokens, logprobs, entropies = [], [], []
        for _ in range(settings.max_new_tokens):
            if settings.greedy:
                log_p = torch.log_softmax(logits.float(), dim=-1)
                token = log_p.argmax(-1)
            else:
                scaled = logits.float() / settings.temperature
                if truncates(**settings.truncation):
                    scaled = truncate_logits(scaled, **settings.truncation)
                log_p = torch.log_softmax(scaled, dim=-1)  # the π the trainer scores
                uniform = torch.rand(batch, 1, dtype=torch.float64, device=device)
                token = draw_tokens(torch.softmax(scaled, dim=-1), uniform[rows])
            token = torch.where(finished[rows], pad, token)
            tokens.append(torch.full((batch,), pad, dtype=token.dtype, device=device))
            tokens[-1][rows] = token
            if with_logprobs:  # (a stopped row's are masked out below)
                logprobs.append(torch.zeros(batch, device=device))
                logprobs[-1][rows] = log_p.gather(-1, token.unsqueeze(-1)).squeeze(-1)
                entropies.append(torch.zeros(batch, device=device))
                entropies[-1][rows] = entropy_from_logprobs(log_p)
            finished[rows] |= token == eos
            if bool(finished.all()):
                break
            if not self.compile_step:
                running = ~finished[rows]
                if drops and int((~running).sum()) >= max(1, len(rows) // 8):
                    keep = running.nonzero().squeeze(-1)
                    cache.batch_select_indices(keep)
                    rows, token = rows[keep], token[keep]
                    attention, next_position = attention[keep], next_position[keep]
                attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
            output = step(
                input_ids=token.unsqueeze(-1),
                attention_mask=attention,
                position_ids=next_position,
                use_cache=True,
                **{cache_name: cache},
            )
            cache, logits = getattr(output, cache_name), output.logits[:, -1]
            next_position = next_position + 1
        self.model.train(was_training)
        response_ids = torch.stack(tokens, 1)
        mask = response_mask_after_stop(response_ids, eos, pad)
        response_ids = torch.where(mask.bool(), response_ids, pad)
        samples = Samples(response_ids, mask)
        if with_logprobs:
            # where, not × mask: a pad token outside top-k / top-p has log-prob −inf
            samples.logprobs = torch.stack(logprobs, 1).where(mask.bool(), 0.0)
            samples.entropy = torch.stack(entropies, 1).where(mask.bool(), 0.0)
        return samples
