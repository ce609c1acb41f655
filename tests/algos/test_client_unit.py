"""client.py's and client_checks.py's functions called directly (issue 54's mutation check, round
4): the checks at their boundaries, each refusal's message compared whole, the module's helpers
on hand-computed values, and the client's methods on a 1-layer, 8-wide Llama (built here in
0.2 s, no test model of conftest's) with what they hand to the stages they call recorded in
place of the stages where the stage itself is tested elsewhere. Runs in a few seconds."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from proxrl.algos.online import client as cl
from proxrl.algos.online import client_checks as cc
from proxrl.algos.online import grpo, ppo
from proxrl.algos.online.client import (
    FORWARD_BACKWARD,
    LOSSES,
    PAIR_LOSSES,
    PreferencePairs,
    Rollout,
    TrainingClient,
    client_config,
    given_config,
)
from proxrl.algos.online.update import minibatches
from proxrl.core import KL_ESTIMATORS, POLICY_LOSSES
from proxrl.data.formats import PreferenceExample, PromptExample
from proxrl.rollout.experience import Experience
from proxrl.runtime import objects
from proxrl.runtime.errors import ProxrlError

F64 = torch.float64
WHERE = "W"


def refused(call: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ProxrlError) as raised:
        call(*args, **kwargs)
    return str(raised.value)


def experience(**over: Any) -> Experience:
    """B = 2 rows of a 3-token prompt and a 2-token response (row 1's second: padding)."""
    fields: dict[str, Any] = dict(
        prompt_ids=torch.tensor([[5, 6, 7], [0, 8, 9]]),
        prompt_mask=torch.tensor([[1, 1, 1], [0, 1, 1]]),
        response_ids=torch.tensor([[10, 11], [12, 0]]),
        response_mask=torch.tensor([[1, 1], [1, 0]]),
        logprobs=None,
        ref_logprobs=None,
        values=torch.zeros(2, 2, dtype=F64),
        scores=torch.zeros(2, dtype=F64),
    )
    return Experience(**(fields | over))


# ---------------------------------------------------------------------------- client_checks


def test_kind_names_a_type_with_its_article():
    assert [cc._kind(v) for v in (1, "s", None, [], 1.5, experience())] == [
        "an int",
        "a str",
        "a NoneType",
        "a list",
        "a float",
        "an Experience",
    ]


def test_count_is_an_int_at_least_1_not_a_bool():
    assert cc.count(1, "n", WHERE) == 1 and cc.count(7, "n", WHERE) == 7
    assert refused(cc.count, True, "n", WHERE) == "W: n: expected an int >= 1, got a bool"
    assert refused(cc.count, 2.0, "n", WHERE) == "W: n: expected an int >= 1, got a float"
    assert refused(cc.count, 0, "n", WHERE) == "W: n: expected an int >= 1, got 0"
    assert refused(cc.count, -3, "k", WHERE) == "W: k: expected an int >= 1, got -3"


def test_flag_is_a_bool():
    assert cc.flag(True, "f", WHERE) is True and cc.flag(False, "f", WHERE) is False
    assert refused(cc.flag, 1, "f", WHERE) == "W: f: expected True or False, got 1"
    assert refused(cc.flag, "no", "g", WHERE) == "W: g: expected True or False, got 'no'"


def test_learning_rate_is_none_or_a_finite_positive_number():
    assert cc.learning_rate(None, "lr", WHERE) is None
    rate = cc.learning_rate(2, "lr", WHERE)
    assert rate == 2.0 and type(rate) is float
    assert cc.learning_rate(5e-324, "lr", WHERE) == 5e-324
    assert (
        refused(cc.learning_rate, True, "lr", WHERE) == "W: lr: expected a number > 0, got a bool"
    )
    assert refused(cc.learning_rate, "1", "lr", WHERE) == "W: lr: expected a number > 0, got a str"
    for bad, shown in [(0.0, "0.0"), (-1, "-1"), (float("inf"), "inf"), (float("nan"), "nan")]:
        assert refused(cc.learning_rate, bad, "c", WHERE) == (
            f"W: c: expected a finite number > 0, got {shown}"
        )


def test_token_ids_are_a_2d_integer_tensor_inside_the_vocabulary():
    cc.check_token_ids(torch.tensor([[0, 9]]), "ids", 10, WHERE)  # both ends
    cc.check_token_ids(torch.zeros(0, 3, dtype=torch.long), "ids", 10, WHERE)  # empty
    cc.check_token_ids(torch.zeros(2, 0, dtype=torch.long), "ids", 1, WHERE)
    cc.check_token_ids(torch.tensor([[True]]), "ids", 2, WHERE)
    shape = "W: ids: expected a (B, L) tensor of token ids, got"
    assert refused(cc.check_token_ids, torch.zeros(1, 2), "ids", 10, WHERE) == f"{shape} (1, 2)"
    assert refused(
        cc.check_token_ids, torch.zeros(1, 2, dtype=torch.complex64), "ids", 10, WHERE
    ) == (f"{shape} (1, 2)")
    assert refused(cc.check_token_ids, torch.tensor([1, 2]), "ids", 10, WHERE) == f"{shape} (2,)"
    assert refused(cc.check_token_ids, torch.ones(1, 1, 1, dtype=torch.long), "ids", 10, WHERE) == (
        f"{shape} (1, 1, 1)"
    )
    assert refused(cc.check_token_ids, [[1]], "ids", 10, WHERE) == f"{shape} a list"
    outside = "is outside this client's vocabulary (0 to 9); was it made with another tokenizer?"
    assert refused(cc.check_token_ids, torch.tensor([[3, 10]]), "ids", 10, WHERE) == (
        f"W: ids: token id 10 {outside}"
    )
    assert refused(cc.check_token_ids, torch.tensor([[-1, 3]]), "ids", 10, WHERE) == (
        f"W: ids: token id -1 {outside}"
    )
    assert refused(cc.check_token_ids, torch.tensor([[-2, 12]]), "ids", 10, WHERE) == (
        f"W: ids: token id -2 {outside}"
    )


def test_an_experience_is_checked_ids_first_then_its_rows():
    cc.check_experience(experience(), 13, WHERE)
    assert refused(cc.check_experience, {}, 13, WHERE) == (
        "W: batch: expected an Experience (TrainingClient.logprobs) or the PreferencePairs of "
        "TrainingClient.pairs, got a dict"
    )
    outside = "is outside this client's vocabulary (0 to 10); was it made with another tokenizer?"
    assert refused(cc.check_experience, experience(), 11, WHERE) == (
        f"W: batch: response_ids: token id 12 {outside}"
    )
    assert refused(cc.check_experience, experience(prompt_ids=torch.tensor([[11]])), 11, WHERE) == (
        f"W: batch: prompt_ids: token id 11 {outside}"
    )
    assert refused(cc.check_experience, experience(prompt_ids=torch.tensor([[5]])), 13, WHERE) == (
        "W: batch: 1 rows of prompt_ids but 2 of response_ids"
    )


def test_token_values_per_row_are_spread_over_the_loss_tokens():
    mask = torch.tensor([[1, 1], [1, 0]])
    spread = cc.token_values(torch.tensor([2.0, -0.5], dtype=F64), "a", mask, WHERE, True)
    assert spread.dtype == F64 and spread.tolist() == [[2.0, 2.0], [-0.5, 0.0]]
    spread = cc.token_values(torch.tensor([3, 4]), "a", mask, WHERE, True)  # ints: float32
    assert spread.dtype == torch.float32 and spread.tolist() == [[3.0, 3.0], [4.0, 0.0]]
    whole = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=F64)
    assert cc.token_values(whole, "a", mask, WHERE, True) is whole  # as given, padding too
    assert cc.token_values(whole, "r", mask, WHERE, False) is whole
    longs = cc.token_values(torch.tensor([[1, 2], [3, 4]]), "r", mask, WHERE, False)
    assert longs.dtype == torch.float32 and longs.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    wanted = "expected shape (B, T) = (2, 2) or (B,) = (2,), got"
    assert refused(cc.token_values, torch.ones(2, 1), "a", mask, WHERE, True) == (
        f"W: batch: a: {wanted} (2, 1)"
    )
    assert refused(cc.token_values, torch.ones(2), "r", mask, WHERE, False) == (
        "W: batch: r: expected shape (B, T) = (2, 2), got (2,)"
    )
    assert (
        refused(cc.token_values, torch.ones(3), "a", mask, WHERE, True)
        == f"W: batch: a: {wanted} (3,)"
    )
    assert refused(cc.token_values, [1.0, 2.0], "a", mask, WHERE, True) == (
        "W: batch: a: expected a tensor of shape (B, T) = (2, 2) or (B,) = (2,), got a list"
    )
    assert refused(cc.token_values, None, "r", mask, WHERE, False) == (
        "W: batch: r: expected a tensor of shape (B, T) = (2, 2), got a NoneType"
    )
    assert refused(
        cc.token_values, torch.ones(2, dtype=torch.complex64), "a", mask, WHERE, True
    ) == ("W: batch: a: expected real values, got torch.complex64")


def test_prompts_are_a_non_empty_list_of_prompts():
    examples = cc.prompt_examples(("hi", [{"role": "user", "content": "yo"}]), WHERE)
    assert examples[0] == PromptExample("hi", None, "prompts[0]")
    assert examples[1].messages == [{"role": "user", "content": "yo"}]
    given = PromptExample("x", None, "mine")
    chat = PromptExample("", [{"role": "user", "content": "yo"}], "chat")
    assert cc.prompt_examples([given, chat], WHERE) == [given, chat]
    assert refused(cc.prompt_examples, "hi", WHERE) == (
        "W: prompts: expected a list of prompts, got a str"
    )
    assert refused(cc.prompt_examples, [], WHERE) == (
        "W: prompts: expected at least one prompt, got an empty list"
    )
    assert refused(cc.prompt_examples, ["a", " \n"], WHERE) == (
        "W: prompts[1]: expected a non-empty prompt, got ' \\n'"
    )
    assert refused(cc.prompt_examples, [PromptExample(" ", None, "p")], WHERE) == (
        "W: prompts[0]: expected a non-empty prompt, got ' '"
    )
    assert refused(cc.prompt_examples, ["a", 3], WHERE) == (
        "W: prompts[1]: expected a string or a list of messages, got an int"
    )
    message = refused(cc.prompt_examples, [[{"role": "user"}]], WHERE)
    assert message.startswith("W: prompts[0]") and message.count("W: ") == 1


def test_checked_config_reads_values_as_yaml_and_prefixes_its_refusals():
    cfg = cc.checked_config(
        grpo.Config, {"model": "m", "group_size": 3, "learning_rate": "1e-3"}, WHERE
    )
    assert type(cfg) is grpo.Config and (cfg.group_size, cfg.learning_rate) == (3, 1e-3)
    assert refused(cc.checked_config, grpo.Config, {"model": "m", "group_size": "3"}, WHERE) == (
        "W: field group_size expects int, found str '3'"
    )
    grpo_refusals = [
        ({"temperature": -1.0}, "temperature: expected > 0, got -1.0"),  # the ranges run
        (
            {"reward_ensemble_std_coef": 2.0},
            "reward_ensemble_std_coef: applies to reward_ensemble "
            "mean_minus_std; this run has mean",
        ),  # a knob of an entry not selected
        (
            {"kl_controller": "proportional", "kl_coef": 0.0},
            "kl_coef: the proportional controller scales β, so it cannot start from 0",
        ),  # the rules between options
    ]
    for values, message in grpo_refusals:
        assert refused(cc.checked_config, grpo.Config, {"model": "m", **values}, WHERE) == (
            f"W: {message}"
        )
    # the policy loss stays open: a knob of a loss not selected is kept
    cfg = cc.checked_config(grpo.Config, {"model": "m", "clip_cov_ratio": 0.5}, WHERE)
    assert cfg.clip_cov_ratio == 0.5
    from proxrl.algos.offline import dpo  # no validate_options: check_knobs

    assert refused(
        cc.checked_config, dpo.Config, {"loss": "ipo", "label_smoothing": 0.1}, WHERE
    ) == ("W: label_smoothing: applies to loss sigmoid, simpo; this run has ipo")
    assert refused(cc.checked_config, dpo.Config, {"loss": "ipo", "beta": -1.0}, WHERE) == (
        "W: beta: expected > 0, got -1.0"
    )
    base = cc.checked_config(grpo.Config, {"model": "m"}, WHERE)
    objects.attach(base, {"python:m": objects.Entry("obj")})
    again = cc.checked_config(grpo.Config, {"seed": 4}, WHERE, base)
    assert (
        again.seed == 4 and again.model == "m" and objects.attached(again) == objects.attached(base)
    )
    assert objects.attached(cc.checked_config(grpo.Config, {"model": "m"}, WHERE)) == {}


# ---------------------------------------------------------------------------- client.py helpers


def test_sft_loss_is_the_nll_under_the_aggregation():
    """−log π at the loss tokens 1, 2, 4 (row 1's second is padding, −8 not read)."""
    logprobs = torch.tensor([[-1.0, -2.0], [-4.0, -8.0]], dtype=F64)
    mb = experience()
    loss, stats = LOSSES["sft"](None, "seq-mean-token-sum")(logprobs, mb)  # type: ignore[arg-type]
    assert loss.dtype == F64 and float(loss) == 3.5 and float(stats["policy_loss"]) == 3.5
    loss, _ = cl._sft_loss(None, "token-mean")(logprobs, mb)  # type: ignore[arg-type]
    assert float(loss) == pytest.approx(7 / 3, rel=1e-15)
    mb = experience(action_mask=torch.tensor([[0, 1], [1, 0]]))
    assert float(cl._sft_loss(None, "token-mean")(logprobs, mb)[0]) == 3.0  # type: ignore[arg-type]


def test_a_named_surrogate_binds_the_knobs_as_the_loop_does(monkeypatch):
    calls = []
    monkeypatch.setattr(cl, "surrogate", lambda *args: calls.append(args) or "bound")
    assert LOSSES["cispo"]("knobs", "agg") == "bound"  # type: ignore[arg-type]
    assert cl._named_surrogate("gspo")("k", "a") == "bound"  # type: ignore[arg-type]
    assert calls == [("cispo", "knobs", "agg"), ("gspo", "k", "a")]
    assert set(LOSSES) == {*POLICY_LOSSES, "sft"}


def test_policy_loss_is_a_name_or_a_users_callable(monkeypatch):
    monkeypatch.setattr(cl, "surrogate", lambda *args: args)
    assert cl._policy_loss("ppo", "k", "a") == ("ppo", "k", "a")  # type: ignore[arg-type]
    sft = cl._policy_loss("sft", "k", "token-mean")  # type: ignore[arg-type]
    assert (
        float(sft(torch.tensor([[-1.0, -2.0], [-4.0, -8.0]], dtype=F64), experience())[0]) == 7 / 3
    )

    def user(logprobs: torch.Tensor, mb: Experience) -> torch.Tensor:
        return logprobs.sum() * len(mb)

    wrapped = cl._policy_loss(user, "k", "a")  # type: ignore[arg-type]
    value, stats = wrapped(torch.tensor([1.5, 2.0]), experience())
    assert float(value) == 7.0 and stats == {}
    assert refused(cl._policy_loss, "nope", "k", "a") == (
        f"TrainingClient.forward_backward: loss: expected one of {', '.join(LOSSES)} or a "
        "callable, got 'nope'"
    )


def test_the_clients_algorithm_pays_the_kl_in_the_loss_and_estimates_nothing():
    algo = cl._algorithm("k3", "loss", "selection")  # type: ignore[arg-type]
    assert (algo.name, algo.policy_loss, algo.step_selection) == ("client", "loss", "selection")
    assert algo.kl_loss is KL_ESTIMATORS["k3"]
    assert cl._algorithm("k1", "loss").kl_loss is KL_ESTIMATORS["k1"]  # type: ignore[arg-type]
    plain = cl._algorithm(None, "loss")  # type: ignore[arg-type]
    assert plain.kl_loss is None and plain.step_selection is None
    assert refused(plain.estimate, experience(), 0.1) == (
        "TrainingClient: advantages are the caller's to compute"
    )


def test_pair_loss_reads_dpos_options_and_pairs_are_counted():
    knobs = cl._pair_loss("sigmoid", {"beta": 0.5, "label_smoothing": 0.25}, WHERE)
    assert (knobs.loss, knobs.beta, knobs.label_smoothing) == ("sigmoid", 0.5, 0.25)
    knobs = cl._pair_loss("simpo", {"simpo_gamma_beta_ratio": 0.75}, WHERE)
    assert (knobs.loss, knobs.simpo_gamma_beta_ratio) == ("simpo", 0.75)
    assert refused(cl._pair_loss, "ipo", {"beta": -1.0}, WHERE).startswith("W: ")
    assert cl._pairs_in(SimpleNamespace(pairs=SimpleNamespace(num_pairs=3))) == 3  # type: ignore[arg-type]
    assert PAIR_LOSSES == {"dpo": "sigmoid", "ipo": "ipo", "simpo": "simpo"}


def test_preference_rows_are_read_as_proxrl_dpo_reads_them():
    rows = [
        {"prompt": "p", "chosen": "a", "rejected": "b"},
        {"prompt": "q", "chosen": "c", "rejected": "c"},
    ]
    examples = cl._preference_examples(rows)
    assert [(e.prompt, e.chosen, e.rejected) for e in examples] == [("p", "a", "b")]
    given = [PreferenceExample("p", "a", "b", None, "mine")]
    assert cl._preference_examples(given) == given
    assert refused(cl._preference_examples, []) == "data 'pairs' has no usable rows"
    assert refused(cl._preference_examples, [rows[0], "row"]) == (
        "TrainingClient.pairs: rows[1]: expected a dict with prompt, chosen and rejected, got str"
    )
    assert refused(cl._preference_examples, [given[0], rows[0], 3]) == (
        "TrainingClient.pairs: rows[0]: expected a dict with prompt, chosen and rejected, got "
        "PreferenceExample"
    )
    message = refused(cl._preference_examples, [rows[0], {"prompt": "p", "chosen": "a"}])
    assert "rows[1]" in message


def test_a_rollout_and_pairs_are_views_of_what_they_hold():
    samples = SimpleNamespace(response_ids="r", response_mask="m", logprobs="l")
    stage = SimpleNamespace(
        prompts=[PromptExample("a", None, "0"), PromptExample("b", None, "1")],
        completions=["x", "y"],
        prompt_ids="p",
        samples=samples,
    )
    rollout = Rollout(stage)  # type: ignore[arg-type]
    assert (rollout.prompts, rollout.text, len(rollout)) == (["a", "b"], ["x", "y"], 2)
    assert (rollout.prompt_ids, rollout.response_ids, rollout.response_mask, rollout.logprobs) == (
        "p",
        "r",
        "m",
        "l",
    )
    assert rollout.scores is None and rollout.token_rewards is None
    assert len(PreferencePairs([1, 2, 3], "dpo", (torch.zeros(3), torch.zeros(3)))) == 3  # type: ignore[list-item]


# ---------------------------------------------------------------------------- configs


class Loaded:
    """Stands for a loaded model: what client_config takes one by."""

    def save_pretrained(self) -> None: ...

    def parameters(self) -> None: ...


def test_client_config_takes_a_path_or_a_loaded_model():
    cfg = client_config("some/path", None, {"seed": 9, "group_size": 3})
    assert type(cfg) is grpo.Config and (cfg.model, cfg.seed, cfg.group_size) == ("some/path", 9, 3)
    assert objects.attached(cfg) == {}
    assert type(client_config("m", None, {}, "ppo")) is ppo.Config
    model = Loaded()
    cfg = client_config(model, "tok", {})
    assert cfg.model == "python:model" and objects.PREFIX == "python:"
    assert objects.attached(cfg) == {"python:model": objects.Entry(model, "tok")}
    half = SimpleNamespace(save_pretrained=1)  # no parameters: a name
    assert client_config(half, None, {}).model == str(half)
    assert refused(client_config, "m", "tok", {}) == (
        "TrainingClient: tokenizer is only for a model given as a loaded model"
    )
    assert refused(client_config, "m", None, {}, "dpo") == (
        "proxrl.TrainingClient(): command: expected one of grpo, ppo, got 'dpo'"
    )
    assert refused(client_config, "m", None, {"group_size": 0}).startswith(
        "proxrl.TrainingClient(): group_size"
    )


def test_given_config_is_checked_and_options_replace_its_fields():
    cfg = client_config(Loaded(), None, {"seed": 2})
    assert given_config(cfg, None, None, {}, "grpo") is cfg
    again = given_config(cfg, None, None, {"seed": 5}, "grpo")
    assert type(again) is grpo.Config and (again.seed, again.model) == (5, "python:model")
    assert objects.attached(again) == objects.attached(cfg)
    where = "proxrl.TrainingClient()"
    assert refused(given_config, {"model": "m"}, None, None, {}, "grpo") == (
        f"{where}: config: expected a grpo.Config or ppo.Config, got dict"
    )
    assert refused(given_config, cfg, "m", None, {}, "grpo") == (
        f"{where}: model: not with config= (the config names its model)"
    )
    assert refused(given_config, cfg, None, "tok", {}, "grpo") == (
        f"{where}: tokenizer: not with config= (the config names its model)"
    )
    assert refused(given_config, cfg, None, None, {}, "ppo") == (
        f"{where}: command: ppo does not match config= (a grpo config)"
    )
    assert refused(given_config, cfg, None, None, {}, "dpo") == (
        f"{where}: command: dpo does not match config= (a grpo config)"
    )
    ppo_cfg = client_config("m", None, {}, "ppo")
    assert given_config(ppo_cfg, None, None, {}, "ppo") is ppo_cfg
    assert given_config(ppo_cfg, None, None, {}, "grpo") is ppo_cfg  # the default command
    assert refused(given_config, cfg, None, None, {"group_size": 0}, "grpo").startswith(
        f"{where}: group_size"
    )


# ---------------------------------------------------------------------------- a tiny client


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> str:
    from proxrl.models.tiny import build_tiny_lm

    path = tmp_path_factory.mktemp("lm") / "lm"
    return str(
        build_tiny_lm(path, ["ab"], hidden_size=8, num_layers=1, num_heads=2, max_positions=64)
    )


OPTIONS = dict(
    dtype="float64",
    group_size=2,
    rollout_batch_size=2,
    max_new_tokens=3,
    learning_rate=0.5,
    lr_schedule="constant",
    seed=3,
)


class Engine:
    """The client's engine, its calls recorded (the real one samples underneath)."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.calls = engine, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def before_update(self, steps: int) -> None:
        self.calls.append(("before", steps))

    def after_update(self, actor: Any, steps: int) -> None:
        self.calls.append(("after", steps))

    def close(self) -> None:
        self.calls.append(("close",))


def make(lm: str, **over: Any) -> TrainingClient:
    client = TrainingClient(lm, **(OPTIONS | over))
    client.engine = Engine(client.engine)
    return client


def test_the_constructor_needs_a_model_or_a_config():
    assert refused(TrainingClient) == "proxrl.TrainingClient(): model: expected a path or a model"


def test_a_client_holds_the_runs_pieces(lm):
    client = make(lm, kl_coef=0.25, kl_loss_type="k3", track_kl=True)
    assert (client.steps, client.engine_behind, client._losses, dict(client._stats)) == (
        0,
        False,
        None,
        {},
    )
    assert (
        client.vocabulary == 260 == len(client.tokenizer)
        and client.tokenizer is client.models.tokenizer
    )
    assert client.model is client.models.actor and client.models.reference is not None
    assert make(lm, max_consecutive_skips=2).guard.max_consecutive == 2
    assert client._kl_loss_type == "k3" and client._roles.kl_loss is KL_ESTIMATORS["k3"]
    assert torch.equal(client.generator.get_state(), torch.Generator().manual_seed(3).get_state())
    assert len(client.optimizers) == 1 and client.guard.max_consecutive == 5
    assert client.prompt_batch(5, 2, 3) == cl.prompt_order(5, 2, 3, 3)
    expected = minibatches(client.cfg.responses_per_step, 4, torch.Generator().manual_seed(3))
    assert [m.tolist() for m in client.minibatches(4)] == [m.tolist() for m in expected]
    ppo_client = make(lm, command="ppo", critic="head")
    assert ppo_client._kl_loss_type is None and len(ppo_client.optimizers) == 2
    assert type(ppo_client.models.critic).__name__ == "ValueHeadCritic"
    given = TrainingClient(config=client.cfg)
    assert given.cfg is client.cfg


def test_sample_checks_its_arguments_and_syncs_the_engine(lm):
    client = make(lm)
    where = "TrainingClient.sample"
    assert refused(client.sample, ["a"], beta=1) == (
        f"{where}: beta: expected one of max_new_tokens, temperature, top_k, top_p, min_p, "
        "stop_strings"
    )
    assert refused(client.sample, ["a"], n=0) == f"{where}: n: expected an int >= 1, got 0"
    assert (
        refused(client.sample, ["a"], logprobs=1)
        == f"{where}: logprobs: expected True or False, got 1"
    )
    assert refused(client.sample, "a") == f"{where}: prompts: expected a list of prompts, got a str"
    assert refused(client.sample, ["a"], top_p=2.0).startswith(f"{where}: top_p")
    rollout = client.sample(["ab", "ba"])
    assert len(rollout) == 4 and rollout.prompts == ["ab", "ab", "ba", "ba"]
    assert rollout.logprobs is not None and rollout.response_ids.shape[1] <= 3
    rollout = client.sample(["ab"], n=3, logprobs=False, max_new_tokens=1)
    assert len(rollout) == 3 and rollout.logprobs is None and rollout.response_ids.shape[1] == 1
    assert client.engine.calls == []
    client.engine_behind, client.steps = True, 4
    client.model.train()
    client.sample(["ab"], n=1)
    assert client.engine.calls == [("after", 4)] and client.engine_behind is False
    assert client.model.training is False
    client.sample(["ab"], n=1)
    assert client.engine.calls == [("after", 4)]


def test_logprobs_checks_its_arguments(lm):
    client = make(lm)
    where = "TrainingClient.logprobs"
    rollout = client.sample(["ab"], n=2)
    assert refused(client.logprobs, "r") == (
        f"{where}: rollout: expected the Rollout of TrainingClient.sample or read_rollouts, got str"
    )
    foreign = Rollout(replace(rollout.stage, prompt_ids=rollout.prompt_ids + 260))
    assert refused(client.logprobs, foreign).startswith(f"{where}: rollout: prompt_ids: token id ")
    samples = replace(rollout.stage.samples, response_ids=rollout.response_ids - 300)
    assert refused(client.logprobs, Rollout(replace(rollout.stage, samples=samples))).startswith(
        f"{where}: rollout: response_ids: token id "
    )
    assert refused(client.logprobs, rollout, [1.0, 2.0, 3.0]) == (
        f"{where}: scores: expected 2 values, got torch.Size([3])"
    )
    bare = client.sample(["ab"], n=2, logprobs=False)
    assert refused(client.logprobs, bare, recorded=True) == (
        f"{where}: recorded: the rollout holds no log-probs"
    )


def test_logprobs_scores_default_to_the_rollouts_then_zeros(lm):
    client = make(lm)
    rollout = client.sample(["ab"], n=2)
    client.model.train()
    exp = client.logprobs(rollout)
    assert client.model.training is False
    assert exp.scores.tolist() == [0.0, 0.0] and exp.token_rewards is None
    assert exp.logprobs.shape == rollout.response_ids.shape
    assert client.logprobs(rollout, [1.0, -2.0]).scores.tolist() == [1.0, -2.0]
    recorded = client.logprobs(rollout, torch.tensor([0.5, 0.25]), recorded=True)
    assert torch.equal(recorded.logprobs, rollout.logprobs.to(recorded.logprobs.dtype))
    assert not torch.equal(exp.logprobs, recorded.logprobs)  # the trainer's, not the sampler's
    rewards = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]])[:, : rollout.response_ids.shape[1]]
    tagged = replace(rollout, scores=torch.tensor([3.0, 4.0]), token_rewards=rewards)
    exp = client.logprobs(tagged)
    assert exp.scores.tolist() == [3.0, 4.0] and torch.equal(exp.token_rewards, rewards)
    exp = client.logprobs(tagged, [1.0, 1.0])
    assert exp.scores.tolist() == [1.0, 1.0] and exp.token_rewards is None


def test_forward_backward_refusals(lm):
    client = make(lm)
    exp = experience()
    assert refused(client.forward_backward, exp, "ppo", beta=0.1) == (
        f"{FORWARD_BACKWARD}: beta: only with a pair loss (dpo, ipo, simpo)"
    )
    assert refused(client.forward_backward, exp, "value") == (
        f"{FORWARD_BACKWARD}: loss: value trains a critic; this client has none (ppo)"
    )
    assert refused(client.forward_backward, exp, "nope").startswith(
        f"{FORWARD_BACKWARD}: loss: expected one of"
    )
    assert refused(client.forward_backward, [1]) == (
        f"{FORWARD_BACKWARD}: batch: expected an Experience (TrainingClient.logprobs) or the "
        "PreferencePairs of TrainingClient.pairs, got a list"
    )
    assert refused(client.forward_backward, exp, "dpo") == (
        f"{FORWARD_BACKWARD}: batch: a pair loss (dpo, ipo, simpo) takes the PreferencePairs of "
        "TrainingClient.pairs, got Experience with loss='dpo'"
    )
    pairs = PreferencePairs([], "dpo", (torch.zeros(0), torch.zeros(0)))
    assert refused(client.forward_backward, pairs, "ppo") == (
        f"{FORWARD_BACKWARD}: batch: a pair loss (dpo, ipo, simpo) takes the PreferencePairs of "
        "TrainingClient.pairs, got PreferencePairs with loss='ppo'"
    )
    assert refused(client.forward_backward, pairs, "ipo") == (
        f"{FORWARD_BACKWARD}: batch: its reference log-probs are for loss=dpo, not ipo"
    )
    assert refused(client.forward_backward, pairs, "dpo", gamma=1.0) == (
        f"{FORWARD_BACKWARD}: gamma: expected one of beta, label_smoothing, simpo_gamma_beta_ratio"
    )
    assert client.forward_backward(pairs, "dpo", beta=0.5) == {}
    critic = make(lm, command="ppo", critic="head")
    assert refused(critic.forward_backward, exp) == (
        f"{FORWARD_BACKWARD}: batch: returns: expected the critic's (B, T) value targets (set them "
        "with dataclasses.replace, as advantages)"
    )
    assert refused(critic.forward_backward, replace(exp, returns=torch.ones(2)), "value") == (
        f"{FORWARD_BACKWARD}: batch: returns: expected shape (B, T) = (2, 2), got (2,)"
    )


class Accumulated:
    """``update.accumulate`` replaced: what forward_backward hands it, and stats it returns."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, losses, batch, rows, optimization, record):  # type: ignore[no-untyped-def]
        self.calls.append((losses, batch, rows, optimization, record))
        return {"loss": 1.5, "n": 2.0}, None


def test_forward_backward_hands_the_update_its_batch_and_step(lm, monkeypatch):
    client = make(lm, kl_coef=0.25, kl_loss_type="k2", track_kl=True)
    accumulated = Accumulated()
    monkeypatch.setattr(cl, "accumulate", accumulated)
    exp = experience(advantages=torch.tensor([1.0, -1.0], dtype=F64))
    client.steps = 6
    client.model.eval()
    assert client.forward_backward(exp) == {"loss": 1.5, "n": 2.0}
    assert client.forward_backward(exp, "sft") == {"loss": 1.5, "n": 2.0}
    assert dict(client._stats) == {"loss": 3.0, "n": 4.0} and client.model.training
    assert client.engine.calls == [("before", 6)] and client.engine_behind is True
    [(losses, batch, rows, optimization, record), (sft, *_)] = accumulated.calls
    assert rows.tolist() == [0, 1] and optimization is client.optimization and record is None
    assert batch.advantages.tolist() == [[1.0, 1.0], [-1.0, 0.0]] and batch.returns is None
    assert losses.prompt_width == 3 and losses.models is client.models
    assert losses.settings is client.settings.updating and losses.drawing is None
    assert (losses.step.kl_coef, losses.step.train_policy, losses.step.iteration) == (0.25, True, 7)
    assert losses.algo.kl_loss is KL_ESTIMATORS["k2"] and losses.algo.step_selection is None
    assert client._losses is sft
    nll = sft.algo.policy_loss(torch.tensor([[-1.0, -2.0], [-4.0, -8.0]], dtype=F64), experience())
    assert float(nll[0]) == pytest.approx(7 / 3, rel=1e-15)  # the NLL, not ppo's loss
    # no advantages: zeros (float32 at the mask's shape)
    client.forward_backward(experience())
    batch = accumulated.calls[-1][1]
    assert batch.advantages.dtype == torch.float32 and batch.advantages.tolist() == [[0.0, 0.0]] * 2
    # every token masked: nothing accumulated, the stats empty, the step recorded
    before = len(accumulated.calls)
    masked = experience(action_mask=torch.zeros(2, 2, dtype=torch.long))
    assert client.forward_backward(masked, "sft") == {} and len(accumulated.calls) == before
    assert client._losses is not sft


def test_a_named_loss_that_draws_draws_from_the_clients_generator(lm, monkeypatch):
    client = make(lm)
    accumulated = Accumulated()
    monkeypatch.setattr(cl, "accumulate", accumulated)
    exp = experience(advantages=torch.tensor([1.0, -1.0], dtype=F64))
    twin = torch.Generator().manual_seed(3)
    client.forward_backward(exp, "clip_cov")
    losses = accumulated.calls[-1][0]
    assert losses.drawing is not None and losses.algo.step_selection is not None
    expected = cl.loss_generator("clip_cov", twin)
    assert torch.equal(losses.drawing.get_state(), expected.get_state())
    assert torch.equal(client.generator.get_state(), twin.get_state())
    client.forward_backward(exp, "cispo")
    losses = accumulated.calls[-1][0]
    assert losses.drawing is None and losses.algo.step_selection is None
    assert torch.equal(client.generator.get_state(), twin.get_state())


def test_a_value_loss_trains_the_critic_alone(lm, monkeypatch):
    client = make(lm, command="ppo", critic="head")
    accumulated = Accumulated()
    monkeypatch.setattr(cl, "accumulate", accumulated)
    exp = experience(returns=torch.ones(2, 2, dtype=torch.long))
    client.forward_backward(exp, "value")
    losses, batch, *_ = accumulated.calls[-1]
    assert losses.step.train_policy is False and losses.step.iteration == 1
    assert batch.returns.dtype == torch.float32 and batch.returns.tolist() == [[1.0, 1.0]] * 2
    client.forward_backward(exp)
    assert accumulated.calls[-1][0].step.train_policy is True


def test_optim_step_sets_the_rates_and_steps_what_was_accumulated(lm):
    client = make(lm, command="ppo", critic="head", critic_learning_rate=0.25)
    where = "TrainingClient.optim_step"
    assert refused(client.optim_step, lr=0) == f"{where}: lr: expected a finite number > 0, got 0"
    assert refused(client.optim_step, critic_lr=-1.0) == (
        f"{where}: critic_lr: expected a finite number > 0, got -1.0"
    )
    assert client.steps == 0
    assert client.optim_step() == {"stepped": 0.0}  # nothing accumulated
    assert client.steps == 1
    rates = [[g["lr"] for g in opt.param_groups] for opt in client.optimizers]
    assert rates == [[0.5], [0.25]]
    client.optim_step(lr=0.125, critic_lr=0.0625)
    rates = [[g["lr"] for g in opt.param_groups] for opt in client.optimizers]
    assert rates == [[0.125], [0.0625]] and client.steps == 2
    grpo_client = make(lm)
    assert refused(grpo_client.optim_step, critic_lr=0.1) == (
        f"{where}: critic_lr: this client has no critic (command ppo)"
    )
    assert grpo_client.steps == 0


def test_optim_step_moves_the_policy_once_and_zeroes_the_gradient(lm):
    client = make(lm)
    rollout = client.sample(["ab"], n=2)
    exp = client.logprobs(rollout)
    stats = client.forward_backward(replace(exp, advantages=torch.tensor([1.0, -1.0])), "sft")
    before = [p.detach().clone() for p in client.model.parameters()]
    result = client.optim_step()
    assert result["stepped"] == 1.0 and "grad_norm" in result and "policy_stepped" not in result
    assert result["loss"] == stats["loss"] and dict(client._stats) == {}
    assert all(p.grad is None for p in client.model.parameters())
    assert any(
        not torch.equal(a, b) for a, b in zip(before, client.model.parameters(), strict=True)
    )
    # the guard skips a non-finite step: the stats come back, nothing moves
    client.forward_backward(exp, lambda logprobs, mb: logprobs.sum() * float("nan"))
    before = [p.detach().clone() for p in client.model.parameters()]
    result = client.optim_step()
    assert result["stepped"] == 0.0 and result["loss"] != result["loss"]
    assert all(torch.equal(a, b) for a, b in zip(before, client.model.parameters(), strict=True))
    assert client.steps == 2


def test_state_and_model_are_saved_and_restored(lm, tmp_path):
    client = make(lm)
    client.steps, client._stats["loss"] = 3, 1.0
    path = client.save_state(tmp_path / "state")
    assert path.parent == tmp_path / "state" / "checkpoints" and path.is_dir()
    other = make(lm)
    other._stats["loss"] = 2.0
    other.engine_behind = False
    assert other.load_state(tmp_path / "state") == 3 and other.steps == 3
    assert other.engine_behind is True and dict(other._stats) == {}
    saved = client.save_model(tmp_path / "model" / "deep")
    assert saved == tmp_path / "model" / "deep"
    assert (saved / "config.json").is_file() and (saved / "tokenizer.json").is_file()
    (tmp_path / "file").write_text("x")
    assert refused(client.save_model, tmp_path / "file").startswith(
        "TrainingClient.save_model: directory"
    )
    assert refused(client.save_state, tmp_path / "file").startswith(
        "TrainingClient.save_state: directory"
    )
    client.close()
    assert client.engine.calls == [("close",)]


def test_pairs_encode_rows_with_the_reference_log_probs_the_loss_needs(lm):
    client = make(lm, track_kl=False)
    rows = [{"prompt": "a", "chosen": "b", "rejected": "ab"}]
    assert refused(client.pairs, rows, "kto") == (
        "TrainingClient.pairs: loss: expected one of dpo, ipo, simpo, got 'kto'"
    )
    assert refused(client.pairs, rows, "dpo") == (
        "TrainingClient.pairs: loss=dpo: no reference model; set track_kl=True (or lora_r) when "
        "building the client"
    )
    simpo = client.pairs(rows, "simpo")
    assert len(simpo) == 1 and simpo.loss == "simpo"
    assert [t.tolist() for t in simpo.reference] == [[0.0], [0.0]]
    reference = make(lm, track_kl=True)
    summed, mean = reference.pairs(rows, "dpo"), reference.pairs(rows, "ipo")
    assert summed.loss == "dpo" and mean.loss == "ipo"
    # ipo averages over the response: "b" and "ab" are two tokens each, with the EOS
    for total, average in zip(summed.reference, mean.reference, strict=True):
        assert float(total[0]) == pytest.approx(2 * float(average[0]), rel=1e-12)
        assert float(total[0]) < 0
    stats = reference.forward_backward(summed, "dpo", beta=0.5)
    assert stats and reference.engine.calls == [("before", 0)] and reference._stats


def test_read_rollouts_gives_the_files_rows_scores_and_token_rewards(lm, tmp_path):
    import json

    client = make(lm)
    good = {"prompt_ids": [5, 6], "response_ids": [7, 8], "logprobs": [-0.5, -1.0], "group": "a"}
    first = {**good, "rewards": [0.75, 0.0], "loss_mask": [1, 0]}
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(first) + "\n" + json.dumps({**good, "reward": 2.0}) + "\n")
    read = client.read_rollouts(path)
    assert (
        read.prompt_ids.tolist() == [[5, 6], [5, 6]] and read.response_ids.tolist() == [[7, 8]] * 2
    )
    assert read.scores.tolist() == [0.75, 2.0]
    assert read.token_rewards.tolist() == [[0.75, 0.0], [0.0, 2.0]]
    assert read.logprobs.tolist() == [[-0.5, 0.0], [-0.5, -1.0]]  # 0 off the model's tokens
    path.write_text(json.dumps({**good, "reward": 1.0, "prompt_ids": [5, 260]}) + "\n")
    assert refused(client.read_rollouts, path).startswith(f"{path}:1: prompt_ids: token id 260")
    long = make(lm, max_new_tokens=1)
    path.write_text((json.dumps({**good, "reward": 1.0}) + "\n") * 2)
    assert "response_ids" in refused(long.read_rollouts, path)  # the client's length limit


def test_a_prompt_that_encodes_to_nothing_is_refused(lm, monkeypatch):
    client = make(lm)
    calls = []

    def encode(tokenizer, prompt, messages, tools):  # type: ignore[no-untyped-def]
        calls.append((tokenizer, prompt, messages, tools))
        return [] if prompt == "b" else [5]

    monkeypatch.setattr(cl, "encode_prompt_text", encode)
    assert refused(client.sample, ["a", "b", "b"]) == (
        "TrainingClient.sample: prompts[1]: encodes to no tokens"
    )
    assert calls[0] == (client.tokenizer, "a", None, None)


def test_logprobs_marks_the_responses_that_did_not_stop_and_corrects_recorded_ones(lm):
    client = make(lm, rollout_correction="tis")
    rollout = client.sample(["ab"], n=2, max_new_tokens=3)
    eos = client.tokenizer.eos_token_id
    ids = torch.tensor([[7, eos, 0], [7, 8, 9]])
    samples = replace(
        rollout.stage.samples,
        response_ids=ids,
        response_mask=torch.tensor([[1, 1, 0], [1, 1, 1]]),
        logprobs=torch.full((2, 3), -1.0, dtype=F64),
    )
    stopped = Rollout(replace(rollout.stage, samples=samples))
    exp = client.logprobs(stopped, recorded=True)
    assert exp.truncated.tolist() == [False, True]
    assert exp.rollout_weights is not None  # the trainer's π_old, the recorded ones weigh
    assert torch.equal(exp.logprobs, client.logprobs(stopped).logprobs)
    assert client.logprobs(stopped).rollout_weights is None


def test_two_clients_of_one_seed_sample_alike_and_start_at_the_configs_rate(lm):
    a = make(lm, seed=11)
    first = a.sample(["ab"], n=4).response_ids
    b = make(lm, seed=11)  # (sampling draws from the global generator, seeded here)
    assert torch.equal(first, b.sample(["ab"], n=4).response_ids)
    assert [g["lr"] for g in a.optimizers[0].param_groups] == [0.5]


def test_pairs_are_truncated_and_a_lora_policy_is_its_own_reference(lm):
    client = make(lm, track_kl=False, lora_r=2)
    rows = [{"prompt": "a", "chosen": "ba" * 6, "rejected": "ab" * 6}]
    short = client.pairs(rows, "dpo", max_length=6)
    assert len(short.items[0]) <= 6
    assert len(client.pairs(rows, "dpo").items[0]) > 6


def test_pair_steps_are_dpos_loss_over_all_pairs_and_move_the_policy(lm):
    from proxrl.algos.offline import dpo

    client = make(lm, track_kl=True, grad_accum=4)
    assert client.cfg.micro_batch_size == 1
    rows = [
        {"prompt": "a", "chosen": "b", "rejected": "ab"},
        {"prompt": "b", "chosen": "a", "rejected": "bb"},
        {"prompt": "ab", "chosen": "ba", "rejected": "a"},
    ]
    pairs = client.pairs(rows, "dpo")
    knobs = cl._pair_loss("sigmoid", {"beta": 0.5}, WHERE)
    whole = dpo.make_batch(
        pairs.items, [0, 1, 2], pairs.reference, client.tokenizer.pad_token_id, F64
    )
    expected, _ = dpo.preference_loss(client.model, whole, knobs)
    expected.backward()
    grads = [p.grad.clone() for p in client.model.parameters()]
    client.optimization.zero_grad()
    client.model.eval()
    stats = client.forward_backward(pairs, "dpo", beta=0.5)
    assert client.model.training
    assert stats["loss"] == pytest.approx(float(expected), rel=1e-12)
    for a, b in zip(grads, [p.grad for p in client.model.parameters()], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-14)
    again = client.forward_backward(pairs, "dpo", beta=0.5)
    assert client._stats["loss"] == pytest.approx(2 * float(expected), rel=1e-12)
    assert again["loss"] == stats["loss"] and client.engine.calls == [("before", 0)]
    before = [p.detach().clone() for p in client.model.parameters()]
    assert client.optim_step()["stepped"] == 1.0
    assert any(
        not torch.equal(a, b) for a, b in zip(before, client.model.parameters(), strict=True)
    )


def test_a_checkpoint_restores_weights_generator_and_keeps_one(lm, tmp_path):
    client = make(lm)
    with torch.no_grad():
        next(client.model.parameters()).add_(1.0)
    torch.randperm(5, generator=client.generator)
    client.steps = 3
    client.save_state(tmp_path)
    client.steps = 4
    path = client.save_state(tmp_path)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir()] == [path.name]
    other = make(lm)
    next(other.model.parameters()).grad = torch.ones_like(next(other.model.parameters()))
    assert other.load_state(tmp_path) == 4
    assert all(p.grad is None for p in other.model.parameters())
    assert torch.equal(other.generator.get_state(), client.generator.get_state())
    assert all(
        torch.equal(a, b)
        for a, b in zip(client.model.parameters(), other.model.parameters(), strict=True)
    )
    client.save_model(tmp_path / "m")
    client.save_model(tmp_path / "m")  # an existing directory: written over
