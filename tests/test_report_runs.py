"""``proxrl report`` on runs that are not the demo's (issue 23): a classic run gets the plots of
its own metrics and its summary.json as a table (not the demo's KeyError), a run without a
summary.json still gets its plots, and a run stopped before its last step is marked incomplete."""

from __future__ import annotations

import pytest
import torch

from proxrl import cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = ["--env", "CartPole-v1", "--num-envs", "2", "--num-steps", "64", "--minibatch-size", "32"]
TINY += ["--epochs", "1", "--no-progress", "--save-every", "1", "--total-steps", "256"]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def test_a_classic_run_gets_its_plots_its_summary_and_the_incomplete_mark(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli.main(["classic", "--output-dir", str(run), *TINY, "--stop-at-step", "128"]) == 0
    assert cli.main(["report", str(run)]) == 0
    report = (run / "report.md").read_text()
    for panel in ("episodic_return", "value_loss", "entropy", "clip_fraction"):
        assert (run / "plots" / f"{panel}.png").read_bytes().startswith(PNG_MAGIC), panel
        assert f"![{panel}](plots/{panel}.png)" in report
    assert "Runs: run (**incomplete**: stopped at step 128 of 256)." in report
    assert "## Summary" in report and "| env | CartPole-v1 |" in report
    assert "| complete | False |" in report

    # Without its summary.json the plots are still drawn.
    (run / "summary.json").unlink()
    for png in (run / "plots").iterdir():
        png.unlink()
    assert cli.main(["report", str(run)]) == 0
    assert (run / "plots" / "episodic_return.png").read_bytes().startswith(PNG_MAGIC)
    assert "## Summary" not in (run / "report.md").read_text()

    # Finished: no longer marked.
    assert cli.main(["classic", "--output-dir", str(run), "--resume"]) == 0
    assert cli.main(["report", str(run)]) == 0
    assert "Runs: run.\n" in (run / "report.md").read_text()


def _png_width(path) -> int:
    return int.from_bytes(path.read_bytes()[16:20], "big")  # the IHDR chunk's width


def test_runs_with_different_rewards_get_their_own_axis(tmp_path):
    """The demo's layout: two PPO runs on the reward model (gold logged at weight 0) and a GRPO
    run on the 0/1 gold reward. Their scores are in other units, so the score panel has one
    sub-panel per reward (GRPO's curve is not flattened against reward-model scores); the KL
    panel, in nats for every run, stays one axis."""
    import json

    import yaml

    from proxrl.report import panel_groups, unit_of, write_report

    rewards = {
        "ppo": [1.0, 0.0],
        "ppo_no_kl": [1.0, 0.0],
        "grpo": [0.0, 1.0],
        "grpo_mixed": [0.5, 1.0],
    }
    configs = {}
    for name, weights in rewards.items():
        (tmp_path / name).mkdir()
        rows = [
            {
                "step": s,
                "objective/scores": s * (0.01 if "grpo" in name else 1.0),
                "objective/kl": s,
            }
            for s in range(1, 21)
        ]
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        configs[name] = {
            "reward_model": ["runs/demo/rm"],
            "reward_fn": ["proxrl.demo.task:gold"],
            "reward_weights": weights,
        }
        (tmp_path / name / "config.yaml").write_text(yaml.safe_dump(configs[name]))
    lines = [(name, [1], [1.0]) for name in rewards]
    for panel, want in {
        "score": [
            ("runs/demo/rm", ["ppo", "ppo_no_kl"]),
            ("proxrl.demo.task:gold", ["grpo"]),
            ("0.5 × runs/demo/rm, proxrl.demo.task:gold", ["grpo_mixed"]),
        ],
        "kl": [(None, list(rewards))],
    }.items():
        units = {name: unit_of(panel, config) for name, config in configs.items()}
        got = [(unit, [line[0] for line in group]) for unit, group in panel_groups(lines, units)]
        assert got == want, panel
    assert unit_of("score", {"environment": "m:env"}) == "environment m:env"
    assert unit_of("episodic_return", {"env": "Hopper-v5"}) == "env Hopper-v5"

    write_report(tmp_path)
    assert _png_width(tmp_path / "plots" / "score.png") == 3 * _png_width(
        tmp_path / "plots" / "kl.png"
    )


def test_distillation_and_held_out_runs_get_their_panels_and_the_best_score(tmp_path):
    """A distillation run (distill/reverse_kl, gjsd's distill/loss) and a run evaluated on
    held-out prompts every 5 iterations (eval/score 0.2, 0.9, 0.9, 0.5: the best 0.9 first at
    iteration 10): each gets its panel, and the held-out section names the last and the best
    score (issue 51: the report had neither)."""
    import json

    from proxrl.report import unit_of, write_report

    evals = {5: 0.2, 10: 0.9, 15: 0.9, 20: 0.5}
    runs = {
        "distill": [
            {"step": s, "objective/scores": 0.0, "distill/reverse_kl": 1 / s, "distill/loss": s}
            for s in range(1, 21)
        ],
        "heldout": [
            {"step": s, "objective/scores": s} | ({"eval/score": evals[s]} if s in evals else {})
            for s in range(1, 21)
        ],
    }
    for name, rows in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = write_report(tmp_path).read_text()
    for panel in ("teacher_kl", "distill_loss", "heldout_score"):
        assert (tmp_path / "plots" / f"{panel}.png").read_bytes().startswith(PNG_MAGIC), panel
        assert f"![{panel}](plots/{panel}.png)" in report
    assert (
        "- heldout: 4 evaluations; last eval/score 0.5 (iteration 20); best 0.9 (iteration 10)"
        in report
    )
    assert "- distill:" not in report
    assert unit_of("heldout_score", {"reward_fn": ["m:f"]}) == "m:f"
    assert unit_of("heldout_score", {"reward_fn": ["m:f"], "eval_reward_fn": "m:g"}) == (
        "eval_reward_fn m:g"
    )
