"""Multi-turn episodes with tools: the environment and its tool-call parser, the token-in /
token-out episode runner, observation tokens masked out of every loss, and ppo / grpo steps."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from proxrl.algos.online import grpo, ppo
from proxrl.algos.online.advantages import estimate
from proxrl.algos.online.roles import load_models, load_prompts, load_rewards, role_settings
from proxrl.algos.online.run_settings import run_settings
from proxrl.algos.online.update import Losses, UpdateStep, terms, update
from proxrl.core import masked_mean
from proxrl.data.batching import pad_left
from proxrl.models.causal_lm import load_causal_lm
from proxrl.models.tokenizer import load_tokenizer
from proxrl.rollout.environment import ToolEnvironment, Turn, parse_hermes, tool_schemas
from proxrl.rollout.forward import policy_forward
from proxrl.rollout.generation import CachedSampler, SamplingSettings
from proxrl.rollout.multiturn import EpisodeLimits, observation_ids, run_episodes
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.guard import NonFiniteGuard
from proxrl.runtime.metrics import read_metrics
from tests.algos.collected import rollout_of
from tests.algos.mt_envs import TwoTurns, echo

WORDS = ["abc", "def", "ghi", "jkl"]


@pytest.fixture(scope="module")
def chat_prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"say: {w} ->"}], "word": w} for w in WORDS]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def small(config_cls, tiny_lm: str, prompts: str, out: Path, **overrides):
    fields = dict(
        model=tiny_lm,
        prompts=prompts,
        environment="tests.algos.mt_envs:two_turns",
        output_dir=str(out),
        iterations=1,
        rollout_batch_size=4,
        max_new_tokens=6,
        max_episode_tokens=48,
        temperature=1.0,
        mini_batch_size=4,
        learning_rate=3e-3,
        progress=False,
        seed=3,
    )
    return config_cls(**(fields | overrides))


# ------------------------------------------------------------------ environment and tools


def test_tool_environment_answers_calls_and_malformed_ones_with_observations():
    """Two good calls, then four malformed ones (invalid JSON, an unknown tool, arguments that
    are not an object, an unclosed tag) and a tool that raises: each gets a tool message, none
    ends the episode; a turn without a call is scored and ends it."""
    env = ToolEnvironment([echo], lambda row, text: float(text == row["answer"]))
    env.reset({"answer": "done"})
    turn = env.step(
        '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'
        '<tool_call>{"name": "echo", "arguments": "{\\"text\\": \\"yo\\"}"}</tool_call>'
        "<tool_call>{not json}</tool_call>"
        '<tool_call>{"name": "add", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "echo", "arguments": [1]}</tool_call>'
        '<tool_call>{"name": "echo", "arguments": {"txt": 1}}</tool_call>'
        "<tool_call>{"
    )
    contents = [m["content"] for m in turn.messages]
    assert [m["role"] for m in turn.messages] == ["tool"] * 7
    assert contents[:2] == ["hi", "yo"]
    assert contents[2].startswith("error: the tool call is not valid JSON")
    assert contents[3] == "error: no tool named 'add' (tools: echo)"
    assert contents[4] == 'error: "arguments" is not a JSON object'
    assert contents[5].startswith("error: TypeError:")  # the tool raised: still a call
    assert contents[6] == "error: the <tool_call> tag is not closed"
    assert (turn.tool_calls, turn.malformed_calls, turn.done, turn.reward) == (3, 4, False, 0.0)
    assert env.step("done") == Turn([], reward=1.0, done=True)
    assert parse_hermes("no call here") == []


def test_tool_schemas_come_from_signature_and_docstring():
    (schema,) = tool_schemas([echo])  # type: ignore[misc]
    assert schema["function"]["name"] == "echo"
    assert schema["function"]["parameters"]["properties"]["text"] == {
        "type": "string",
        "description": "what to repeat",
    }
    assert tool_schemas([]) is None

    def undocumented(x: int) -> int:
        return x

    with pytest.raises(ProxrlError, match="environment: tool undocumented"):
        tool_schemas([undocumented])


# ------------------------------------------------------------------ the episode runner


class Recording:
    """A sampler that keeps what the wrapped one returned, call by call."""

    def __init__(self, sampler):
        self.sampler, self.calls = sampler, []

    def sample(self, prompt_ids, prompt_mask, settings, with_logprobs=False):
        out = self.sampler.sample(prompt_ids, prompt_mask, settings, with_logprobs)
        self.calls.append(out)
        return out


def _episodes(tiny_lm, env_factory, n=8, limits=None, max_new_tokens=6):
    limits = limits or EpisodeLimits(2, 48)
    tokenizer = load_tokenizer(tiny_lm)
    model = load_causal_lm(tiny_lm).eval()
    conversations = [[{"role": "user", "content": f"say: {WORDS[i % 4]} ->"}] for i in range(n)]
    ids = [
        tokenizer(tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True))[
            "input_ids"
        ]
        for c in conversations
    ]
    sampler = Recording(CachedSampler(model, tokenizer))
    torch.manual_seed(0)
    episodes = run_episodes(
        sampler,
        tokenizer,
        [env_factory() for _ in range(n)],
        [{}] * n,
        conversations,
        pad_left(ids, tokenizer.pad_token_id),
        pad_left([[1] * len(r) for r in ids], 0),
        SamplingSettings(max_new_tokens, temperature=1.0),
        limits,
        with_logprobs=True,
    )
    return tokenizer, model, sampler, conversations, ids, episodes


def test_episode_tokens_are_the_sampled_ones_and_the_trainer_scores_them_alike(tiny_lm):
    """Token in, token out: each model turn's ids are exactly the sampler's (never the
    re-encoding of their text, which differs here: the byte-level BPE has merges a random model
    does not follow), each observation's ids are the chat template's rendering of it, and the
    trainer's log-probs of every model token equal the sampler's."""
    tokenizer, model, sampler, conversations, ids, ep = _episodes(tiny_lm, TwoTurns)
    first, second = sampler.calls
    re_encoded_differs = False
    for i in range(len(ids)):
        length = int(ep.response_mask[i].sum())
        actions = ep.action_mask[i, :length].tolist()
        turn1 = first.response_ids[i, : int(first.response_mask[i].sum())].tolist()
        assert actions[: len(turn1)] == [1] * len(turn1)
        assert ep.response_ids[i, : len(turn1)].tolist() == turn1
        text = tokenizer.decode(turn1, skip_special_tokens=True)
        plain = [t for t in turn1 if t != tokenizer.eos_token_id]
        re_encoded_differs |= tokenizer(text, add_special_tokens=False)["input_ids"] != plain
        observation = observation_ids(
            tokenizer,
            conversations[i] + [{"role": "assistant", "content": text}],
            [{"role": "user", "content": "again:"}],
            None,
        )
        start, end = len(turn1), len(turn1) + len(observation)
        assert ep.response_ids[i, start:end].tolist() == observation
        assert actions[start:end] == [0] * len(observation)
        turn2 = second.response_ids[i, : int(second.response_mask[i].sum())].tolist()
        assert ep.response_ids[i, end:length].tolist() == turn2
        assert actions[end:] == [1] * len(turn2)
    assert re_encoded_differs  # else this test would not tell the two apart
    assert tokenizer.decode(observation) == "<|user|>again:\n<|assistant|>"
    prompt = pad_left(ids, tokenizer.pad_token_id)
    prompt_mask = pad_left([[1] * len(r) for r in ids], 0)
    with torch.no_grad():
        trainer = policy_forward(
            model,
            torch.cat([prompt, ep.response_ids], 1),
            torch.cat([prompt_mask, ep.response_mask], 1),
            prompt.shape[1],
            1.0,
        ).logprobs
    actions = ep.action_mask.bool()
    torch.testing.assert_close(ep.logprobs[actions], trainer[actions], rtol=0, atol=1e-5)
    assert torch.equal(ep.logprobs[~actions], torch.zeros_like(ep.logprobs[~actions]))
    assert ep.metrics["episode/turns_mean"] == 2.0 and ep.metrics["episode/budget_cut_rate"] == 0
    # what reward functions get for each episode: its turns after the prompt, as TRL's tool loop
    for i in range(len(ids)):
        turns = [c.response_ids[i, : int(c.response_mask[i].sum())] for c in sampler.calls]
        texts = [tokenizer.decode(t, skip_special_tokens=True) for t in turns]
        assert ep.messages[i] == [
            {"role": "assistant", "content": texts[0]},
            {"role": "user", "content": "again:"},
            {"role": "assistant", "content": texts[1]},
        ]
    assert all(len(c) == 1 for c in conversations)  # the prompts' own lists are untouched


class Endless:
    """Never done: answers every turn with a tool message."""

    tools: list = []

    def reset(self, row):
        pass

    def step(self, completion):
        return Turn([{"role": "tool", "name": "x", "content": "ok"}], reward=0.25)


def test_budget_and_max_turns_end_episodes_and_are_counted(tiny_lm):
    """max_turns 3 with room to spare: three model turns, rewards summed, no budget cut. A
    budget of 20 tokens: every episode is cut (an observation alone takes more than the room
    left after a 6-token turn or two), never longer than 20 tokens, ending on a model token."""
    *_, ep = _episodes(tiny_lm, Endless, limits=EpisodeLimits(3, 400))
    assert ep.metrics["episode/turns_mean"] == 3 and ep.metrics["episode/max_turns_rate"] == 1
    assert ep.metrics["episode/budget_cut_rate"] == 0
    torch.testing.assert_close(ep.scores, torch.full((8,), 0.75))
    *_, ep = _episodes(tiny_lm, Endless, limits=EpisodeLimits(10, 20))
    assert ep.metrics["episode/budget_cut_rate"] == 1 and ep.metrics["episode/max_turns_rate"] == 0
    lengths = ep.response_mask.sum(-1)
    assert int(lengths.max()) <= 20
    last = ep.action_mask.gather(1, (lengths - 1).unsqueeze(1))
    assert bool(last.bool().all()) and not bool(ep.stopped.any())


# ------------------------------------------------------------------ the trainer side


def _rollout(cfg, config_module):
    algo = config_module.build(cfg)
    models = load_models(role_settings(cfg).models, algo)
    examples, ids = load_prompts(role_settings(cfg).prompts, models.tokenizer)
    torch.manual_seed(0)
    experience, _, row = rollout_of(
        cfg, algo, models, load_rewards(role_settings(cfg).rewards), examples, ids, 0.1, {}
    )
    return algo, models, estimate(algo, experience, 0.1), row


def _grads(cfg, algo, models, mb, kl_coef=0.1):
    params = [p for p in models.actor.parameters()] + list(models.critic.parameters())
    for p in params:
        p.grad = None
    losses = Losses(
        run_settings(cfg, algo, models.critic).updating,
        algo,
        models,
        mb.prompt_ids.shape[1],
        UpdateStep(kl_coef, True, 1),
    )
    loss, stats, _ = terms(losses, mb)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in params if p.grad is not None]), stats


def _poisoned(mb, where):
    """``mb`` with every per-token target of the ``where`` positions changed."""
    w = where.bool()
    return replace(
        mb,
        logprobs=torch.where(w, mb.logprobs + 3.0, mb.logprobs),
        ref_logprobs=torch.where(w, mb.ref_logprobs - 2.0, mb.ref_logprobs),
        advantages=torch.where(w, 50.0, mb.advantages),
        values=torch.where(w, mb.values + 0.05, mb.values),  # inside value_clip: V's gradient
        # flows through the clipped term too
        returns=torch.where(w, -9.0, mb.returns),
    )


@pytest.mark.parametrize("estimator", ["ppo", "grpo"])
def test_observation_tokens_take_no_part_in_any_loss(tiny_lm, chat_prompts, tmp_path, estimator):
    """Change every target of the observation tokens (π_old, π_ref, advantage, V_old, return):
    the gradient of policy loss + KL (in the loss, grpo) + entropy + value loss (ppo's value
    head) is unchanged; change them at one model token and it moves. The rollout's advantages
    are 0 at observations, and the entropy term averages over model tokens only."""
    if estimator == "ppo":
        cfg = small(ppo.Config, tiny_lm, chat_prompts, tmp_path, critic="head", entropy_coef=0.1)
        algo, models, exp, _ = _rollout(cfg, ppo)
    else:
        cfg = small(
            grpo.Config, tiny_lm, chat_prompts, tmp_path, group_size=2, kl_coef=0.1,
            mini_batch_size=8, entropy_coef=0.1, skip_old_logprobs_pass=False,
        )  # fmt: skip
        algo, models, exp, _ = _rollout(cfg, grpo)
    observations = exp.response_mask.bool() & ~exp.action_mask.bool()
    assert observations.any() and exp.action_mask.sum() < exp.response_mask.sum()
    assert not exp.advantages[observations].any() and exp.advantages[exp.action_mask.bool()].any()
    models.actor.train()
    clean, stats = _grads(cfg, algo, models, exp)
    poisoned, _ = _grads(cfg, algo, models, _poisoned(exp, observations))
    torch.testing.assert_close(poisoned, clean, rtol=1e-6, atol=1e-9)
    one_model_token = torch.zeros_like(observations)
    one_model_token[0, 0] = True
    moved, _ = _grads(cfg, algo, models, _poisoned(exp, one_model_token))
    assert (moved - clean).abs().max() > 1e-4
    with torch.no_grad():
        entropy = policy_forward(
            models.actor, exp.input_ids, exp.attention_mask, exp.prompt_ids.shape[1], 1.0,
            with_entropy=True,
        ).entropy  # fmt: skip
    # (a random tiny model's entropy is near log V everywhere: the two means differ by ~1e-4)
    over_actions = masked_mean(entropy, exp.action_mask.float()).item()
    over_response = masked_mean(entropy, exp.response_mask.float()).item()
    assert stats["entropy"].item() == pytest.approx(over_actions, rel=0, abs=2e-6)
    assert abs(over_response - over_actions) > 2e-5


@pytest.mark.parametrize("config_module", [ppo, grpo], ids=["ppo", "grpo"])
def test_a_step_on_episodes_trains_the_policy(tiny_lm, chat_prompts, tmp_path, config_module):
    """One iteration on two-turn episodes: the policy's weights move, every metric is finite,
    the episode metrics and the environment's reward are logged."""
    extra = {"group_size": 2, "mini_batch_size": 8} if config_module is grpo else {}
    cfg = small(config_module.Config, tiny_lm, chat_prompts, tmp_path, **extra)
    before = {k: v.clone() for k, v in load_causal_lm(tiny_lm).state_dict().items()}
    config_module.train(cfg)
    (row,) = read_metrics(tmp_path)
    assert row["episode/turns_mean"] == 2.0 and row["episode/observation_tokens_mean"] > 0
    assert row["reward/environment"] == pytest.approx(row["objective/scores"])
    assert [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)] == []
    after = load_causal_lm(str(tmp_path)).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


class GradientRecorder:
    """An optimizer that keeps the gradient of its one step instead of taking it."""

    def __init__(self, params):
        self.param_groups = [{"params": list(params)}]
        self.gradient = None

    def zero_grad(self, set_to_none=True):
        for p in self.param_groups[0]["params"]:
            p.grad = None

    def step(self):
        self.gradient = torch.cat([p.grad.flatten() for p in self.param_groups[0]["params"]])


def test_micro_batches_weigh_by_model_tokens(tiny_lm, chat_prompts, tmp_path):
    """grad_accum 2: the update weighs each micro-batch's token-mean loss by its share of the
    step's *model* tokens, so the accumulated gradient is the whole batch's (weighing by all
    response tokens would not be: episodes hold different shares of observation tokens)."""
    cfg = small(
        grpo.Config, tiny_lm, chat_prompts, tmp_path, group_size=2, kl_coef=0.1,
        mini_batch_size=8, grad_accum=2, entropy_coef=0.1, max_grad_norm=0,
        environment="tests.algos.mt_envs:echo_once",
    )  # fmt: skip
    algo, models, exp, _ = _rollout(cfg, grpo)
    models.actor.train()
    shares = exp.action_mask.sum(-1) / exp.response_mask.sum(-1)
    assert shares.max() - shares.min() > 0.05
    whole, _ = _grads(cfg, algo, models, exp)
    recorder = GradientRecorder(models.actor.parameters())
    settings = run_settings(cfg, algo, models.critic).updating
    update(settings, algo, models, exp, [recorder], UpdateStep(0.1, True, 1),
           torch.Generator().manual_seed(0), NonFiniteGuard())  # fmt: skip
    torch.testing.assert_close(recorder.gradient, whole, rtol=1e-4, atol=1e-7)


def test_python_api_takes_an_environment_class(tiny_lm, tmp_path):
    """``proxrl.grpo(environment=TwoTurns)``: the class is the factory, behind a handle."""
    import proxrl

    run = proxrl.grpo(
        model=tiny_lm,
        prompts=[{"messages": [{"role": "user", "content": f"say: {w} ->"}]} for w in WORDS],
        environment=TwoTurns,
        group_size=2,
        iterations=1,
        rollout_batch_size=2,
        mini_batch_size=4,
        max_new_tokens=4,
        progress=False,
        report_to="none",
        output_dir=tmp_path / "grpo",
    )
    assert run.metrics["episode/turns_mean"] == 2.0
    assert "environment: python:TwoTurns" in (run.output_dir / "config.yaml").read_text()


def _model_tokens_only(exp):
    """``exp`` with every observation column taken out of each row and the model's tokens
    left-aligned: the single-turn batch an estimator should see in the episodes."""
    keep = exp.loss_mask.bool()
    width = int(keep.sum(-1).max())

    def compact(t: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(t.shape[0], width, dtype=t.dtype)
        for i, row in enumerate(t):
            out[i, : int(keep[i].sum())] = row[keep[i]]
        return out

    mask = compact(keep.long())
    return replace(
        exp, logprobs=compact(exp.logprobs), ref_logprobs=compact(exp.ref_logprobs),
        values=compact(exp.values), response_mask=mask, action_mask=mask,
    )  # fmt: skip


@pytest.fixture(scope="module")
def echo_episodes(tiny_lm, chat_prompts, tmp_path_factory):
    """Eight two-turn episodes whose observations differ in length, with a KL to the
    reference, a random critic's values, ReMax's greedy scores and GDPO's combined scores (the
    scores themselves) filled in."""
    cfg = small(
        grpo.Config, tiny_lm, chat_prompts, tmp_path_factory.mktemp("estimators"), group_size=2,
        kl_coef=0.1, mini_batch_size=8, skip_old_logprobs_pass=False,
        environment="tests.algos.mt_envs:echo_once",
    )  # fmt: skip
    _, _, exp, _ = _rollout(cfg, grpo)
    generator = torch.Generator().manual_seed(5)
    values = torch.randn(exp.values.shape, generator=generator, dtype=exp.values.dtype)
    greedy = torch.rand(exp.scores.shape, generator=generator, dtype=exp.scores.dtype)
    filled = replace(exp, greedy_scores=greedy, combined_scores=exp.scores)
    return cfg, replace(filled, values=values * exp.response_mask)


@pytest.mark.parametrize("estimator", ["ppo", *grpo.ESTIMATORS])
def test_every_estimator_sees_episodes_as_if_observations_were_absent(
    tiny_lm, chat_prompts, tmp_path, echo_episodes, estimator
):
    """PPO's GAE (γ 0.9, λ 0.8, whitened) and every critic-free estimator (γ 0.9 where it
    discounts): the rewards, advantages and returns at the model's tokens of an episode equal
    those of the same tokens with the observations cut out, and are 0 at the observations —
    advantages and reward-to-go flow from one model turn to the next across them."""
    grpo_cfg, exp = echo_episodes
    if estimator == "ppo":
        cfg = small(ppo.Config, tiny_lm, chat_prompts, tmp_path, gamma=0.9, lam=0.8,
                    whiten_rewards=True, environment="tests.algos.mt_envs:echo_once")  # fmt: skip
        algo = ppo.build(cfg)
    else:
        algo = grpo.build(replace(grpo_cfg, estimator=estimator, gamma=0.9))
    observations = exp.response_mask.bool() & ~exp.action_mask.bool()
    assert observations.any() and (observations.sum(-1).unique().numel() > 1)
    compact = _model_tokens_only(exp)
    names = ("rewards", "advantages", "returns")
    estimates = zip(names, algo.estimate(exp, 0.1), algo.estimate(compact, 0.1), strict=True)
    for name, full, alone in estimates:
        assert not full[observations].any(), name
        torch.testing.assert_close(
            _model_tokens_only(replace(exp, values=full)).values, alone, rtol=1e-6, atol=1e-7,
            msg=lambda m, name=name: f"{name}: {m}",
        )  # fmt: skip
        assert alone.abs().max() > 1e-3, name
