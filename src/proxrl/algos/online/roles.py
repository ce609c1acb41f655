"""The roles of the online loop and what they are fed: the actor, the reference, the critic and
the reward sources, loaded from the records ``role_settings`` builds once from the config and
placed on devices, and the prompts they start from."""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from proxrl.algos.online.algorithm import Algorithm
from proxrl.algos.online.config import OnlineConfig
from proxrl.algos.online.critic import Critic, SeparateCritic
from proxrl.algos.online.episodes import environment_tools
from proxrl.algos.online.role_settings import (
    EngineSettings,
    LaunchAhead,
    Loading,
    ModelSettings,
    PromptSettings,
    RaySettings,
    RewardSettings,
    RoleSettings,
)
from proxrl.core import DISTILL_LOSSES, KL_CONTROLLERS
from proxrl.data.encoding import check_tokenizer_on, encode_prompt_text
from proxrl.data.formats import PromptExample, load_prompt_examples
from proxrl.models.causal_lm import check_causal_lm, load_causal_lm
from proxrl.models.lora import apply_lora, is_peft_model
from proxrl.models.scalar_head import load_score_model, unwrap_peft
from proxrl.models.tokenizer import load_tokenizer, resize_for_tokenizer, tokenizer_difference
from proxrl.rollout.ensemble import EnsembleReward, training_score_std
from proxrl.rollout.generation import SamplingSettings
from proxrl.rollout.rewards import (
    REENCODED_MISMATCH,
    FunctionReward,
    RewardModelReward,
    WeightedRewards,
    load_reward_function,
)
from proxrl.runtime import distributed as dist
from proxrl.runtime.config import narrowed
from proxrl.runtime.errors import ProxrlError

log = logging.getLogger(__name__)


@dataclass
class Models:
    actor: nn.Module
    # None with LoRA: the adapter-disabled actor is the reference; placement ray: a stand-in
    # for the reference actor (``rollout.forward.frozen_pass`` asks it for log-probs)
    reference: Any
    critic: Critic  # NoCritic for the critic-free family
    tokenizer: Any
    tracks_kl: bool = True  # False: β is fixed at 0 and no reference pass is made
    # on-policy distillation's frozen teacher (None: none); placement ray: a stand-in for the
    # teacher actor (``rollout.forward.frozen_pass`` asks it for log-probs)
    teacher: Any = None


def role_settings(cfg: OnlineConfig) -> RoleSettings:
    """What loading and placing the roles reads of ``cfg``, built once when the run opens: the
    one place the config is read for them (``role_settings``)."""
    loading = narrowed(Loading, cfg)
    # the run measures the KL to a reference (False: β is fixed at 0 and none is loaded)
    tracks_kl = (
        cfg.track_kl
        or cfg.kl_coef > 0
        or KL_CONTROLLERS.trait(cfg.kl_controller, "adapts")
        or cfg.ref_reset_every > 0
    )
    ahead = None
    if cfg.async_rollout:
        ahead = narrowed(LaunchAhead, cfg, sampling=narrowed(SamplingSettings, cfg))
    ray = narrowed(
        RaySettings,
        cfg,
        reference_actor=tracks_kl and not cfg.lora_r,  # under LoRA: the adapters off
        # a teacher whose signal is its log-probs of the sampled tokens (reverse_kl_reward):
        # gjsd reads its whole distribution in the update, so it stays beside the policy
        teacher_actor=(
            cfg.teacher_model is not None and DISTILL_LOSSES[cfg.distill_loss].advantage is not None
        ),
        critic_actor=getattr(cfg, "critic", None) == "separate",  # a value head is the policy's
        ahead=ahead,
    )
    return RoleSettings(
        narrowed(ModelSettings, cfg, loading=loading, tracks_kl=tracks_kl),
        narrowed(RewardSettings, cfg, loading=loading),
        narrowed(EngineSettings, cfg),
        narrowed(PromptSettings, cfg),
        ray,
    )


def load_models(
    settings: ModelSettings, algo: Algorithm, with_reference: bool = True, with_teacher: bool = True
) -> Models:
    """The roles ``settings`` names, in this process; ``with_reference`` / ``with_teacher`` False
    leave the reference / teacher unloaded (None) for a caller that places it elsewhere. A policy
    or teacher that is not a causal LM (a reward model's checkpoint: its LM head would be
    random), and a teacher with another tokenizer, are refused first, before any model loads."""
    kwargs = settings.loading.loader_kwargs()
    trust_remote_code = settings.loading.trust_remote_code
    check_causal_lm(settings.model, "model", trust_remote_code)
    if settings.teacher_model is not None:
        check_causal_lm(settings.teacher_model, "teacher_model", trust_remote_code)
    tokenizer = load_tokenizer(settings.model, trust_remote_code=trust_remote_code)
    if settings.teacher_model is not None:
        check_teacher_tokenizer(settings.teacher_model, tokenizer, trust_remote_code)
    actor = load_causal_lm(
        settings.model, gradient_checkpointing=settings.gradient_checkpointing, **kwargs
    )
    resize_for_tokenizer(actor, tokenizer)
    reference = None
    if settings.lora_r:
        actor = apply_lora(actor, settings.lora_r, settings.lora_alpha or None)
    elif settings.tracks_kl and with_reference:
        reference = load_causal_lm(settings.model, **kwargs)
        resize_for_tokenizer(reference, tokenizer)
        reference.requires_grad_(False).eval()
    critic = algo.critic(
        settings, actor, tokenizer
    )  # after the reference: the same random stream as before
    teacher = None
    if settings.teacher_model is not None and with_teacher:  # after the critic: its stream kept
        teacher = load_teacher(settings, tokenizer, actor)
    return Models(actor, reference, critic, tokenizer, settings.tracks_kl, teacher)


def check_teacher_tokenizer(path: str, tokenizer: Any, trust_remote_code: bool) -> None:
    """The teacher scores the policy's token ids, so it must read them as the policy does:
    the same token → id map (special tokens included), else one line."""
    try:
        theirs = load_tokenizer(path, trust_remote_code=trust_remote_code)
    except ProxrlError as error:
        raise ProxrlError(f"teacher_model: {error}") from None
    mine, other = tokenizer.get_vocab(), theirs.get_vocab()
    if mine != other:
        differ = sum(other.get(token) != index for token, index in mine.items())
        raise ProxrlError(
            f"teacher_model: {path} has another tokenizer than the policy ({len(other)} vs "
            f"{len(mine)} tokens, {differ} of the policy's mapped to another id or missing); "
            "on-policy distillation needs the one tokenizer both models read"
        )


def load_teacher(settings: ModelSettings, tokenizer: Any, actor: nn.Module) -> nn.Module:
    """The frozen teacher, loaded as the reference is; with distill_loss gjsd its output width
    must be the policy's (the divergence runs over every entry of both distributions)."""
    path = settings.teacher_model
    assert path is not None
    teacher = load_causal_lm(path, role="teacher_model", **settings.loading.loader_kwargs())
    resize_for_tokenizer(teacher, tokenizer)
    if DISTILL_LOSSES.trait(settings.distill_loss, "logits"):
        check_output_widths(teacher, actor, path)
    return teacher.requires_grad_(False).eval()


def check_output_widths(teacher: nn.Module, actor: nn.Module, path: str) -> None:
    """distill_loss gjsd compares whole distributions: both models' logits one width."""
    theirs = teacher.get_output_embeddings().weight.shape[0]  # type: ignore[operator]
    mine = actor.get_output_embeddings().weight.shape[0]  # type: ignore[operator]
    if theirs != mine:
        raise ProxrlError(
            f"teacher_model: {path} outputs {theirs} logits, the policy {mine}; distill_loss "
            "gjsd compares whole distributions (use distill_loss reverse_kl_reward)"
        )


def load_rewards(settings: RewardSettings, policy_tokenizer: Any = None) -> WeightedRewards:
    """The run's reward sources. ``policy_tokenizer``: the policy's, against which each reward
    model's tokenizer is judged once here (``load_reward_model``); None scores text, as ever."""
    sources: list[Any] = []
    paths = settings.reward_model
    members = [load_reward_model(settings, path, policy_tokenizer) for path in paths]
    if len(members) == 1:
        sources += members
    elif members:  # an ensemble: one source (rollout.ensemble)
        scales = [training_score_std(m, p) for m, p in zip(members, paths, strict=True)]
        combination, k = settings.reward_ensemble, settings.reward_ensemble_std_coef
        sources.append(EnsembleReward(members, scales, combination, k, list(paths)))
    sources += [FunctionReward(spec, load_reward_function(spec)) for spec in settings.reward_fn]
    return WeightedRewards(sources, list(settings.reward_weights) or [1.0] * len(sources))


def reward_policy_tokenizer(settings: RewardSettings) -> Any:
    """The policy's tokenizer for ``load_rewards`` (None without a reward model: only a reward
    model reads the responses' tokens)."""
    if not settings.reward_model:
        return None
    return load_tokenizer(settings.model, trust_remote_code=settings.loading.trust_remote_code)


def load_reward_model(
    settings: RewardSettings, path: str, policy_tokenizer: Any = None
) -> RewardModelReward:
    """The reward model at ``path``. With its tokenizer the policy's (``tokenizer_difference``),
    it scores the sampled ids; otherwise their text re-encoded, which it says in one line."""
    try:
        # A checkpoint without a score head would get a random one: PPO would chase noise.
        model = load_score_model(path, new_head=None, **settings.loading.loader_kwargs())
    except ProxrlError as exc:
        raise ProxrlError(f"reward_model: {exc}") from exc
    model.requires_grad_(False).eval()
    tokenizer = load_tokenizer(path, trust_remote_code=settings.loading.trust_remote_code)
    reads_ids = False
    if policy_tokenizer is not None:
        difference = tokenizer_difference(policy_tokenizer, tokenizer)
        reads_ids = difference is None
        if reads_ids:
            log.info("reward_model %s: the policy's tokenizer; scores the sampled token ids", path)
        else:
            log.info(
                "reward_model %s: %s than the policy's; scores the responses' text, re-encoded "
                "(%s counts where it is not what was sampled)",
                path,
                difference,
                REENCODED_MISMATCH,
            )
    return RewardModelReward(
        model,
        tokenizer,
        # unset: packed from each batch's own lengths, except where every rank must run as
        # many forwards as the others (a sharded run), which pads
        max_tokens=0 if dist.is_sharded() else settings.max_tokens_per_micro_batch,
        policy_tokenizer=policy_tokenizer,
        reads_ids=reads_ids,
        # a group's prompt forwarded once, in one process (a sharded run's ranks must run
        # their forwards alike: ``rollout.prefix.can_share``)
        shared_prefix=settings.shares_prefix and not dist.is_sharded(),
    )


def load_prompts(
    settings: PromptSettings, tokenizer: Any
) -> tuple[list[PromptExample], list[list[int]]]:
    examples = load_prompt_examples(settings.prompts)
    check_tokenizer_on(tokenizer, examples)
    kept, ids = [], []
    tools = environment_tools(
        settings.environment, settings.tool_call_format
    )  # what the prompts offer an episode's environment
    limit = settings.max_prompt_length
    for example in examples:
        encoded = encode_prompt_text(tokenizer, example.prompt, example.messages, tools)
        if len(encoded) <= limit:
            kept.append(example)
            ids.append(encoded)
    if len(kept) < len(examples):
        log.warning(
            "%d of %d prompts are longer than max_prompt_length=%d and were dropped",
            len(examples) - len(kept),
            len(examples),
            limit,
        )
    if not kept:
        raise ProxrlError(
            f"prompts: every prompt in {settings.prompts} is longer than max_prompt_length={limit}"
        )
    return kept, ids


def place_roles(models: Models, rewards: WeightedRewards, offload_frozen: bool) -> None:
    """Put the actor and critic on this process's device (``runtime.distributed.device``: the
    CPU without a GPU, so a no-op there), and the reference, teacher and reward models too unless
    ``offload_frozen`` keeps them on the CPU. FSDP / DeepSpeed place the trained roles
    themselves when they wrap them."""
    device = dist.device()
    if device.type == "cpu":
        return
    models.actor.to(device)
    for module in models.critic.modules():
        module.to(device)
    frozen_device = torch.device("cpu") if offload_frozen else device
    for frozen in (models.reference, models.teacher):
        if isinstance(frozen, nn.Module):  # (not a stand-in for one placed elsewhere)
            frozen.to(frozen_device)
    place_rewards(rewards, frozen_device)


def place_rewards(rewards: WeightedRewards, device: torch.device) -> None:
    """Move every reward model of ``rewards`` (an ensemble's members too) to ``device``."""
    for source in rewards.sources:
        for model in getattr(source, "models", [source.model] if hasattr(source, "model") else []):
            model.to(device)


def share_reward_model(
    models: Models, rewards: WeightedRewards, offload_frozen_roles: bool, async_rollout: bool
) -> bool:
    """Score with the LoRA critic's frozen base where that base is the reward model, weight
    for weight (the default critic start, InstructGPT's: ``critic_model`` unset, one reward
    model, ``critic_lora_r`` > 0), and drop the reward model's own copy: one model's weights
    less in memory (2 GB at Qwen2-0.5B in float32), the same scores bit for bit (with its
    adapters off a peft model computes its base layers and original head alone).

    Only in one process, with the roles on one device (not offload_frozen_roles) and no
    rollout running beside the update (not async_rollout: the adapters are off while it
    scores). Returns whether the reward model is shared."""
    critic = models.critic
    if (
        dist.world_size() > 1
        or offload_frozen_roles
        or async_rollout
        or not isinstance(critic, SeparateCritic)
        or not is_peft_model(critic.module)
    ):
        return False
    for i, source in enumerate(rewards.sources):
        if isinstance(source, RewardModelReward) and is_base_of(source.model, critic.module):
            rewards.sources[i] = replace(source, model=critic.module, adapter_disabled=True)
            del source
            gc.collect()  # (the reward model's weights are freed here)
            log.info("the reward model is the critic's base: scored with its adapters off")
            return True
    return False


def is_base_of(model: nn.Module, adapted: nn.Module) -> bool:
    """Whether ``model`` is what the peft model ``adapted`` computes with its adapters off:
    the same tensors (names, dtypes, devices, values) once peft's LoRA and trained copies of
    saved modules are set aside, and the same stored score offset."""
    inner = unwrap_peft(adapted)
    base = {
        name.replace(".base_layer.", ".").replace(".original_module.", "."): tensor
        for name, tensor in inner.state_dict().items()
        if "lora_" not in name and ".modules_to_save." not in name
    }
    own = model.state_dict()
    offset = [getattr(m.config, "reward_offset", 0.0) for m in (model, inner)]
    return (
        base.keys() == own.keys()
        and offset[0] == offset[1]
        and all(
            base[k].dtype == v.dtype and base[k].device == v.device and torch.equal(base[k], v)
            for k, v in own.items()
        )
    )
