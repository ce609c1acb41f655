"""Forward passes over prompt + response that every online algorithm needs.

Positions are computed from the attention mask, as ``generate`` does for left-padded prompts, so
the log-probs recomputed here are those the sampler drew from (a plain forward would number a
left-padded row's tokens from the padding and shift every position).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from proxrl.core import processed_entropy, processed_logprobs
from proxrl.models.scalar_head import apply_head, backbone, score_head


def position_ids(attention_mask: Tensor) -> Tensor:
    """(B, L) 0/1 mask → (B, L) positions counting real tokens only (pads get 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


@dataclass
class PolicyOutput:
    logprobs: Tensor  # (B, T) log π(a_t|s_t) of the response tokens under the processed
    # distribution (temperature, top-k, top-p, min-p: ``core.processed_logprobs``)
    entropy: Tensor | None  # (B, T) entropy of that processed π(·|s_t), when asked for
    hidden: Tensor | None  # (B, T, d) last hidden state at s_t, when asked for (value head)


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
) -> PolicyOutput:
    """Log-probs of the response tokens ``input_ids[:, P:]`` given everything before them,
    under the distribution the sampler drew from (its temperature, top-k, top-p and min-p).

    ``logits[:, P−1+t]`` predicts response token t, so the (B, T, V) slice is a view of the
    model's own logits, never a copy.
    """
    output = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids(attention_mask),
        output_hidden_states=with_hidden,
        use_cache=False,
    )
    logits = output.logits[:, prompt_length - 1 : -1]
    response = input_ids[:, prompt_length:]
    return PolicyOutput(
        logprobs=processed_logprobs(logits, response, temperature, top_k, top_p, min_p),
        entropy=(
            processed_entropy(logits.detach(), temperature, top_k, top_p, min_p)
            if with_entropy
            else None
        ),
        hidden=output.hidden_states[-1][:, prompt_length - 1 : -1] if with_hidden else None,
    )


def critic_forward(
    critic: nn.Module, input_ids: Tensor, attention_mask: Tensor, prompt_length: int
) -> Tensor:
    """V(s_t) for every response token from a separate critic (a ``num_labels=1`` sequence
    classifier): its head on the hidden state that precedes token t. → (B, T)."""
    hidden = backbone(critic)(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids(attention_mask),
    ).last_hidden_state
    return apply_head(score_head(critic), hidden[:, prompt_length - 1 : -1]).squeeze(-1).float()
