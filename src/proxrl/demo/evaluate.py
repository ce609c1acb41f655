"""Score a policy on held-out prompts three ways: gold (exact accuracy), proxy (the reward
model) and KL to the SFT policy.

Responses are sampled at the training temperature (1 by default, so the policy is the model's
own distribution). KL is the mean over responses of Σ_t [log π(y_t|·) − log π_sft(y_t|·)] on
the policy's own samples: an unbiased estimate of the per-sequence KL(π‖π_sft).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from proxrl.data.batching import pad_left
from proxrl.data.encoding import encode_prompt_text
from proxrl.data.formats import PromptExample
from proxrl.demo.task import is_correct
from proxrl.rollout.forward import policy_forward
from proxrl.rollout.generation import HFSampler, SamplingSettings
from proxrl.rollout.rewards import RewardModelReward


@dataclass
class PolicyScores:
    gold: float  # share of exactly correct responses, in [0, 1]
    proxy: float  # mean (normalised) reward-model score
    kl: float  # mean per-sequence KL(π‖π_sft), k1 estimate on π's samples
    samples: list[dict[str, Any]]  # {"prompt", "completion", "correct", "proxy"} per response


@torch.no_grad()
def evaluate_policy(
    policy: nn.Module,
    sft: nn.Module,
    reward: RewardModelReward,
    tokenizer: Any,
    prompts: list[PromptExample],
    samples_per_prompt: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    batch_size: int = 256,
    seed: int = 0,
) -> PolicyScores:
    """Sample ``samples_per_prompt`` responses per prompt from ``policy`` and score them."""
    examples = [p for p in prompts for _ in range(samples_per_prompt)]
    settings = SamplingSettings(max_new_tokens, temperature)
    sampler = HFSampler(policy, tokenizer)
    completions: list[str] = []
    completion_ids: list[list[int]] = []  # the reward model scores these where it reads ids
    kls: list[torch.Tensor] = []
    policy.eval()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        for start in range(0, len(examples), batch_size):
            chunk = examples[start : start + batch_size]
            ids = [encode_prompt_text(tokenizer, p.prompt, p.messages) for p in chunk]
            prompt_ids = pad_left(ids, tokenizer.pad_token_id)
            prompt_mask = pad_left([[1] * len(r) for r in ids], 0)
            sampled = sampler.sample(prompt_ids, prompt_mask, settings)
            response_ids, response_mask = sampled.response_ids, sampled.response_mask
            completions += tokenizer.batch_decode(response_ids, skip_special_tokens=True)
            completion_ids += [
                row[keep].tolist()
                for row, keep in zip(response_ids, response_mask.bool(), strict=True)
            ]
            if policy is sft:
                kls.append(torch.zeros(len(chunk)))
                continue
            input_ids = torch.cat([prompt_ids, response_ids], 1)
            attention_mask = torch.cat([prompt_mask, response_mask], 1)
            P = prompt_ids.shape[1]
            logprobs = policy_forward(policy, input_ids, attention_mask, P, temperature).logprobs
            ref_logprobs = policy_forward(sft, input_ids, attention_mask, P, temperature).logprobs
            kls.append(((logprobs - ref_logprobs) * response_mask).sum(-1).double())
    proxy = reward(examples, completions, {"completion_ids": completion_ids})
    correct = [is_correct(p.prompt, c) for p, c in zip(examples, completions, strict=True)]
    samples = [
        {"prompt": p.prompt, "completion": c, "correct": ok, "proxy": round(float(s), 4)}
        for p, c, ok, s in zip(examples, completions, correct, proxy.tolist(), strict=True)
    ]
    return PolicyScores(
        gold=sum(correct) / len(correct),
        proxy=float(proxy.mean()),
        kl=float(torch.cat(kls).mean()),
        samples=samples,
    )
