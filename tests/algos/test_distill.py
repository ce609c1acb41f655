"""On-policy distillation on tiny models: the teacher's term reaches every estimator's
advantages exactly, pure distillation (no task reward) moves a student of another
architecture toward the teacher in both forms, gjsd's step is invariant to micro-batching, and
a run killed after its first checkpoint resumes to the very weights of an uninterrupted one."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from proxrl.algos.online import grpo, ppo
from proxrl.algos.online.advantages import estimate
from proxrl.cli import main
from proxrl.rollout.experience import Experience
from proxrl.runtime.metrics import read_metrics
from tests.algos.killed_runs import comparable, sigkill_after_first_checkpoint
from tests.algos.test_loss_invariance import _assert_invariant, _step

WORDS = ["abc", "def", "ghi", "jkl"]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in WORDS))
    return str(path)


def _fields(tiny_lm: str, teacher: str, prompts: str, out: Path, **overrides) -> dict:
    return {
        "model": tiny_lm,
        "prompts": prompts,
        "teacher_model": teacher,
        "output_dir": str(out),
        "iterations": 3,
        "rollout_batch_size": 4,
        "group_size": 2,
        "max_new_tokens": 8,
        "temperature": 1.0,
        "mini_batch_size": 8,
        "learning_rate": 3e-3,
        "kl_coef": 0.0,
        "track_kl": False,
        "progress": False,
        "seed": 3,
    } | overrides


def _rollout(B: int = 4, T: int = 5) -> Experience:
    g = torch.Generator().manual_seed(0)
    mask = (torch.arange(T)[None, :] < torch.tensor([5, 2, 3, 1])[:, None]).float()
    logprobs = -torch.rand(B, T, generator=g) * mask
    return Experience(
        prompt_ids=torch.ones(B, 2, dtype=torch.long),
        prompt_mask=torch.ones(B, 2, dtype=torch.long),
        response_ids=torch.ones(B, T, dtype=torch.long),
        response_mask=mask.long(),
        logprobs=logprobs,
        ref_logprobs=logprobs - 0.1 * mask,
        values=torch.zeros(B, T),
        scores=torch.tensor([1.0, 0.0, 0.5, 0.25]),
        greedy_scores=torch.tensor([0.5, 0.5, 0.2, 0.2]),
        combined_scores=torch.tensor([1.0, -1.0, 0.5, -0.5]),
        teacher_logprobs=(-torch.rand(B, T, generator=g) * 3) * mask,
        teacher_argmax=torch.ones(B, T, dtype=torch.long),
    )


@pytest.mark.parametrize("estimator", [*grpo.ESTIMATORS])
def test_every_estimator_gets_the_teacher_term_exactly(estimator):
    """Â_t = A_t − λ·(log π_old − log π_T) at every sampled token, 0 elsewhere (λ = 0.5, k1),
    whatever the estimator made of the scores; the rewards and returns are the task's."""
    base = {"model": "m", "prompts": "p", "group_size": 2, "kl_coef": 0.1}
    plain = grpo.Config(**base, estimator=estimator, reward_fn=("m:f",))
    taught = grpo.Config(**base, estimator=estimator, teacher_model="t", distill_coef=0.5)
    rollout = _rollout()
    without = estimate(grpo.build(plain), rollout, 0.1, plain)
    with_teacher = estimate(grpo.build(taught), rollout, 0.1, taught)
    mask = rollout.loss_mask.float()
    expected = -0.5 * (rollout.logprobs - rollout.teacher_logprobs) * mask
    torch.testing.assert_close(with_teacher.advantages - without.advantages, expected)
    assert torch.equal(with_teacher.returns, without.returns)
    assert torch.equal(with_teacher.rewards, without.rewards)


def test_ppo_gets_the_term_after_its_critic_and_whitening():
    """PPO's GAE advantages (whitened) plus the teacher's term, the value targets untouched."""
    base = {"model": "m", "prompts": "p", "kl_coef": 0.1}
    plain = ppo.Config(**base, reward_fn=("m:f",))
    taught = ppo.Config(**base, teacher_model="t", distill_kl_estimator="k3")
    rollout = _rollout()
    without = estimate(ppo.build(plain), rollout, 0.1, plain)
    with_teacher = estimate(ppo.build(taught), rollout, 0.1, taught)
    log_ratio = rollout.teacher_logprobs - rollout.logprobs
    expected = -(torch.expm1(log_ratio) - log_ratio) * rollout.loss_mask.float()
    torch.testing.assert_close(with_teacher.advantages - without.advantages, expected)
    assert torch.equal(with_teacher.returns, without.returns)


def test_a_teacher_alone_is_a_valid_config_and_no_teacher_needs_a_reward():
    grpo.Config(model="m", prompts="p", teacher_model="t").validate()
    with pytest.raises(Exception, match="or a teacher_model alone"):
        grpo.Config(model="m", prompts="p").validate()


def _teacher_logprobs(out: Path) -> list[float]:
    return [row["distill/teacher_logprob"] for row in read_metrics(out)]


@pytest.mark.parametrize(
    ("distill_loss", "prompts_per_iteration", "learning_rate"),
    [("reverse_kl_reward", 8, 3e-2), ("gjsd", 4, 2e-2)],
)
def test_pure_distillation_moves_a_student_of_another_architecture_to_the_teacher(
    distill_loss,
    prompts_per_iteration,
    learning_rate,
    tiny_lm,
    tiny_teacher,
    prompts,
    tmp_path,
    caplog,
):
    """No task reward: the student (32 wide, 2 layers, near uniform) samples, the teacher (48
    wide, 1 layer, 0.64 of its mass on ten letters) scores. Within 10 iterations the reverse
    KL per token falls from ~0.9 to under half of it and the teacher's log-prob of the student's
    tokens rises by more than 1 nat (measured: 0.9 → 0.15 and −6.6 → −3.3 for
    reverse_kl_reward; 0.95 → 0.0 and −6.7 → −4.0 for gjsd). The progress lines show the
    teacher's KL (and gjsd's loss), not a score that is 0 throughout (issue 51)."""
    fields = _fields(
        tiny_lm,
        tiny_teacher,
        prompts,
        tmp_path,
        iterations=10,
        rollout_batch_size=prompts_per_iteration,
        group_size=4,
        mini_batch_size=4 * prompts_per_iteration,
        distill_loss=distill_loss,
        learning_rate=learning_rate,
        lr_schedule="constant",
        progress=True,  # (pytest's capture is no terminal: the bar is a line per 10%)
    )
    cfg = grpo.Config(**fields)
    cfg.validate()
    with caplog.at_level(logging.INFO, logger="proxrl.runtime.metrics"):
        grpo.train(cfg)
    lines = [r.getMessage() for r in caplog.records if r.name == "proxrl.runtime.metrics"]
    assert len(lines) == 10 and all(" teacher_kl " in line for line in lines), lines
    assert not any(" score " in line for line in lines), lines
    assert all((" distill_loss " in line) == (distill_loss == "gjsd") for line in lines)
    rows = read_metrics(tmp_path)
    teacher = [r["distill/teacher_logprob"] for r in rows]
    reverse_kl = [r["distill/reverse_kl"] for r in rows]
    print(distill_loss, [round(x, 2) for x in teacher], [round(x, 2) for x in reverse_kl])
    assert sum(teacher[-2:]) / 2 > sum(teacher[:2]) / 2 + 1.0, teacher
    assert sum(reverse_kl[-2:]) / 2 < 0.5 * sum(reverse_kl[:2]) / 2, reverse_kl
    assert all(0 <= r["distill/teacher_argmax_agreement"] <= 1 for r in rows)
    assert ("distill/loss" in rows[0]) == (distill_loss == "gjsd")


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_gjsd_step_is_invariant_to_micro_batching(beta, tiny_lm, tiny_teacher, tmp_path):
    """The full-vocabulary term reduced as every other term: 1, 2 or 4 micro-batches give one
    gradient (test_loss_invariance's hand-built ragged rollout, float64), and the term is in
    that gradient (a step without it is another)."""
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "say: abc ->"}) + "\n")
    gjsd = dict(
        teacher_model=tiny_teacher,
        distill_loss="gjsd",
        distill_beta=beta,
        distill_chunk_size=2,
        distill_coef=2.0,
    )
    _assert_invariant(grpo, tiny_lm, str(path), tmp_path, **gjsd)
    with_term = _step(grpo, tiny_lm, str(path), tmp_path, 1, **gjsd)
    without = _step(grpo, tiny_lm, str(path), tmp_path, 1)
    assert float((with_term - without).abs().max()) > 1e-2 * float(with_term.abs().max())


def test_a_killed_distillation_run_resumes_to_the_same_weights(
    tiny_lm, tiny_teacher, prompts, tmp_path
):
    """grpo with a task reward and a teacher (reverse_kl_reward), 4 iterations, a checkpoint
    every 2: SIGKILL after the first, --resume: the metrics rows (distill/ ones included) and
    the final weights equal an uninterrupted run's bit for bit."""

    def config(out: Path) -> Path:
        fields = _fields(
            tiny_lm,
            tiny_teacher,
            prompts,
            out,
            iterations=4,
            save_every=2,
            reward_fn=["tests.algos.online_rewards:target_fraction"],
            distill_coef=0.5,
        )
        path = out.with_suffix(".yaml")
        path.write_text(yaml.safe_dump(fields))
        return path

    whole, killed = tmp_path / "whole", tmp_path / "killed"
    sigkill_after_first_checkpoint(
        ["grpo", "--config", str(config(killed))], killed, tmp_path / "killed.log"
    )
    assert main(["grpo", "--config", str(config(whole))]) == 0
    assert main(["grpo", "--config", str(config(killed)), "--resume", "True"]) == 0
    rows = read_metrics(whole)
    assert all("distill/teacher_logprob" in r for r in rows)
    assert comparable(read_metrics(killed)) == comparable(rows)
    a, b = load_file(whole / "model.safetensors"), load_file(killed / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_teacher_scores_a_rollouts_file_as_it_scores_samples(tiny_lm, tiny_teacher, tmp_path):
    """Trajectories produced elsewhere (rollouts_file): the teacher scores their tokens at the
    run's temperature (0.7: at 1.0 a teacher scored at 1.0 would pass), and distill/reverse_kl
    of the first iteration is the file's recorded log π minus the teacher's log-probs of the
    same tokens, averaged over them."""
    from proxrl.algos.online.client import TrainingClient
    from proxrl.models.causal_lm import load_causal_lm
    from proxrl.rollout.forward import frozen_pass
    from tests.algos.test_client import config
    from tests.algos.test_client_rollouts import write_rollouts

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in WORDS))
    writer = TrainingClient(config=config(tiny_lm, str(prompts), tmp_path / "w", seed=5))
    rollouts = tmp_path / "rollouts.jsonl"
    rollout = write_rollouts(writer, rollouts)["rollout"]
    cfg = config(
        tiny_lm,
        "",
        tmp_path / "run",
        reward_fn=(),
        rollouts_file=str(rollouts),
        rollout_batch_size=2,
        mini_batch_size=2,
        teacher_model=tiny_teacher,
        temperature=0.7,
    )
    cfg.validate()
    grpo.train(cfg)
    first = read_metrics(tmp_path / "run")[0]
    teacher = load_causal_lm(tiny_teacher, dtype="float64").eval()
    prompt_mask, mask = rollout.stage.prompt_mask, rollout.response_mask
    with torch.no_grad():
        logprobs, _ = frozen_pass(
            teacher,
            torch.cat([rollout.prompt_ids, rollout.response_ids], 1),
            torch.cat([prompt_mask, mask], 1),
            rollout.prompt_ids.shape[1],
            cfg.temperature,
            {"top_k": 0, "top_p": 1.0, "min_p": 0.0},
            packed=False,
        )
    assert cfg.temperature == 0.7
    recorded = rollout.logprobs.double()
    keep = mask.bool()
    expected = float((recorded[keep] - logprobs[keep]).mean())
    assert first["distill/reverse_kl"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(("offload", "frozen"), [(True, "cpu"), (False, "meta")])
def test_the_teacher_is_placed_as_the_reference(offload, frozen, monkeypatch):
    """On an accelerator (here the meta device stands in for one) the actor goes there; the
    reference and the teacher too, or both stay on the CPU under offload_frozen_roles."""
    from torch import nn

    from proxrl.algos.online import roles
    from proxrl.algos.online.critic import NoCritic
    from proxrl.rollout.rewards import WeightedRewards

    monkeypatch.setattr(roles.dist, "device", lambda: torch.device("meta"))
    models = roles.Models(
        actor=nn.Linear(2, 2),
        reference=nn.Linear(2, 2),
        critic=NoCritic(),
        tokenizer=None,
        teacher=nn.Linear(2, 2),
    )
    roles.place_roles(models, WeightedRewards([], []), offload_frozen=offload)
    where = {name: getattr(models, name).weight.device.type for name in ("actor", "reference")}
    where["teacher"] = models.teacher.weight.device.type
    assert where == {"actor": "meta", "reference": frozen, "teacher": frozen}


def test_the_teacher_pass_is_the_same_padded_and_packed(tiny_teacher):
    """Left-padded prompts, right-padded responses, temperature 0.7 and top-p 0.9: the packed
    teacher pass (max_tokens_per_micro_batch) gives the padded one's log-probs and argmax at
    every response token (float64)."""
    from proxrl.models.causal_lm import load_causal_lm
    from proxrl.rollout.forward import frozen_pass

    teacher = load_causal_lm(tiny_teacher, dtype="float64").eval()
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, 60, (3, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :2] = 0
    attention_mask[1, 7:] = 0
    attention_mask[2, 0] = attention_mask[2, 8] = 0
    input_ids = input_ids * attention_mask
    truncation = {"top_k": 0, "top_p": 0.9, "min_p": 0.0}
    with torch.no_grad():
        padded = frozen_pass(teacher, input_ids, attention_mask, 4, 0.7, truncation, False, True)
        packed = frozen_pass(teacher, input_ids, attention_mask, 4, 0.7, truncation, True, True)
    real = attention_mask[:, 4:].bool()
    torch.testing.assert_close(packed[0][real], padded[0][real], rtol=1e-12, atol=1e-12)
    assert torch.equal(packed[1][real], padded[1][real])
    assert (padded[0][real] < 0).all()


@pytest.mark.parametrize(
    ("command", "options"),
    [
        (ppo, {"critic_learning_rate": 1e-3}),  # a value head beside the teacher's term
        (grpo, {"dynamic_sampling": True}),  # rounds joined (teacher fields padded as the rest)
        (grpo, {"max_tokens_per_micro_batch": 24}),  # packed teacher and π_old passes
        (grpo, {"estimator": "remax", "offload_frozen_roles": True}),
    ],
)
def test_a_teacher_beside_a_task_reward_trains_with_the_loops_options(
    command, options, tiny_lm, tiny_teacher, prompts, tmp_path, monkeypatch
):
    """Each iteration's advantages are the task's estimate plus the teacher's term exactly, on
    log π_T that is the teacher's own at the sampling temperature (0.7) for every sampled
    token, whatever the option does to the rollout (joined rounds, packed passes, the reference
    offloaded, a critic)."""
    from proxrl.algos.online import loop
    from proxrl.algos.online.advantages import teacher_term
    from proxrl.models.causal_lm import load_causal_lm
    from proxrl.rollout.forward import frozen_pass

    seen = []

    def spy(algo, experience, kl_coef, distill):  # type: ignore[no-untyped-def]
        out = estimate(algo, experience, kl_coef, distill)
        task = estimate(algo, experience, kl_coef, None)  # no teacher: the task's own
        seen.append((experience, out.advantages - task.advantages))
        return out

    monkeypatch.setattr(loop, "estimate", spy)
    fields = _fields(
        tiny_lm,
        tiny_teacher,
        prompts,
        tmp_path,
        iterations=2,
        reward_fn=("tests.algos.online_rewards:target_fraction",),
        kl_coef=0.05,
        track_kl=True,
        temperature=0.7,
        distill_coef=0.5,
    )
    cfg = command.Config(**(fields | options))
    cfg.validate()
    command.train(cfg)
    rows = read_metrics(tmp_path)
    assert len(rows) == 2 and len(seen) == 2
    teacher = load_causal_lm(tiny_teacher, dtype="float32").eval()
    for row, (experience, added) in zip(rows, seen, strict=True):
        assert row["distill/teacher_logprob"] < 0 and math.isfinite(row["distill/reverse_kl"])
        assert "objective/kl" in row and "reward/target_fraction" in row
        mask = experience.loss_mask
        keep = mask.bool()
        term = teacher_term(cfg, experience)
        assert bool(term[keep].ne(0).any())
        torch.testing.assert_close(added, term, rtol=0, atol=1e-5)  # (float32: A + t − A)
        with torch.no_grad():
            by_hand, _ = frozen_pass(
                teacher,
                experience.input_ids,
                experience.attention_mask,
                experience.prompt_ids.shape[1],
                0.7,
                {"top_k": 0, "top_p": 1.0, "min_p": 0.0},
                packed=False,
            )
        recorded = experience.teacher_logprobs
        # (float32, packed or not: to 1e-5; the teacher at temperature 1 is ~0.1 off)
        torch.testing.assert_close(recorded[keep], by_hand[keep], rtol=0, atol=1e-5)
