"""The critic role of ``placement: ray``: PPO's separate value model (``critic: separate``) and its
optimizer in an actor of their own, and ``RemoteCritic``, the stand-in through which the trainer's
loop uses it as it uses any ``Critic``.

- Rollout: per micro-batch the (B, P + T) ids and mask go to the actor and the (B, T) values
  V_old(s_t) come back (never hidden states).
- Update: each optimizer step sends the critic its share of the step's micro-batches (the same
  rows, weighted by the same units) before the policy's forward and backward start, so both run
  at once; the trainer then collects the critic's gradient norm and stats. The update clips the
  policy's and the critic's gradients by their one global norm and the non-finite guard skips
  the whole step, as in one process: the trainer tells the critic the clip coefficient and then
  steps its optimizer (``RemoteOptimizer``), or does neither.
- Checkpoints: the critic's trained weights and optimizer state are fetched into the trainer's
  checkpoint (``RemoteWeights``, ``RemoteOptimizer.state_dict``), written atomically with the
  rest, and put back on resume; ``save_pretrained`` writes the actor's ``critic/`` files beside
  the policy.

A value head (``critic: head``) reads the policy's last hidden state: it is part of the policy
and stays in the trainer. The actor loads the critic from the trainer's random state at the
point where the loop in one process loads it, and hands the state back, so the run draws the
same random numbers as in one process (a new head's initialisation consumes some).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from proxrl.algos.online.critic import Critic, CriticGradient, CriticLoader, value_metrics
from proxrl.algos.online.placement.ray_group import answer, join_paths, ready_within
from proxrl.algos.online.placement.ray_roles import RoleActor
from proxrl.algos.online.role_settings import ModelSettings
from proxrl.core import Aggregation
from proxrl.models.tokenizer import load_tokenizer
from proxrl.rollout.experience import Experience
from proxrl.runtime import distributed as dist
from proxrl.runtime.accumulation import accumulate_gradients
from proxrl.runtime.checkpointer import TrainableWeights
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.guard import first_nonfinite_grad
from proxrl.runtime.seeding import capture_rng_state, restore_rng_state

# The fields of a rollout the value loss does not read: not sent to the critic actor.
UNREAD = ("logprobs", "ref_logprobs", "rollout_weights", "greedy_scores", "truncated")


def host_rng() -> dict[str, Any]:
    """This process's Python, NumPy and torch CPU generators (the GPU ones stay: the processes
    may see different devices)."""
    return {k: v for k, v in capture_rng_state().items() if k != "cuda"}


def moved(obj: Any, device: torch.device | str) -> Any:
    """Every tensor of a (nested) state on ``device``."""
    if isinstance(obj, Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: moved(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(moved(v, device) for v in obj)
    return obj


def on(experience: Experience, device: torch.device | str) -> Experience:
    return replace(
        experience,
        **{f.name: moved(getattr(experience, f.name), device) for f in fields(experience)},
    )


def value_rows(experience: Experience, rows: Tensor) -> Experience:
    """The rows ``rows`` of ``experience`` as the value loss reads them, on the CPU."""
    return on(replace(experience.select(rows), **dict.fromkeys(UNREAD)), "cpu")


def remote_loader(start: Callable[..., Any], loader: CriticLoader, output_dir: str) -> CriticLoader:
    """A critic loader for ``roles.load_models`` that loads the critic with ``loader`` in a
    critic actor (``start(model_settings, loader, rng)``: a started one) from this process's random
    state, waits for it and takes the state back. ``output_dir``: the run's, named when the
    actor dies."""

    def load(model_settings: ModelSettings, actor: nn.Module, tokenizer: Any) -> RemoteCritic:
        handle = start(model_settings, loader, host_rng())
        (loaded,) = ready_within([handle.loaded.remote()], "the critic actor")
        if loaded["error"] is not None:
            raise ProxrlError(loaded["error"])
        restore_rng_state(loaded["rng"])
        return RemoteCritic(handle, loaded, output_dir)

    return load


class CriticActor(RoleActor):
    """The separate critic and its AdamW, trained where they live."""

    def __init__(
        self,
        paths: list[str],
        model_settings: ModelSettings,
        loader: CriticLoader,
        rng: dict[str, Any],
    ) -> None:
        join_paths(paths)
        self.model_settings = model_settings
        self.rng = rng
        self.device = dist.device()
        try:
            restore_rng_state(rng)
            trust_remote_code = model_settings.loading.trust_remote_code
            tokenizer = load_tokenizer(model_settings.model, trust_remote_code=trust_remote_code)
            # (a separate critic reads no policy: there is none here)
            self.critic: Critic = loader(model_settings, None, tokenizer)  # type: ignore[arg-type]
            self.rng = host_rng()
            for module in self.critic.modules():
                module.to(self.device)
            (self.optimizer,) = self.critic.optimizers()
        except ProxrlError as error:
            self.error = str(error)

    def loaded(self) -> dict[str, Any]:
        """The load's error (None), the random state after it, and what the stand-in mirrors."""
        if self.error is not None:
            return {"error": self.error}
        return {
            "error": None,
            "rng": self.rng,
            "warmup_iterations": self.critic.warmup_iterations,
            "learning_rate": self.optimizer.param_groups[0]["lr"],
        }

    @torch.no_grad()
    def values(self, input_ids: Tensor, attention_mask: Tensor, prompt_length: int) -> Tensor:
        """(B, P + T) ids and mask → (B, T) V(s_t) at every response token (CPU)."""
        with self.model_settings.autocast():
            values = self.critic.values(
                input_ids.to(self.device), attention_mask.to(self.device), prompt_length, None
            )
        return values.cpu()

    def backward(
        self, batches: list[tuple[Experience, float]], total_units: float, loss_agg: Aggregation
    ) -> CriticGradient:
        """The value loss's gradient over one optimizer step's micro-batches (each with its
        units), accumulated as the update accumulates the policy's."""
        self.optimizer.zero_grad(set_to_none=True)

        def loss(model: nn.Module, batch: tuple[Experience, float]) -> Any:
            with self.model_settings.autocast():
                return self.critic.loss(on(batch[0], self.device), None, loss_agg)

        module = self.critic.modules()[0]
        stats = accumulate_gradients(module, batches, loss, lambda b: b[1], total_units)
        grads = [p.grad for p in self.critic.parameters() if p.grad is not None]
        norm = float(torch.nn.utils.get_total_norm(grads))
        named = list(self.critic.named_parameters())
        culprit = None if math.isfinite(norm) else first_nonfinite_grad(named)
        return CriticGradient(norm, stats, culprit)

    @torch.no_grad()
    def clip(self, coefficient: float) -> None:
        grads = [p.grad for p in self.critic.parameters() if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, coefficient)

    def step(self, learning_rate: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate
        self.optimizer.step()

    def trainable_state(self) -> dict[str, Tensor]:
        weights = self.critic.checkpoint_weights()
        assert weights is not None
        return moved(weights.state_dict(), "cpu")

    def load_trainable(self, state: dict[str, Tensor]) -> None:
        weights = self.critic.checkpoint_weights()
        assert weights is not None
        weights.load_state_dict(state)

    def optimizer_state(self) -> dict[str, Any]:
        return moved(self.optimizer.state_dict(), "cpu")

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)

    def saved_files(self) -> dict[str, bytes]:
        """What ``save_pretrained`` writes, by path under the run directory (the trainer writes
        them there: the actor may live on another node)."""
        with tempfile.TemporaryDirectory() as tmp:
            self.critic.save_pretrained(Path(tmp))
            return {
                str(path.relative_to(tmp)): path.read_bytes()
                for path in sorted(Path(tmp).rglob("*"))
                if path.is_file()
            }


class RemoteCritic(Critic):
    """The critic actor as the loop's ``Critic`` (see the module docstring). Calls whose answer
    the trainer does not wait for (clip, step) are checked at the next one it waits for."""

    def __init__(self, handle: Any, loaded: dict[str, Any], output_dir: str) -> None:
        self.handle = handle
        self.output_dir = output_dir
        self.warmup_iterations = loaded["warmup_iterations"]
        self.optimizer = RemoteOptimizer(self, loaded["learning_rate"])
        self.sent: list[Any] = []
        self.step_started: Any = None

    def wait(self, refs: Any) -> Any:
        from ray.exceptions import RayActorError

        try:
            answer(self.sent)
            self.sent = []
            return answer(refs)
        except RayActorError as error:
            raise ProxrlError(
                f"placement: the critic actor died ({type(error).__name__}); the last "
                f"checkpoint in {self.output_dir} is whole: --resume continues the run"
            ) from error

    def call(self, method: str, *args: Any) -> Any:
        return self.wait(getattr(self.handle, method).remote(*args))

    def send(self, method: str, *args: Any) -> None:
        self.sent.append(getattr(self.handle, method).remote(*args))

    def values(
        self, input_ids: Tensor, attention_mask: Tensor, prompt_length: int, hidden: Tensor | None
    ) -> Tensor:
        values = self.call("values", input_ids.cpu(), attention_mask.cpu(), prompt_length)
        return values.to(input_ids.device)

    def loss(
        self, mb: Experience, hidden: Tensor | None, loss_agg: str | Aggregation
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """0: the value loss is computed in the actor (``start_step``)."""
        return torch.zeros((), device=mb.response_mask.device), {}

    def start_step(
        self,
        experience: Experience,
        micro_batches: list[Tensor],
        units: Callable[[Tensor], float],
        total_units: float,
        loss_agg: Aggregation,
    ) -> None:
        batches = [(value_rows(experience, rows), units(rows)) for rows in micro_batches]
        self.step_started = self.handle.backward.remote(batches, total_units, loss_agg)

    def finish_step(self) -> CriticGradient:
        started, self.step_started = self.step_started, None
        return self.wait(started)

    def clip(self, coefficient: float) -> None:
        self.send("clip", coefficient)

    def rollout_metrics(self, experience: Experience) -> dict[str, float]:
        return value_metrics(experience)

    def modules(self) -> list[nn.Module]:
        return []  # none here: nothing to place, wrap or synchronise

    def optimizers(self) -> list[Any]:
        return [self.optimizer]

    def wrapped(self, wrap: Any) -> Critic:
        return self

    def save_pretrained(
        self, output_dir: Path, state_dict: dict[str, Tensor] | None = None
    ) -> None:
        for name, data in self.call("saved_files").items():
            path = output_dir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)

    def checkpoint_weights(self) -> TrainableWeights:
        return RemoteWeights(self)


class RemoteWeights(TrainableWeights):
    """The critic actor's trained weights as a checkpoint entry (the same tensors, by the same
    names, as ``TrainableWeights`` of the critic in one process)."""

    def __init__(self, critic: RemoteCritic) -> None:  # (no module in this process)
        self.critic = critic

    def state_dict(self) -> dict[str, Tensor]:
        state: dict[str, Tensor] = self.critic.call("trainable_state")
        return state

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.critic.call("load_trainable", moved(state, "cpu"))


class RemoteOptimizer(torch.optim.Optimizer):
    """The critic actor's AdamW as one of the update's optimizers: the run's LR schedule sets
    its learning rate (``param_groups``, holding no parameter here), the update steps it after
    ``RemoteCritic.clip``, and the checkpoint saves and restores its state.

    An ``Optimizer`` only so that torch's ``LRScheduler`` (``runtime.lr_schedule``) accepts it;
    ``Optimizer.__init__`` is not called: it would ask for parameters, which live in the actor."""

    def __init__(self, critic: RemoteCritic, learning_rate: float) -> None:
        self.critic = critic
        self.defaults: dict[str, Any] = {"lr": learning_rate}
        self.state: dict[Any, Any] = {}
        self.param_groups: list[dict[str, Any]] = [{"lr": learning_rate, "params": []}]

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass  # each step's backward starts from no gradient in the actor

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self.critic.send("step", self.param_groups[0]["lr"])

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        state: dict[str, Any] = self.critic.call("optimizer_state")
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:  # type: ignore[override]
        self.critic.call("load_optimizer_state", state)
        self.param_groups[0]["lr"] = state["param_groups"][0]["lr"]
