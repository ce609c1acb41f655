"""The training client checks its arguments (issue 49): each wrong call is refused with a
one-line ``ProxrlError`` naming the argument (never a torch traceback, never a silent success),
the config's per-call overrides are checked as the constructor's options are, and a good call
still works. One tiny client serves the whole module."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from proxrl.algos.online import grpo
from proxrl.algos.online.client import Rollout, TrainingClient
from proxrl.runtime.errors import ProxrlError
from tests.algos.lm_tasks import preference_rows

PROMPTS = ["say: abc ->", "say: def ->"]


@pytest.fixture(scope="module")
def client(tiny_lm: str) -> TrainingClient:
    return TrainingClient(
        tiny_lm,
        dtype="float64",
        group_size=2,
        rollout_batch_size=2,
        max_new_tokens=6,
        temperature=1.0,
        learning_rate=1e-2,
        lr_schedule="constant",
        seed=3,
    )


@pytest.fixture(scope="module")
def batch(client: TrainingClient):
    """A (B=4, T) batch of the client's own, without advantages."""
    torch.set_num_threads(1)
    return client.logprobs(client.sample(PROMPTS, n=2), torch.tensor([1.0, 0.0, 0.5, 0.5]))


def _weights(client: TrainingClient) -> list[torch.Tensor]:
    return [p.detach().clone() for p in client.model.parameters()]


def _grads(client: TrainingClient) -> list[torch.Tensor]:
    return [p.grad.clone() for p in client.model.parameters() if p.grad is not None]


def _refused(match: str, call, *args, **kwargs) -> str:
    """``call`` raises a one-line ProxrlError matching ``match``; its message."""
    with pytest.raises(ProxrlError, match=match) as raised:
        call(*args, **kwargs)
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_a_good_call_still_works(client, batch):
    """sample → logprobs → forward_backward → optim_step; (B,) advantages are spread over each
    row's loss tokens: the same loss and gradient as the (B, T) ones a user writes."""
    scores = batch.scores
    per_row = scores - scores.mean()
    rollout = client.sample(PROMPTS, n=2, temperature=0.5, max_new_tokens=3)
    assert len(rollout) == 4 and rollout.response_ids.shape[1] <= 3
    stats = client.forward_backward(replace(batch, advantages=per_row))
    grads = _grads(client)
    client.optimization.zero_grad()
    tokens = per_row[:, None] * batch.loss_mask.float()
    again = client.forward_backward(replace(batch, advantages=tokens.double()))
    assert stats["loss"] == pytest.approx(again["loss"], rel=1e-12)
    for a, b in zip(grads, _grads(client), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)
    before = _weights(client)
    assert client.optim_step(lr=1e-2)["stepped"] == 1.0
    assert any(not torch.equal(a, b) for a, b in zip(before, _weights(client), strict=True))


def test_a_message_list_is_a_prompt(client):
    rollout = client.sample([[{"role": "user", "content": "say: abc ->"}]], n=1)
    assert len(rollout) == 1
    _refused(r"^TrainingClient.sample: prompts\[0\]: .*role", client.sample, [[{"x": 1}]])


@pytest.mark.parametrize(
    ("prompts", "match"),
    [
        ("say: abc ->", r"^TrainingClient.sample: prompts: expected a list of prompts, got a str$"),
        ([], r"^TrainingClient.sample: prompts: expected at least one prompt"),
        (["say: abc ->", ""], r"^TrainingClient.sample: prompts\[1\]: expected a non-empty prompt"),
        ([3], r"^TrainingClient.sample: prompts\[0\]: expected a string or a list of messages"),
    ],
    ids=["a string", "empty list", "empty prompt", "not a prompt"],
)
def test_sample_refuses_prompts_that_are_not_a_list_of_prompts(client, prompts, match):
    _refused(match, client.sample, prompts)


@pytest.mark.parametrize(
    ("n", "match"),
    [(0, "got 0$"), (-2, "got -2$"), (1.5, "got a float$"), (True, "got a bool$")],
)
def test_sample_refuses_n_below_1_or_not_an_int(client, n, match):
    """n=0 no longer quietly means the group size."""
    _refused(
        rf"^TrainingClient.sample: n: expected an int >= 1, {match}", client.sample, PROMPTS, n
    )


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"temperature": 0.0}, r"temperature: expected > 0, got 0.0$"),
        ({"max_new_tokens": 0}, r"max_new_tokens: expected >= 1, got 0$"),
        ({"top_p": 1.5}, r"top_p: expected in \(0, 1\], got 1.5$"),
        ({"temperature": "hot"}, r"field temperature expects float, found str 'hot'$"),
        ({"beam_width": 2}, r"beam_width: expected one of max_new_tokens"),
    ],
    ids=["temperature 0", "max_new_tokens 0", "top_p", "a str temperature", "unknown"],
)
def test_sample_checks_its_overrides_as_the_config_checks_its_fields(client, override, match):
    """A per-call override is read and range-checked as a YAML value is (temperature=0 was
    blamed on the policy, max_new_tokens=0 ended in a torch traceback)."""
    _refused(f"^TrainingClient.sample: {match}", client.sample, PROMPTS, 1, **override)


@pytest.mark.parametrize(
    "shape",
    [lambda b, t: (b, 1), lambda b, t: (1, t), lambda b, t: (b + 1,), lambda b, t: (b, t + 1)],
    ids=["(B, 1)", "(1, T)", "(B+1,)", "(B, T+1)"],
)
def test_forward_backward_refuses_advantages_of_another_shape(client, batch, shape):
    """(B, 1) and (1, T) would broadcast silently; the others failed deep in the loss."""
    rows, length = batch.response_ids.shape
    wrong = torch.ones(shape(rows, length))
    message = _refused(
        r"^TrainingClient.forward_backward: batch: advantages: expected shape \(B, T\)",
        client.forward_backward,
        replace(batch, advantages=wrong),
    )
    assert f"got {tuple(wrong.shape)}" in message


def test_forward_backward_refuses_a_batch_that_is_not_one(client, batch):
    _refused(
        r"^TrainingClient.forward_backward: batch: expected an Experience .* got a dict$",
        client.forward_backward,
        {"prompt_ids": batch.prompt_ids},
    )
    _refused(
        r"^TrainingClient.forward_backward: batch: advantages: expected a tensor .* got a list$",
        client.forward_backward,
        replace(batch, advantages=[1.0] * len(batch)),
    )


def test_a_batch_from_another_tokenizer_is_refused(client, batch):
    """Token ids the client's model does not embed: refused by name, not an IndexError."""
    vocabulary = client.model.get_input_embeddings().num_embeddings
    foreign = batch.response_ids.clone()
    foreign[0, 0] = vocabulary + 7
    message = _refused(
        r"^TrainingClient.forward_backward: batch: response_ids: token id \d+ is outside",
        client.forward_backward,
        replace(batch, response_ids=foreign),
    )
    assert str(vocabulary + 7) in message
    rollout = client.sample(PROMPTS[:1], n=1)
    stage = replace(rollout.stage, prompt_ids=rollout.prompt_ids + vocabulary)
    _refused(
        r"^TrainingClient.logprobs: rollout: prompt_ids: token id \d+ is outside",
        client.logprobs,
        Rollout(stage),
    )


@pytest.mark.parametrize(
    ("lr", "match"),
    [
        (-1e-3, "lr: expected a finite number > 0, got -0.001$"),
        (0.0, "lr: expected a finite number > 0, got 0.0$"),
        (math.inf, "lr: expected a finite number > 0, got inf$"),
        ("1e-3", "lr: expected a number > 0, got a str$"),
    ],
)
def test_optim_step_refuses_a_learning_rate_that_is_not_a_positive_number(client, lr, match):
    """A negative rate would have stepped up the loss."""
    _refused(f"^TrainingClient.optim_step: {match}", client.optim_step, lr=lr)


def test_optim_step_lr_nan_is_refused_and_the_weights_stay(client, batch):
    """lr=nan made every weight NaN; refused, the weights and the accumulated gradient stay,
    and the next good step takes it."""
    client.forward_backward(replace(batch, advantages=batch.scores - batch.scores.mean()))
    before, steps = _weights(client), client.steps
    _refused(r"^TrainingClient.optim_step: lr: .* got nan$", client.optim_step, lr=math.nan)
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(client), strict=True))
    assert client.steps == steps
    assert client.optim_step(lr=1e-2)["stepped"] == 1.0


def test_optim_step_refuses_a_critic_rate_without_a_critic(client):
    _refused(
        r"^TrainingClient.optim_step: critic_lr: this client has no critic",
        client.optim_step,
        critic_lr=1e-3,
    )


def test_pair_options_are_checked_as_proxrl_dpo_checks_them(client):
    pairs = client.pairs(preference_rows(2, seed=0), "simpo")
    _refused(
        r"^TrainingClient.forward_backward: beta: expected > 0, got -1",
        client.forward_backward,
        pairs,
        "simpo",
        beta=-1.0,
    )
    _refused(
        r"^TrainingClient.forward_backward: label_smoothing: applies to loss sigmoid, simpo; "
        r"this run has ipo$",
        client.forward_backward,
        replace(pairs, loss="ipo"),
        "ipo",
        label_smoothing=0.1,
    )


def test_the_constructor_checks_a_given_config(tiny_lm):
    """``config=`` goes through the options' checks (it was taken as it was), before any model
    loads; it names the model and the command, so a model or another command beside it is
    refused."""
    cfg = grpo.Config(model=tiny_lm, temperature=0.0)
    _refused(
        r"^proxrl.TrainingClient\(\): temperature: expected > 0, got 0.0$",
        TrainingClient,
        config=cfg,
    )
    _refused(
        r"^proxrl.TrainingClient\(\): model: not with config=",
        TrainingClient,
        tiny_lm,
        config=replace(cfg, temperature=1.0),
    )
    _refused(
        r"^proxrl.TrainingClient\(\): temperature: expected > 0",
        TrainingClient,
        config=replace(cfg, temperature=1.0),
        temperature=-1.0,
    )
    _refused(
        r"^proxrl.TrainingClient\(\): command: ppo does not match config= \(a grpo config\)$",
        TrainingClient,
        config=replace(cfg, temperature=1.0),
        command="ppo",
    )
    _refused(
        r"^proxrl.TrainingClient\(\): config: expected a grpo.Config or ppo.Config, got dict$",
        TrainingClient,
        config={"model": tiny_lm},
    )
    given = replace(cfg, temperature=1.0, dtype="float64")
    built = TrainingClient(config=given, max_new_tokens=3)  # the options replaced into it
    assert built.cfg.max_new_tokens == 3 and given.max_new_tokens != 3
    built.close()


def test_save_state_and_save_model_under_a_plain_file_are_one_line(client, tmp_path):
    """A directory under a plain file (or the file itself) cannot be made: one line naming it
    and the file, not NotADirectoryError (issue 51)."""
    notes = tmp_path / "notes.txt"
    notes.write_text("")
    message = _refused("is a file", client.save_state, notes / "state")
    assert message == (
        f"TrainingClient.save_state: directory {notes / 'state'}: {notes} is a file, not a "
        "directory; choose another path"
    )
    _refused(f"save_model: directory {notes}/model: {notes} is a file", client.save_model,
             notes / "model")  # fmt: skip
    _refused(f"save_state: directory {notes} is a file", client.save_state, notes)
