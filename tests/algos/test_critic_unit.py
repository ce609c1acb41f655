"""critic.py's functions called directly, with no model loaded and no trainer imported (issue 54's
mutation check, round 4): each value hand-computed (float64 where numbers are compared, exact in
binary where they can be), each message compared whole, the loaders' and savers' calls recorded
in place of transformers'. Runs in about a second."""

from __future__ import annotations

import locale
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from proxrl.algos.online import critic as cr
from proxrl.algos.online.critic import (
    POLICY,
    CriticSettings,
    NoCritic,
    SeparateCritic,
    ValueHeadCritic,
    WarmupStop,
    _TrainedCritic,
    critic_start,
    value_metrics,
)
from proxrl.algos.online.role_settings import Loading, ModelSettings
from proxrl.models.value_head import ValueHead
from proxrl.rollout.experience import Experience
from proxrl.runtime.checkpointer import TrainableWeights
from tests.algos.test_client_checks_unit import F64, experience, refused

SETTINGS = CriticSettings(learning_rate=0.125, vf_coef=0.25, value_clip=0.5)


def batch(action_mask: torch.Tensor | None = None) -> Experience:
    """``experience``'s B = 2 rows (a 3-token prompt, so P differs from B and T; T = 2, row 1's
    second token padding) with V_old and returns as in the docstrings of the tests below."""
    return experience(
        values=torch.tensor([[0.0, 2.0], [0.5, 3.0]], dtype=F64),
        returns=torch.tensor([[2.0, 1.0], [0.0, 1.0]], dtype=F64),
        action_mask=action_mask,
    )


NEW_VALUES = torch.tensor([[1.0, 2.0], [0.5, 0.0]], dtype=F64)


class Recording(_TrainedCritic):
    """A trained critic whose V is NEW_VALUES; it records what ``values`` was given."""

    def __init__(self, module, settings, warmup_stop=None):  # type: ignore[no-untyped-def]
        super().__init__(module, settings, warmup_stop)
        self.calls: list[tuple] = []

    def values(self, input_ids, attention_mask, prompt_length, hidden):  # type: ignore[no-untyped-def]
        self.calls.append((input_ids, attention_mask, prompt_length, hidden))
        return NEW_VALUES

    def save_pretrained(self, output_dir, state_dict=None):  # type: ignore[no-untyped-def]
        raise AssertionError("not saved here")


def half_frozen() -> nn.Linear:
    """A (1, 2) linear layer whose bias does not train."""
    module = nn.Linear(2, 1)
    module.bias.requires_grad_(False)
    return module


# ---------------------------------------------------------------------------- WarmupStop


def test_warmup_stop_ends_after_patience_stalls_equal_loss_included():
    stop = WarmupStop(6, 2)
    assert (stop.iterations, stop.patience, stop.best, stop.stalled) == (6, 2, math.inf, 0)
    assert stop.observe(0, 3.0) is False and (stop.best, stop.stalled) == (3.0, 0)
    assert stop.observe(1, 3.0) is False and (stop.best, stop.stalled) == (3.0, 1)  # not below
    assert stop.observe(2, 2.0) is False and (stop.best, stop.stalled) == (2.0, 0)
    assert stop.observe(3, 2.5) is False and stop.stalled == 1
    assert stop.observe(4, 2.0) is True
    assert stop.state_dict() == {"iterations": 5, "best": 2.0, "stalled": 2}


def test_warmup_stop_never_ends_at_or_after_its_last_planned_iteration():
    stop = WarmupStop(5, 1)
    assert stop.observe(0, 1.0) is False
    assert stop.observe(4, 1.0) is False  # the last: it ends anyway
    assert stop.state_dict() == {"iterations": 5, "best": 1.0, "stalled": 0}
    assert stop.observe(3, 1.0) is True and stop.state_dict()["iterations"] == 4


def test_warmup_stop_state_round_trips_as_int_and_float():
    stop = WarmupStop(9, 3)
    stop.load_state_dict({"iterations": 4.0, "best": 1, "stalled": 2.0})
    state = stop.state_dict()
    assert state == {"iterations": 4, "best": 1.0, "stalled": 2}
    assert [type(v) for v in state.values()] == [int, float, int]
    assert stop.patience == 3


def test_end_warmup_iteration_asks_the_stop_if_there_is_one():
    assert NoCritic().end_warmup_iteration(0, 1.0) is False
    critic = Recording(half_frozen(), CriticSettings(1.0, 1.0, None, 4, 1))
    assert critic.end_warmup_iteration(0, 2.0) is False
    assert critic.end_warmup_iteration(1, 2.0) is True
    assert critic.warmup_iterations == 2


# ---------------------------------------------------------------------------- NoCritic


def test_no_critic_is_zero_values_and_nothing_else():
    exp = batch()
    critic = NoCritic.load(None, None, None)  # type: ignore[arg-type]
    assert type(critic) is NoCritic
    values = critic.values(exp.input_ids, exp.attention_mask, 1, None)
    assert values.dtype == torch.float32 and values.shape == (2, 4) and not values.any()
    loss, stats = critic.loss(exp, None, "token-mean")
    assert loss.shape == () and float(loss) == 0.0 and stats == {}
    assert critic.rollout_metrics(exp) == {}
    assert (critic.modules(), critic.optimizers(), list(critic.parameters())) == ([], [], [])
    assert (critic.checkpoint_weights(), critic.state_dict()) == (None, {})
    assert critic.wrapped(lambda m: pytest.fail("nothing to wrap")) is critic
    assert critic.save_pretrained(Path("/nonexistent")) is None
    assert (critic.needs_hidden, critic.warmup_iterations, critic.warmup_stop) == (False, 0, None)
    assert critic.start_step(exp, [], lambda rows: 1.0, 1.0, None) is None  # type: ignore[arg-type]
    assert critic.finish_step() is None and critic.clip(0.5) is None


def test_no_critics_values_are_float32_whatever_the_default_dtype():
    exp = batch()
    before = torch.get_default_dtype()
    try:
        torch.set_default_dtype(F64)
        values = NoCritic().values(exp.input_ids, exp.attention_mask, 3, None)
    finally:
        torch.set_default_dtype(before)
    assert values.dtype == torch.float32 and values.shape == (2, 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_no_critics_zeros_are_on_the_batchs_device():
    """On a CPU-only machine every device is the CPU: this alone tells the device apart."""
    exp = batch()
    exp.prompt_ids, exp.response_ids = exp.prompt_ids.cuda(), exp.response_ids.cuda()
    exp.prompt_mask, exp.response_mask = exp.prompt_mask.cuda(), exp.response_mask.cuda()
    assert NoCritic().values(exp.input_ids, exp.attention_mask, 3, None).device.type == "cuda"
    assert NoCritic().loss(exp, None, "token-mean")[0].device.type == "cuda"


# ---------------------------------------------------------------------------- a trained critic


def test_value_metrics_is_the_explained_variance_over_the_loss_tokens():
    """R at the loss tokens 2, 1, 0 (var 1), R − V there 1, −1, −0.5 (var 13/12): 1 − 13/12."""
    exp = batch()
    exp.values = NEW_VALUES
    assert value_metrics(exp) == {"value/explained_var": pytest.approx(-1 / 12, abs=1e-15)}
    assert Recording(half_frozen(), SETTINGS).rollout_metrics(exp) == value_metrics(exp)
    # the action mask, not the response mask: row 0's tokens, R 2, 1 (var ½), R − V 1, −1 (var 2)
    exp.action_mask = torch.tensor([[1, 1], [0, 0]])
    assert value_metrics(exp) == {"value/explained_var": -3.0}


def test_loss_is_vf_coef_times_the_clipped_value_loss_on_the_loss_tokens():
    """Per token ½·max((V − R)², (clip(V, V_old ± ½) − R)²): (0, 0) V = 1 clipped to ½:
    max(1, 2.25); (0, 1) 1; (1, 0) 0.25; (1, 1) padding. token-mean: ½·3.5/3; seq-mean-token-sum:
    ½·(3.25 + 0.25)/2 = 0.875; × vf_coef ¼."""
    critic = Recording(half_frozen(), SETTINGS)
    exp = batch()
    hidden = torch.ones(2, 2, 1)
    loss, stats = critic.loss(exp, hidden, "token-mean")
    assert loss.dtype == F64 and float(loss) == pytest.approx(0.25 * 0.5 * 3.5 / 3, rel=1e-15)
    assert float(stats["value_clipfrac"]) == pytest.approx(1 / 3, rel=1e-15)
    [(ids, mask, prompt_length, given)] = critic.calls
    assert torch.equal(ids, exp.input_ids) and torch.equal(mask, exp.attention_mask)
    assert prompt_length == 3 and given is hidden
    loss, _ = critic.loss(exp, None, "seq-mean-token-sum")
    assert float(loss) == 0.25 * 0.875
    unclipped = Recording(half_frozen(), CriticSettings(1.0, 0.5, None))
    loss, stats = unclipped.loss(exp, None, "token-mean")
    assert float(loss) == 0.5 * 0.5 * 2.25 / 3 and "value_clipfrac" not in stats
    # the action mask: row 0 alone, ½·(2.25 + 1)/2 × ¼
    loss, _ = critic.loss(batch(torch.tensor([[1, 1], [0, 0]])), None, "token-mean")
    assert float(loss) == 0.25 * 0.5 * 3.25 / 2


def test_a_trained_critic_trains_its_modules_own_trainable_weights():
    module = half_frozen()
    critic = Recording(module, SETTINGS)
    assert critic.modules() == [module] and critic.warmup_stop is None
    assert critic.warmup_iterations == 0
    assert [p is module.weight for p in critic.parameters()] == [True]
    assert [name for name, _ in critic.named_parameters()] == ["weight", "bias"]
    weights = critic.checkpoint_weights()
    assert isinstance(weights, TrainableWeights) and weights.module is module
    assert list(critic.state_dict()) == ["weight"]
    [optimizer] = critic.optimizers()
    assert type(optimizer) is torch.optim.AdamW
    [group] = optimizer.param_groups
    assert group["lr"] == 0.125 and group["weight_decay"] == 0.0
    assert [p is module.weight for p in group["params"]] == [True]
    assert critic.start_step(batch(), [], lambda rows: 1.0, 1.0, None) is None  # type: ignore[arg-type]
    assert critic.finish_step() is None and critic.clip(0.5) is None


def test_a_trained_critic_builds_its_warmup_stop_and_wrapping_shares_it():
    settings = CriticSettings(1.0, 1.0, None, warmup_iterations=7, warmup_patience=3)
    critic = Recording(half_frozen(), settings)
    stop = critic.warmup_stop
    assert isinstance(stop, WarmupStop) and (stop.iterations, stop.patience) == (7, 3)
    assert critic.warmup_iterations == 7
    stop.iterations = 4
    assert critic.warmup_iterations == 4
    other = nn.Linear(2, 1)
    seen: list[nn.Module] = []
    wrapped = critic.wrapped(lambda m: seen.append(m) or other)
    assert seen == [critic.module]
    assert type(wrapped) is Recording and wrapped.module is other
    assert wrapped.settings is settings and wrapped.warmup_stop is stop
    given = WarmupStop(2, 1)
    assert Recording(half_frozen(), settings, given).warmup_stop is given
    plain = Recording(half_frozen(), CriticSettings(1.0, 1.0, None, warmup_iterations=5))
    assert plain.warmup_stop is None and plain.warmup_iterations == 5


# ---------------------------------------------------------------------------- critic_start


def test_critic_start_defaults_to_the_first_reward_model_else_the_policy():
    assert critic_start(None, "pol", ("rm1", "rm2")) == "rm1"
    assert critic_start(None, "pol", ()) == "pol"
    assert critic_start(POLICY, "pol", ("rm1",)) == "pol" and POLICY == "policy"
    assert critic_start("org/not-a-dir", "pol", ("rm1",)) == "org/not-a-dir"


def test_critic_start_from_directories(tmp_path):
    run = tmp_path / "run"
    (run / "critic").mkdir(parents=True)
    (run / "critic" / "config.json").write_text("{}")
    (run / "config.yaml").write_text("rollout_batch_size: 4\n")
    assert critic_start(str(run), "pol", ()) == str(run / "critic")
    (run / "critic" / "config.json").unlink()
    assert refused(critic_start, str(run), "pol", ()) == (
        f"critic_model: {run} is a ppo/grpo run without a critic/ to start from (critic-free, "
        "or critic: head); give a run trained with critic: separate, a model, or policy"
    )
    model = tmp_path / "model"
    model.mkdir()
    assert refused(critic_start, str(model), "pol", ()) == (
        f"critic_model: {model} holds no critic (no critic/, no config.json)"
    )
    (model / "adapter_config.json").write_text("{}")
    assert critic_start(str(model), "pol", ()) == str(model)
    (model / "adapter_config.json").unlink()
    (model / "config.json").write_text("{}")
    assert critic_start(str(model), "pol", ()) == str(model)
    # a config.yaml of another command, or none that reads, is no online run
    for text in ("beta: 0.1\n", "- rollout_batch_size\n", "a: [1\n"):
        (model / "config.yaml").write_text(text)
        assert critic_start(str(model), "pol", ()) == str(model), text


def test_an_online_run_is_a_config_yaml_with_rollout_batch_size(tmp_path):
    assert cr._is_online_run(tmp_path) is False
    (tmp_path / "config.yaml").mkdir()
    assert cr._is_online_run(tmp_path) is False  # not a file
    (tmp_path / "config.yaml").rmdir()
    (tmp_path / "config.yaml").write_text("rollout_batch_size: 2\n")
    assert cr._is_online_run(tmp_path) is True
    (tmp_path / "config.yaml").write_text("a: [1\n")
    assert cr._is_online_run(tmp_path) is False
    (tmp_path / "config.yaml").write_text("model: caf\u00e9\nrollout_batch_size: 2\n", "utf-8")
    before = locale.setlocale(locale.LC_CTYPE)
    try:  # UTF-8 whatever the locale's encoding (C: ASCII, unless Python runs in UTF-8 mode)
        locale.setlocale(locale.LC_CTYPE, "C")
        assert cr._is_online_run(tmp_path) is True
    finally:
        locale.setlocale(locale.LC_CTYPE, before)


# ---------------------------------------------------------------------------- SeparateCritic


def model_settings(reward_model: tuple[str, ...] = ("rm",)) -> ModelSettings:
    return ModelSettings(
        model="pol",
        loading=Loading("float64", "eager", True),
        gradient_checkpointing=True,
        mixed_precision="no",
        lora_r=0,
        lora_alpha=16.0,
        tracks_kl=False,
        teacher_model=None,
        distill_loss="fkl",
        reward_model=reward_model,
    )


@pytest.fixture
def recorded(monkeypatch):  # type: ignore[no-untyped-def]
    """critic.py's loaders and savers replaced by recorders: the calls, in order."""
    calls: list[tuple] = []
    model = nn.Linear(2, 1)

    def load_score_model(source, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(("load", source, kwargs))
        return model

    def resize(module, tokenizer):  # type: ignore[no-untyped-def]
        calls.append(("resize", module, tokenizer))

    def apply_lora(module, r, alpha, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(("lora", module, r, alpha, kwargs))
        return "adapted"

    def critic_forward(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(("forward", args, kwargs))
        return "values"

    def save_model(module, output_dir, state_dict=None):  # type: ignore[no-untyped-def]
        calls.append(("save", module, output_dir, state_dict))

    for name, fn in [
        ("load_score_model", load_score_model),
        ("resize_for_tokenizer", resize),
        ("apply_lora", apply_lora),
        ("critic_forward", critic_forward),
        ("save_model", save_model),
    ]:
        monkeypatch.setattr(cr, name, fn)
    return model, calls


def test_separate_critic_loads_where_it_starts_with_a_zero_head(recorded):
    model, calls = recorded
    settings = CriticSettings(1.0, 1.0, None, source=None)
    critic = SeparateCritic.load(settings, model_settings(), "actor", "tok")  # type: ignore[arg-type]
    assert type(critic) is SeparateCritic and critic.module is model
    assert critic.settings is settings
    kwargs = {
        "new_head": "zero",
        "gradient_checkpointing": True,
        "dtype": "float64",
        "attn_implementation": "eager",
        "trust_remote_code": True,
    }
    assert calls == [("load", "rm", kwargs), ("resize", model, "tok")]
    calls.clear()
    settings = CriticSettings(1.0, 1.0, None, source=POLICY, lora_r=4, lora_alpha=3.0)
    critic = SeparateCritic.load(settings, model_settings(), "actor", "tok")  # type: ignore[arg-type]
    assert critic.module == "adapted" and critic.settings is settings
    assert calls == [
        ("load", "pol", kwargs),
        ("resize", model, "tok"),
        ("lora", model, 4, 3.0, {"task": "seq_cls"}),
    ]


def test_separate_critic_values_and_saves_through_forward_and_save_model(recorded, tmp_path):
    model, calls = recorded
    settings = CriticSettings(1.0, 1.0, None, packed=True, shared_prefix=True)
    critic = SeparateCritic(model, settings)
    ids, mask = torch.ones(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.long)
    assert critic.values(ids, mask, 3, None) == "values"
    assert calls == [("forward", (model, ids, mask, 3, True), {"shared_prefix": True})]
    calls.clear()
    SeparateCritic(model, SETTINGS).values(ids, mask, 2, None)
    assert calls == [("forward", (model, ids, mask, 2, False), {"shared_prefix": False})]
    calls.clear()
    state = {"w": torch.zeros(1)}
    critic.save_pretrained(tmp_path, state)
    critic.save_pretrained(tmp_path)
    assert calls == [
        ("save", model, tmp_path / "critic", state),
        ("save", model, tmp_path / "critic", None),
    ]


# ---------------------------------------------------------------------------- ValueHeadCritic


class Actor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = type("Config", (), {"hidden_size": 3})()


def test_value_head_critic_is_a_zero_head_as_wide_as_the_policy():
    critic = ValueHeadCritic.load(SETTINGS, model_settings(), Actor(), None)
    assert type(critic) is ValueHeadCritic and critic.settings is SETTINGS
    assert isinstance(critic.module, ValueHead) and critic.module.linear.in_features == 3
    assert critic.needs_hidden is True


def test_value_head_values_read_the_hidden_state_else_a_one_line_error():
    head = ValueHead(2)
    with torch.no_grad():
        head.linear.weight.copy_(torch.tensor([[1.0, -1.0]]))
        head.linear.bias.fill_(0.5)
    critic = ValueHeadCritic(head, SETTINGS)
    ids = torch.ones(1, 4, dtype=torch.long)
    hidden = torch.tensor([[[2.0, 1.0], [0.0, 0.25]]])
    values = critic.values(ids, ids, 2, hidden)
    assert values.dtype == torch.float32 and values.tolist() == [[1.5, 0.25]]
    with pytest.raises(ValueError) as raised:
        critic.values(ids, ids, 2, None)
    assert str(raised.value) == (
        "a value head reads the policy's hidden state: run policy_forward with with_hidden=True"
    )


def test_value_head_saves_its_weights_or_the_given_ones_contiguous(tmp_path):
    from safetensors.torch import load_file

    head = ValueHead(2)
    with torch.no_grad():
        head.linear.weight.copy_(torch.tensor([[1.0, -1.0]]))
    ValueHeadCritic(head, SETTINGS).save_pretrained(tmp_path)
    saved = load_file(tmp_path / "value_head.safetensors")
    assert saved.keys() == {"linear.weight", "linear.bias"}
    assert saved["linear.weight"].tolist() == [[1.0, -1.0]]
    given = {"linear.weight": torch.tensor([[1.0, 3.0], [2.0, 4.0]]).t()}  # not contiguous
    ValueHeadCritic(head, SETTINGS).save_pretrained(tmp_path, given)
    saved = load_file(tmp_path / "value_head.safetensors")
    assert saved.keys() == {"linear.weight"}
    assert saved["linear.weight"].tolist() == [[1.0, 2.0], [3.0, 4.0]]
