"""client.py's ``TrainingClient`` methods (issue 54's mutation check, round 4) on a 1-layer, 8-wide
Llama built here (0.2 s; no test model of conftest's), with what they hand to the stages they call
recorded in place of the stages where the stage itself is tested elsewhere; each refusal's message
compared whole. The module-level helpers and client_checks.py: ``test_client_checks_unit.py``.
Runs in a few seconds."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
import torch

from proxrl.algos.online import client as cl
from proxrl.algos.online.client import FORWARD_BACKWARD, PreferencePairs, Rollout, TrainingClient
from proxrl.algos.online.update import minibatches
from proxrl.core import KL_ESTIMATORS
from tests.algos.test_client_checks_unit import F64, WHERE, experience, refused

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

    def start(self, actor: Any, iteration: int) -> None:
        self.calls.append(("start", actor, iteration))
        self.engine.start(actor, iteration)

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


def test_a_loaded_model_is_trained_with_its_tokenizer_and_starts_the_engine(lm, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(lm, dtype=torch.float64)
    tokenizer = AutoTokenizer.from_pretrained(lm)
    tokenizer.chat_template = "{{ messages[0]['content'] }}"  # not the saved one: this is used
    engines: list[Engine] = []
    made = cl.make_engine
    monkeypatch.setattr(
        cl, "make_engine", lambda *a: engines.append(Engine(made(*a))) or engines[-1]
    )
    placed: list = []  # (place_roles moves nothing on a CPU: what it is handed is the check)
    monkeypatch.setattr(cl, "place_roles", lambda *a: placed.append(a))
    client = TrainingClient(model, tokenizer=tokenizer, offload_frozen_roles=True, **OPTIONS)
    assert len(placed) == 1 and placed[0][0] is client.models and placed[0][2] is True
    assert (placed[0][1].sources, placed[0][1].weights) == ([], [])  # the client scores nothing
    assert client.model is model and client.tokenizer.chat_template == tokenizer.chat_template
    assert client.tokenizer is not tokenizer  # a copy: the client sets its padding side
    assert engines[0].calls == [("start", model, 0)]
    where = "proxrl.TrainingClient()"
    assert refused(TrainingClient, lm, config=client.cfg) == (
        f"{where}: model: not with config= (the config names its model)"
    )
    assert refused(TrainingClient, config=client.cfg, tokenizer=tokenizer) == (
        f"{where}: tokenizer: not with config= (the config names its model)"
    )


def test_a_value_head_decides_where_pi_old_comes_from(lm):
    # a value head reads the pass's hidden state: with sampler_logprobs π_old is still the pass
    ppo_client = make(lm, command="ppo", critic="head", sampler_logprobs=True)
    assert ppo_client.settings.collecting.old_policy.from_sampler is False
    assert make(lm, sampler_logprobs=True).settings.collecting.old_policy.from_sampler is True


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
    twin = torch.Generator().manual_seed(3)
    expected = minibatches(client.cfg.responses_per_step, 40, twin)
    drawn = client.minibatches(40)  # from the client's generator, which moves as the twin did
    assert [m.tolist() for m in drawn] == [m.tolist() for m in expected] and len(drawn) == 10
    assert torch.equal(client.generator.get_state(), twin.get_state())
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
    assert refused(client.forward_backward, experience(advantages=torch.ones(2, 1))) == (
        f"{FORWARD_BACKWARD}: batch: advantages: expected shape (B, T) = (2, 2) or (B,) = (2,), "
        "got (2, 1)"
    )
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
    default = reference.pairs(rows)  # dpo's, summed
    assert default.loss == "dpo" and torch.equal(default.reference[0], summed.reference[0])
    assert refused(reference.forward_backward, summed, "dpo", beta=-1) == (
        "TrainingClient.forward_backward: beta: expected > 0, got -1.0"
    )


def test_pairs_are_truncated_at_512_tokens_unless_told_and_a_full_prompt_is_refused(lm):
    client = make(lm, track_kl=False)
    long = client.pairs([{"prompt": "a", "chosen": "b" * 600, "rejected": "a" * 600}], "simpo")
    assert [len(long.items[0].chosen), len(long.items[0].rejected)] == [512, 512]
    assert refused(
        client.pairs, [{"prompt": "ab" * 5, "chosen": "a", "rejected": "b"}], "simpo", max_length=4
    ) == ("TrainingClient.pairs: rows: every example is longer than max_length=4")


def test_read_rollouts_gives_the_files_rows_scores_and_token_rewards(lm, tmp_path):

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
    path.write_text((json.dumps({**good, "reward": 1.0, "response": "zz"}) + "\n") * 2)
    assert refused(client.read_rollouts, path).startswith(  # checked with this tokenizer
        f"{path}:1: response_ids: decode to "
    )
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


def test_sample_renders_message_prompts_with_the_environments_tools(lm, monkeypatch):
    client = make(lm, environment="tests.algos.mt_envs:tools", max_episode_tokens=16)
    seen = []

    def encode(tokenizer, prompt, messages, tools):  # type: ignore[no-untyped-def]
        seen.append((messages, tools))
        return []  # refused after encoding: what reached the template is all this checks

    monkeypatch.setattr(cl, "encode_prompt_text", encode)
    said = [{"role": "user", "content": "ab"}]
    refused(client.sample, [said, "ab"])
    echo = {"name": "echo", "description": "Repeat a text.", "parameters": {"type": "object",
        "properties": {"text": {"type": "string", "description": "what to repeat"}},
        "required": ["text"]}, "return": {"type": "string"}}  # fmt: skip
    tools = [{"type": "function", "function": echo}]
    assert seen == [(said, tools), (None, tools)]  # a string prompt has no messages


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
    # an EOS at the last position the budget allows: stopped by itself, not cut off
    at_budget = replace(
        samples,
        response_ids=torch.tensor([[7, 8, eos], [7, 8, 9]]),
        response_mask=torch.ones(2, 3, dtype=torch.long),
    )
    exp = client.logprobs(Rollout(replace(rollout.stage, samples=at_budget)))
    assert exp.truncated.tolist() == [False, True]


def test_two_clients_of_one_seed_sample_alike_and_start_at_the_configs_rate(lm):
    a = make(lm, seed=11)
    first = a.sample(["ab"], n=4).response_ids
    b = make(lm, seed=11)
    assert torch.equal(first, b.sample(["ab"], n=4).response_ids)
    assert [g["lr"] for g in a.optimizers[0].param_groups] == [0.5]


def test_a_clients_samples_follow_its_seed_alone_and_leave_the_callers_streams(lm):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = make(lm, seed=11)
    first = a.sample(["ab"], n=8).response_ids
    assert torch.equal(torch.rand(3), expected)  # neither building nor sampling moved them
    make(lm, seed=5)  # another client, built between two samples of the first
    second = a.sample(["ab"], n=8).response_ids
    twin = make(lm, seed=11)
    assert torch.equal(twin.sample(["ab"], n=8).response_ids, first)
    torch.rand(100)  # the caller's own draws between two samples
    assert torch.equal(twin.sample(["ab"], n=8).response_ids, second)
    assert not torch.equal(first, second)
    # what building draws (LoRA's initial A matrices) comes from the seed too
    torch.manual_seed(7)
    one = make(lm, lora_r=2)
    torch.manual_seed(8)
    two = make(lm, lora_r=2)
    pairs = list(zip(one.model.parameters(), two.model.parameters(), strict=True))
    assert all(torch.equal(x, y) for x, y in pairs)


def test_an_updates_draws_come_from_the_clients_streams(lm, monkeypatch):
    drawn: list[float] = []

    def draw(*args: Any) -> Any:  # the update's dropout, say
        drawn.append(torch.rand(()).item())
        return ({}, None) if len(args) == 5 else {}

    monkeypatch.setattr(cl, "accumulate", draw)
    monkeypatch.setattr(cl, "accumulate_gradients", draw)
    rows = [{"prompt": "a", "chosen": "b", "rejected": "ab"}]
    for client in (make(lm, seed=2), make(lm, seed=2)):
        exp = client.logprobs(client.sample(["ab"], n=2))
        torch.rand(len(drawn) + 1)  # the caller draws a different amount before each
        client.forward_backward(replace(exp, advantages=torch.tensor([1.0, -1.0])), "sft")
        torch.rand(3)
        client.forward_backward(client.pairs(rows, "simpo"), "simpo")
    assert len(drawn) == 4 and drawn[:2] == drawn[2:] and drawn[0] != drawn[1]


def test_pairs_are_truncated_and_a_lora_policy_is_its_own_reference(lm):
    client = make(lm, track_kl=False, lora_r=2)
    rows = [{"prompt": "a", "chosen": "ba" * 6, "rejected": "ab" * 6}]
    short = client.pairs(rows, "dpo", max_length=6)
    assert len(short.items[0]) <= 6
    assert len(client.pairs(rows, "dpo").items[0]) > 6


@pytest.mark.parametrize("grad_accum, micro_batch_size", [(4, 1), (2, 2)])
def test_pair_steps_are_dpos_loss_over_all_pairs_and_move_the_policy(
    lm, grad_accum, micro_batch_size
):
    from proxrl.algos.offline import dpo

    client = make(lm, track_kl=True, grad_accum=grad_accum)
    assert client.cfg.micro_batch_size == micro_batch_size  # 3 pairs: 1 + 1 + 1, or 2 + 1
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
    expected = expected.detach()
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


def test_a_checkpoint_restores_the_critic_optimizers_guard_and_global_generators(lm, tmp_path):
    client = make(lm, command="ppo", critic="head")
    for optimizer in client.optimizers:  # Adam's moments, in both the policy's and the critic's
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad = torch.rand_like(p)
        optimizer.step()
    client.guard.load_state_dict({"consecutive": 2, "skipped": 3})
    client.sample(["ab"], n=2)  # moves the client's own streams past its seed's start
    client.save_state(tmp_path)
    drawn = client.sample(["ab"], n=4).response_ids  # as a resumed loop must sample them
    other = make(lm, command="ppo", critic="head")
    assert other.load_state(tmp_path) == 0
    assert torch.equal(other.sample(["ab"], n=4).response_ids, drawn)
    assert other.guard.state_dict() == {"consecutive": 2, "skipped": 3}
    for mine, theirs in zip(client.optimizers, other.optimizers, strict=True):
        saved, restored = mine.state_dict()["state"], theirs.state_dict()["state"]
        assert saved.keys() == restored.keys() and len(saved) > 0
        for key, state in saved.items():
            assert all(torch.equal(state[k], restored[key][k]) for k in state)
    critic = [m.state_dict() for m in client.models.critic.modules()]
    assert critic and all(
        torch.equal(t, m.state_dict()[k])
        for saved, m in zip(critic, other.models.critic.modules(), strict=True)
        for k, t in saved.items()
    )
    exp = other.logprobs(other.sample(["ab"], n=2))
    batch = replace(exp, advantages=torch.tensor([1.0, -1.0]), returns=exp.logprobs * 0)
    other.forward_backward(batch, "sft")
    assert set(other._stats) >= {"loss"}  # a restored client accumulates again


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
