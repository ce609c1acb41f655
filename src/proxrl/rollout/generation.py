"""Sampling responses, behind one small interface.

``Sampler.sample`` takes left-padded prompt ids and returns response ids and the mask of valid
response tokens; anything after the stop (EOS or a stop string) is masked. The Hugging Face
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


class Sampler(Protocol):
    def sample(self, prompt_ids: Tensor, prompt_mask: Tensor, settings: SamplingSettings) -> tuple[Tensor, Tensor]:
        """(B, P) left-padded prompts → ``(response_ids, response_mask)``, both (B, T)."""
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
    def sample(self, prompt_ids: Tensor, prompt_mask: Tensor, settings: SamplingSettings) -> tuple[Tensor, Tensor]:
        kwargs: dict[str, Any] = {
            "max_new_tokens": settings.max_new_tokens,
            "pad_token_id": self.tokenizer.pad_token_id,
            "eos_token_id": self.tokenizer.eos_token_id,
            "use_cache": True,
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
        response_ids = output[:, prompt_ids.shape[1] :]
        mask = response_mask_after_stop(response_ids, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id)
        response_ids = torch.where(mask.bool(), response_ids, self.tokenizer.pad_token_id)
        return response_ids, mask
