"""The critic of the online loop behind one small interface: none, a separate value model, or a
value head on the policy's last hidden state.

An algorithm picks one by option from ``CRITICS`` (PPO's ``critic: separate|head``; the
critic-free family keeps ``NoCritic``) and binds its ``CriticSettings``; ``roles.load_models``
loads it. The rollout asks it for V_old(s_t), the update for its weighted value loss, the loop
for its optimizer, checkpoint state and saved files: none of them asks which one it has.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml
from torch import Tensor, nn

from proxrl.core import Aggregation, Registry, explained_variance, value_loss
from proxrl.models.lora import apply_lora, save_model
from proxrl.models.scalar_head import load_score_model
from proxrl.models.tokenizer import resize_for_tokenizer
from proxrl.models.value_head import ValueHead
from proxrl.rollout.experience import Experience
from proxrl.rollout.forward import critic_forward
from proxrl.runtime.checkpointer import TrainableWeights
from proxrl.runtime.errors import ProxrlError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from proxrl.algos.online.role_settings import ModelSettings


@dataclass(frozen=True)
class CriticSettings:
    """How a critic trains: PPO's ``critic_*``, ``vf_coef`` and ``value_clip`` options."""

    learning_rate: float
    """AdamW learning rate of the critic's own optimizer."""
    vf_coef: float
    """Weight of the value loss in the update's loss."""
    value_clip: float | None
    """Clip new values to ±value_clip around the rollout's (None: off)."""
    warmup_iterations: int = 0
    """Train only the critic for this many first iterations."""
    warmup_patience: int | None = None
    """End the warm-up after this many iterations in a row whose value loss is not below its
    best (None: the whole warm-up)."""
    source: str | None = None
    """Where a separate critic starts (``critic_start``): None, ``policy``, a model, or a run."""
    packed: bool = False
    """A separate critic's forward passes run padding-free (``max_tokens_per_micro_batch``)."""
    shared_prefix: bool = False
    """A separate critic's padded passes forward a group's prompt once (``shared_prefix``)."""
    lora_r: int = 0
    """LoRA rank of a separate critic (0: every weight trains); its score head trains in full."""
    lora_alpha: float | None = None
    """LoRA scale numerator of a separate critic (None: 2 × lora_r)."""


class Critic(ABC):
    """V(s_t) for the online loop, and everything the loop does with the model behind it."""

    needs_hidden: bool = False
    """The policy's forward pass must return its last hidden state (``values``' ``hidden``)."""
    warmup_iterations: int = 0
    """Iterations at the start that train only the critic."""
    warmup_stop: WarmupStop | None = None
    """The warm-up's early end when its value loss stops falling (None: it runs its length)."""

    def end_warmup_iteration(self, iteration: int, value_loss: float) -> bool:
        """After warm-up iteration ``iteration`` (0-based), whose mean value loss was
        ``value_loss``: whether the warm-up ends here (``warmup_stop``), the policy training
        from the next iteration on."""
        return self.warmup_stop is not None and self.warmup_stop.observe(iteration, value_loss)

    @abstractmethod
    def values(
        self, input_ids: Tensor, attention_mask: Tensor, prompt_length: int, hidden: Tensor | None
    ) -> Tensor:
        """(B, P+T) ids and mask, with the policy's (B, T, d) last hidden state when
        ``needs_hidden`` → (B, T) float32 V(s_t) at every response token."""

    @abstractmethod
    def loss(
        self, mb: Experience, hidden: Tensor | None, loss_agg: str | Aggregation
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The weighted value loss (vf_coef × clipped value loss) of a minibatch, and its stats."""

    @abstractmethod
    def rollout_metrics(self, experience: Experience) -> dict[str, float]:
        """What the loop logs about the critic once advantages and returns are known."""

    @abstractmethod
    def modules(self) -> list[nn.Module]:
        """The trained modules (placed on the device, wrapped by FSDP, synced by DDP)."""

    @abstractmethod
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The critic's own optimizers, built at its learning rate (none without a critic)."""

    @abstractmethod
    def wrapped(self, wrap: Callable[[nn.Module], Any]) -> Critic:
        """The same critic around ``wrap(module)`` (a sharded engine's wrapper)."""

    @abstractmethod
    def save_pretrained(
        self, output_dir: Path, state_dict: dict[str, Tensor] | None = None
    ) -> None:
        """Save the critic beside the policy, in a layout transformers (or safetensors) reads;
        ``state_dict``: the weights to write instead of the module's (FSDP's gathered ones)."""

    def parameters(self) -> Iterator[nn.Parameter]:
        """The parameters that train."""
        return (p for module in self.modules() for p in module.parameters() if p.requires_grad)

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """Every parameter of the trained modules, by name (for the non-finite guard's report)."""
        return (item for module in self.modules() for item in module.named_parameters())

    def state_dict(self) -> dict[str, Tensor]:
        """The trained weights, as a module's ``state_dict`` would give them ({} without a
        critic)."""
        weights = self.checkpoint_weights()
        return weights.state_dict() if weights is not None else {}

    @abstractmethod
    def checkpoint_weights(self) -> TrainableWeights | None:
        """What a checkpoint holds of the critic: its trained weights (None without a critic)."""

    # An optimizer step of a critic in another process (placement ray's critic actor). A critic
    # in this process does nothing here: its value loss joins the policy's (``loss``), and its
    # gradients are clipped and stepped with the policy's.

    def start_step(
        self,
        experience: Experience,
        micro_batches: list[Tensor],
        units: Callable[[Tensor], float],
        total_units: float,
        loss_agg: Aggregation,
    ) -> None:
        """Start the value loss's forward and backward on a step's micro-batches (rows of
        ``experience``, each weighted by ``units(rows) / total_units``) where the critic lives,
        to run while the policy's do."""
        return None

    def finish_step(self) -> CriticGradient | None:
        """The started step's gradient norm and stats (None: the critic's gradients are in this
        process's parameters)."""
        return None

    def clip(self, coefficient: float) -> None:
        """Scale the finished step's gradients by the update's clip coefficient (the one global
        norm over policy and critic); its optimizer then steps as any of the update's."""
        return None


@dataclass(frozen=True)
class CriticGradient:
    """What a critic in another process reports of one optimizer step's backward."""

    norm: float
    """The 2-norm of its gradients (as ``torch.nn.utils.get_total_norm`` computes it)."""
    stats: dict[str, float]
    """Its unit-weighted step stats (``loss``: its share of the step's loss; value_loss, …)."""
    nonfinite: str | None = None
    """The first of its parameters whose gradient holds a NaN or Inf (None: none does)."""


class WarmupStop:
    """The critic's warm-up (VC-PPO's value pretraining) ended once its value loss stops
    falling: after ``patience`` warm-up iterations in a row whose mean value loss is not below
    the best before them, the policy trains from the next iteration. Its state is checkpointed
    (a resumed run keeps where the warm-up ended)."""

    def __init__(self, iterations: int, patience: int) -> None:
        self.iterations = iterations  # the warm-up's length: as planned, or where it ended
        self.patience = patience
        self.best = math.inf
        self.stalled = 0  # warm-up iterations in a row without a new best

    def observe(self, iteration: int, value_loss: float) -> bool:
        """Whether the warm-up ends after iteration ``iteration`` (0-based) with this loss."""
        if iteration + 1 >= self.iterations:  # its last planned iteration ends it anyway
            return False
        if value_loss < self.best:
            self.best, self.stalled = value_loss, 0
            return False
        self.stalled += 1
        if self.stalled < self.patience:
            return False
        self.iterations = iteration + 1
        return True

    def state_dict(self) -> dict[str, float]:
        return {"iterations": self.iterations, "best": self.best, "stalled": self.stalled}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.iterations, self.stalled = int(state["iterations"]), int(state["stalled"])
        self.best = float(state["best"])


def value_metrics(experience: Experience) -> dict[str, float]:
    """What the loop logs about a trained critic once advantages and returns are known."""
    mask = experience.loss_mask.float()
    return {
        "value/explained_var": explained_variance(
            experience.values, experience.returns, mask
        ).item()
    }


class NoCritic(Critic):
    """The critic-free family: V ≡ 0, nothing trained, saved or logged."""

    @classmethod
    def load(cls, model_settings: ModelSettings, actor: nn.Module, tokenizer: Any) -> NoCritic:
        return cls()

    def values(
        self, input_ids: Tensor, attention_mask: Tensor, prompt_length: int, hidden: Tensor | None
    ) -> Tensor:
        return torch.zeros(
            input_ids.shape[0],
            input_ids.shape[1] - prompt_length,
            dtype=torch.float32,
            device=input_ids.device,
        )

    def loss(
        self, mb: Experience, hidden: Tensor | None, loss_agg: str | Aggregation
    ) -> tuple[Tensor, dict[str, Tensor]]:
        return torch.zeros((), device=mb.response_mask.device), {}

    def rollout_metrics(self, experience: Experience) -> dict[str, float]:
        return {}

    def modules(self) -> list[nn.Module]:
        return []

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return []

    def wrapped(self, wrap: Callable[[nn.Module], Any]) -> Critic:
        return self

    def save_pretrained(
        self, output_dir: Path, state_dict: dict[str, Tensor] | None = None
    ) -> None:
        pass

    def checkpoint_weights(self) -> None:
        return None


class _TrainedCritic(Critic):
    """What a critic with a model shares: its settings, loss, optimizer and metrics."""

    def __init__(
        self, module: nn.Module, settings: CriticSettings, warmup_stop: WarmupStop | None = None
    ) -> None:
        self.module = module
        self.settings = settings
        if warmup_stop is None and settings.warmup_patience is not None:
            warmup_stop = WarmupStop(settings.warmup_iterations, settings.warmup_patience)
        self.warmup_stop = warmup_stop  # (one, shared with ``wrapped``'s critic)

    @property  # type: ignore[override]
    def warmup_iterations(self) -> int:
        """The warm-up's length: as planned, or where it ended (``warmup_stop``, restored)."""
        if self.warmup_stop is not None:
            return self.warmup_stop.iterations
        return self.settings.warmup_iterations

    def loss(
        self, mb: Experience, hidden: Tensor | None, loss_agg: str | Aggregation
    ) -> tuple[Tensor, dict[str, Tensor]]:
        new_values = self.values(mb.input_ids, mb.attention_mask, mb.prompt_ids.shape[1], hidden)
        v_loss, stats = value_loss(
            new_values,
            mb.values,
            mb.returns,
            mb.loss_mask.float(),
            self.settings.value_clip,
            loss_agg,
        )
        return self.settings.vf_coef * v_loss, stats

    def rollout_metrics(self, experience: Experience) -> dict[str, float]:
        return value_metrics(experience)

    def modules(self) -> list[nn.Module]:
        return [self.module]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [
            torch.optim.AdamW(
                list(self.parameters()), lr=self.settings.learning_rate, weight_decay=0.0
            )
        ]

    def wrapped(self, wrap: Callable[[nn.Module], Any]) -> Critic:
        return type(self)(wrap(self.module), self.settings, self.warmup_stop)

    def checkpoint_weights(self) -> TrainableWeights:
        return TrainableWeights(self.module)


POLICY = "policy"
"""``critic_model: policy``: the critic starts from the policy's weights (a zero head)."""


def critic_start(source: str | None, model: str, reward_model: tuple[str, ...]) -> str:
    """Where a separate critic starts, as veRL / OpenRLHF / NeMo RL allow:

    - None: the reward model (InstructGPT; its head is kept; an ensemble's first), else the
      policy;
    - ``policy``: the policy (``model``), with a zero head, even when there is a reward model;
    - an earlier run's directory: its ``critic/`` (warm start from the critic proxrl saved);
    - any other model directory (a peft adapter's too: merged into its base) or hub id: that
      model (its head kept if it has one, else zero).

    A ppo/grpo run directory without ``critic/`` (critic-free, or ``critic: head``) and a
    directory with no model in it are one-line errors. ``model``: the policy; ``reward_model``:
    the run's reward models."""
    if source is None:
        return reward_model[0] if reward_model else model
    if source == POLICY:
        return model
    path = Path(source)
    if not path.is_dir():
        return source  # a hub id (the loader reports one that does not exist)
    if (path / "critic" / "config.json").is_file():
        return str(path / "critic")
    if _is_online_run(path):
        raise ProxrlError(
            f"critic_model: {source} is a ppo/grpo run without a critic/ to start from "
            "(critic-free, or critic: head); give a run trained with critic: separate, "
            "a model, or policy"
        )
    if not any((path / name).is_file() for name in ("config.json", "adapter_config.json")):
        raise ProxrlError(f"critic_model: {source} holds no critic (no critic/, no config.json)")
    return source


def _is_online_run(path: Path) -> bool:
    config = path / "config.yaml"
    if not config.is_file():
        return False
    try:
        fields = yaml.safe_load(config.read_text(encoding="utf-8"))
    except yaml.YAMLError:
        return False
    return isinstance(fields, dict) and "rollout_batch_size" in fields


class SeparateCritic(_TrainedCritic):
    """A value model of its own in the ``AutoModelForSequenceClassification`` (num_labels=1)
    layout, its head read at every response token (InstructGPT's critic). With ``lora_r`` its
    body trains as LoRA adapters and its head in full (OpenRLHF's critic under ``--lora_rank``):
    no gradient or AdamW state for the body's weights."""

    module: PreTrainedModel

    @classmethod
    def load(
        cls,
        settings: CriticSettings,
        model_settings: ModelSettings,
        actor: nn.Module,
        tokenizer: Any,
    ) -> SeparateCritic:
        source = critic_start(settings.source, model_settings.model, model_settings.reward_model)
        model = load_score_model(
            source,
            new_head="zero",
            gradient_checkpointing=model_settings.gradient_checkpointing,
            **model_settings.loading.loader_kwargs(),
        )
        resize_for_tokenizer(model, tokenizer)
        if settings.lora_r:
            return cls(
                apply_lora(model, settings.lora_r, settings.lora_alpha, task="seq_cls"), settings
            )
        return cls(model, settings)

    def values(
        self, input_ids: Tensor, attention_mask: Tensor, prompt_length: int, hidden: Tensor | None
    ) -> Tensor:
        settings = self.settings
        return critic_forward(
            self.module,
            input_ids,
            attention_mask,
            prompt_length,
            settings.packed,
            shared_prefix=settings.shared_prefix,
        )

    def save_pretrained(
        self, output_dir: Path, state_dict: dict[str, Tensor] | None = None
    ) -> None:
        """Under ``critic/``, a sequence classifier transformers loads (under LoRA: merged,
        with its adapter in ``critic/adapter``)."""
        save_model(self.module, output_dir / "critic", state_dict=state_dict)


class ValueHeadCritic(_TrainedCritic):
    """A zero-initialised linear head on the policy's last hidden state: the critic shares the
    actor's backbone (its gradient reaches the actor through the hidden state)."""

    module: ValueHead
    needs_hidden = True

    @classmethod
    def load(
        cls,
        settings: CriticSettings,
        model_settings: ModelSettings,
        actor: nn.Module,
        tokenizer: Any,
    ) -> ValueHeadCritic:
        config: Any = actor.config  # a transformers config (through peft's wrapper under LoRA)
        return cls(ValueHead(config.hidden_size), settings)

    def values(
        self, input_ids: Tensor, attention_mask: Tensor, prompt_length: int, hidden: Tensor | None
    ) -> Tensor:
        if hidden is None:
            raise ValueError(
                "a value head reads the policy's hidden state: "
                "run policy_forward with with_hidden=True"
            )
        values: Tensor = self.module(hidden)
        return values

    def save_pretrained(
        self, output_dir: Path, state_dict: dict[str, Tensor] | None = None
    ) -> None:
        """``value_head.safetensors`` beside the policy."""
        from safetensors.torch import save_file

        save_file(
            {k: v.contiguous() for k, v in (state_dict or self.module.state_dict()).items()},
            str(output_dir / "value_head.safetensors"),
        )


CriticLoader = Callable[["ModelSettings", nn.Module, Any], Critic]
"""(what loading the run's models reads, actor, tokenizer) → the critic, its model loaded
(``roles.load_models`` calls it after the actor and reference, so the random stream is consumed
in the same order)."""

CRITICS: Registry[Callable[[CriticSettings, ModelSettings, nn.Module, Any], Critic]] = Registry(
    "critic"
)
"""PPO's ``critic`` option → the load function of that critic (bind its settings first)."""
CRITICS.add(
    "separate",
    SeparateCritic.load,
    "a separate value model",
    knobs=("critic_model", "critic_lora_r"),
)
CRITICS.add("head", ValueHeadCritic.load, "a value head on the policy's backbone")
