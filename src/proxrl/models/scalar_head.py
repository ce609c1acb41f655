"""Reward and value models: a transformer with a scalar head, in the Hugging Face
``AutoModelForSequenceClassification`` (``num_labels=1``) layout.

The layout is what makes reward models portable: a model saved here is a plain
``LlamaForSequenceClassification`` (or Qwen2…, GPT-2…) that ``transformers`` loads without
proxrl, and a reward model trained elsewhere loads here.

- A reward read from the sequence is the head's output at the last non-pad token (the HF
  classifier does the same when the pad token is distinct from EOS; see ``models.tokenizer``).
- A value model reads the head at every token (``token_values``).
- A head that is missing from the checkpoint (a causal LM turned into a reward model) is
  initialised N(0, 1/√(d+1)) with bias 0 for a reward model (Ziegler et al. 2019; "The N
  implementation details of RLHF with PPO"), and to zero for a value model: only where
  training starts (``proxrl rm``, the critic). The model that scores rollouts must bring its
  head (``new_head=None``): transformers would build a random one and only warn.
- Score normalisation: most HF heads (Llama, Qwen2, GPT-2) have no bias, so the shift that
  makes the mean training score 0 cannot be folded into the head. ``reward_mean`` and
  ``reward_std`` are stored in the model config instead and ``sequence_scores(...,
  normalize=True)`` subtracts the mean; when the head has a bias it is shifted and the stored
  offset is 0. Plain transformers then gives the raw (unshifted) score of a bias-free head.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor, nn

from proxrl.models.causal_lm import from_pretrained_kwargs, load_pretrained, prepare_for_training
from proxrl.models.lora import is_peft_model
from proxrl.runtime.errors import ProxrlError

if TYPE_CHECKING:  # transformers loads with the first model, not with a config
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

HeadInit = Literal["reward", "zero"]


def load_score_model(
    name_or_path: str,
    *,
    new_head: HeadInit | None = "reward",
    dtype: str = "float32",
    attn_implementation: str | None = None,
    gradient_checkpointing: bool = False,
    trust_remote_code: bool = False,
) -> PreTrainedModel:
    """Load a ``num_labels=1`` sequence classifier; initialise its head if the checkpoint has
    none (``new_head="reward"``: N(0, 1/√(d+1)); ``"zero"``: zeros, for a critic; ``None``:
    refuse such a checkpoint with a ``ProxrlError``, for a model used as it is)."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    kwargs = from_pretrained_kwargs(dtype, attn_implementation, trust_remote_code)
    # transformers prints a multi-line load report when a causal LM becomes a classifier (its
    # lm_head unused, the head missing): expected here, so it is replaced by one log line.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model, info = load_pretrained(
            AutoModelForSequenceClassification,
            name_or_path,
            num_labels=1,
            output_loading_info=True,
            **kwargs,
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    head = score_head(model)
    head_names = {
        f"{name}.{p}"
        for name, module in model.named_modules()
        if module is head
        for p in ("weight", "bias")
    }
    missing = set(info["missing_keys"])
    if head_names & missing:
        if new_head is None:
            raise ProxrlError(f"{name_or_path} {_without_head(model)}")
        init_score_head(head, new_head)
        log.info(
            "%s: no scalar head in the checkpoint; initialised a %s head", name_or_path, new_head
        )
    if missing - head_names:
        log.warning(
            "%s: %d weights missing from the checkpoint were newly initialised (e.g. %s)",
            name_or_path,
            len(missing - head_names),
            sorted(missing - head_names)[0],
        )
    prepare_for_training(model, gradient_checkpointing)
    return model


def _without_head(model: PreTrainedModel) -> str:
    """What a checkpoint without a score head holds, in words (the architectures its config
    records; the missing head itself is what the loader reported)."""
    saved = [a for a in getattr(model.config, "architectures", None) or [] if isinstance(a, str)]
    kind = ", ".join(saved) or "no recorded architecture"
    causal = any("CausalLM" in a or a.endswith("LMHeadModel") for a in saved)
    what = "a causal LM" if causal else "a model"
    return f"holds {what} ({kind}) without a score head; train one with `proxrl rm`"


def score_head(model: nn.Module) -> nn.Linear:
    """The scalar head of a sequence classifier (``score`` in most HF models, ``classifier`` in
    some), looking through a peft wrapper."""
    inner = unwrap_peft(model)
    for name in ("score", "classifier"):
        head = getattr(inner, name, None)
        if head is not None:
            # peft wraps trained heads in ModulesToSaveWrapper; the active copy is the head,
            # the original one with the adapters disabled (``models.lora.adapter_disabled``).
            active = getattr(head, "modules_to_save", None)
            if active is not None and getattr(head, "disable_adapters", False):
                return head.original_module
            if active is not None:
                return active[
                    head.active_adapter
                    if isinstance(head.active_adapter, str)
                    else head.active_adapter[0]
                ]
            return head
    raise TypeError(f"{type(inner).__name__} has no 'score' or 'classifier' head")


def init_score_head(head: nn.Linear, how: HeadInit) -> None:
    """N(0, 1/√(d+1)) weights for a reward head, zeros for a value head; bias 0 in both."""
    with torch.no_grad():
        if how == "reward":
            head.weight.normal_(mean=0.0, std=1.0 / math.sqrt(head.in_features + 1))
        elif how == "zero":
            head.weight.zero_()
        else:
            raise ValueError(f"unknown head init {how!r}")
        if head.bias is not None:
            head.bias.zero_()


def unwrap_peft(model: nn.Module) -> nn.Module:
    """The transformers model inside a peft wrapper (LoRA layers stay injected); a
    data-parallel wrapper stays (``runtime.distributed.unwrap_parallel`` removes that one)."""
    return model.get_base_model() if is_peft_model(model) else model


def backbone(model: nn.Module) -> nn.Module:
    """The transformer body of a sequence classifier (``model.model`` for Llama)."""
    inner = unwrap_peft(model)
    return getattr(inner, inner.base_model_prefix)


def last_token_index(attention_mask: Tensor) -> Tensor:
    """(B, T) 0/1 mask → (B,) index of the last real token; works for left and right padding."""
    positions = torch.arange(attention_mask.shape[-1], device=attention_mask.device)
    return (positions * attention_mask.to(positions.dtype)).argmax(-1)


def apply_head(head: nn.Linear, hidden: Tensor) -> Tensor:
    """``head(hidden)`` in the head's own dtype, outside any autocast: under
    ``mixed_precision=bf16`` a bfloat16 score near 8 moves in steps of 1/32, enough to tie the
    responses of a group or coarsen a value target. (..., d) → (..., out)."""
    with torch.autocast(hidden.device.type, enabled=False):
        return head(hidden.to(head.weight.dtype))


def token_values(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """The head at every position: (B, T) ids and mask → (B, T) values (a critic's V(s_t))."""
    body = backbone(model)
    hidden = body(
        input_ids=input_ids, attention_mask=attention_mask, use_cache=False
    ).last_hidden_state
    return apply_head(score_head(model), hidden).squeeze(-1)


def without_offset(model: nn.Module, scores: Tensor) -> Tensor:
    """(B,) scores minus the ``reward_offset`` stored in ``model``'s config (0 where none): the
    normalised scores of every way a reward model is run."""
    return scores - float(getattr(unwrap_peft(model).config, "reward_offset", 0.0))


def sequence_scores(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, normalize: bool = False
) -> Tensor:
    """(B, T) ids and mask → (B,) the head at each sequence's last non-pad token, minus the
    stored ``reward_offset`` when ``normalize``."""
    values = token_values(model, input_ids, attention_mask)
    batch = torch.arange(values.shape[0], device=values.device)
    scores = values[batch, last_token_index(attention_mask)]
    return without_offset(model, scores) if normalize else scores


def store_score_normalization(model: nn.Module, mean: float, std: float) -> None:
    """Record the training-score statistics in the config (saved with the model) and make the
    normalised score mean 0: shift the head's bias when it has one, else store the offset that
    ``sequence_scores(normalize=True)`` subtracts."""
    head = score_head(model)
    config = unwrap_peft(model).config
    config.reward_mean = float(mean)
    config.reward_std = float(std)
    if head.bias is not None:
        with torch.no_grad():
            head.bias.sub_(mean)
        config.reward_offset = 0.0
    else:
        config.reward_offset = float(mean)
