"""Other libraries' names for proxrl's options (TRL, veRL, OpenRLHF, CleanRL): data, in one
place, read by ``runtime.config``.

``SAME``: a name whose meaning is exactly that of a proxrl option is accepted in its place (flags,
YAML, the Python API) by every command that has the option and no option of that name itself
(``beta`` is dpo's own); config.yaml keeps proxrl's name. ``DIFFERENT``: a name whose meaning
differs (units per device against global ones, optimizer steps against iterations) is refused
like any unknown name, and the refusal says what proxrl has instead and how it differs. An
unknown name's suggestion comes from here before the closest spelling. veRL's dotted keys go by
their last part (``actor_rollout_ref.actor.clip_ratio`` → ``clip_ratio``). docs/coming_from_trl.md
shows both tables (a test keeps it in step)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

SAME: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        # name: (proxrl option, whose name)
        "model_name_or_path": ("model", "TRL"),
        "sft_model_path": ("model", "TRL PPO"),
        "pretrain": ("model", "OpenRLHF"),
        "reward_model_path": ("reward_model", "TRL PPO"),
        "reward_pretrain": ("reward_model", "OpenRLHF"),
        "critic_pretrain": ("critic_model", "OpenRLHF"),
        "save_path": ("output_dir", "OpenRLHF"),
        "num_generations": ("group_size", "TRL"),
        "n_samples_per_prompt": ("group_size", "OpenRLHF"),
        "max_completion_length": ("max_new_tokens", "TRL"),
        "response_length": ("max_new_tokens", "TRL PPO, veRL"),
        "max_response_length": ("max_new_tokens", "veRL"),
        "generate_max_len": ("max_new_tokens", "OpenRLHF"),
        "max_seq_length": ("max_length", "TRL SFT"),
        "beta": ("kl_coef", "TRL GRPO, RLOO"),
        "init_kl_coef": ("kl_coef", "OpenRLHF"),
        "epsilon": ("clip", "TRL"),
        "cliprange": ("clip", "TRL PPO"),
        "clip_ratio": ("clip", "veRL"),
        "eps_clip": ("clip", "OpenRLHF"),
        # for cispo, TRL caps the weight at epsilon_high and proxrl at 1 + clip_high (README)
        "epsilon_high": ("clip_high", "TRL"),
        "clip_ratio_high": ("clip_high", "veRL"),
        "cliprange_value": ("value_clip", "TRL PPO"),
        "sapo_temperature_pos": ("sapo_tau_pos", "TRL"),
        "sapo_temperature_neg": ("sapo_tau_neg", "TRL"),
        "num_iterations": ("ppo_epochs", "TRL GRPO"),
        "num_ppo_epochs": ("ppo_epochs", "TRL PPO"),
        "mask_truncated_completions": ("mask_truncated", "TRL"),
        "loss_agg_mode": ("loss_aggregation", "veRL"),
        "adv_estimator": ("estimator", "veRL"),
        "advantage_estimator": ("estimator", "OpenRLHF"),
        "entropy_coeff": ("entropy_coef", "veRL"),
        "entropy_loss_coef": ("entropy_coef", "OpenRLHF"),
        "ent_coef": ("entropy_coef", "CleanRL"),
        "lambd": ("lam", "OpenRLHF"),
        "gae_lambda": ("lam", "CleanRL"),
        "lr": ("learning_rate", "CleanRL"),
        "actor_learning_rate": ("learning_rate", "OpenRLHF"),
        "gradient_accumulation_steps": ("grad_accum", "TRL"),
        "num_train_epochs": ("epochs", "TRL SFT, RM, DPO"),
        "loss_type": ("loss", "TRL DPO"),
        "total_training_steps": ("iterations", "veRL"),
        "minibatch_size": ("mini_batch_size", "CleanRL"),
        "target_kl": ("early_stop_kl", "CleanRL"),
        "norm_adv": ("whiten_advantages", "CleanRL"),
    }
)
"""Accepted in place of the proxrl option, where the command has it."""

DIFFERENT: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        # name: (whose name, what proxrl has instead and how it differs)
        "per_device_train_batch_size": (
            "TRL",
            "counts per device; proxrl's batch_size (sft, rm, dpo) and mini_batch_size (ppo, grpo: "
            "responses per optimizer step) count all processes together",
        ),
        "max_steps": (
            "TRL",
            "counts optimizer steps; ppo and grpo count iterations (a rollout and its updates): "
            "iterations",
        ),
        "num_train_epochs": (
            "TRL",
            "counts passes over the prompts; ppo and grpo count iterations (rollout_batch_size "
            "prompts each): iterations",
        ),
        "loss_type": (
            "TRL GRPO",
            "picks the loss aggregation or a policy loss: loss_aggregation takes grpo, dapo, bnpo "
            "and dr_grpo, policy_loss takes cispo and sapo (TRL's importance_sampling_level "
            "sequence is policy_loss gspo)",
        ),
        "save_steps": (
            "TRL",
            "counts optimizer steps; save_every counts them in sft, rm and dpo, and iterations in "
            "ppo and grpo",
        ),
        "logging_steps": ("TRL", "counts optimizer steps; log_every (sft, rm, dpo) does"),
        "prompt_max_len": (
            "OpenRLHF",
            "truncates a longer prompt; proxrl's max_prompt_length drops it (counted in the log)",
        ),
        "train_batch_size": (
            "veRL, OpenRLHF",
            "is prompts per iteration in veRL (rollout_batch_size) and responses per optimizer "
            "step in OpenRLHF (mini_batch_size)",
        ),
        "ppo_mini_batch_size": (
            "veRL",
            "counts prompts; proxrl's mini_batch_size counts responses (veRL's × group_size)",
        ),
        "num_mini_batches": (
            "TRL PPO",
            "counts mini-batches per epoch; proxrl's mini_batch_size is the size of one",
        ),
        "micro_train_batch_size": (
            "OpenRLHF",
            "counts per device; proxrl splits a mini-batch into grad_accum micro-batches",
        ),
        "kl_loss_coef": (
            "veRL",
            "is a KL in the loss: grpo's kl_coef with a group estimator (kl_loss_type); ppo's "
            "kl_coef is paid in the reward",
        ),
        "use_vllm": ("TRL", "is a switch; proxrl's sampler option takes vllm"),
        "bf16": ("TRL", "is a switch; proxrl's mixed_precision option takes bf16"),
        "total_episodes": (
            "TRL PPO",
            "counts responses; ppo and grpo count iterations (rollout_batch_size × group_size "
            "responses each): iterations",
        ),
        "num_episodes": (
            "OpenRLHF",
            "counts passes over the prompts; ppo and grpo count iterations: iterations",
        ),
        "warmup_ratio": ("TRL", "is a share of the steps; warmup_steps (sft, rm, dpo) counts them"),
        "importance_sampling_level": (
            "TRL",
            "picks token or sequence ratios: policy_loss ppo or gspo",
        ),
        "ref_model_sync_steps": (
            "TRL",
            "counts optimizer steps and mixes weights; ref_reset_every copies the policy every so "
            "many iterations",
        ),
    }
)
"""Refused, with what to use instead (a name also in ``SAME`` is refused so only where the
command lacks that option)."""
