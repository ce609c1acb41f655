"""The training client (issue 38): a GRPO loop written with it is ``proxrl grpo``'s loop to the
bit (float64, tiny model, same seed), and each method does what it says."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from proxrl.algos.online import grpo
from proxrl.algos.online.client import TrainingClient
from proxrl.core import REWARD_SCALES
from proxrl.data.formats import load_prompt_examples
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.metrics import read_metrics
from tests.algos.online_rewards import target_fraction

WORDS = ["abc", "def", "ghi", "jkl", "mno", "pqr", "stu", "vwx"]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in WORDS))
    return str(path)


def config(tiny_lm: str, prompts: str, out: Path, **overrides) -> grpo.Config:
    fields = dict(
        model=tiny_lm,
        prompts=prompts,
        reward_fn=("tests.algos.online_rewards:target_fraction",),
        output_dir=str(out),
        iterations=2,
        rollout_batch_size=4,
        group_size=2,
        mini_batch_size=4,  # two optimizer steps per iteration: π_old by the rollout's pass
        max_new_tokens=8,
        temperature=1.0,
        learning_rate=3e-3,
        lr_schedule="constant",
        dtype="float64",
        save_every=0,
        sample_every=0,
        progress=False,
        seed=3,
        shared_prefix=False,  # bit-identities (π_ref = π_old before a step); see test_shared_prefix
    )
    return grpo.Config(**(fields | overrides))


def grpo_iteration(client: TrainingClient, examples, iteration: int) -> list[dict[str, float]]:
    """One iteration of GRPO written with the client, as the README shows it."""
    cfg = client.cfg
    batch_prompts = [examples[i] for i in client.prompt_batch(len(examples), 4, iteration)]
    rollout = client.sample(batch_prompts, n=cfg.group_size)
    scores = torch.tensor(target_fraction(rollout.prompts, rollout.text))
    batch = client.logprobs(rollout, scores)  # π_old (and π_ref) by the trainer's forward
    advantages = REWARD_SCALES["group"](batch.scores, cfg.group_size)
    batch = replace(batch, advantages=advantages[:, None] * batch.loss_mask.float())
    steps = []
    for rows in client.minibatches(len(batch)):
        stats = client.forward_backward(batch.select(rows), loss="ppo")
        steps.append(stats | client.optim_step(lr=cfg.learning_rate))
    return [s | {"score": float(scores.mean())} for s in steps]


NAMES = {"loss": "policy/total_loss", "grad_norm": "policy/grad_norm"}


def test_a_grpo_loop_written_with_the_client_equals_proxrl_grpo(tiny_lm, prompts, tmp_path):
    """Same seed, float64: every policy metric of each iteration, the scores and the final
    weights of the client's loop equal those of ``proxrl grpo`` (module-level train) exactly."""
    cfg = config(tiny_lm, prompts, tmp_path / "builtin")
    grpo.train(cfg)
    rows = read_metrics(tmp_path / "builtin")

    client = TrainingClient(config=config(tiny_lm, prompts, tmp_path / "unused"))
    examples = load_prompt_examples(prompts)
    for iteration, row in enumerate(rows):
        steps = grpo_iteration(client, examples, iteration)
        assert row["objective/scores"] == steps[0]["score"]
        assert row["policy/optimizer_steps"] == sum(s["stepped"] for s in steps) == 2
        keys = set(steps[0]) - {"score", "stepped"}
        assert {"loss", "grad_norm", "clipfrac", "approx_kl"} <= keys
        for key in keys:  # the update's mean over its steps, summed in the same order
            total = 0.0
            for s in steps:
                total += s[key]
            assert row[NAMES.get(key, f"policy/{key}")] == total / len(steps), key
    client.save_model(tmp_path / "client")
    built_in = load_file(tmp_path / "builtin" / "model.safetensors")
    ours = load_file(tmp_path / "client" / "model.safetensors")
    assert built_in.keys() == ours.keys()
    assert all(torch.equal(built_in[k], ours[k]) for k in built_in)
    start = load_file(Path(tiny_lm) / "model.safetensors")
    assert not all(torch.equal(start[k].double(), ours[k].double()) for k in start)


@pytest.fixture
def client(tiny_lm, prompts, tmp_path) -> TrainingClient:
    return TrainingClient(config=config(tiny_lm, prompts, tmp_path / "unused"))


def _batch(client: TrainingClient, texts: list[str], n: int = 2):
    rollout = client.sample(texts, n=n)
    scores = torch.tensor(target_fraction(rollout.prompts, rollout.text))
    batch = client.logprobs(rollout, scores)
    advantages = REWARD_SCALES["group"](batch.scores, n)
    return replace(batch, advantages=advantages[:, None] * batch.loss_mask.float())


def _grads(client: TrainingClient) -> list[torch.Tensor]:
    return [p.grad.clone() for p in client.model.parameters() if p.grad is not None]


def test_sample_gives_n_responses_their_text_and_the_samplers_logprobs(client):
    """n consecutive responses per prompt, decoded; the sampler's log-probs equal the trainer's
    forward (to the sampler's float32 rounding); a per-call override bounds the length."""
    rollout = client.sample(["say: abc ->", "say: def ->"], n=3, logprobs=True)
    assert len(rollout) == 6 and rollout.prompts == ["say: abc ->"] * 3 + ["say: def ->"] * 3
    assert rollout.response_ids.shape[0] == 6 and rollout.logprobs is not None
    mask = rollout.response_mask.bool()
    decoded = client.tokenizer.batch_decode(
        torch.where(mask, rollout.response_ids, client.tokenizer.pad_token_id),
        skip_special_tokens=True,
    )
    assert rollout.text == decoded
    batch = client.logprobs(rollout)
    assert batch.logprobs is not None and batch.ref_logprobs is not None
    torch.testing.assert_close(
        rollout.logprobs[mask].double(), batch.logprobs[mask].double(), rtol=0, atol=1e-5
    )
    # the reference is the starting policy: before any step π_ref = π_old
    assert torch.equal(batch.ref_logprobs[mask], batch.logprobs[mask])
    assert client.sample(["say: abc ->"], n=2, max_new_tokens=3).response_ids.shape[1] <= 3
    with pytest.raises(ProxrlError, match="sample: seed: expected one of max_new_tokens"):
        client.sample(["x"], seed=1)
    with pytest.raises(ProxrlError, match=r"logprobs: scores: expected 6 values"):
        client.logprobs(rollout, [1.0])


def test_forward_backward_normalises_as_the_update_and_accumulates(tiny_lm, prompts, tmp_path):
    """The gradient of one call does not depend on grad_accum (the update's normaliser is the
    batch's units); a second call adds its gradient; a callable loss equal to the sft loss
    gives sft's gradient."""
    texts = ["say: abc ->", "say: ghi ->"]
    grads = []
    for accum in (1, 4):
        c = TrainingClient(config=config(tiny_lm, prompts, tmp_path / "x", grad_accum=accum))
        batch = _batch(c, texts)
        c.forward_backward(batch, "ppo")
        grads.append(_grads(c))
    assert len(grads[0]) > 0
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)
    c.forward_backward(batch, "ppo")  # (grad_accum 4) the same batch again: twice the gradient
    for a, b in zip(_grads(c), grads[1], strict=True):
        torch.testing.assert_close(a, 2 * b, rtol=1e-10, atol=1e-13)
    c.optim_step()
    assert _grads(c) == []  # zeroed after the step
    c.forward_backward(batch, "sft")
    sft = _grads(c)
    c.optimization.zero_grad()

    def nll(logprobs: torch.Tensor, mb) -> torch.Tensor:  # token-mean over the micro-batch
        mask = mb.loss_mask.to(logprobs.dtype)
        return -(logprobs * mask).sum() / mask.sum()

    c.forward_backward(batch, nll)
    for a, b in zip(_grads(c), sft, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)
    with pytest.raises(ProxrlError, match="loss: expected one of ppo, .*sft or a callable"):
        c.forward_backward(batch, "ppo2")


def test_optim_step_skips_a_zero_gradient_and_steps_at_lr(client):
    """All advantages 0 (no KL, no entropy term): an exactly zero gradient, no step, the
    weights and the optimizer's state untouched; a real gradient steps at the given rate."""
    batch = _batch(client, ["say: abc ->", "say: def ->"])
    before = {k: v.clone() for k, v in client.model.state_dict().items()}
    client.forward_backward(replace(batch, advantages=torch.zeros_like(batch.advantages)))
    stats = client.optim_step(lr=1e-2)
    assert stats["stepped"] == 0.0 and stats["grad_norm"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in client.model.state_dict().items())
    assert client.optimizers[0].state == {}
    batch = replace(batch, advantages=torch.ones_like(batch.advantages) * batch.loss_mask)
    client.forward_backward(batch)
    assert client.optim_step(lr=1e-2)["stepped"] == 1.0
    assert client.optimizers[0].param_groups[0]["lr"] == 1e-2
    assert not all(torch.equal(before[k], v) for k, v in client.model.state_dict().items())


def test_save_state_then_load_state_resumes_bit_for_bit(tiny_lm, prompts, tmp_path):
    """One iteration, save_state, one more; a fresh client that loads the state and runs that
    second iteration samples the same text and ends with the same weights, bit for bit."""
    examples = load_prompt_examples(prompts)
    whole = TrainingClient(config=config(tiny_lm, prompts, tmp_path / "a"))
    grpo_iteration(whole, examples, 0)
    whole.save_state(tmp_path / "state")
    expected = grpo_iteration(whole, examples, 1)

    resumed = TrainingClient(config=config(tiny_lm, prompts, tmp_path / "b"))
    assert resumed.load_state(tmp_path / "state") == 2
    assert grpo_iteration(resumed, examples, 1) == expected
    a, b = whole.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.steps == whole.steps == 4


def test_save_model_loads_with_transformers_and_lora_keeps_its_adapter(tiny_lm, prompts, tmp_path):
    """save_model writes what transformers loads (the merged model under LoRA, the adapter in
    adapter/); a model object is trained in place."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_lm, torch_dtype=torch.float64)
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm)
    client = TrainingClient(model, tokenizer=tokenizer, lora_r=4, dtype="float64", seed=1)
    batch = _batch(client, ["say: abc ->", "say: pqr ->"])
    client.forward_backward(replace(batch, advantages=torch.ones_like(batch.advantages)))
    assert client.optim_step(lr=1e-2)["stepped"] == 1.0
    out = client.save_model(tmp_path / "saved")
    assert (out / "adapter").is_dir()
    loaded = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float64)
    ids = tokenizer("say: abc ->", return_tensors="pt").input_ids
    with torch.no_grad():
        ours = client.model(ids).logits
        theirs = loaded(ids).logits
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-9)
    with pytest.raises(ProxrlError, match="lora_r"):
        TrainingClient(tiny_lm, lora_r=-1)
    with pytest.raises(ProxrlError, match="unknown key lernig_rate; did you mean learning_rate"):
        TrainingClient(tiny_lm, lernig_rate=1e-3)


class RecordingEngine:
    """The built-in engine, its lifecycle calls recorded."""

    def __init__(self, engine) -> None:
        self.engine, self.calls = engine, []

    def sampler(self, policy):
        self.calls.append("sampler")
        return self.engine.sampler(policy)

    def before_update(self, iteration: int) -> None:
        self.calls.append(f"before_update {iteration}")

    def after_update(self, policy, iteration: int) -> dict[str, float]:
        self.calls.append(f"after_update {iteration}")
        return {}


def test_the_engine_sleeps_through_an_update_and_syncs_before_the_next_sample(client, tmp_path):
    """The loop's engine lifecycle: before_update ahead of the first forward_backward after a
    sample, after_update (vLLM's weight sync) ahead of the next sample, and after load_state."""
    client.engine = engine = RecordingEngine(client.engine)
    batch = _batch(client, ["say: abc ->"])
    client.forward_backward(batch)
    client.forward_backward(batch)
    client.optim_step()
    client.sample(["say: abc ->"], n=2)
    client.save_state(tmp_path / "state")
    client.load_state(tmp_path / "state")
    client.sample(["say: abc ->"], n=2)
    client.sample(["say: abc ->"], n=2)
    assert engine.calls == [
        "sampler",
        "before_update 0",
        "after_update 1",
        "sampler",
        "after_update 1",
        "sampler",
        "sampler",
    ]
