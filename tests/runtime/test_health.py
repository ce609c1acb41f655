"""Training-health rules: each fires on a sick synthetic series (at the iteration worked out by
hand where the series is noise-free) and stays silent on a healthy one."""

from __future__ import annotations

import json
import logging
import math
import random
import re

import pytest

from proxrl.runtime import health
from proxrl.runtime.health import (
    HealthMonitor,
    clip_fraction_high,
    diagnose,
    entropy_collapse,
    explained_variance_negative,
    kl_runaway,
    length_balloon,
    noise,
    ratio_spread,
    render_markdown,
    reward_hacking,
    trailing_mean,
    value_loss_diverging,
)

STEPS = list(range(1, 101))


def noisy(values, sigma, seed):
    rng = random.Random(seed)
    return [v + rng.gauss(0, sigma) for v in values]


def test_trailing_mean_by_hand():
    # [1, 2, 3, 4] window 2: 1, (1+2)/2, (2+3)/2, (3+4)/2
    assert trailing_mean([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]


def test_noise_ignores_a_trend_and_measures_the_scatter():
    # A straight line has constant differences: MAD 0, so only the floor (1% of max |v| = 1.0).
    assert noise([float(s) for s in STEPS]) == pytest.approx(1.0)
    # Gaussian scatter σ = 0.5 on top of a trend: the estimate is near 0.5 (averaged over seeds:
    # one 100-point estimate scatters by ~20%).
    estimates = [noise(noisy([0.1 * s for s in STEPS], 0.5, seed)) for seed in range(20)]
    assert sum(estimates) / 20 == pytest.approx(0.5, rel=0.1)


def test_kl_runaway():
    # kl = 0.5 s; the 5-point trailing mean at s is 0.5 (s − 2) > 10 first at s = 23.
    assert kl_runaway(STEPS, [0.5 * s for s in STEPS]) == 23
    healthy = [2 * (1 - math.exp(-s / 20)) for s in STEPS]  # levels off at 2 nats
    assert kl_runaway(STEPS, healthy) is None


def test_kl_above_the_limit_during_warmup_only_is_not_reported():
    kl = [20.0 if s <= 5 else 1.0 for s in STEPS]  # trailing mean at s = 11..: 1
    assert kl_runaway(STEPS, kl) is None


def test_ratio_spread_and_clip_fraction():
    # approx-KL 0.01 until iteration 40, then 0.2: the trailing mean passes 0.05 when 2 of 5
    # points are 0.2 ((3·0.01 + 2·0.2)/5 = 0.086; one point gives 0.048): iteration 42.
    approx = [0.01 if s <= 40 else 0.2 for s in STEPS]
    assert ratio_spread(STEPS, approx) == 42
    assert ratio_spread(STEPS, [0.01] * 100) is None
    # clipfrac 0.1 then 0.5 from 60: (3·0.1 + 2·0.5)/5 = 0.26, (2·0.1 + 3·0.5)/5 = 0.34 → 62.
    clip = [0.1 if s < 60 else 0.5 for s in STEPS]
    assert clip_fraction_high(STEPS, clip) == 62
    assert clip_fraction_high(STEPS, [0.1] * 100) is None


def test_entropy_collapse():
    # warm-up mean 2.0; entropy 2 · 0.9^(s−10) after it: the trailing mean drops under 0.2
    entropy = [2.0 if s <= 10 else 2.0 * 0.9 ** (s - 10) for s in STEPS]
    since = entropy_collapse(STEPS, entropy)
    means = trailing_mean(entropy, 5)
    assert since == next(s for s, m in zip(STEPS, means, strict=True) if s > 10 and m < 0.2)
    # a healthy decline to half of the start
    assert entropy_collapse(STEPS, [2.0 - 0.01 * s for s in STEPS]) is None


def test_value_loss_diverging_and_explained_variance():
    # loss 1 until 50, then doubling: trailing means 1.2, 1.8, 3.2, 6.2 at 51..54 and
    # (2 + 4 + 8 + 16 + 32)/5 = 12.4 > 10 × 1 at 55.
    loss = [1.0 if s <= 50 else 2.0 ** (s - 50) for s in STEPS]
    expected = 55
    assert value_loss_diverging(STEPS, loss) == expected
    # measured from its lowest, not its start: 5 falling to 0.2 by 30, 0.1 to 40, then 2 (20×
    # the low, 0.4× the start): the trailing mean passes 10 × 0.1 = 1 with three points of 2,
    # (2 · 0.1 + 3 · 2)/5 = 1.24 at 43
    dip = [5.0 - 0.16 * s if s <= 30 else (0.1 if s <= 40 else 2.0) for s in STEPS]
    assert value_loss_diverging(STEPS, dip) == 43
    falling = [10.0 * math.exp(-s / 30) + 0.1 for s in STEPS]  # a critic that learns
    assert value_loss_diverging(STEPS, falling) is None
    # Explained variance starts at −1 (every critic does) and climbs to 0.8 by iteration 8:
    # nothing to report; one that stays negative is reported at the first step past warm-up.
    learning = [min(0.8, -1 + 0.25 * s) for s in STEPS]
    assert explained_variance_negative(STEPS, learning) is None
    assert explained_variance_negative(STEPS, [-0.3] * 100) == 11


def test_length_balloon_needs_both_longer_responses_and_a_rising_reward():
    reward = noisy([0.05 * s for s in STEPS], 0.1, seed=1)
    long = [2.0 if s <= 30 else 2.0 + 0.2 * (s - 30) for s in STEPS]
    since = length_balloon(STEPS, reward, long)
    # warm-up length 2; the trailing mean 2 + 0.2 (s − 32) passes 4 at s = 43, where the reward
    # has long risen (by ~2 against a noise of 0.1)
    assert since == 43
    assert length_balloon(STEPS, reward, [2.0] * 100) is None  # same length
    flat = noisy([1.0] * 100, 0.1, seed=1)
    assert length_balloon(STEPS, flat, long) is None  # longer but no better


def hacked_series(seed):
    """Proxy climbing throughout; gold rising to iteration 40, then falling."""
    proxy = noisy([0.1 * s for s in STEPS], 0.3, seed)
    gold = noisy([0.3 + 0.01 * min(s, 40) - 0.015 * max(s - 40, 0) for s in STEPS], 0.03, seed + 1)
    return proxy, gold


def test_reward_hacking_fires_after_the_held_out_peak():
    for seed in range(5):
        proxy, gold = hacked_series(seed)
        since = reward_hacking(STEPS, proxy, gold)
        assert since is not None and 41 <= since <= 60, (seed, since)


def test_reward_hacking_silent_when_both_rise_or_plateau():
    for seed in range(5):
        proxy = noisy([0.1 * s for s in STEPS], 0.3, seed)
        gold = noisy([0.3 + 0.5 * (1 - math.exp(-s / 20)) for s in STEPS], 0.05, seed + 1)
        assert reward_hacking(STEPS, proxy, gold) is None
        # held-out falls, but so does the trained reward: a run getting worse, not hacking
        falling = noisy([10 - 0.1 * s for s in STEPS], 0.3, seed)
        gold_down = noisy([0.8 - 0.005 * s for s in STEPS], 0.03, seed + 1)
        assert reward_hacking(STEPS, falling, gold_down) is None


def test_reward_hacking_on_sparse_evaluations_and_persistence():
    steps = list(range(5, 101, 5))
    # gold: 0.3, 0.35, ..., best 0.5 at step 25, then 0.1 lower per evaluation
    gold = [0.3 + 0.05 * i if i < 5 else 0.5 - 0.1 * (i - 4) for i in range(len(steps))]
    proxy = [float(i) for i in range(len(steps))]
    # Noise: the differences are mostly −0.1, so the MAD is 0 and the floor holds: 1% of the
    # largest |value| (1.0), a bar of 4 × 0.01 × √(2/2) = 0.04. Window 2: at step 30 the mean
    # (0.5 + 0.4)/2 = 0.45 is 0.025 under the best mean (0.45 + 0.5)/2 = 0.475: not yet; at 35,
    # 40, 45 it is 0.125, 0.225, 0.325 under: three points (window + 1) in a row, from 35.
    assert reward_hacking(steps, proxy, gold, window=2) == 35
    # One low evaluation drags two trailing means down, not three: no finding.
    one_dip = gold[:6] + [0.5] * (len(steps) - 6)
    assert reward_hacking(steps, proxy, one_dip, window=2) is None


def rows_of(**columns):
    return [
        {"step": s, **{name.replace("__", "/"): col[i] for name, col in columns.items()}}
        for i, s in enumerate(STEPS)
    ]


def test_diagnose_reads_the_rules_in_order_and_names_the_metric():
    proxy, gold = hacked_series(0)
    rows = rows_of(
        objective__kl=[0.5 * s for s in STEPS],
        objective__scores=proxy,
        reward__gold=gold,
        value__explained_var=[0.5] * 100,
    )
    findings = diagnose(rows)
    assert [f.rule for f in findings] == ["kl_runaway", "reward_hacking"]
    assert findings[0].since == 23 and findings[0].metric == "objective/kl"
    assert findings[1].metric == "objective/scores vs reward/gold"
    assert "kl_coef" in findings[0].remedy
    healthy = rows_of(objective__kl=[1.0] * 100, objective__scores=[0.01 * s for s in STEPS])
    assert diagnose(healthy) == []


def test_diagnose_pairs_an_eval_metric_with_the_reward_of_its_iteration():
    proxy = [0.1 * s for s in STEPS]
    rows = [{"step": s, "objective/scores": proxy[s - 1]} for s in STEPS]
    for i, s in enumerate(range(5, 101, 5)):
        rows[s - 1]["eval/score"] = 0.3 + 0.05 * i if i < 5 else 0.5 - 0.1 * (i - 4)
    (finding,) = diagnose(rows)
    # As the live warning reads it: on the rows up to step 40 the evaluations are 0.3 … 0.5,
    # 0.4, 0.3, 0.2; their differences' MAD is 0, so the floor holds: 1% of 0.5, a bar of
    # 4 × 0.005 × √(2/2) = 0.02 (the whole series' floor, 1% of |−1.0|, makes it 0.04 and 35).
    # At step 30 the mean 0.45 is 0.025 under the best 0.475 and the proxy's mean 4.5 is 1 over
    # 3.5 (bar 4 × 1% of 5 = 0.2); 35 and 40 follow: three in a row, from 30.
    assert finding.rule == "reward_hacking" and finding.since == 30
    assert finding.metric == "objective/scores vs eval/score"


def test_render_markdown_lists_each_run():
    rows = rows_of(objective__kl=[0.5 * s for s in STEPS])
    text = "\n".join(render_markdown({"sick": rows, "fine": rows_of(objective__kl=[1.0] * 100)}))
    assert "## Health" in text
    assert "**sick**:\n  - `kl_runaway` since iteration 23" in text
    assert "**fine**: no rule fired." in text


def test_monitor_warns_once_when_a_rule_first_fires(caplog):
    monitor = HealthMonitor()
    fired = []
    with caplog.at_level(logging.WARNING, logger=health.__name__):
        for s in STEPS:
            fired += [(s, f.rule) for f in monitor.observe(s, {"objective/kl": 0.5 * s})]
    assert fired == [(23, "kl_runaway")]
    assert [r.getMessage() for r in caplog.records] == [
        "health: kl_runaway since iteration 23: the KL to the reference exceeds 10 nats per "
        "sequence; try: a larger kl_coef or kl_controller proportional, a lower learning_rate"
    ]
    # a resumed run, seeded with the rows so far, does not warn again
    resumed = HealthMonitor(monitor.rows)
    assert resumed.observe(101, {"objective/kl": 60.0}) == []


def test_report_has_a_health_section_in_reading_order(tmp_path):
    from proxrl.report import write_report

    proxy, gold = hacked_series(0)
    sick = rows_of(
        objective__kl=[0.5 * s for s in STEPS],
        objective__scores=proxy,
        reward__gold=gold,
        reward__reward_model=proxy,
    )
    for name, rows in (("sick", sick), ("sft", [{"step": 1, "train/loss": 1.0}])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = write_report(tmp_path).read_text()
    section = report.split("## Health")[1].split("\n## ")[0]
    assert "sft" not in section  # no rule reads an SFT run's metrics
    assert section.index("`kl_runaway` since iteration 23") < section.index("`reward_hacking`")


def noisier_later_run(seed):
    """The hacked series, with the held-out score much noisier after iteration 70: the whole
    series' noise (the significance bar) is larger than the noise up to the first firing."""
    proxy, gold = hacked_series(seed)
    rng = random.Random(seed + 100)
    gold = [g + (rng.gauss(0, 0.4) if s > 70 else 0.0) for s, g in zip(STEPS, gold, strict=True)]
    return rows_of(objective__scores=proxy, reward__gold=gold, objective__kl=[1.0] * 100)


def test_the_report_gives_the_since_the_live_warning_gave(tmp_path, caplog):
    """One run, its metrics.jsonl read by the report and fed row by row to the live monitor:
    the same rules, with the same "since" (the whole series alone would say 56, the live warning
    50: the report replays the rules whose bar is measured on the whole series)."""
    from proxrl.report import write_report

    rows = noisier_later_run(0)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monitor, live = HealthMonitor(), []
    with caplog.at_level(logging.WARNING, logger=health.__name__):
        for row in rows:
            fields = {k: v for k, v in row.items() if k != "step"}
            live += [(f.rule, f.since) for f in monitor.observe(row["step"], fields)]
    assert live == [("reward_hacking", 50)]
    section = write_report(tmp_path).read_text().split("## Health")[1].split("\n## ")[0]
    reported = [(r, int(s)) for r, s in re.findall(r"`(\w+)` since iteration (\d+)", section)]
    assert reported == live
    assert [(f.rule, f.since) for f in diagnose(rows)] == live
    assert health.check(rows, health.RULES[-1]).since == 56  # the whole series' own answer


def test_causal_rules_give_the_replayed_since_from_the_whole_series():
    """``Rule.causal`` is true: a causal rule on the whole series says what it said when it
    first fired on a prefix (so the report need not replay it)."""
    rng = random.Random(3)
    for trial in range(5):
        walk = [0.0]
        for _ in STEPS[1:]:
            walk.append(walk[-1] + rng.gauss(0.05, 0.3))
        rows = rows_of(
            objective__kl=[abs(w) * 2 for w in walk],
            policy__approx_kl=[abs(w) / 20 for w in walk],
            policy__clipfrac=[min(1.0, abs(w) / 5) for w in walk],
            objective__entropy=[math.exp(-abs(w)) for w in walk],
            value__loss=[math.exp(w) for w in walk],
            value__explained_var=[math.tanh(w) for w in walk],
        )
        for rule in health.RULES:
            if not rule.causal:
                continue
            whole = health.check(rows, rule)
            replayed = next(
                (f for end in range(1, 101) if (f := health.check(rows[:end], rule))), None
            )
            assert whole == replayed, (trial, rule.name)


def test_the_report_replays_what_the_monitor_warned_on_random_runs():
    """Random sick and healthy runs, noisier late, with a held-out eval/score that appears
    mid-run (before it, the rule reads reward/gold): the report's findings are the live ones."""
    for seed in range(6):
        rng = random.Random(seed)
        rows = []
        for s in range(1, 121):
            late = 1 + 5 * (s > 90)
            row = {
                "step": s,
                "objective/scores": 0.1 * s + rng.gauss(0, 0.3),
                "reward/gold": 0.6 + rng.gauss(0, 0.03 * late),
                "response/length_mean": 2 + 0.3 * max(s - 30, 0) * (seed % 2) + rng.gauss(0, late),
            }
            if s % 5 == 0 and s >= 20:
                row["eval/score"] = 0.5 - 0.01 * max(s - 40, 0) * (seed < 4) + rng.gauss(0, 0.02)
            rows.append(row)
        monitor, live = HealthMonitor(), []
        for row in rows:
            fields = {k: v for k, v in row.items() if k != "step"}
            live += monitor.observe(row["step"], fields)
        order = [rule.name for rule in health.RULES]
        assert diagnose(rows) == sorted(live, key=lambda f: order.index(f.rule)), seed
        assert any(f.rule == "reward_hacking" for f in live) == (seed < 4), seed
