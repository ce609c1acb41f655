"""A rollouts file's per-token rewards reach PPO's GAE at their own tokens (issue 38): a row's
``rewards`` are not summed into one score at its last token; a multi-turn row's observation
tokens (loss_mask 0) are skipped as GAE skips them."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from proxrl.algos.online import grpo, ppo
from proxrl.algos.online.client import TrainingClient
from proxrl.core import gae
from proxrl.runtime.errors import ProxrlError

# Row 1 (multi-turn): model tokens 0, 1, 3; token 2 an observation; rewards 0.25 at token 0 and
# 0.5 at token 3. Row 2: one reward, 1.0: the score at its last token.
ROWS = [
    {
        "prompt_ids": [5, 6],
        "response_ids": [7, 8, 9, 10],
        "logprobs": [-0.5, -1.0, 0.0, -0.7],
        "loss_mask": [1, 1, 0, 1],
        "rewards": [0.25, 0.0, 0.0, 0.5],
        "group": "a",
    },
    {
        "prompt_ids": [5, 6],
        "response_ids": [7, 9],
        "logprobs": [-0.3, -0.2],
        "reward": 1.0,
        "group": "a",
    },
]
AT_TOKENS = [[0.25, 0.0, 0.0, 0.5], [0.0, 1.0, 0.0, 0.0]]  # (B, T) where GAE must see them
MASK = [[1, 1, 0, 1], [1, 1, 0, 0]]
# γ = 1, λ = 0.5, V ≡ 0 (a fresh value head): A_t = r_t + 0.5·A_next over model tokens.
# Row 1: A_3 = 0.5, A_1 = 0 + 0.25 = 0.25, A_0 = 0.25 + 0.125 = 0.375. Row 2: A_1 = 1,
# A_0 = 0.5. (Summed into one score at the last token, row 1 would read 0.1875, 0.375, ·, 0.75.)
BY_HAND = [[0.375, 0.25, 0.0, 0.5], [0.5, 1.0, 0.0, 0.0]]


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def _config(tiny_lm: str, out: Path, rollouts: Path, command: str = "ppo", **overrides):
    """ppo (a fresh value head, γ = 1, λ = 0.5, no KL, advantages not whitened) or grpo on
    the rollouts file, float64."""
    fields = dict(
        model=tiny_lm,
        rollouts_file=str(rollouts),
        output_dir=str(out),
        iterations=2,
        rollout_batch_size=1,
        group_size=2,
        mini_batch_size=2,
        max_new_tokens=8,
        learning_rate=3e-3,
        lr_schedule="constant",
        dtype="float64",
        save_every=0,
        sample_every=0,
        progress=False,
        report_to=["none"],
        seed=3,
    )
    if command == "grpo":
        return grpo.Config(**(fields | overrides))
    critic = dict(critic="head", critic_learning_rate=3e-2, gamma=1.0, lam=0.5, kl_coef=0.0)
    return ppo.Config(**(fields | critic | dict(whiten_advantages=False) | overrides))


@pytest.fixture
def rollouts(tmp_path: Path) -> Path:
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


def test_gae_takes_a_files_rewards_at_their_tokens(tiny_lm, rollouts, tmp_path):
    """PPO's estimate on the file's rollout (read by the client): the rewards at their tokens,
    and GAE over them equals core.gae on the hand-placed rewards, with V ≡ 0 (advantages by
    hand) and with any values."""
    cfg = _config(tiny_lm, tmp_path / "x", rollouts)
    client = TrainingClient(config=cfg)
    batch = client.logprobs(client.read_rollouts(rollouts), recorded=True)
    assert torch.equal(batch.loss_mask.float(), t(MASK).float())
    assert batch.scores.tolist() == [0.75, 1.0]  # the critic-free estimators' sequence score
    estimate = ppo.build(cfg).estimate
    rewards, advantages, returns = estimate(replace(batch, values=t(MASK) * 0), 0.0)
    torch.testing.assert_close(rewards, t(AT_TOKENS), rtol=0, atol=1e-12)
    torch.testing.assert_close(advantages, t(BY_HAND), rtol=0, atol=1e-12)
    values = t([[0.5, -1.0, 2.0, 0.25], [-0.75, 0.125, 0.0, 0.0]]) * t(MASK)
    rewards, advantages, returns = estimate(replace(batch, values=values), 0.0)
    expected, expected_returns = gae(t(AT_TOKENS), values, t(MASK), 1.0, 0.5)
    torch.testing.assert_close(advantages, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(returns, expected_returns, rtol=0, atol=1e-12)


def test_ppo_trains_on_a_files_per_token_rewards(tiny_lm, rollouts, tmp_path, monkeypatch):
    """proxrl ppo on the file, end to end: every iteration's advantages are GAE over the
    rewards at their tokens under that iteration's values (V ≡ 0 first: the hand numbers; then
    the trained head's), the loss mask skipping the observation; the policy moves."""
    from safetensors.torch import load_file

    from proxrl.runtime.metrics import read_metrics

    seen = _estimates(monkeypatch)
    ppo.train(_config(tiny_lm, tmp_path / "run", rollouts))
    assert len(seen) == 2 and len(read_metrics(tmp_path / "run")) == 2
    for exp in seen:
        torch.testing.assert_close(exp.rewards.double(), t(AT_TOKENS), rtol=0, atol=1e-12)
        expected, _ = gae(t(AT_TOKENS), exp.values.double(), t(MASK), 1.0, 0.5)
        torch.testing.assert_close(exp.advantages.double(), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(seen[0].advantages.double(), t(BY_HAND), rtol=0, atol=1e-12)
    assert seen[1].values.abs().max() > 1e-3  # the second iteration's values are not 0
    start = load_file(Path(tiny_lm) / "model.safetensors")
    end = load_file(tmp_path / "run" / "model.safetensors")
    assert not all(torch.equal(start[k].to(end[k].dtype), end[k]) for k in start)
    assert all(math.isfinite(v) for v in read_metrics(tmp_path / "run")[-1].values() if v == v)


def _estimates(monkeypatch: pytest.MonkeyPatch) -> list:
    """Every iteration's experience once the loop's estimator has filled it, as a run makes
    them."""
    from proxrl.algos.online import loop

    seen = []
    estimate = loop.estimate

    def recording(*args):
        estimated = estimate(*args)
        seen.append(estimated)
        return estimated

    monkeypatch.setattr(loop, "estimate", recording)
    return seen


def test_the_shaping_rules_change_the_sum_at_the_last_token(
    tiny_lm, rollouts, tmp_path, monkeypatch
):
    """reward_clip 0.5 clips the scores 0.75 and 1 to 0.5: row 1's change (−0.25) joins its last
    model token's 0.5, row 2's (−0.5) its reward; the other tokens keep theirs."""
    seen = _estimates(monkeypatch)
    ppo.train(_config(tiny_lm, tmp_path / "run", rollouts, iterations=1, reward_clip=0.5))
    assert seen[0].scores.tolist() == [0.5, 0.5]
    clipped = [[0.25, 0.0, 0.0, 0.25], [0.0, 0.5, 0.0, 0.0]]
    torch.testing.assert_close(seen[0].rewards.double(), t(clipped), rtol=0, atol=1e-12)


def write_parquet(rows: list[dict], path: Path) -> Path:
    """The rows as a Parquet table, a field a row lacks null in it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = list(dict.fromkeys(k for row in rows for k in row))
    pq.write_table(pa.table({k: [row.get(k) for row in rows] for k in names}), path)
    return path


@pytest.mark.parametrize("command", ["ppo", "grpo"])
def test_the_same_rollouts_as_jsonl_and_parquet_train_to_the_same_weights(
    command, tiny_lm, rollouts, tmp_path
):
    """One file in both formats (rows with and without loss_mask, reward and rewards: nulls
    in Parquet): the same metrics and weights, bit for bit."""
    from safetensors.torch import load_file

    from proxrl.runtime.metrics import read_metrics

    parquet = write_parquet(ROWS, tmp_path / "rollouts.parquet")
    weights, metrics = [], []
    for name, path in (("jsonl", rollouts), ("parquet", parquet)):
        cfg = _config(tiny_lm, tmp_path / name, path, command)
        (ppo if command == "ppo" else grpo).train(cfg)
        weights.append(load_file(tmp_path / name / "model.safetensors"))
        metrics.append(read_metrics(tmp_path / name))
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    drop = ("time/", "perf/")
    assert [{k: v for k, v in row.items() if not k.startswith(drop)} for row in metrics[0]] == [
        {k: v for k, v in row.items() if not k.startswith(drop)} for row in metrics[1]
    ]
    start = load_file(Path(tiny_lm) / "model.safetensors")
    assert not all(torch.equal(start[k].to(weights[1][k].dtype), weights[1][k]) for k in start)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"logprobs": [-0.3, 0.5]}, r"logprobs: expected finite log-probabilities <= 0"),
        ({"response_ids": [7, 10**6]}, r"response_ids: token id 1000000 is outside"),
        ({"reward": None}, r"reward: expected reward \(a number\) or rewards"),
    ],
)
def test_a_bad_parquet_row_is_refused_with_file_and_row(bad, message, tiny_lm, tmp_path):
    """The second row (row 1: rows count from 0, as for a data file's Parquet rows) is bad."""
    client = TrainingClient(config=_config(tiny_lm, tmp_path / "x", tmp_path / "r.parquet"))
    path = write_parquet([ROWS[0], {**ROWS[1], **bad}], tmp_path / "r.parquet")
    with pytest.raises(ProxrlError, match=rf"r\.parquet:row 1: {message}"):
        client.read_rollouts(path)
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(ProxrlError, match=r"rollouts_file: cannot read .*broken.parquet as Parq"):
        client.read_rollouts(tmp_path / "broken.parquet")
