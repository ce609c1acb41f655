"""Sampling responses, behind one small interface.

``Sampler.sample`` takes left-padded prompt ids and returns response ids, the mask of valid
response tokens (anything after the stop, EOS or a stop string, is masked) and, on request,
the sampler's own log-probs. The Hugging Face
implementation uses ``generate`` with the KV cache; a vLLM backend for GPUs implements the same
method and no algorithm changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor


@dataclass(frozen=True)
class SamplingSettings:
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    stop_strings: tuple[str, ...] = ()
    greedy: bool = False


@dataclass
class Samples:
    response_ids: Tensor  # (B, T) sampled tokens, pad after the stop
    response_mask: Tensor  # (B, T) 1 up to and including the stop token
    logprobs: Tensor | None = None  # (B, T) log π(a_t|s_t) from the sampler's temperature-scaled logits
    entropy: Tensor | None = None  # (B, T) entropy of the sampler's temperature-scaled distribution


class Sampler(Protocol):
    def sample(
        self, prompt_ids: Tensor, prompt_mask: Tensor, settings: SamplingSettings, with_logprobs: bool = False
    ) -> Samples:
        """(B, P) left-padded prompts → the sampled responses, and with ``with_logprobs`` the
        sampler's own log-probs of them (so no second forward pass is needed)."""
        ...


def response_mask_after_stop(response_ids: Tensor, eos_token_id: int, pad_token_id: int) -> Tensor:
    """(B, T) → (B, T) mask: 1 up to and including the first EOS, 0 at pad and after the EOS.

    The pad id must differ from EOS (``models.tokenizer`` guarantees it), or a padded response
    would look like one that stopped.
    """
    is_eos = response_ids == eos_token_id
    after_eos = (is_eos.cumsum(-1) - is_eos.long()) > 0
    return (~after_eos & (response_ids != pad_token_id)).long()


def stopped(response_mask: Tensor, response_ids: Tensor, eos_token_id: int, max_new_tokens: int) -> Tensor:
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
        self, prompt_ids: Tensor, prompt_mask: Tensor, settings: SamplingSettings, with_logprobs: bool = False
    ) -> Samples:
        kwargs: dict[str, Any] = {
            "max_new_tokens": settings.max_new_tokens,
            "pad_token_id": self.tokenizer.pad_token_id,
            "eos_token_id": self.tokenizer.eos_token_id,
            "use_cache": True,
            "return_dict_in_generate": True,
            "output_logits": with_logprobs,
        }
        if settings.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(
                do_sample=True,
                temperature=settings.temperature,
                top_k=settings.top_k or None,
                top_p=settings.top_p if settings.top_p < 1.0 else None,
            )
        if settings.stop_strings:
            kwargs.update(stop_strings=list(settings.stop_strings), tokenizer=self.tokenizer)
        was_training = self.model.training
        self.model.eval()
        output = self.model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, **kwargs)
        self.model.train(was_training)
        response_ids = output.sequences[:, prompt_ids.shape[1] :]
        mask = response_mask_after_stop(response_ids, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id)
        response_ids = torch.where(mask.bool(), response_ids, self.tokenizer.pad_token_id)
        samples = Samples(response_ids, mask)
        if with_logprobs:
            # Raw logits, one (B, V) step at a time: scale by the temperature as the trainer
            # does, never stacking a (B, T, V) copy.
            temperature = 1.0 if settings.greedy else settings.temperature
            logprobs, entropy = [], []
            for t, step_logits in enumerate(output.logits):
                log_p = torch.log_softmax(step_logits.float() / temperature, dim=-1)
                logprobs.append(log_p.gather(-1, response_ids[:, t : t + 1]).squeeze(-1))
                p = log_p.exp()
                entropy.append(-torch.where(p > 0, p * log_p, 0.0).sum(-1))
            samples.logprobs = torch.stack(logprobs, 1) * mask
            samples.entropy = torch.stack(entropy, 1) * mask
        return samples
