"""The training client: the online trainers' own stages as primitives a user composes into a
loop of their own (Tinker's ``sample`` / ``forward_backward`` / ``optim_step``).

Every method calls the function the built-in loop calls at that stage — ``collect.sample``
(the run's engine), ``collect.forward_passes`` (π_old, π_ref), ``update.accumulate`` (the
micro-batches, the loss terms, the aggregation's normaliser), ``update.clipped_step`` (clip,
the non-finite guard, no step on an exactly zero gradient), ``run.make_optimizers``,
``loop.save_policy`` — so a loop written with it is ``proxrl grpo``'s loop, to the bit on the
same seed (``tests/algos/test_client.py``). Its sampling and updates draw from global
generators of its own (``seeding.OwnStreams``): two clients, or the caller's own draws between
calls, do not move each other's samples. The roles load as the trainers load them
(``roles.load_models``: a path, hub id or transformers model; full or LoRA). With a ``grpo``
config (the default) the critic-free family's choices apply: no critic, the KL to the reference
paid in the loss (``kl_coef``, ``kl_loss_type``). With a ``ppo`` config (``command="ppo"``) the
run's critic loads too (``critic``: a value head or a separate model): ``logprobs`` gives its
values V_old, ``forward_backward`` adds its value loss (``vf_coef``, ``value_clip``) on the
batch's ``returns`` as ``proxrl ppo``'s update does, ``optim_step`` steps both optimizers, and
the KL is the user's to pay in the reward (``core.shaped_rewards``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from proxrl.algos.offline import dpo
from proxrl.algos.offline.loop import under_autocast
from proxrl.algos.online import grpo, ppo
from proxrl.algos.online.algorithm import Algorithm, StepSelection, step_selection, surrogate
from proxrl.algos.online.client_checks import (
    check_experience,
    check_token_ids,
    checked_config,
    count,
    flag,
    learning_rate,
    prompt_examples,
    token_values,
)
from proxrl.algos.online.collect import Sampled, Scored, forward_passes, sample
from proxrl.algos.online.config import OnlineConfig
from proxrl.algos.online.critic import NoCritic
from proxrl.algos.online.episodes import environment_tools, responses_stopped
from proxrl.algos.online.loop import save_policy
from proxrl.algos.online.old_policy import OldPolicySource
from proxrl.algos.online.prompts import prompt_order
from proxrl.algos.online.roles import load_models, place_roles, role_settings
from proxrl.algos.online.rollouts_file import limits_of, read_rollouts, recorded_stage
from proxrl.algos.online.run import make_optimizers
from proxrl.algos.online.run_settings import run_settings
from proxrl.algos.online.samplers import make_engine
from proxrl.algos.online.update import (
    POLICY_STEPPED,
    Losses,
    Optimization,
    UpdateStep,
    accumulate,
    clipped_step,
    loss_generator,
    minibatches,
)
from proxrl.core import (
    KL_ESTIMATORS,
    POLICY_LOSSES,
    Aggregation,
    PolicyLossSettings,
    policy_gradient_loss,
)
from proxrl.data.encoding import EncodedPair, encode_preferences, encode_prompt_text
from proxrl.data.formats import PreferenceExample, PromptExample, preference_examples
from proxrl.data.readers import Row
from proxrl.models.lora import adapter_disabled, is_peft_model
from proxrl.rollout.experience import Experience
from proxrl.rollout.rewards import WeightedRewards
from proxrl.runtime import objects
from proxrl.runtime.accumulation import accumulate_gradients
from proxrl.runtime.checkpointer import Checkpointer, TrainableWeights
from proxrl.runtime.config import config_to_dict, narrowed
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.guard import NonFiniteGuard
from proxrl.runtime.run_dir import check_creatable
from proxrl.runtime.seeding import OwnStreams
from proxrl.runtime.threads import choose_cpu_threads

PolicyLoss = Callable[[Tensor, Experience], tuple[Tensor, dict[str, Tensor]]]
UserLoss = Callable[[Tensor, Experience], Tensor]


BoundLoss = Callable[[PolicyLossSettings, Aggregation], PolicyLoss]
"""(the policy losses' knobs, the aggregation) → the policy loss bound to them."""


def _sft_loss(knobs: PolicyLossSettings, aggregation: Aggregation) -> PolicyLoss:
    """The negative log-likelihood of the batch's tokens (advantage 1 everywhere: REINFORCE's
    loss is the NLL then), reduced by the config's ``aggregation`` (no knob applies)."""

    def loss(logprobs: Tensor, mb: Experience) -> tuple[Tensor, dict[str, Tensor]]:
        mask = mb.loss_mask.float()
        return policy_gradient_loss(logprobs, torch.ones_like(logprobs), mask, aggregation)

    return loss


def _named_surrogate(name: str) -> BoundLoss:
    """``core.POLICY_LOSSES[name]`` bound to the run's knobs, as ``surrogate`` binds it."""
    return lambda knobs, aggregation: surrogate(name, knobs, aggregation)


LOSSES: Mapping[str, BoundLoss] = MappingProxyType(
    {
        **{name: _named_surrogate(name) for name in POLICY_LOSSES},
        "sft": _sft_loss,
    }
)
"""``forward_backward``'s ``loss`` → (knobs, aggregation) → the policy loss: every
``core.POLICY_LOSSES`` surrogate bound to the config's knobs (``surrogate``, as ``grpo``/``ppo``
bind it), and ``sft``, the negative log-likelihood."""

VALUE_LOSS = "value"
"""``forward_backward``'s loss that trains the critic alone (a ``ppo`` client; the update of
``proxrl ppo``'s critic warm-up): the value loss, no policy term."""

COMMANDS: Mapping[str, type[OnlineConfig]] = MappingProxyType(
    {"grpo": grpo.Config, "ppo": ppo.Config}
)
"""``TrainingClient(command=…)`` → the config its options are fields of."""


PAIR_LOSSES = MappingProxyType({"dpo": "sigmoid", "ipo": "ipo", "simpo": "simpo"})
"""``forward_backward``'s losses on ``PreferencePairs`` → ``proxrl dpo``'s ``loss`` (the same
``dpo.preference_loss``)."""

PAIR_OPTIONS = ("beta", "label_smoothing", "simpo_gamma_beta_ratio")
"""The ``proxrl dpo`` options ``forward_backward`` takes with a pair loss (its defaults)."""


@dataclass
class PreferencePairs:
    """What ``TrainingClient.pairs`` returns: encoded (prompt, chosen, rejected) pairs as
    ``proxrl dpo`` encodes them, with their reference log-probs for one pair loss."""

    items: list[EncodedPair]
    loss: str  # the PAIR_LOSSES name the reference log-probs were computed for
    reference: tuple[Tensor, Tensor]  # (N,) chosen and (N,) rejected, float64 (SimPO: zeros)

    def __len__(self) -> int:
        return len(self.items)


@dataclass
class Rollout:
    """What ``TrainingClient.sample`` returns: ``n`` responses per prompt, a prompt's ``n``
    consecutive (B = len(prompts) · n rows)."""

    stage: Sampled  # the sample stage's record, as the built-in loop hands it on
    scores: Tensor | None = None  # (B,) the recorded scores of a rollouts file's trajectories
    token_rewards: Tensor | None = None  # (B, T) a rollouts file's per-token rewards (0 at
    # padding), None unless a row has them; ``scores`` holds their sums

    @property
    def prompts(self) -> list[str]:
        """(B,) each row's prompt text."""
        return [p.prompt for p in self.stage.prompts]

    @property
    def text(self) -> list[str]:
        """(B,) the responses decoded."""
        return self.stage.completions

    @property
    def prompt_ids(self) -> Tensor:
        """(B, P) left-padded prompt tokens."""
        return self.stage.prompt_ids

    @property
    def response_ids(self) -> Tensor:
        """(B, T) sampled tokens, padding after the stop."""
        return self.stage.samples.response_ids

    @property
    def response_mask(self) -> Tensor:
        """(B, T) 1 at response tokens up to and including the stop."""
        return self.stage.samples.response_mask

    @property
    def logprobs(self) -> Tensor | None:
        """(B, T) the sampler's log-probs of its tokens (None when not asked for)."""
        return self.stage.samples.logprobs

    def __len__(self) -> int:
        return len(self.stage.completions)


def client_config(
    model: Any, tokenizer: Any, options: dict[str, Any], command: str = "grpo"
) -> OnlineConfig:
    """A ``command`` (``COMMANDS``: grpo, ppo) config for the client: ``model`` a path, hub id
    or transformers model (its ``tokenizer``), ``options`` its fields, each checked as a YAML
    value is (type, range). No prompts or reward are asked for: the client's user brings
    them."""
    entries: dict[str, objects.Entry] = {}
    if hasattr(model, "save_pretrained") and hasattr(model, "parameters"):
        handle = objects.PREFIX + "model"
        entries[handle] = objects.Entry(model, tokenizer)
        model = handle
    elif tokenizer is not None:
        raise ProxrlError("TrainingClient: tokenizer is only for a model given as a loaded model")
    where = "proxrl.TrainingClient()"
    if command not in COMMANDS:
        raise ProxrlError(
            f"{where}: command: expected one of {', '.join(COMMANDS)}, got {command!r}"
        )
    values = {"model": str(model), **options}
    cfg = checked_config(COMMANDS[command], values, where)  # (prompts and rewards: not ours)
    objects.attach(cfg, entries)
    return cfg


def given_config(
    config: Any, model: Any, tokenizer: Any, options: dict[str, Any], command: str
) -> OnlineConfig:
    """``TrainingClient(config=…)``'s config checked as the options are (every field read
    as a YAML value is, then the ranges), with ``options`` replaced into it."""
    where = "proxrl.TrainingClient()"
    if not isinstance(config, tuple(COMMANDS.values())):
        raise ProxrlError(
            f"{where}: config: expected a grpo.Config or ppo.Config, got {type(config).__name__}"
        )
    for name, given in (("model", model), ("tokenizer", tokenizer)):
        if given is not None:
            raise ProxrlError(f"{where}: {name}: not with config= (the config names its model)")
    if command != "grpo" and not isinstance(config, COMMANDS.get(command, ())):
        raise ProxrlError(
            f"{where}: command: {command} does not match config= (a "
            f"{type(config).__module__.rsplit('.', 1)[-1]} config)"
        )
    checked = checked_config(type(config), config_to_dict(config) | options, where, config)
    return checked if options else config  # (as given when nothing is replaced)


class TrainingClient:
    """A policy with its optimizer, trained by the loop its user writes.

    ``TrainingClient(model, learning_rate=1e-5, …)``: ``model`` a path, hub id or transformers
    model (``tokenizer=`` its tokenizer), the options any field of ``proxrl grpo`` (sampling:
    ``max_new_tokens``, ``temperature``…; batching: ``mini_batch_size``, ``grad_accum``; the
    loss knobs: ``clip``, ``loss_aggregation``, ``kl_coef``…; ``lora_r``, ``dtype``, ``seed``),
    or with ``command="ppo"`` of ``proxrl ppo`` (its critic: ``critic``, ``vf_coef``,
    ``critic_learning_rate``…). ``TrainingClient(config=cfg)`` takes a ``grpo``/``ppo`` config
    (the options, if any, replaced into it).

    Every argument is checked (``client_checks``): the options, a given config and a call's
    config overrides as a YAML file's values are (type, range), the client's own arguments
    against what it holds (its vocabulary, the batch's shape); a wrong call raises a one-line
    ``ProxrlError`` naming the argument (``TrainingClient.sample: n: expected an int >= 1, got
    0``)."""

    def __init__(
        self,
        model: Any = None,
        *,
        tokenizer: Any = None,
        config: OnlineConfig | None = None,
        command: str = "grpo",
        **options: Any,
    ) -> None:
        choose_cpu_threads()  # as proxrl grpo would, unless the user chose
        if config is None and model is None:
            raise ProxrlError("proxrl.TrainingClient(): model: expected a path or a model")
        if config is None:
            config = client_config(model, tokenizer, options, command)
        else:
            config = given_config(config, model, tokenizer, options, command)
        self.cfg = config
        # the global generators' streams of this client (sampling draws from them), seeded as
        # open_run seeds proxrl grpo's, and swapped in only while the client draws: building
        # another client, or the caller's own draws, does not move its samples
        self._streams = OwnStreams(self.cfg.seed)
        with self._streams.active():
            self._build(config)

    def _build(self, config: OnlineConfig) -> None:
        # the critic-free family's KL in the loss, when the config has one (grpo's)
        self._kl_loss_type: str | None = getattr(config, "kl_loss_type", None)
        policy_loss = LOSSES["ppo"](narrowed(PolicyLossSettings, config), config.aggregation)
        # a ppo config's critic (``ppo.build``), none for grpo
        critic = ppo.build(config).critic if isinstance(config, ppo.Config) else NoCritic.load
        self._roles = replace(_algorithm(self._kl_loss_type, policy_loss), critic=critic)
        role_records = role_settings(config)  # what loading the roles and the engine reads
        with objects.registered(objects.attached(self.cfg)):
            self.models = load_models(role_records.models, self._roles)
        place_roles(self.models, WeightedRewards([], []), self.cfg.offload_frozen_roles)
        # what the stages the client calls read of its options, as the loop's run opens them
        self.settings = run_settings(config, self._roles, self.models.critic)
        self.optimizers = make_optimizers(self.settings.optimizing.learning_rate, self.models)
        self.optimization = Optimization.of(self.models, self.optimizers)
        self.generator = torch.Generator().manual_seed(self.cfg.seed)  # the minibatch order
        self.guard = NonFiniteGuard(self.cfg.max_consecutive_skips)
        self.engine = make_engine(role_records.engine, self.models.tokenizer)
        self.engine.start(self.models.actor, 0)
        # the token ids the policy embeds (a batch's are checked against them)
        self.vocabulary = int(self.models.actor.get_input_embeddings().num_embeddings)
        self.engine_behind = False  # the policy may have moved since the engine last synced
        self.steps = 0  # optimizer steps asked for (optim_step calls)
        self._losses: Losses | None = None  # the latest forward_backward's
        self._stats: dict[str, float] = defaultdict(float)  # since the latest optim_step

    @property
    def tokenizer(self) -> Any:
        return self.models.tokenizer

    @property
    def model(self) -> torch.nn.Module:
        """The policy being trained (a peft model under LoRA)."""
        return self.models.actor

    def prompt_batch(self, n_prompts: int, batch_size: int, draw: int) -> list[int]:
        """The prompt indices of batch ``draw`` in ``proxrl grpo``'s schedule (a fresh seeded
        permutation per pass over the ``n_prompts``)."""
        return prompt_order(n_prompts, batch_size, draw, self.cfg.seed)

    def sample(
        self,
        prompts: Sequence[str | PromptExample],
        n: int | None = None,
        logprobs: bool = True,
        **sampling: Any,
    ) -> Rollout:
        """``n`` responses (default: the config's ``group_size``) to each of ``prompts`` (a
        non-empty list of strings, message lists or ``PromptExample``s) from the run's
        engine, with the sampler's log-probs of them (``logprobs=False``: without; the built-in
        sampler draws the same tokens either way). ``sampling`` overrides the config's
        ``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``stop_strings``
        for this call."""
        where = "TrainingClient.sample"
        unknown = set(sampling) - set(SAMPLING_OPTIONS)
        if unknown:
            raise ProxrlError(
                f"{where}: {sorted(unknown)[0]}: expected one of {', '.join(SAMPLING_OPTIONS)}"
            )
        examples = prompt_examples(prompts, where)
        n = self.cfg.group_size if n is None else count(n, "n", where)
        logprobs = flag(logprobs, "logprobs", where)
        cfg = checked_config(type(self.cfg), {**sampling, "group_size": n}, where, self.cfg)
        # the sample stage's record of this call's options
        settings = run_settings(cfg, self._roles, self.models.critic).collecting.sampling
        tools = environment_tools(cfg.environment, cfg.tool_call_format)
        ids = [encode_prompt_text(self.tokenizer, e.prompt, e.messages, tools) for e in examples]
        empty = next((i for i, row in enumerate(ids) if not row), None)
        if empty is not None:
            raise ProxrlError(f"{where}: prompts[{empty}]: encodes to no tokens")
        if self.engine_behind:  # as the loop after an update: vLLM gets the new weights
            self.engine.after_update(self.models.actor, self.steps)
            self.engine_behind = False
        self.models.actor.eval()
        with torch.no_grad(), cfg.autocast(), self._streams.active():
            stage = sample(settings, self.models, self.engine, examples, ids, logprobs)
        return Rollout(stage)

    def read_rollouts(self, path: str | Path) -> Rollout:
        """The trajectories of a rollouts file (``rollouts_file``: its schema; every line
        checked against this tokenizer, ``group_size`` and the length limits), with their
        recorded log-probs as the sampler's, their recorded ``scores`` and (where rows give
        them) ``token_rewards``."""
        limits = limits_of(self.settings.loop.recorded, self.tokenizer)
        rows = read_rollouts(path, self.tokenizer, limits)
        device = next(self.models.actor.parameters()).device
        stage, scores, token_rewards = recorded_stage(rows, self.tokenizer, device)
        return Rollout(stage, scores, token_rewards)

    def logprobs(
        self,
        rollout: Rollout,
        scores: Sequence[float] | Tensor | None = None,
        recorded: bool = False,
    ) -> Experience:
        """The trainer's forward passes over ``rollout`` (``collect.forward_passes``): an
        ``Experience`` with log π_old (``logprobs``) and log π_ref (``ref_logprobs``; π_old's
        own when no KL is tracked), (B, T) each, and ``scores`` (B,) (when not given, the
        rollout's recorded ones with its ``token_rewards``, else zeros). ``recorded``: π_old is
        the rollout's own log-probs (the sampler's, or a rollouts file's), or with a
        ``rollout_correction`` the trainer's, the recorded ones giving the correction's weights
        (``rollout_weights``). Its ``advantages`` are the caller's to fill
        (``dataclasses.replace``)."""
        where = "TrainingClient.logprobs"
        if not isinstance(rollout, Rollout):
            raise ProxrlError(
                f"{where}: rollout: expected the Rollout of TrainingClient.sample or "
                f"read_rollouts, got {type(rollout).__name__}"
            )
        check_token_ids(rollout.prompt_ids, "rollout: prompt_ids", self.vocabulary, where)
        check_token_ids(rollout.response_ids, "rollout: response_ids", self.vocabulary, where)
        device = next(self.models.actor.parameters()).device
        samples = rollout.stage.samples
        n = len(rollout)
        if recorded and samples.logprobs is None:
            raise ProxrlError("TrainingClient.logprobs: recorded: the rollout holds no log-probs")
        token_rewards = rollout.token_rewards if scores is None else None
        scores = rollout.scores if scores is None else scores
        values = torch.zeros(n) if scores is None else torch.as_tensor(scores)
        if values.shape != (n,):
            raise ProxrlError(
                f"TrainingClient.logprobs: scores: expected {n} values, got {values.shape}"
            )
        ended = responses_stopped(samples, self.tokenizer.eos_token_id, self.cfg.max_new_tokens)
        scored = Scored(values, values, ended.cpu(), {}, None, token_rewards=token_rewards)
        correct = self.cfg.rollout_correction != "none"
        source = OldPolicySource.of_recorded(correct) if recorded else TRAINER_PASS
        settings = self.settings.collecting.passes
        self.models.actor.eval()
        with torch.no_grad(), self.cfg.autocast():
            passes = forward_passes(settings, self.models, rollout.stage, scored, source)
        return replace(passes.experience, scores=passes.experience.scores.to(device))

    def minibatches(self, rows: int) -> list[Tensor]:
        """One epoch's minibatches of ``rows`` rows, shuffled and split as ``proxrl grpo``'s
        update does (``mini_batch_size`` each; the client's generator is checkpointed)."""
        return minibatches(self.cfg.responses_per_step, rows, self.generator)

    def pairs(
        self,
        rows: Sequence[dict[str, Any] | PreferenceExample],
        loss: str = "dpo",
        max_length: int = 512,
    ) -> PreferencePairs:
        """Preference rows ({"prompt", "chosen", "rejected"}, as ``proxrl dpo`` reads them)
        encoded as it encodes them (``max_length``, longer ones truncated), with the reference
        log-probs ``loss`` (a ``PAIR_LOSSES`` name) needs: summed (dpo) or averaged (ipo) over
        the response under the reference model (``track_kl``/``kl_coef`` load one; LoRA: the
        adapter disabled), none for simpo."""
        if loss not in PAIR_LOSSES:
            raise ProxrlError(
                f"TrainingClient.pairs: loss: expected one of {', '.join(PAIR_LOSSES)}, "
                f"got {loss!r}"
            )
        examples = _preference_examples(rows)
        where = "TrainingClient.pairs: rows"
        items = encode_preferences(examples, self.tokenizer, max_length, "truncate", where)
        option = PAIR_LOSSES[loss]
        if not dpo.DPO_LOSSES.trait(option, "reference"):
            return PreferencePairs(items, loss, (torch.zeros(len(items)), torch.zeros(len(items))))
        if isinstance(self.models.reference, torch.nn.Module):
            reference = self.models.reference
        elif is_peft_model(self.models.actor):
            reference = self.models.actor  # its adapter disabled below
        else:
            raise ProxrlError(
                f"TrainingClient.pairs: loss={loss}: no reference model; set track_kl=True (or "
                "lora_r) when building the client"
            )
        with adapter_disabled(reference) as ref, self.cfg.autocast():
            logps = dpo.reference_logps(
                ref,
                items,
                self.cfg.micro_batch_size,
                self.tokenizer.pad_token_id,
                dpo.uses_average(option),
            )
        return PreferencePairs(items, loss, logps)

    def forward_backward(
        self,
        batch: Experience | PreferencePairs,
        loss: str | UserLoss = "ppo",
        **pair_options: float,
    ) -> dict[str, float]:
        """Add the gradient of ``loss`` on ``batch`` to the accumulated one: the built-in
        update's micro-batches, terms (+ β·KL to the reference in the loss, − the entropy
        bonus, from the config) and normaliser (the batch's loss units, counted before its
        micro-batches run). ``loss``: a name in ``LOSSES`` (``core.POLICY_LOSSES``' and
        ``sft``), or a callable (log π (b, t), micro-batch Experience) → scalar, the
        micro-batch's loss as a mean over its units (then weighed by their share). The batch's
        ``advantages`` are (B, T), or (B,) one per row (spread over its loss tokens), or None
        (zeros); no other shape is broadcast. A batch without ``logprobs`` takes π_old = π
        (detached). A ``ppo`` client adds its critic's
        value loss on the batch's ``returns`` (and ``values``, V_old) to every loss, and
        ``loss="value"`` trains the critic alone. ``dpo``/``ipo``/``simpo`` (``PAIR_LOSSES``)
        take ``pairs``' batch and ``proxrl dpo``'s loss and normaliser (the mean over the pairs,
        ``micro_batch_size`` pairs a forward pass), ``pair_options`` its ``beta``,
        ``label_smoothing``, ``simpo_gamma_beta_ratio``. Returns the batch's stats."""
        if isinstance(batch, PreferencePairs) or loss in PAIR_LOSSES:
            return self._pairs_forward_backward(batch, loss, pair_options)
        if pair_options:
            raise ProxrlError(
                f"TrainingClient.forward_backward: {sorted(pair_options)[0]}: only with a pair "
                f"loss ({', '.join(PAIR_LOSSES)})"
            )
        batch = self._checked_batch(batch, loss)
        train_policy = loss != VALUE_LOSS
        knobs, aggregation = self.settings.policy_loss, self.settings.updating.aggregation
        policy_loss = (
            _policy_loss(loss, knobs, aggregation)
            if train_policy
            else LOSSES["ppo"](knobs, aggregation)
        )
        # a named surrogate's choices over the whole batch (clip_cov's draw: from a generator
        # seeded by the client's, as the loop's update seeds it from the run's)
        named = (
            checked_config(type(self.cfg), {"policy_loss": loss}, FORWARD_BACKWARD, self.cfg)
            if isinstance(loss, str) and loss in POLICY_LOSSES
            else None
        )
        selection = None if named is None else step_selection(named.policy_loss, knobs)
        algo = _algorithm(self._kl_loss_type, policy_loss, selection)
        losses = Losses(
            self.settings.updating,
            algo,
            self.models,
            batch.prompt_ids.shape[1],
            UpdateStep(self.cfg.kl_coef, train_policy=train_policy, iteration=self.steps + 1),
            None if named is None else loss_generator(named.policy_loss, self.generator),
        )
        self._losses = losses
        if self.cfg.aggregation.units(batch.loss_mask) == 0:
            return {}  # every token masked: nothing to learn from (the update skips it too)
        if not self.engine_behind:  # as the loop before an update: a GPU engine sleeps
            self.engine.before_update(self.steps)
            self.engine_behind = True
        self.models.actor.train()
        with self._streams.active():  # (dropout draws)
            stats, _ = accumulate(losses, batch, torch.arange(len(batch)), self.optimization, None)
        for key, value in stats.items():
            self._stats[key] += value
        return stats

    def _checked_batch(self, batch: Experience, loss: str | UserLoss) -> Experience:
        """``batch`` this client's (``check_experience``: its token ids in the vocabulary), its
        advantages (B, T), or (B,) spread over each row's tokens (zeros where it has none); a
        critic's (B, T) value targets required."""
        where = FORWARD_BACKWARD
        check_experience(batch, self.vocabulary, where)
        critic = bool(self.models.critic.modules())
        if loss == VALUE_LOSS and not critic:
            raise ProxrlError(f"{where}: loss: value trains a critic; this client has none (ppo)")
        if critic and batch.returns is None:
            raise ProxrlError(
                f"{where}: batch: returns: expected the critic's (B, T) value targets "
                "(set them with dataclasses.replace, as advantages)"
            )
        mask = batch.loss_mask
        advantages = (
            torch.zeros_like(mask, dtype=torch.float32)
            if batch.advantages is None
            else token_values(batch.advantages, "advantages", mask, where, per_row=True)
        )
        returns = batch.returns
        if critic:
            returns = token_values(returns, "returns", mask, where, per_row=False)
        return replace(batch, advantages=advantages, returns=returns)

    def _pairs_forward_backward(
        self, batch: Any, loss: Any, options: dict[str, float]
    ) -> dict[str, float]:
        """``proxrl dpo``'s step gradient on ``batch`` (``dpo.make_batch``, ``preference_loss``
        under the run's autocast, ``accumulate_gradients`` weighing by pairs)."""
        where = FORWARD_BACKWARD
        if not isinstance(batch, PreferencePairs) or loss not in PAIR_LOSSES:
            raise ProxrlError(
                f"{where}: batch: a pair loss ({', '.join(PAIR_LOSSES)}) takes the "
                f"PreferencePairs of TrainingClient.pairs, got {type(batch).__name__} with "
                f"loss={loss!r}"
            )
        if batch.loss != loss:
            raise ProxrlError(
                f"{where}: batch: its reference log-probs are for loss={batch.loss}, not {loss}"
            )
        unknown = set(options) - set(PAIR_OPTIONS)
        if unknown:
            raise ProxrlError(
                f"{where}: {sorted(unknown)[0]}: expected one of {', '.join(PAIR_OPTIONS)}"
            )
        if not batch.items:
            return {}
        knobs = _pair_loss(PAIR_LOSSES[loss], options, where)
        dtype = torch.promote_types(next(self.models.actor.parameters()).dtype, torch.float32)
        size, pad_id = self.cfg.micro_batch_size, self.tokenizer.pad_token_id
        micro = [
            dpo.make_batch(
                batch.items,
                list(range(i, min(i + size, len(batch)))),
                batch.reference,
                pad_id,
                dtype,
            )
            for i in range(0, len(batch), size)
        ]
        # what optim_step reads of it: the settings, the models and the step's iteration
        self._losses = Losses(
            self.settings.updating,
            self._roles,
            self.models,
            0,
            UpdateStep(self.cfg.kl_coef, train_policy=True, iteration=self.steps + 1),
        )
        if not self.engine_behind:
            self.engine.before_update(self.steps)
            self.engine_behind = True
        self.models.actor.train()
        loss_fn = under_autocast(lambda m, b: dpo.preference_loss(m, b, knobs), self.cfg)
        with self._streams.active():  # (dropout draws)
            stats = accumulate_gradients(self.models.actor, micro, loss_fn, _pairs_in)
        for key, value in stats.items():
            self._stats[key] += value
        return stats

    def optim_step(
        self, lr: float | None = None, critic_lr: float | None = None
    ) -> dict[str, float]:
        """One optimizer step on the accumulated gradient (``update.clipped_step``: the policy's
        and a critic's clipped to ``max_grad_norm`` by their one global norm, skipped when a
        stat or the gradient is not finite, and no step for an optimizer whose gradient is
        exactly zero), at ``lr`` (a finite number > 0; default: the config's ``learning_rate``)
        and a critic's
        ``critic_lr`` (default: ``critic_learning_rate``); the gradients are zeroed after.
        Returns the step's stats with ``grad_norm`` and ``stepped`` (1: the policy moved)."""
        where = "TrainingClient.optim_step"
        lr = learning_rate(lr, "lr", where)
        critic_lr = learning_rate(critic_lr, "critic_lr", where)
        if critic_lr is not None and len(self.optimizers) < 2:
            raise ProxrlError(f"{where}: critic_lr: this client has no critic (command ppo)")
        self.steps += 1
        policy_rate = self.cfg.learning_rate if lr is None else lr
        critic_rate = (
            getattr(self.cfg, "critic_learning_rate", None) if critic_lr is None else critic_lr
        )
        for index, optimizer in enumerate(self.optimizers):  # the policy's, then a critic's
            for group in optimizer.param_groups:
                group["lr"] = policy_rate if index == 0 else critic_rate
        stats, self._stats = dict(self._stats), defaultdict(float)
        if self._losses is None:
            return {"stepped": 0.0}
        losses = replace(self._losses, step=replace(self._losses.step, iteration=self.steps))
        result = clipped_step(losses, stats, None, self.optimization, self.guard)
        self.optimization.zero_grad()
        if result is None:  # the guard skipped it
            return stats | {"stepped": 0.0}
        result["stepped"] = result.pop(POLICY_STEPPED)
        return result

    def _checkpointer(self, directory: str | Path) -> Checkpointer:
        return Checkpointer(directory, keep=1).track(
            actor=TrainableWeights(self.models.actor),
            critic=self.models.critic.checkpoint_weights(),  # None without a critic
            optimizers=self.optimizers,
            generator=self.generator,
            guard=self.guard,
            rng=self._streams,
        )

    def save_state(self, directory: str | Path) -> Path:
        """Everything a resumed loop needs to continue as the uninterrupted one: the trained
        weights, the optimizer, the minibatch generator, the guard and the client's own global
        generators (the sampler's stream), under ``directory/checkpoints``; returns the
        checkpoint's path."""
        check_creatable(directory, "TrainingClient.save_state: directory")
        return self._checkpointer(directory).save(self.steps, steps=self.steps)

    def load_state(self, directory: str | Path) -> int:
        """Restore ``save_state``'s newest checkpoint in ``directory``; returns its step count."""
        restored = self._checkpointer(directory).restore()
        self.steps = int(restored.counters["steps"])
        self.engine_behind = True  # the restored weights reach the engine before it samples
        self._stats = defaultdict(float)
        self.optimization.zero_grad()
        return self.steps

    def save_model(self, directory: str | Path) -> Path:
        """The policy as the trainers save it (``save_pretrained``, safetensors; under LoRA the
        merged model and the adapter in ``adapter/``) and its tokenizer: what transformers,
        vLLM or the next proxrl stage loads."""
        path = Path(directory)
        check_creatable(path, "TrainingClient.save_model: directory")
        path.mkdir(parents=True, exist_ok=True)
        save_policy(self.models, path)
        return path

    def close(self) -> None:
        """Stop the engine."""
        self.engine.close()


TRAINER_PASS = OldPolicySource(from_sampler=False, correct=False, forward_pass=True)
"""π_old from the trainer's own forward pass over the rollout."""

FORWARD_BACKWARD = "TrainingClient.forward_backward"  # its refusals start so

SAMPLING_OPTIONS = ("max_new_tokens", "temperature", "top_k", "top_p", "min_p", "stop_strings")
"""The config fields ``TrainingClient.sample`` may override per call."""


def _pair_loss(option: str, options: dict[str, float], where: str) -> dpo.PairLoss:
    """``proxrl dpo``'s loss options, read and checked as its config's fields are (not its
    ``validate()``, which asks for a model and data the client does not have): their ranges,
    and a knob of another loss refused (label smoothing is no part of IPO)."""
    cfg = checked_config(dpo.Config, {"loss": option, **options}, where)
    return dpo.PairLoss(
        cfg.loss,
        beta=cfg.beta,
        label_smoothing=cfg.label_smoothing,
        simpo_gamma_beta_ratio=cfg.simpo_gamma_beta_ratio,
    )


def _pairs_in(batch: dpo.DPOBatch) -> float:
    return batch.pairs.num_pairs


def _preference_examples(rows: Sequence[dict[str, Any] | PreferenceExample]) -> list[Any]:
    """``rows`` as ``proxrl dpo`` reads a data file's (``formats.preference_examples``: pairs
    whose chosen equals rejected dropped), or the ``PreferenceExample``s given."""
    if rows and all(isinstance(row, PreferenceExample) for row in rows):
        return list(rows)
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ProxrlError(
                f"TrainingClient.pairs: rows[{index}]: expected a dict with prompt, chosen and "
                f"rejected, got {type(row).__name__}"
            )
    return preference_examples([Row(row, f"rows[{i}]") for i, row in enumerate(rows)], "pairs")


def _policy_loss(
    loss: str | UserLoss, knobs: PolicyLossSettings, aggregation: Aggregation
) -> PolicyLoss:
    """The policy loss ``loss`` names (bound to ``knobs`` and ``aggregation``), or a user's
    callable returning a scalar."""
    if callable(loss):
        user = loss

        def policy_loss(logprobs: Tensor, mb: Experience) -> tuple[Tensor, dict[str, Tensor]]:
            value = user(logprobs, mb)
            return value, {}

        return policy_loss
    if loss not in LOSSES:
        raise ProxrlError(
            f"TrainingClient.forward_backward: loss: expected one of {', '.join(LOSSES)} or a "
            f"callable, got {loss!r}"
        )
    return LOSSES[loss](knobs, aggregation)


def _algorithm(
    kl_type: str | None, policy_loss: PolicyLoss, selection: StepSelection | None = None
) -> Algorithm:
    """The critic-free family's choices around ``policy_loss`` (and its ``selection`` over the
    whole batch): the KL to the reference in the loss (``kl_type``: the config's
    ``kl_loss_type``, as grpo's estimators pay it) when the config has one."""

    def no_estimate(exp: Experience, kl_coef: float) -> tuple[Tensor, Tensor, Tensor]:
        raise ProxrlError("TrainingClient: advantages are the caller's to compute")

    return Algorithm(
        name="client",
        estimate=no_estimate,
        policy_loss=policy_loss,
        kl_loss=None if kl_type is None else KL_ESTIMATORS[kl_type],
        step_selection=selection,
    )
