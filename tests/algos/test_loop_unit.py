"""loop.py's stages called one at a time (issue 54): what each hands the next, at its
boundaries. No model is loaded and no trainer runs: a run is a namespace of recorders, so a
mutant of the loop's wiring (an argument dropped, a condition turned, an off-by-one in the
iteration it reports) fails here in milliseconds. The run tests cover the stages together."""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from proxrl.algos.online import loop
from proxrl.algos.online.collect import RolloutBatch
from proxrl.algos.online.prompts import PromptDraw
from proxrl.algos.online.update import UpdateStep
from proxrl.data.formats import PromptExample
from proxrl.rollout.rewards import TrainerState
from tests.algos.test_client_checks_unit import F64, experience


class Spy:
    """Any method call is recorded in the shared ``calls`` as (``name.method``, args, kwargs)
    and answered from ``answers`` (a value, or a function of the call's arguments)."""

    def __init__(self, calls: list, name: str, **answers: Any) -> None:
        self._calls, self._name, self._answers = calls, name, answers

    def __getattr__(self, method: str) -> Any:
        if method.startswith("__"):
            raise AttributeError(method)

        def call(*args: Any, **kwargs: Any) -> Any:
            self._calls.append((f"{self._name}.{method}", args, kwargs))
            answer = self._answers.get(method)
            return answer(*args, **kwargs) if callable(answer) else answer

        return call


def names(calls: list) -> list[str]:
    return [name for name, _, _ in calls]


class Clock:
    def __init__(self, *times: float) -> None:
        self.times = list(times)

    def perf_counter(self) -> float:
        return self.times.pop(0)


def fake_run(calls: list, **over: Any) -> SimpleNamespace:
    """The fields of an ``OnlineRun`` the stages read; every collaborator a ``Spy``."""
    run = SimpleNamespace(
        settings=SimpleNamespace(
            loop=SimpleNamespace(
                iterations=4,
                save_every=0,
                sample_every=0,
                progress=False,
                task_reward=True,
                mask_truncated=False,
                distill="DISTILL",
                mixed_precision="no",
                drawing=SimpleNamespace(group_size=2, dynamic_sampling=False),
                recorded=SimpleNamespace(rollouts_file=None),
            ),
            collecting="COLLECTING",
            updating="UPDATING",
            controlling=SimpleNamespace(samples_per_measure=8, ref_reset_every=0),
        ),
        algo=SimpleNamespace(name="grpo", penalty=None),
        models=SimpleNamespace(
            actor=Spy(calls, "actor", state_dict={"w": 1}),
            critic=Spy(calls, "critic", rollout_metrics={"value/x": 1.0}),
            reference=None,
            tokenizer=SimpleNamespace(pad_token_id=0),
        ),
        train_models="TRAIN_MODELS",
        rewards=SimpleNamespace(trainer_state=None),
        prompts=[PromptExample(p, None, f"p{i}") for i, p in enumerate("abc")],
        prompt_ids=[[1], [2], [3]],
        held_out=None,
        output_dir=None,
        context=Spy(calls, "context", learning_rate=0.25, log=lambda step, row: dict(row)),
        optimizers="OPTIMIZERS",
        kl=Spy(calls, "kl"),
        generator="GENERATOR",
        engine=Spy(calls, "engine", after_update={"time/sync_s": 0.5}),
        guard=Spy(calls, "guard", metrics={"guard/skips": 0.0}),
        start=0,
        extra_rounds=0,
        last={},
        policy_iterations=0,
        empty_iterations=0,
        warned_empty=False,
        warned_masked=False,
    )
    run.kl.value = 0.125
    run.models.critic.warmup_iterations = 0
    for name, value in over.items():
        setattr(run, name, value)
    return run


def scored(scores: list[float]) -> Any:
    """A rollout of ``len(scores)`` rows: ``experience``'s two rows, repeated."""
    n = len(scores)
    base = experience()
    return experience(
        prompt_ids=base.prompt_ids.repeat(n // 2, 1),
        prompt_mask=base.prompt_mask.repeat(n // 2, 1),
        response_ids=base.response_ids.repeat(n // 2, 1),
        response_mask=base.response_mask.repeat(n // 2, 1),
        values=torch.zeros(n, 2, dtype=F64),
        scores=torch.tensor(scores, dtype=F64),
    )


# ---------------------------------------------------------------------------- small stages


def test_namespaced_puts_the_updates_stats_under_their_metric_names():
    stats = {"loss": 1.0, "value_loss": 2.0, "objective/kl": 3.0, "clipfrac": 4.0}
    assert loop.namespaced(stats) == {
        "policy/total_loss": 1.0,
        "value/loss": 2.0,
        "objective/kl": 3.0,  # already namespaced
        "policy/clipfrac": 4.0,
    }


def test_progress_figures_show_the_score_only_with_a_task_reward():
    row = {"objective/scores": 0.5, "objective/kl": 0.1, "train/lr": 1e-3, "other": 9.0}
    assert loop.progress_figures(True, row) == {"score": 0.5, "kl": 0.1, "lr": 1e-3}
    teacher = {"train/lr": 2.0, "distill/reverse_kl": 0.3, "distill/loss": 0.7}
    assert loop.progress_figures(False, teacher) == {
        "teacher_kl": 0.3,
        "distill_loss": 0.7,
        "lr": 2.0,
    }


def test_save_due_every_save_every_iterations_but_not_the_last():
    assert [loop.save_due(2, 6, done) for done in range(1, 7)] == [
        False,
        True,
        False,
        True,
        False,
        False,  # the last is finish's
    ]
    assert not any(loop.save_due(0, 6, done) for done in range(1, 7))
    assert loop.save_due(1, 3, 2) and not loop.save_due(1, 3, 3)


def test_a_warming_critic_ends_its_warmup_when_its_loss_stalls(caplog):
    calls: list = []
    run = fake_run(calls)
    run.models.critic = Spy(calls, "critic", end_warmup_iteration=True)
    with caplog.at_level(logging.INFO, logger=loop.__name__):
        loop.end_warmup_if_stalled(run, 4, {"value_loss": 0.25}, train_policy=False)
    assert calls == [("critic.end_warmup_iteration", (4, 0.25), {})]
    assert caplog.messages == ["iteration 5: the critic's warm-up ends (value loss stalled)"]
    calls.clear()
    loop.end_warmup_if_stalled(run, 4, {"value_loss": 0.25}, train_policy=True)
    loop.end_warmup_if_stalled(run, 4, {}, train_policy=False)  # no critic loss: no critic
    assert calls == []
    caplog.clear()
    run.models.critic = Spy(calls, "critic", end_warmup_iteration=False)
    with caplog.at_level(logging.INFO, logger=loop.__name__):
        loop.end_warmup_if_stalled(run, 1, {"value_loss": 1.0}, train_policy=False)
    assert names(calls) == ["critic.end_warmup_iteration"] and caplog.text == ""


def test_iteration_metrics_join_the_stages_records():
    calls: list = []
    run = fake_run(calls)
    exp = scored([1.0, 1.0, 0.0, 2.0, 3.0, 3.0])  # groups of 2: two of three constant
    batch = RolloutBatch(exp, [], [], {"objective/scores": 0.5})
    row = loop.iteration_metrics(run, 0.25, batch, exp, {"loss": 1.5}, rollout_ok=True)
    assert row == {
        "objective/scores": 0.5,
        "train/lr": 0.25,
        "sampling/constant_groups": 2.0,
        "policy/total_loss": 1.5,
        "value/x": 1.0,
    }
    assert calls == [("critic.rollout_metrics", (exp,), {})]
    run.settings.loop.drawing.group_size = 1  # no groups
    calls.clear()
    row = loop.iteration_metrics(run, 0.25, batch, exp, {}, rollout_ok=False)
    assert row == {"objective/scores": 0.5, "train/lr": 0.25} and calls == []
    assert batch.metrics == {"objective/scores": 0.5}  # the batch's record is not written to


def test_inspect_rollout_asks_the_guard_only_about_a_non_finite_rollout():
    calls: list = []
    exp = replace(experience(), advantages=torch.zeros(2, 2, dtype=F64))
    run = fake_run(calls, guard=Spy(calls, "guard", problem=None, check=False))
    assert loop.inspect_rollout(run, exp, 6) is True
    assert names(calls) == ["guard.problem"]
    tensors = calls[0][2]["tensors"]
    assert list(tensors) == ["scores", "rewards", "advantages"]
    assert tensors["scores"] is exp.scores and tensors["advantages"] is exp.advantages
    assert tensors["rewards"] is exp.rewards
    calls.clear()
    run.guard = Spy(calls, "guard", problem="scores: nan", check=False)
    assert loop.inspect_rollout(run, exp, 6) is False
    assert names(calls) == ["guard.problem", "guard.check"] and calls[1][1] == (7,)
    assert calls[1][2]["tensors"] == tensors
    run.guard = Spy(calls, "guard", problem="scores: nan", check=True)  # under its skip limit
    assert loop.inspect_rollout(run, exp, 6) is True


def test_train_tells_the_engine_then_updates_only_a_good_rollout(monkeypatch):
    calls: list = []
    run = fake_run(calls)
    monkeypatch.setattr(loop, "update", lambda *a: calls.append(("update", a, {})) or {"loss": 1})
    monkeypatch.setattr(loop, "time", Clock(10.0, 12.5, 20.0, 20.25))
    step = UpdateStep(0.125, True, 3)
    stats = loop.train(run, "TRAINED", step, rollout_ok=True)
    assert names(calls) == ["actor.train", "engine.before_update", "update"]
    assert calls[1][1] == (2,)
    assert calls[2][1] == (
        "UPDATING",
        run.algo,
        "TRAIN_MODELS",
        "TRAINED",
        "OPTIMIZERS",
        step,
        "GENERATOR",
        run.guard,
    )
    assert stats == {"loss": 1, "time/update_s": 2.5}
    calls.clear()
    stats = loop.train(run, "TRAINED", step, rollout_ok=False)
    assert names(calls) == ["actor.train", "engine.before_update"]
    assert stats == {"time/update_s": 0.25}


def test_the_controllers_measure_the_rollouts_kl_and_reset_the_reference():
    calls: list = []
    run = fake_run(calls)
    batch = RolloutBatch(experience(), [], [], {"objective/kl": 0.5})
    assert loop.update_controllers(run, batch, {}, True, True, 0) == {}
    assert calls == [("kl.update", (0.5, 8), {})]
    calls.clear()  # the update's KL, where the rollout ran no π_old pass
    loop.update_controllers(run, batch, {"objective/kl": 0.75}, True, True, 0)
    assert calls == [("kl.update", (0.75, 8), {})]
    calls.clear()
    loop.update_controllers(run, RolloutBatch(experience(), [], [], {}), {}, True, True, 0)
    assert calls == [("kl.update", (0.0, 8), {})]
    calls.clear()
    loop.update_controllers(run, batch, {}, False, True, 0)  # a skipped rollout measures nothing
    assert calls == []
    # PPO-Penalty's β moves with a step of the policy
    penalty = Spy(calls, "penalty")
    penalty.value = 2.5
    run.algo.penalty = penalty
    got = loop.update_controllers(run, batch, {"steps": 2, "approx_kl": 0.01}, False, True, 0)
    assert got == {"policy/penalty_beta": 2.5} and calls == [("penalty.update", (0.01,), {})]
    calls.clear()
    assert loop.update_controllers(run, batch, {"steps": 2}, False, True, 0) == {
        "policy/penalty_beta": 2.5
    }
    assert calls == [("penalty.update", (0.0,), {})]
    calls.clear()
    assert loop.update_controllers(run, batch, {"steps": 0}, False, True, 0) == {}
    assert loop.update_controllers(run, batch, {"steps": 2}, False, False, 0) == {}  # warming
    assert calls == []
    # the reference copied from the policy every ref_reset_every iterations
    run.algo.penalty = None
    run.models.reference = Spy(calls, "reference")
    run.settings.controlling.ref_reset_every = 3
    reset_at = []
    for iteration in range(7):
        calls.clear()
        loop.update_controllers(run, batch, {}, False, True, iteration)
        if "reference.load_state_dict" in names(calls):
            reset_at.append(iteration)
    assert reset_at == [2, 5]  # after the 3rd and the 6th iteration (0-based 2 and 5)
    calls.clear()
    loop.update_controllers(run, batch, {}, False, True, 8)
    assert calls == [
        ("actor.state_dict", (), {}),
        ("reference.load_state_dict", ({"w": 1},), {}),
    ]
    calls.clear()
    run.models.reference = None  # none kept (KL not tracked)
    loop.update_controllers(run, batch, {}, False, True, 2)
    assert calls == []


def test_mostly_empty_iterations_warn_once(caplog):
    run = fake_run([])
    empty = {"skipped_steps": 1.0}
    with caplog.at_level(logging.WARNING, logger=loop.__name__):
        loop.warn_if_mostly_empty(run, 0, empty)
        loop.warn_if_mostly_empty(run, 1, {"steps": 1.0})
        assert (run.policy_iterations, run.empty_iterations) == (2, 1) and caplog.text == ""
        loop.warn_if_mostly_empty(run, 2, empty)  # 2 of 3: most
    assert (run.policy_iterations, run.empty_iterations, run.warned_empty) == (3, 2, True)
    assert caplog.messages == [
        "iteration 3: 2 of 3 iterations so far took no policy step (every group's scores "
        "equal: a zero gradient, see policy/skipped_steps); the policy learns nothing from "
        "them: try dynamic_sampling: true, a larger group_size or a higher temperature"
    ]
    caplog.clear()
    loop.warn_if_mostly_empty(run, 3, empty)
    assert caplog.text == "" and run.empty_iterations == 3


def test_half_empty_is_not_mostly_empty_and_the_count_waits_for_three(caplog):
    run = fake_run([])
    with caplog.at_level(logging.WARNING, logger=loop.__name__):
        loop.warn_if_mostly_empty(run, 0, {"skipped_steps": 1.0})
        loop.warn_if_mostly_empty(run, 1, {"skipped_steps": 1.0})  # 2 of 2, but only 2 so far
    assert (run.policy_iterations, run.empty_iterations) == (2, 2) and caplog.text == ""
    run = fake_run([])
    with caplog.at_level(logging.WARNING, logger=loop.__name__):
        loop.warn_if_mostly_empty(run, 0, {"steps": 1.0})
        loop.warn_if_mostly_empty(run, 1, {"skipped_steps": 1.0})
        loop.warn_if_mostly_empty(run, 2, {"steps": 2.0, "skipped_steps": 1.0})  # a step moved
        loop.warn_if_mostly_empty(run, 3, {"skipped_steps": 1.0})  # 2 of 4: half
    assert (run.policy_iterations, run.empty_iterations) == (4, 2) and caplog.text == ""
    assert not run.warned_empty


def test_steps_masked_whole_by_mask_truncated_warn_once_and_are_not_empty(caplog):
    run = fake_run([])
    masked = {"masked_steps": 2.0, "skipped_steps": 2.0, "steps": 1.0}
    with caplog.at_level(logging.WARNING, logger=loop.__name__):
        for iteration in range(4):
            loop.warn_if_mostly_empty(run, iteration, {"masked_steps": 2.0, "skipped_steps": 2.0})
    assert caplog.messages == [
        "iteration 1: in 2 of 2 optimizer steps every response hit max_new_tokens, and "
        "mask_truncated left nothing to train on (counted in policy/masked_steps): raise "
        "max_new_tokens, or set mask_truncated: false"
    ]
    assert run.warned_masked and run.empty_iterations == 0  # not a zero-gradient iteration
    caplog.clear()
    run = fake_run([])
    with caplog.at_level(logging.WARNING, logger=loop.__name__):
        loop.warn_if_mostly_empty(run, 4, masked)
    assert "in 2 of 3 optimizer steps" in caplog.text and "iteration 5:" in caplog.text


# ---------------------------------------------------------------------------- samples


def test_samples_are_written_on_the_first_every_nth_and_last_iteration(monkeypatch):
    written: list = []
    monkeypatch.setattr(loop, "write_samples", lambda *a, **k: written.append((a, k)))
    run = fake_run([], output_dir="OUT")
    run.settings.loop.sample_every, run.settings.loop.iterations = 3, 5
    exp = scored([0.5, 1.5])
    batch = RolloutBatch(exp, ["x", "y"], [2, 0], {})
    for iteration in range(5):
        loop.write_samples_if_due(run, iteration, batch, exp)
    assert [a[1] for a, _ in written] == [1, 4, 5]
    args, kwargs = written[0]
    assert args == ("OUT", 1, [run.prompts[2], run.prompts[0]], ["x", "y"], exp.scores)
    assert kwargs == {"show": False}
    written.clear()
    run.settings.loop.progress = True
    own = [PromptExample("z", None, "f:1"), PromptExample("w", None, "f:2")]
    loop.write_samples_if_due(run, 0, replace(batch, prompts=own), exp)  # a rollouts file's
    assert written[0][0][2] == own and written[0][1] == {"show": True}
    written.clear()
    run.settings.loop.sample_every = 0
    for iteration in range(5):
        loop.write_samples_if_due(run, iteration, batch, exp)
    assert written == []


def test_write_samples_appends_each_row_as_the_data_set_had_its_prompt(tmp_path, caplog):
    said = [{"role": "user", "content": "hi"}]
    prompts = [PromptExample("ab", None, "p:1"), PromptExample("", said, "p:2")]
    scores = torch.tensor([0.5, -1.25])
    with caplog.at_level(logging.INFO, logger=loop.__name__):
        loop.write_samples(tmp_path, 3, prompts, ["c", "d"], scores)
        loop.write_samples(tmp_path, 4, prompts[:1], ["é"], scores[:1])
    assert caplog.messages == []  # shown only when asked
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert rows == [
        {"iteration": 3, "prompt": "ab", "completion": "c", "score": 0.5},
        {"iteration": 3, "prompt": said, "completion": "d", "score": -1.25},
        {"iteration": 4, "prompt": "ab", "completion": "é", "score": 0.5},
    ]
    with pytest.raises(ValueError):  # a completion per prompt
        loop.write_samples(tmp_path, 6, prompts, ["c"], scores)


def test_shown_samples_are_the_first_three_as_a_table(tmp_path, caplog, monkeypatch):
    tables = []
    monkeypatch.setattr(loop, "rendered", lambda table: tables.append(table) or "TABLE %d")
    said = [{"role": "user", "content": "hi"}]
    prompts = [PromptExample("ab", None, "p:1"), PromptExample("", said, "p:2")] * 2
    scores = torch.tensor([0.5, -1.25, 2.0, 3.0])
    with caplog.at_level(logging.INFO, logger=loop.__name__):
        loop.write_samples(tmp_path, 7, prompts, ["c", "d", "e", "f"], scores, show=True)
    assert caplog.messages == ["TABLE %d"]
    (table,) = tables
    assert table.title == "samples at iteration 7" and table.show_lines is True
    assert [(c.header, c.overflow) for c in table.columns] == [
        ("prompt", "fold"),
        ("completion", "fold"),
        ("score", "fold"),
    ]
    assert [list(c.cells) for c in table.columns] == [
        ["ab", str(said), "ab"],
        ["c", "d", "e"],
        ["0.500", "-1.250", "2.000"],
    ]
    loop.write_samples(tmp_path, 8, prompts, ["c", "d", "e", "f"], scores, show=True, shown=1)
    assert [list(c.cells) for c in tables[1].columns] == [["ab"], ["c"], ["0.500"]]


# ---------------------------------------------------------------------------- the rollout


def recorded_autocast(monkeypatch: pytest.MonkeyPatch, calls: list) -> None:
    """loop's ``autocast`` replaced by a context that records its precision in ``calls``."""

    @contextmanager
    def autocast(precision):  # type: ignore[no-untyped-def]
        calls.append(("autocast", (precision,), {}))
        yield

    monkeypatch.setattr(loop, "autocast", autocast)


def test_the_rollout_samples_the_draws_prompts(monkeypatch):
    calls: list = []
    run = fake_run(calls)
    exp = scored([1.0, 2.0])
    monkeypatch.setattr(
        loop,
        "collect_rollout",
        lambda *a: calls.append(("collect", a, {})) or (exp, ["c"], {"m": 1}),
    )
    run.settings.loop.drawing = Spy(calls, "drawing", draw=PromptDraw([2, 0], [2, 2, 0, 0]))
    run.settings.loop.drawing.dynamic_sampling = False
    run.settings.loop.mixed_precision = "bf16"
    recorded_autocast(monkeypatch, calls)
    timings: dict = {}
    batch = loop.rollout(run, 5, timings)
    assert names(calls) == ["drawing.draw", "autocast", "collect"] and calls[0][1] == (3, 5)
    assert calls[1][1] == ("bf16",)
    del calls[1]
    assert calls[1][1] == (
        "COLLECTING",
        run.algo,
        run.models,
        run.rewards,
        [run.prompts[2], run.prompts[0]],
        [[3], [1]],
        0.125,
        timings,
        run.engine,
    )
    assert (batch.experience, batch.completions, batch.rows, batch.metrics) == (
        exp,
        ["c"],
        [2, 2, 0, 0],
        {"m": 1},
    )


def test_dynamic_sampling_draws_past_the_extra_rounds_and_counts_them(monkeypatch):
    calls: list = []
    run = fake_run(calls, extra_rounds=2)
    run.models.tokenizer.pad_token_id = 9
    run.settings.loop.drawing.dynamic_sampling = True
    made = RolloutBatch(experience(), [], [], {}, extra_rounds=3)
    rounds: list = []

    def dynamic(drawing, sample_round, n, pad_id, timings, draw):  # type: ignore[no-untyped-def]
        rounds.append((drawing, n, pad_id, timings, draw))
        sample_round(PromptDraw([1], [1, 1]), {})  # a round samples the draw's prompts
        return made

    exp = scored([1.0, 2.0])
    monkeypatch.setattr(loop, "collect_rollout", lambda *a: calls.append(a) or (exp, [], {}))

    monkeypatch.setattr(loop, "dynamic_rollout", dynamic)
    timings: dict = {}
    assert loop.rollout(run, 4, timings) is made
    assert rounds == [(run.settings.loop.drawing, 3, 9, timings, 6)]
    assert calls[0][4:6] == ([run.prompts[1]], [[2]])
    assert run.extra_rounds == 5


def test_a_rollouts_files_batch_is_read_not_sampled(monkeypatch):
    calls: list = []
    run = fake_run(calls)
    run.settings.loop.recorded.rollouts_file = "r.jsonl"
    made = RolloutBatch(experience(), [], [], {})
    recorded_autocast(monkeypatch, calls)
    monkeypatch.setattr(loop, "recorded_rollout", lambda *a: calls.append(("read", a, {})) or made)
    timings: dict = {}
    assert loop.rollout(run, 0, timings) is made
    assert calls == [
        ("autocast", ("no",), {}),
        ("read", (run.settings.loop.recorded, "COLLECTING", run.models, 0.125, timings), {}),
    ]


# ---------------------------------------------------------------------------- one iteration


def staged(monkeypatch, calls: list, batch: RolloutBatch, **over: Any) -> None:
    """Each stage of ``run_iteration`` replaced by a recorder of what it is handed."""
    estimated = replace(batch.experience, advantages=torch.ones(2, 2, dtype=F64))

    def stage(name: str, answer: Any) -> Any:
        def call(*args: Any) -> Any:
            calls.append((name, args, {}))
            return answer(*args) if callable(answer) else answer

        return call

    stages = {
        "rollout": lambda run, it, timings: timings.update({"time/rollout_s": 1.0}) or batch,
        "estimate": estimated,
        "without_truncated": "MASKED",
        "inspect_rollout": True,
        "train": lambda *a: {"loss": 0.5, "time/update_s": 3.0},
        "end_warmup_if_stalled": None,
        "update_controllers": {"policy/penalty_beta": 0.5},
        "warn_if_mostly_empty": None,
        "iteration_metrics": lambda run, lr, b, exp, stats, ok: {"train/lr": lr} | stats,
        "write_samples_if_due": None,
    } | over
    for name, answer in stages.items():
        monkeypatch.setattr(loop, name, stage(name, answer))
    monkeypatch.setattr(loop, "time", Clock(10.0, 12.0))


def test_an_iteration_hands_each_stage_the_last_ones_output(monkeypatch):
    calls: list = []
    run = fake_run(calls)
    exp = scored([1.0, 2.0])
    batch = RolloutBatch(exp, ["a", "b"], [0, 0], {"objective/kl": 0.5})
    staged(monkeypatch, calls, batch)
    health = Spy(calls, "health")
    row, stop = loop.run_iteration(run, 2, health)
    assert names(calls) == [
        "context.learning_rate",
        "actor.eval",
        "rollout",
        "estimate",
        "inspect_rollout",
        "train",
        "end_warmup_if_stalled",
        "engine.after_update",
        "update_controllers",
        "warn_if_mostly_empty",
        "iteration_metrics",
        "guard.metrics",
        "context.log",
        "health.observe",
        "write_samples_if_due",
    ]
    by_name = {name: args for name, args, _ in calls}
    assert by_name["context.learning_rate"] == (3,)
    assert run.rewards.trainer_state == TrainerState(2, 3, 4)
    assert by_name["rollout"][:2] == (run, 2)
    assert by_name["estimate"] == (run.algo, exp, 0.125, "DISTILL")
    estimated = by_name["inspect_rollout"][1]
    assert by_name["inspect_rollout"] == (run, estimated, 2) and estimated.advantages is not None
    assert by_name["train"] == (run, estimated, UpdateStep(0.125, True, 3), True)
    assert by_name["end_warmup_if_stalled"] == (run, 2, {"loss": 0.5}, True)
    assert by_name["engine.after_update"] == (run.models.actor, 3)
    assert by_name["update_controllers"] == (run, batch, {"loss": 0.5}, True, True, 2)
    assert by_name["warn_if_mostly_empty"] == (run, 2, {"loss": 0.5})
    assert by_name["iteration_metrics"] == (
        run,
        0.25,
        batch,
        estimated,
        {"loss": 0.5, "policy/penalty_beta": 0.5},
        True,
    )
    assert row == {
        "train/lr": 0.25,
        "loss": 0.5,
        "policy/penalty_beta": 0.5,
        "guard/skips": 0.0,
        "perf/tokens_per_s": 1.5,  # 3 response tokens in 2 s
        "time/iteration_s": 2.0,
        "time/rollout_s": 1.0,
        "time/update_s": 3.0,
        "time/sync_s": 0.5,
    }
    assert by_name["context.log"] == (3, row) and run.last == row and run.last is not row
    assert by_name["health.observe"] == (3, run.last)
    assert by_name["write_samples_if_due"] == (run, 2, batch, estimated)
    assert stop is False


def test_a_warming_critic_masked_rows_and_a_skipped_rollout_change_what_the_update_gets(
    monkeypatch,
):
    calls: list = []
    run = fake_run(calls)
    run.models.critic.warmup_iterations = 3
    run.settings.loop.mask_truncated = True
    batch = RolloutBatch(scored([1.0, 2.0]), [], [0, 0], {})
    staged(monkeypatch, calls, batch, inspect_rollout=False)
    loop.run_iteration(run, 2, Spy(calls, "health"))
    by_name = {name: args for name, args, _ in calls}
    estimated = by_name["inspect_rollout"][1]
    assert by_name["without_truncated"] == (estimated,)
    assert by_name["train"] == (run, "MASKED", UpdateStep(0.125, False, 3), False)
    assert by_name["end_warmup_if_stalled"][3] is False
    assert by_name["update_controllers"][3:5] == (False, False)
    assert "warn_if_mostly_empty" not in by_name  # neither training the policy nor a rollout
    calls.clear()
    run.models.critic.warmup_iterations = 2  # the first iteration that trains the policy
    staged(monkeypatch, calls, batch, inspect_rollout=False)
    loop.run_iteration(run, 2, Spy(calls, "health"))
    by_name = {name: args for name, args, _ in calls}
    assert by_name["train"][2] == UpdateStep(0.125, True, 3)
    assert "warn_if_mostly_empty" not in by_name  # a skipped rollout trained nothing


def test_held_out_patience_stops_the_run(monkeypatch):
    calls: list = []
    held_out = Spy(calls, "held_out", step=True)
    run = fake_run(calls, held_out=held_out)
    batch = RolloutBatch(scored([1.0, 2.0]), [], [0, 0], {})
    staged(monkeypatch, calls, batch)
    row, stop = loop.run_iteration(run, 0, Spy(calls, "health"))
    assert stop is True
    step = next(args for name, args, _ in calls if name == "held_out.step")
    assert step == (1, row, run.models)


# ---------------------------------------------------------------------------- the driver


class Stopped(Exception):
    """``Run.interrupted``'s exception here (the real one is ``errors.Interrupted``). Not a
    KeyboardInterrupt: raised by a mutant out of another test, pytest would stop the session."""


class Context:
    """``Run.running``'s context: the bar, the stop flag, what finished and was saved."""

    def __init__(self, calls: list, stop_after: int | None = None) -> None:
        self.calls, self.stop_after, self.bar = calls, stop_after, Spy(calls, "bar")

    @property
    def stop_requested(self) -> bool:
        done = sum(name == "context.finished" for name, _, _ in self.calls)
        return self.stop_after is not None and done >= self.stop_after - 1

    def finished(self, done: int, **counters: Any) -> None:
        self.calls.append(("context.finished", (done,), counters))

    def interrupted(self, path: Any) -> Exception:
        return Stopped(path)


def driven(monkeypatch, calls: list, rows: list[tuple[dict, bool]], context: Context, **over):
    run = fake_run(calls, **over)
    run.save = lambda done: calls.append(("run.save", (done,), {})) or f"ckpt-{done}"
    run.context.save_finished = "SAVE_FINISHED"

    @contextmanager
    def running(*args: Any, **kwargs: Any):  # type: ignore[no-untyped-def]
        calls.append(("context.running", args, kwargs))
        yield context

    run.context.running = running
    placement = Spy(calls, "placement", stop="STOP")
    answers = iter(rows)
    monkeypatch.setattr(loop, "open_run", lambda *a: calls.append(("open_run", a, {})) or run)
    monkeypatch.setattr(loop, "health_monitor", lambda r: "HEALTH" if r is run else None)
    monkeypatch.setattr(
        loop,
        "run_iteration",
        lambda r, it, h: (
            calls.append(("iteration", (it, h), {})) or next(answers) if r is run else None
        ),
    )
    monkeypatch.setattr(
        loop,
        "finish",
        lambda r, done: calls.append(("finish", (done,), {})) or {"x": 1.0} if r is run else None,
    )
    return run, placement


ROW = {"objective/scores": 0.5, "train/lr": 0.1}


def test_the_driver_runs_each_iteration_saves_when_due_and_finishes(monkeypatch):
    calls: list = []
    context = Context(calls)
    run, placement = driven(monkeypatch, calls, [(ROW, False)] * 3, context, start=1)
    run.settings.loop.save_every, run.settings.loop.iterations = 2, 4
    run.extra_rounds = 7
    cfg = SimpleNamespace()
    assert loop.train_online(cfg, run.algo, placement) == {"x": 1.0}
    assert calls[0] == ("open_run", (cfg, run.algo, placement), {})
    assert calls[2] == (
        "context.running",
        (4, "grpo", 1, "STOP"),
        {"save_on_error": "SAVE_FINISHED"},
    )
    assert names(calls)[3:] == [
        "iteration",
        "bar.update",
        "run.save",  # after iteration 2 of 4
        "context.finished",
        "iteration",
        "bar.update",
        "context.finished",
        "iteration",
        "bar.update",
        "context.finished",
        "finish",
    ]
    assert [args for name, args, _ in calls if name == "iteration"] == [
        (1, "HEALTH"),
        (2, "HEALTH"),
        (3, "HEALTH"),
    ]
    assert calls[4] == ("bar.update", (1,), {"score": 0.5, "lr": 0.1})
    assert calls[5][1] == (2,)
    finished = [(args, kw) for name, args, kw in calls if name == "context.finished"]
    assert finished[0] == ((2,), {"iteration": 2, "extra_rounds": 7})
    assert [args for args, _ in finished] == [(2,), (3,), (4,)]
    assert calls[-1] == ("finish", (4,), {})


def test_the_driver_stops_early_without_a_periodic_save(monkeypatch):
    calls: list = []
    rows = [(ROW, False), (ROW, True), (ROW, False)]
    run, placement = driven(monkeypatch, calls, rows, Context(calls))
    run.settings.loop.save_every, run.settings.loop.iterations = 2, 4
    loop.train_online(SimpleNamespace(), run.algo, placement)
    assert "run.save" not in names(calls)  # iteration 2 was due, but the run stops there
    assert names(calls)[-2:] == ["context.finished", "finish"] and calls[-1][1] == (2,)


def test_a_stop_signal_saves_the_next_iteration_and_raises(monkeypatch):
    calls: list = []
    run, placement = driven(monkeypatch, calls, [(ROW, False)] * 4, Context(calls, stop_after=2))
    with pytest.raises(Stopped) as stopped:
        loop.train_online(SimpleNamespace(), run.algo, placement)
    assert stopped.value.args == ("ckpt-2",)
    assert [args for name, args, _ in calls if name == "run.save"] == [(2,)]
    # a signal during the one before the last: saved there, the last is not run
    calls.clear()
    run, placement = driven(monkeypatch, calls, [(ROW, False)] * 4, Context(calls, stop_after=3))
    with pytest.raises(Stopped):
        loop.train_online(SimpleNamespace(), run.algo, placement)
    assert [args for name, args, _ in calls if name == "run.save"] == [(3,)]
    # a signal during the last iteration: finish saves it
    calls.clear()
    run, placement = driven(monkeypatch, calls, [(ROW, False)] * 4, Context(calls, stop_after=4))
    loop.train_online(SimpleNamespace(), run.algo, placement)
    assert "run.save" not in names(calls) and calls[-1] == ("finish", (4,), {})


def test_a_held_out_run_that_already_stopped_runs_no_iteration(monkeypatch):
    calls: list = []
    held_out = SimpleNamespace(stopped=True)
    run, placement = driven(monkeypatch, calls, [], Context(calls), start=2, held_out=held_out)
    loop.train_online(SimpleNamespace(), run.algo, placement)
    assert "iteration" not in names(calls) and calls[-1] == ("finish", (2,), {})
    calls.clear()
    held_out.stopped = False
    run, placement = driven(
        monkeypatch, calls, [(ROW, False)] * 2, Context(calls), start=2, held_out=held_out
    )
    loop.train_online(SimpleNamespace(), run.algo, placement)
    assert [args[0] for name, args, _ in calls if name == "iteration"] == [2, 3]


def test_finish_saves_what_this_process_ran_then_closes(monkeypatch):
    calls: list = []
    saved: list = []
    monkeypatch.setattr(loop, "save_policy", lambda models, out: saved.append((models, out)))
    held_out = Spy(calls, "held_out")
    run = fake_run(calls, start=1, output_dir="OUT", held_out=held_out, last={"x": 2.0})
    run.save = lambda done: calls.append(("run.save", (done,), {}))
    assert loop.finish(run, 3) == {"x": 2.0}
    assert names(calls) == ["run.save", "held_out.finish", "engine.close", "context.close"]
    assert calls[0][1] == (3,) and calls[1][1] == ("OUT",)
    assert saved == [(run.models, "OUT")]
    calls.clear()
    run.held_out = None
    loop.finish(run, 1)  # nothing ran past the restored iteration
    assert names(calls) == ["engine.close", "context.close"]


def test_save_policy_writes_the_policy_its_tokenizer_and_the_critic(monkeypatch):
    calls: list = []
    monkeypatch.setattr(loop, "save_model", lambda *a: calls.append(("save_model", a, {})))
    monkeypatch.setattr(loop, "save_tokenizer", lambda *a: calls.append(("save_tokenizer", a, {})))
    run = fake_run(calls)
    loop.save_policy(run.models, "OUT")
    assert calls == [
        ("save_model", (run.models.actor, "OUT", None), {}),
        ("save_tokenizer", (run.models.tokenizer, "OUT", "left"), {}),
        ("critic.save_pretrained", ("OUT", None), {}),
    ]


def test_a_sharded_policy_and_critic_are_gathered_on_every_rank_and_written_by_rank_0(monkeypatch):
    calls: list = []
    monkeypatch.setattr(loop, "save_model", lambda *a: calls.append(("save_model", a, {})))
    monkeypatch.setattr(loop, "save_tokenizer", lambda *a: calls.append(("save_tokenizer", a, {})))
    main = [True]
    fsdp = SimpleNamespace(
        is_sharded=lambda: True,
        is_main=lambda: main[0],
        full_state=lambda state: {"whole": state},
    )
    monkeypatch.setattr(loop, "dist", fsdp)
    run = fake_run(calls)
    head, other = Spy(calls, "head", state_dict={"v": 1}), Spy(calls, "other", state_dict={"u": 2})
    run.models.critic = Spy(calls, "critic", modules=[head, other])
    loop.save_policy(run.models, "OUT")
    assert [c for c in calls if c[0] in ("save_model", "critic.save_pretrained")] == [
        ("save_model", (run.models.actor, "OUT", {"whole": {"w": 1}}), {}),
        ("critic.save_pretrained", ("OUT", {"whole": {"v": 1}}), {}),
    ]
    assert "other.state_dict" in names(calls)  # every critic module joins the gathers
    calls.clear()
    main[0] = False
    loop.save_policy(run.models, "OUT")
    assert names(calls) == [
        "actor.state_dict",
        "critic.modules",
        "head.state_dict",
        "other.state_dict",
    ]
