"""The roles of the online loop and what they are fed: the actor, the reference, the critic and
the reward sources loaded from a config, placed on devices, and the prompts they start from."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from proxrl.algos.online.algorithm import Algorithm
from proxrl.algos.online.config import OnlineConfig
from proxrl.algos.online.critic import Critic
from proxrl.algos.online.episodes import environment_tools
from proxrl.data.encoding import check_tokenizer_on, encode_prompt_text
from proxrl.data.formats import PromptExample, load_prompt_examples
from proxrl.models.causal_lm import load_causal_lm
from proxrl.models.lora import apply_lora
from proxrl.models.scalar_head import load_score_model
from proxrl.models.tokenizer import load_tokenizer, resize_for_tokenizer
from proxrl.rollout.ensemble import EnsembleReward, training_score_std
from proxrl.rollout.rewards import (
    FunctionReward,
    RewardModelReward,
    WeightedRewards,
    load_reward_function,
)
from proxrl.runtime import distributed as dist
from proxrl.runtime.errors import ProxrlError

log = logging.getLogger(__name__)


@dataclass
class Models:
    actor: nn.Module
    # None with LoRA: the adapter-disabled actor is the reference; placement ray: a stand-in
    # for the reference actor (``rollout.forward.reference_pass`` asks it for log-probs)
    reference: Any
    critic: Critic  # NoCritic for the critic-free family
    tokenizer: Any
    tracks_kl: bool = True  # False: β is fixed at 0 and no reference pass is made


def measures_kl(cfg: OnlineConfig) -> bool:
    """Whether the run measures the KL to a reference (False: β is fixed at 0)."""
    return (
        cfg.track_kl or cfg.kl_coef > 0 or cfg.kl_controller != "fixed" or cfg.ref_reset_every > 0
    )


def load_models(cfg: OnlineConfig, algo: Algorithm, with_reference: bool = True) -> Models:
    """The roles of ``cfg`` in this process; ``with_reference`` False leaves the reference model
    unloaded (``Models.reference`` None) for a caller that places it elsewhere."""
    kwargs = cfg.loader_kwargs()
    tokenizer = load_tokenizer(cfg.model, trust_remote_code=cfg.trust_remote_code)
    actor = load_causal_lm(cfg.model, gradient_checkpointing=cfg.gradient_checkpointing, **kwargs)
    resize_for_tokenizer(actor, tokenizer)
    reference = None
    if cfg.lora_r:
        actor = apply_lora(actor, cfg.lora_r, cfg.lora_alpha or None)
    elif measures_kl(cfg) and with_reference:
        reference = load_causal_lm(cfg.model, **kwargs)
        resize_for_tokenizer(reference, tokenizer)
        reference.requires_grad_(False).eval()
    critic = algo.critic(
        cfg, actor, tokenizer
    )  # after the reference: the same random stream as before
    return Models(actor, reference, critic, tokenizer, measures_kl(cfg))


def load_rewards(cfg: OnlineConfig) -> WeightedRewards:
    sources: list[Any] = []
    members = [load_reward_model(cfg, path) for path in cfg.reward_model]
    if len(members) == 1:
        sources += members
    elif members:  # an ensemble: one source (rollout.ensemble)
        scales = [training_score_std(m, p) for m, p in zip(members, cfg.reward_model, strict=True)]
        combination, k = cfg.reward_ensemble, cfg.reward_ensemble_std_coef
        sources.append(EnsembleReward(members, scales, combination, k, list(cfg.reward_model)))
    sources += [FunctionReward(spec, load_reward_function(spec)) for spec in cfg.reward_fn]
    return WeightedRewards(sources, list(cfg.reward_weights) or [1.0] * len(sources))


def load_reward_model(cfg: OnlineConfig, path: str) -> RewardModelReward:
    try:
        # A checkpoint without a score head would get a random one: PPO would chase noise.
        model = load_score_model(path, new_head=None, **cfg.loader_kwargs())
    except ProxrlError as exc:
        raise ProxrlError(f"reward_model: {exc}") from exc
    model.requires_grad_(False).eval()
    return RewardModelReward(
        model,
        load_tokenizer(path, trust_remote_code=cfg.trust_remote_code),
        max_tokens=cfg.max_tokens_per_micro_batch,
    )


def load_prompts(cfg: OnlineConfig, tokenizer: Any) -> tuple[list[PromptExample], list[list[int]]]:
    examples = load_prompt_examples(cfg.prompts)
    check_tokenizer_on(tokenizer, examples)
    kept, ids = [], []
    tools = environment_tools(cfg)  # what the prompts offer an episode's environment
    for example in examples:
        encoded = encode_prompt_text(tokenizer, example.prompt, example.messages, tools)
        if len(encoded) <= cfg.max_prompt_length:
            kept.append(example)
            ids.append(encoded)
    if len(kept) < len(examples):
        log.warning(
            "%d of %d prompts are longer than max_prompt_length=%d and were dropped",
            len(examples) - len(kept),
            len(examples),
            cfg.max_prompt_length,
        )
    if not kept:
        raise ProxrlError(
            f"prompts: every prompt in {cfg.prompts} is longer than "
            f"max_prompt_length={cfg.max_prompt_length}"
        )
    return kept, ids


def place_roles(models: Models, rewards: WeightedRewards, offload_frozen: bool) -> None:
    """Put the actor and critic on this process's device (``runtime.distributed.device``: the
    CPU without a GPU, so a no-op there), and the reference and reward models too unless
    ``offload_frozen`` keeps them on the CPU. FSDP / DeepSpeed place the trained roles
    themselves when they wrap them."""
    device = dist.device()
    if device.type == "cpu":
        return
    models.actor.to(device)
    for module in models.critic.modules():
        module.to(device)
    frozen_device = torch.device("cpu") if offload_frozen else device
    if isinstance(models.reference, nn.Module):  # (not a stand-in for one placed elsewhere)
        models.reference.to(frozen_device)
    place_rewards(rewards, frozen_device)


def place_rewards(rewards: WeightedRewards, device: torch.device) -> None:
    """Move every reward model of ``rewards`` (an ensemble's members too) to ``device``."""
    for source in rewards.sources:
        for model in getattr(source, "models", [source.model] if hasattr(source, "model") else []):
            model.to(device)
