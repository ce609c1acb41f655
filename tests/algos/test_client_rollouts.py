"""Rollouts from elsewhere (issue 38): a rollouts file read into the client trains as the
rollout it records, π_old from its log-probs (or the trainer's under a rollout correction); a bad
line is refused with file:line."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from proxrl.algos.online.client import TrainingClient
from proxrl.core import REWARD_SCALES
from proxrl.runtime.errors import ProxrlError
from tests.algos.online_rewards import target_fraction
from tests.algos.test_client import WORDS, config

TEXTS = ["say: abc ->", "say: jkl ->"]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in WORDS))
    return str(path)


def write_rollouts(client: TrainingClient, path: Path, n: int = 2) -> dict:
    """What a harness would write: the client's own samples, one line per trajectory."""
    rollout = client.sample(TEXTS, n=n, logprobs=True)
    scores = target_fraction(rollout.prompts, rollout.text)
    lines = []
    for i in range(len(rollout)):
        prompt = rollout.prompt_ids[i][rollout.stage.prompt_mask[i].bool()].tolist()
        length = int(rollout.response_mask[i].sum())
        lines.append(
            {
                "prompt_ids": prompt,
                "response_ids": rollout.response_ids[i, :length].tolist(),
                "logprobs": rollout.logprobs[i, :length].tolist(),
                "reward": scores[i],
                "group": i // n,
                "response": rollout.text[i],
            }
        )
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return {"rollout": rollout, "scores": torch.tensor(scores), "lines": lines}


def _trained(client: TrainingClient, rollout, scores) -> list[torch.Tensor]:
    batch = client.logprobs(rollout, scores, recorded=True)
    advantages = REWARD_SCALES["group"](batch.scores, 2)
    client.forward_backward(replace(batch, advantages=advantages[:, None] * batch.loss_mask))
    grads = [p.grad.clone() for p in client.model.parameters() if p.grad is not None]
    client.optimization.zero_grad()
    return grads


def test_a_rollouts_file_trains_as_the_rollout_it_records(tiny_lm, prompts, tmp_path):
    """The file's rows come back as the sampled rows (ids, masks, log-probs, scores), π_old is
    the recorded log-probs, and the gradient equals that of the sampled rollout itself."""
    client = TrainingClient(config=config(tiny_lm, prompts, tmp_path / "x"))
    written = write_rollouts(client, tmp_path / "rollouts.jsonl")
    sampled = written["rollout"]
    read = client.read_rollouts(tmp_path / "rollouts.jsonl")
    assert torch.equal(read.prompt_ids, sampled.prompt_ids)
    width = read.response_ids.shape[1]
    mask = sampled.response_mask.bool()
    assert torch.equal(
        read.response_mask, sampled.response_mask[:, :width].to(read.response_mask.dtype)
    )
    assert torch.equal(read.response_ids[mask[:, :width]], sampled.response_ids[mask])
    assert read.text == sampled.text and torch.equal(read.scores, written["scores"])
    batch = client.logprobs(read, recorded=True)
    assert torch.equal(
        batch.logprobs[mask[:, :width]], sampled.logprobs[mask].to(batch.logprobs.dtype)
    )
    ours = _trained(client, read, None)
    theirs = _trained(client, sampled, written["scores"])
    assert len(ours) > 0
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)


def test_a_rollout_correction_recomputes_pi_old_and_weighs_by_the_recorded(
    tiny_lm, prompts, tmp_path
):
    """With a rollout correction π_old is the trainer's forward, and the recorded log-probs give
    the weights: off-policy rows (recorded log-probs shifted) are weighted, on-policy ones ≈ 1."""
    cfg = config(tiny_lm, prompts, tmp_path / "x", rollout_correction="tis")
    client = TrainingClient(config=cfg)
    written = write_rollouts(client, tmp_path / "rollouts.jsonl")
    read = client.read_rollouts(tmp_path / "rollouts.jsonl")
    batch = client.logprobs(read, recorded=True)
    fresh = client.logprobs(read)
    assert torch.equal(batch.logprobs, fresh.logprobs)
    mask = batch.loss_mask.bool()
    torch.testing.assert_close(
        batch.rollout_weights[mask],
        torch.ones(int(mask.sum()), dtype=batch.rollout_weights.dtype),
        rtol=0,
        atol=1e-5,
    )
    stale = [line | {"logprobs": [v - 0.5 for v in line["logprobs"]]} for line in written["lines"]]
    (tmp_path / "stale.jsonl").write_text("".join(json.dumps(line) + "\n" for line in stale))
    weights = client.logprobs(
        client.read_rollouts(tmp_path / "stale.jsonl"), recorded=True
    ).rollout_weights
    # w = min(π_old / μ, cap): μ half a nat below π_old: e^0.5 ≈ 1.65 under tis's cap 2
    torch.testing.assert_close(
        weights[mask], torch.full_like(weights[mask], 0.5).exp(), rtol=0, atol=1e-4
    )


GOOD = {
    "prompt_ids": [5, 6],
    "response_ids": [7, 8],
    "logprobs": [-0.5, -1.0],
    "reward": 1.0,
    "group": "a",
}


@pytest.mark.parametrize(
    ("second", "message"),
    [
        ("{not json", r":2: expected a JSON object"),
        ({**GOOD, "response_ids": [7, 10**6]}, r":2: response_ids: token id 1000000 is outside"),
        ({**GOOD, "logprobs": [-0.5]}, r":2: logprobs: expected 2 numbers"),
        (
            {**GOOD, "logprobs": [-0.5, 0.5]},
            r":2: logprobs: expected finite log-probabilities <= 0, got 0.5",
        ),
        ({**GOOD, "logprobs": [-0.5, float("nan")]}, r":2: logprobs: expected finite"),
        ({k: v for k, v in GOOD.items() if k != "reward"}, r":2: reward: expected reward"),
        ({**GOOD, "rewards": [0.0, 1.0]}, r":2: reward: expected reward \(a number\) or rewards"),
        ({**GOOD, "loss_mask": [1, 2]}, r":2: loss_mask: expected 2 values, each 0 or 1"),
        ({**GOOD, "group": "b"}, r":1: group: expected 2 rows \(group_size\) in group 'a', got 1"),
        (
            {**GOOD, "prompt_ids": [5, 9]},
            r":2: prompt_ids: expected those of the group's first row",
        ),
        ({**GOOD, "response": "zzz"}, r":2: response_ids: decode to .* ids of another tokenizer"),
        (
            {**GOOD, "response_ids": [7] * 9, "logprobs": [-1.0] * 9},
            r":2: response_ids: expected at most 8 tokens \(max_new_tokens\)",
        ),
        ({**GOOD, "group": [1]}, r":2: group: expected a string or an integer"),
        (
            {**{k: v for k, v in GOOD.items() if k != "reward"}, "rewards": [0.0, math.inf]},
            r":2: rewards: expected finite numbers, got inf",
        ),
        (
            {
                **{k: v for k, v in GOOD.items() if k != "reward"},
                "rewards": [0.0, 0.5],
                "loss_mask": [1, 0],
            },
            r":2: rewards: expected 0 at token 1 \(loss_mask 0: an observation\)",
        ),
    ],
)
def test_a_bad_line_is_refused_with_file_and_line(second, message, tiny_lm, prompts, tmp_path):
    client = TrainingClient(config=config(tiny_lm, prompts, tmp_path / "x"))
    path = tmp_path / "rollouts.jsonl"
    line = second if isinstance(second, str) else json.dumps(second)
    path.write_text(json.dumps(GOOD) + "\n" + line + "\n")
    with pytest.raises(ProxrlError, match=f"rollouts.jsonl{message}"):
        client.read_rollouts(path)


def test_per_token_rewards_sum_into_the_score_and_a_loss_mask_masks(tiny_lm, prompts, tmp_path):
    client = TrainingClient(config=config(tiny_lm, prompts, tmp_path / "x"))
    path = tmp_path / "rollouts.jsonl"
    first = {**GOOD, "rewards": [0.75, 0.0], "loss_mask": [1, 0]}
    del first["reward"]
    path.write_text(json.dumps(first) + "\n" + json.dumps(GOOD) + "\n")
    read = client.read_rollouts(path)
    assert read.scores.tolist() == [0.75, 1.0]
    assert read.token_rewards.tolist() == [[0.75, 0.0], [0.0, 1.0]]  # a reward: the last token's
    batch = client.logprobs(read, recorded=True)
    assert batch.loss_mask.tolist() == [[1, 0], [1, 1]]
    assert batch.logprobs.tolist() == [[-0.5, 0.0], [-0.5, -1.0]]


def _file_config(tiny_lm: str, out: Path, rollouts: Path, **overrides):
    """grpo on a rollouts file: no prompts, no reward function."""
    fields = dict(
        reward_fn=(), rollouts_file=str(rollouts), rollout_batch_size=2, mini_batch_size=2
    )
    return config(tiny_lm, "", out, **(fields | overrides))


@pytest.mark.parametrize("correction", ["none", "tis"])
def test_grpo_on_a_rollouts_file_equals_the_client_on_it(correction, tiny_lm, prompts, tmp_path):
    """proxrl grpo with rollouts_file (π_old the recorded log-probs, or the trainer's with tis)
    and a client loop on the same file end with the same weights and metrics, bit for bit."""
    from safetensors.torch import load_file

    from proxrl.algos.online import grpo
    from proxrl.runtime.metrics import read_metrics

    writer = TrainingClient(config=config(tiny_lm, prompts, tmp_path / "w", seed=5))
    rollouts = tmp_path / "rollouts.jsonl"
    write_rollouts(writer, rollouts)
    cfg = _file_config(tiny_lm, tmp_path / "run", rollouts, rollout_correction=correction)
    grpo.train(cfg)
    rows = read_metrics(tmp_path / "run")
    assert len(rows) == 2 and all(row["policy/optimizer_steps"] == 2 for row in rows)
    client = TrainingClient(config=cfg)
    for row in rows:  # the file is not refreshed: both iterations train on it
        batch = client.logprobs(client.read_rollouts(rollouts), recorded=True)
        advantages = REWARD_SCALES["group"](batch.scores, 2)
        batch = replace(batch, advantages=advantages[:, None] * batch.loss_mask.float())
        losses = []
        for minibatch in client.minibatches(len(batch)):
            losses.append(client.forward_backward(batch.select(minibatch))["loss"])
            client.optim_step()
        assert row["policy/total_loss"] == (losses[0] + losses[1]) / 2
        assert row["objective/scores"] == float(batch.scores.mean())
    client.save_model(tmp_path / "client")
    ours, theirs = (
        load_file(tmp_path / "client/model.safetensors"),
        load_file(tmp_path / "run/model.safetensors"),
    )
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_rollouts_file_refuses_prompts_rewards_and_a_wrong_batch(tiny_lm, prompts, tmp_path):
    from proxrl.algos.online import grpo

    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD) + "\n")
    with pytest.raises(ProxrlError, match="prompts: not with rollouts_file"):
        replace(_file_config(tiny_lm, tmp_path / "a", rollouts), prompts=prompts).validate()
    with pytest.raises(ProxrlError, match="rollouts_file: .*missing.jsonl is not a file"):
        _file_config(tiny_lm, tmp_path / "a", tmp_path / "missing.jsonl").validate()
    with pytest.raises(ProxrlError, match="holds 2 trajectories; expected rollout_batch_size"):
        grpo.train(_file_config(tiny_lm, tmp_path / "b", rollouts))
    assert not (tmp_path / "b").exists()  # refused before the output directory is touched


def test_rollouts_file_refuses_gdpo(tiny_lm, tmp_path):
    """gdpo normalises each reward source apart: a file's one score per trajectory has none."""
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text(json.dumps(GOOD) + "\n")
    _file_config(tiny_lm, tmp_path / "a", rollouts, estimator="grpo").validate()
    with pytest.raises(ProxrlError, match="estimator: gdpo .* rollouts_file brings one score"):
        _file_config(tiny_lm, tmp_path / "a", rollouts, estimator="gdpo").validate()


@pytest.mark.parametrize("critic", ["head", "separate"])
def test_ppo_trains_on_a_rollouts_file_from_the_command_line(critic, tiny_lm, prompts, tmp_path):
    """proxrl ppo --rollouts-file: the critic's values from the trainer's pass, π_old the
    recorded log-probs; finite metrics, the policy moves."""
    from safetensors.torch import load_file

    from proxrl.cli import main
    from proxrl.runtime.metrics import read_metrics

    writer = TrainingClient(config=config(tiny_lm, prompts, tmp_path / "w"))
    rollouts = tmp_path / "rollouts.jsonl"
    write_rollouts(writer, rollouts)
    out = tmp_path / "ppo"
    argv = ["ppo", "--model", tiny_lm, "--rollouts-file", str(rollouts), "--output-dir", str(out)]
    argv += ["--rollout-batch-size", "2", "--group-size", "2", "--mini-batch-size", "2"]
    argv += ["--iterations", "2", "--max-new-tokens", "8", "--learning-rate", "3e-3"]
    argv += ["--critic", critic, "--no-progress", "--report-to", "none", "--sample-every", "1"]
    assert main(argv) in (0, None)
    rows = read_metrics(out)
    assert len(rows) == 2
    for row in rows:  # (the entropy of recorded log-probs is unknown: NaN, logged only)
        bad = [k for k, v in row.items() if "entropy" not in k and not math.isfinite(v)]
        assert not bad
    start, end = (
        load_file(Path(tiny_lm) / "model.safetensors"),
        load_file(out / "model.safetensors"),
    )
    assert not all(torch.equal(start[k].to(end[k].dtype), end[k]) for k in start)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    first = json.loads(rollouts.read_text().splitlines()[0])
    assert len(samples) == 8 and samples[0]["completion"] == first["response"]


def test_a_file_written_by_plain_transformers_generate_is_read_and_scored_as_sampled(
    tiny_lm, prompts, tmp_path
):
    """The harness of the issue: transformers alone samples (generate, scores of the processed
    distribution) and writes the file; proxrl reads it, and the recorded log-probs are the
    trainer's own π at the same temperature, to float64 round-off."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_lm, torch_dtype=torch.float64)
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm)
    torch.manual_seed(0)
    lines = []
    for group, text in enumerate(TEXTS):
        ids = tokenizer(text, return_tensors="pt").input_ids
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=8,
            num_return_sequences=2,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=tokenizer.pad_token_id,
        )
        steps = torch.stack(out.scores, 1).log_softmax(-1)  # (2, T, V)
        for row in range(2):
            response = out.sequences[row, ids.shape[1] :].tolist()
            if tokenizer.eos_token_id in response:  # up to and including the stop token
                response = response[: response.index(tokenizer.eos_token_id) + 1]
            logprobs = [float(steps[row, t, tok]) for t, tok in enumerate(response)]
            lines.append(
                {
                    "prompt_ids": ids[0].tolist(),
                    "response_ids": response,
                    "logprobs": logprobs,
                    "reward": float(len(response)),
                    "group": group,
                    "response": tokenizer.decode(response, skip_special_tokens=True),
                }
            )
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))

    client = TrainingClient(config=config(tiny_lm, prompts, tmp_path / "x"))
    read = client.read_rollouts(path)
    recorded, trainer = client.logprobs(read, recorded=True), client.logprobs(read)
    mask = recorded.loss_mask.bool()
    torch.testing.assert_close(
        recorded.logprobs[mask], trainer.logprobs[mask].float(), rtol=0, atol=1e-5
    )
    assert read.scores.tolist() == [float(len(line["response_ids"])) for line in lines]
