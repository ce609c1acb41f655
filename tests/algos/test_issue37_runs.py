"""Issue 37's options in short real runs of the online loop (tiny model): GDPO's per-source
rewards reach the estimate through the rollout, the masks and the covariance losses train and
log their shares, and Clip-Cov's draw is the run generator's (a rerun draws the same)."""

from __future__ import annotations

import json
import math

import pytest

from proxrl.algos.online import grpo
from proxrl.runtime.metrics import read_metrics
from tests.algos.test_online import WORDS, _grpo_learns, small

TWO_REWARDS = (
    "tests.algos.online_rewards:target_fraction",
    "tests.algos.online_rewards:echoes_word",
)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": f"say: {w} ->", "word": w}) + "\n" for w in WORDS)
    )
    return str(path)


def test_gdpo_trains_on_two_reward_functions(tiny_lm, prompts, tmp_path, monkeypatch):
    """Two reward functions of different scales: the rollout keeps the normalised weighted sum
    (``combined_scores``), and every iteration's advantages are the batch-whitened sum (mean 0,
    unbiased std 1 up to ε) whatever the raw scores' scale."""
    from proxrl.algos.online import loop

    seen = []
    estimate = loop.estimate

    def spy(algo, experience, kl_coef, *rest):  # type: ignore[no-untyped-def]
        out = estimate(algo, experience, kl_coef, *rest)
        seen.append((experience.combined_scores.clone(), out.advantages[:, 0].clone()))
        return out

    monkeypatch.setattr(loop, "estimate", spy)
    cfg = small(
        grpo.Config,
        tiny_lm,
        prompts,
        tmp_path,
        iterations=2,
        group_size=4,
        mini_batch_size=32,
        estimator="gdpo",
        reward_fn=TWO_REWARDS,
        reward_weights=(1.0, 0.5),
    )
    grpo.train(cfg)
    rows = read_metrics(tmp_path)
    assert len(rows) == 2 and all(math.isfinite(r["policy/total_loss"]) for r in rows)
    assert seen, "the estimate stage was not reached"
    for combined, advantages in seen:
        assert combined.shape == (32,)
        if bool((combined != combined[0]).any()):
            assert abs(float(advantages.mean())) < 1e-5
            assert math.isclose(float(advantages.std()), 1.0, rel_tol=1e-4)


@pytest.mark.parametrize(
    "options",
    [
        {"policy_loss": "dppo_tv", "dppo_delta_high": 1e-3, "dppo_delta_low": 1e-3},
        {"policy_loss": "dppo_kl"},
        {"off_policy_mask": "opsm", "opsm_delta": 1e-4},
        {"off_policy_mask": "m2po", "m2po_tau": 1e-4},
        {"policy_loss": "unclipped", "off_policy_mask": "m2po", "m2po_tau": 1e-4},
        {"policy_loss": "clip_cov", "clip_cov_lb": -1.0, "clip_cov_ratio": 0.2},
        {"policy_loss": "kl_cov", "kl_cov_ratio": 0.2},
        {"estimator": "maxrl"},
        {"estimator": "asymre"},
    ],
    ids=lambda o: "-".join(str(v) for v in o.values()),
)
def test_each_option_trains_with_stale_epochs(options, tiny_lm, prompts, tmp_path):
    """Four epochs over each rollout (π moves away from π_old), two iterations: finite losses,
    and the masks' and covariance losses' shares logged."""
    cfg = small(
        grpo.Config, tiny_lm, prompts, tmp_path, iterations=2, group_size=2, ppo_epochs=4,
        mini_batch_size=8, **options,
    )  # fmt: skip
    grpo.train(cfg)
    rows = read_metrics(tmp_path)
    assert len(rows) == 2 and all(math.isfinite(r["policy/total_loss"]) for r in rows)
    share = {"off_policy_mask": "policy/off_policy_masked", "clip_cov": "policy/cov_dropped"}
    key = share.get(next(iter(options)), share.get(str(options.get("policy_loss"))))
    if key is not None:  # the mask or selection acted on some tokens, not on all
        assert all(0.0 <= r[key] < 1.0 for r in rows) and any(r[key] > 0 for r in rows)


def test_clip_cov_draws_from_the_run_generator(tiny_lm, prompts, tmp_path, monkeypatch):
    """The same seed twice, torch's global generator reseeded (to another seed in each run)
    for every update and restored after it, so the sampler's stream is the same: the same
    losses over two iterations (the draw is the run generator's, seeded by the config and saved
    with the checkpoint, not torch's global one, which the run also seeds); the window is wide
    and 20% of the tokens drawn, so there is a draw to repeat."""
    import torch

    from proxrl.algos.online import loop

    options = dict(policy_loss="clip_cov", clip_cov_lb=-1.0, clip_cov_ratio=0.2, ppo_epochs=2)
    update, finals = loop.update, []

    def global_rng_elsewhere(seed):  # type: ignore[no-untyped-def]
        def wrapped(*args, **kwargs):  # type: ignore[no-untyped-def]
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                return update(*args, **kwargs)

        return wrapped

    for run, seed in (("a", 11), ("b", 22)):
        monkeypatch.setattr(loop, "update", global_rng_elsewhere(seed))
        cfg = small(grpo.Config, tiny_lm, prompts, tmp_path / run, iterations=2, group_size=2,
                    mini_batch_size=8, **options)  # fmt: skip
        grpo.train(cfg)
        rows = read_metrics(tmp_path / run)
        assert all(r["policy/cov_dropped"] > 0 for r in rows)
        finals.append([r["policy/total_loss"] for r in rows])
    assert finals[0] == finals[1]


def test_clip_cov_moves_the_run_generator_by_one_draw_per_update():
    """Every rank draws the same minibatches from the run's generator: clip_cov's own draws come
    from a child seeded by one draw of it, however many steps draw; other losses leave
    it untouched."""
    import torch

    from proxrl.algos.online.update import loss_generator

    run, reference = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert loss_generator(grpo.Config.policy_loss, run) is None  # the default loss (ppo)
    assert torch.equal(run.get_state(), reference.get_state())
    child = loss_generator("clip_cov", run)
    assert child is not None
    torch.randperm(1000, generator=child)  # a micro-batch's draw
    torch.randint(0, 2**62, (), generator=reference)
    assert torch.equal(run.get_state(), reference.get_state())


@pytest.mark.parametrize(
    "overrides",
    [
        {"policy_loss": "dppo_tv"},
        {"policy_loss": "dppo_kl"},
        {"policy_loss": "clip_cov"},
        {"policy_loss": "kl_cov"},
        {"off_policy_mask": "opsm"},
        {"off_policy_mask": "m2po"},
        {"policy_loss": "unclipped", "off_policy_mask": "m2po"},  # M2PO as its paper states it
    ],
    ids=lambda o: str(next(iter(o.values()))),
)
def test_the_new_losses_and_masks_raise_a_learnable_reward(overrides, tiny_lm, prompts, tmp_path):
    """As test_online's surrogates: 30 iterations, 2 epochs, defaults of each option."""
    _grpo_learns(tiny_lm, prompts, tmp_path, **overrides)
