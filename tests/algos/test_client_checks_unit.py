"""client_checks.py's checks and client.py's module-level helpers called directly, no model built
(issue 54's mutation check, round 4): each check at its boundaries, each refusal's message compared
whole, the helpers on hand-computed values. Runs in well under a second: the TESTS of a mutation
run of client_checks.py, and the first of client.py's (``test_client_unit.py``: the methods)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from proxrl.algos.online import client as cl
from proxrl.algos.online import client_checks as cc
from proxrl.algos.online import grpo, ppo
from proxrl.algos.online.client import (
    LOSSES,
    PAIR_LOSSES,
    PreferencePairs,
    Rollout,
    client_config,
    given_config,
)
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
    # rows, not columns: B = 2 rows of 3 prompt and 4 response tokens pass; 1 x 3 against 2 x 4 not
    cc.check_experience(experience(response_ids=torch.ones(2, 4, dtype=torch.long)), 13, WHERE)
    prompt = torch.tensor([[5, 6, 7]])
    wide = torch.ones(2, 4, dtype=torch.long)
    assert refused(
        cc.check_experience, experience(prompt_ids=prompt, response_ids=wide), 13, WHERE
    ) == ("W: batch: 1 rows of prompt_ids but 2 of response_ids")


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
