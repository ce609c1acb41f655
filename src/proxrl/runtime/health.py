"""Training health: the textbook reading of a sick PPO run, as rules over metric series.

Look at the KL first, then the value loss, then the reward: ``diagnose`` applies the rules in
that order to the rows of a ``metrics.jsonl`` and returns a ``Finding`` per rule that fired —
what looks wrong, since which iteration, and what to try. ``proxrl report`` renders them as its
"Health" section, the online loop prints a one-line warning when a rule first fires
(``HealthMonitor``), and the online early stop acts on the same ``reward_hacking`` rule.

Every rule is a pure function of plain lists (``steps``, ``values``). The thresholds below were
fixed from the textbook and common practice before any demo run was looked at:

- every rule ignores the first ``WARMUP`` iterations (a critic starts with explained variance
  below 0, the KL starts at 0, the first entropies and lengths are the SFT policy's);
- a series is read through a trailing mean over ``WINDOW`` points; a change counts as a
  rise or a fall only when it exceeds ``SIGNIFICANCE`` standard errors of the difference of two
  such means (4 was set on synthetic series: 3 raised a false alarm on 6% of noisy 100-point
  plateaus under a rising reward, 4 on under 1%), the per-point noise taken from the median
  absolute first difference (robust to trends and single jumps) and floored at 1% of the
  series' largest magnitude;
- KL to the reference running away: above ``KL_LIMIT`` nats per sequence (well past the 6 nats a
  proportional controller targets by default);
- the ratio's spread: approx-KL(π_old‖π) of an update above ``APPROX_KL_LIMIT`` per token (five
  times the 0.01 that PPO implementations commonly target);
- clip fraction above ``CLIPFRAC_LIMIT``;
- entropy collapsed: below ``ENTROPY_FRACTION`` of its warm-up mean;
- value loss diverging: above ``VALUE_LOSS_GROWTH`` times its lowest trailing mean so far;
  explained variance below 0 after warm-up;
- reward rising while responses balloon: length above ``LENGTH_GROWTH`` times its warm-up mean
  while the reward rose significantly over the same span;
- reward hacking: the held-out (or verifiable) score fell significantly below its best while
  the trained reward rose significantly above its value at that best, at ``window + 1``
  consecutive points (a single outlier stays in a trailing mean for ``window`` points only).

One computation for the live warning and the report: a finding's "since" is what the rule said
the first time it fired on the rows logged so far, which is what ``HealthMonitor`` prints during
training. Most rules read each point and those before it only, so the whole series gives the same
answer; ``length_balloon`` and ``reward_hacking`` measure their significance bar on the whole
series (more points, another noise estimate), so ``diagnose`` replays them point by point
(``Rule.causal``).

What the rules cannot tell apart: ``length_balloon`` fires whenever the reward rises with
responses more than twice as long, also when the longer answer is the behaviour the reward asks
for. On the calculator task (``benchmarks/calculator_task.py``) a tool episode is ~38 model
tokens against the SFT policy's 2-token give-up, so the rule fires at iteration ~12-15 of PPO and
GRPO on a run that is learning exactly what it should; the finding's text says so.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

WARMUP = 10
WINDOW = 5
EVAL_WINDOW = 2  # held-out evaluations are sparse: a shorter trailing mean
SIGNIFICANCE = 4.0  # 3 gave 6% false alarms on a noisy plateau under a rising proxy; 4: < 1%
NOISE_FLOOR = 0.01
KL_LIMIT = 10.0
APPROX_KL_LIMIT = 0.05
CLIPFRAC_LIMIT = 0.3
ENTROPY_FRACTION = 0.1
VALUE_LOSS_GROWTH = 10.0
LENGTH_GROWTH = 2.0

# Metric names each rule reads, tried in order (the language-model trainers', then classic's).
KL_METRICS = ("objective/kl",)
APPROX_KL_METRICS = ("policy/approx_kl", "losses/approx_kl")
CLIPFRAC_METRICS = ("policy/clipfrac", "losses/clipfrac")
ENTROPY_METRICS = ("objective/entropy", "policy/entropy", "losses/entropy")
VALUE_LOSS_METRICS = ("value/loss", "losses/value_loss")
EXPLAINED_VAR_METRICS = ("value/explained_var", "losses/explained_variance")
LENGTH_METRICS = ("response/length_mean",)
REWARD_METRICS = ("objective/scores", "charts/episodic_return")
HELDOUT_METRICS = ("eval/score", "reward/gold")


@dataclass(frozen=True)
class Finding:
    """One rule that fired: which, on what metric, since which iteration, and what to try."""

    rule: str
    metric: str
    since: int
    what: str
    remedy: str

    def line(self) -> str:
        return f"{self.rule} since iteration {self.since}: {self.what}; try: {self.remedy}"


def trailing_mean(values: Sequence[float], window: int) -> list[float]:
    """Mean of the last ``window`` points at each point (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def noise(values: Sequence[float]) -> float:
    """Per-point noise σ of a series: 1.4826 × the median absolute deviation of its first
    differences / √2 (a slow trend and a few jumps leave it unchanged), floored at
    ``NOISE_FLOOR`` × the largest |value| (a constant series is not infinitely precise)."""
    floor = max(NOISE_FLOOR * max((abs(v) for v in values), default=0.0), 1e-12)
    if len(values) < 3:
        return floor
    diffs = [b - a for a, b in zip(values, values[1:], strict=False)]
    centre = statistics.median(diffs)
    mad = statistics.median(abs(d - centre) for d in diffs)
    return max(1.4826 * mad / math.sqrt(2), floor)


def significant(values: Sequence[float], window: int) -> float:
    """The smallest difference of two ``window``-point trailing means that counts as a change:
    ``SIGNIFICANCE`` × σ × √(2 / window)."""
    return SIGNIFICANCE * noise(values) * math.sqrt(2 / window)


def first_after_warmup(
    steps: Sequence[int], condition: Sequence[bool], warmup: int = WARMUP
) -> int | None:
    """The first step past ``warmup`` where ``condition`` holds."""
    for step, holds in zip(steps, condition, strict=True):
        if step > warmup and holds:
            return step
    return None


def above_limit(
    steps: Sequence[int], values: Sequence[float], limit: float, window: int = WINDOW
) -> int | None:
    """The first step past warm-up whose trailing mean exceeds ``limit``."""
    return first_after_warmup(steps, [m > limit for m in trailing_mean(values, window)])


def warmup_mean(steps: Sequence[int], values: Sequence[float]) -> float | None:
    head = [v for s, v in zip(steps, values, strict=True) if s <= WARMUP]
    return sum(head) / len(head) if head else None


# -- the rules, in the order they are read -------------------------------------------------


def kl_runaway(steps: Sequence[int], kl: Sequence[float]) -> int | None:
    """KL to the reference, per sequence, above ``KL_LIMIT`` nats."""
    return above_limit(steps, kl, KL_LIMIT)


def ratio_spread(steps: Sequence[int], approx_kl: Sequence[float]) -> int | None:
    """An update moved the policy far from the one that sampled: approx-KL above the limit."""
    return above_limit(steps, approx_kl, APPROX_KL_LIMIT)


def clip_fraction_high(steps: Sequence[int], clipfrac: Sequence[float]) -> int | None:
    return above_limit(steps, clipfrac, CLIPFRAC_LIMIT)


def entropy_collapse(steps: Sequence[int], entropy: Sequence[float]) -> int | None:
    """Entropy below ``ENTROPY_FRACTION`` of its warm-up mean."""
    start = warmup_mean(steps, entropy)
    if start is None or start <= 0:
        return None
    return first_after_warmup(
        steps, [m < ENTROPY_FRACTION * start for m in trailing_mean(entropy, WINDOW)]
    )


def value_loss_diverging(steps: Sequence[int], loss: Sequence[float]) -> int | None:
    """Value loss above ``VALUE_LOSS_GROWTH`` × its lowest trailing mean so far."""
    smooth, lowest, diverged = trailing_mean(loss, WINDOW), math.inf, []
    for m in smooth:
        lowest = min(lowest, m)
        diverged.append(lowest > 0 and m > VALUE_LOSS_GROWTH * lowest)
    return first_after_warmup(steps, diverged)


def explained_variance_negative(steps: Sequence[int], ev: Sequence[float]) -> int | None:
    """The critic predicts the returns worse than their mean does, after warm-up."""
    return first_after_warmup(steps, [m < 0 for m in trailing_mean(ev, WINDOW)])


def length_balloon(
    steps: Sequence[int], reward: Sequence[float], length: Sequence[float]
) -> int | None:
    """Responses grew past ``LENGTH_GROWTH`` × their warm-up length while the reward rose
    significantly (both series on the same steps)."""
    start_len, start_reward = warmup_mean(steps, length), warmup_mean(steps, reward)
    if start_len is None or start_reward is None or start_len <= 0:
        return None
    rise = significant(reward, WINDOW)
    return first_after_warmup(
        steps,
        [
            n > LENGTH_GROWTH * start_len and r - start_reward > rise
            for n, r in zip(
                trailing_mean(length, WINDOW), trailing_mean(reward, WINDOW), strict=True
            )
        ],
    )


def reward_hacking(
    steps: Sequence[int],
    reward: Sequence[float],
    heldout: Sequence[float],
    window: int = WINDOW,
) -> int | None:
    """The held-out score fell significantly below its best while the trained reward rose
    significantly above its value at that best, at ``window + 1`` consecutive points past
    warm-up (both series on the same ``steps``). Returns the first of those points."""
    if not steps:
        return None
    held, trained = trailing_mean(heldout, window), trailing_mean(reward, window)
    fall, rise = significant(heldout, window), significant(reward, window)
    best, run = 0, 0
    for i, step in enumerate(steps):
        if held[i] > held[best]:
            best = i
        hacked = held[best] - held[i] > fall and trained[i] - trained[best] > rise
        run = run + 1 if hacked and step > WARMUP else 0
        if run == window + 1:
            return steps[i - window]
    return None


# -- applying the rules to metrics.jsonl rows ---------------------------------------------

Row = Mapping[str, Any]


def finite_series(rows: Sequence[Row], metric: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that logged ``metric`` with a finite value."""
    points = [
        (int(r["step"]), float(r[metric]))
        for r in rows
        if isinstance(r.get(metric), (int, float)) and math.isfinite(r[metric])
    ]
    return [p[0] for p in points], [p[1] for p in points]


def first_metric(rows: Sequence[Row], names: Sequence[str]) -> str | None:
    return next((n for n in names if finite_series(rows, n)[0]), None)


def aligned(
    rows: Sequence[Row], first: str, second: str
) -> tuple[list[int], list[float], list[float]]:
    """The steps where both metrics were logged, with both values (a held-out evaluation is
    paired with the training reward of the iteration it followed)."""
    by_step = dict(zip(*finite_series(rows, first), strict=True))
    pairs = [(s, by_step[s], v) for s, v in zip(*finite_series(rows, second), strict=True)]
    pairs = [p for p in pairs if p[0] in by_step]
    return [p[0] for p in pairs], [p[1] for p in pairs], [p[2] for p in pairs]


@dataclass(frozen=True)
class Rule:
    """A rule applied to rows: the metric(s) it reads and how a finding reads."""

    name: str
    metrics: tuple[tuple[str, ...], ...]
    check: Callable[..., int | None]
    what: str
    remedy: str
    causal: bool = True
    """Whether its verdict at a point reads only that point and those before it (then the whole
    series gives the "since" the live warning gave; otherwise ``diagnose`` replays it)."""


RULES = (
    Rule(
        "kl_runaway",
        (KL_METRICS,),
        kl_runaway,
        f"the KL to the reference exceeds {KL_LIMIT:g} nats per sequence",
        "a larger kl_coef or kl_controller proportional, a lower learning_rate",
    ),
    Rule(
        "ratio_spread",
        (APPROX_KL_METRICS,),
        ratio_spread,
        f"each update moves the policy far from the sampling one (approx-KL > {APPROX_KL_LIMIT:g})",
        "a lower learning_rate, fewer ppo_epochs, early_stop_kl",
    ),
    Rule(
        "clip_fraction_high",
        (CLIPFRAC_METRICS,),
        clip_fraction_high,
        f"more than {CLIPFRAC_LIMIT:.0%} of the tokens are clipped",
        "a lower learning_rate, fewer ppo_epochs or larger mini_batch_size",
    ),
    Rule(
        "entropy_collapse",
        (ENTROPY_METRICS,),
        entropy_collapse,
        f"the entropy fell below {ENTROPY_FRACTION:.0%} of its start: the policy is nearly "
        "deterministic (the goal on a task with one answer; premature if the reward stalls)",
        "a lower learning_rate, entropy_coef > 0, clip_high (DAPO), a higher temperature",
    ),
    Rule(
        "value_loss_diverging",
        (VALUE_LOSS_METRICS,),
        value_loss_diverging,
        f"the value loss grew past {VALUE_LOSS_GROWTH:g}× its lowest",
        "value_clip, a lower critic_learning_rate, reward_clip or normalised scores",
    ),
    Rule(
        "explained_variance_negative",
        (EXPLAINED_VAR_METRICS,),
        explained_variance_negative,
        "the critic predicts the returns worse than their mean (explained variance < 0)",
        "warm the critic up (critic_warmup_iterations), a higher critic_learning_rate or vf_coef",
    ),
    Rule(
        "length_balloon",
        (REWARD_METRICS, LENGTH_METRICS),
        length_balloon,
        f"the reward rises while responses grew past {LENGTH_GROWTH:g}× their start length "
        "(a length exploit, or a longer behaviour the reward asks for, e.g. a tool call)",
        "if longer is not what the task needs: a length penalty (overlong_buffer, "
        "no_stop_penalty), a larger kl_coef",
        causal=False,
    ),
    Rule(
        "reward_hacking",
        (REWARD_METRICS, HELDOUT_METRICS),
        reward_hacking,
        "the trained reward rises while the held-out score falls",
        "stop early (eval_data with stop_on_reward_hacking; best/ keeps the best policy), a "
        "larger kl_coef, a reward-model ensemble, reset the reference (ref_reset_every)",
        causal=False,
    ),
)


def points(rows: Sequence[Row], names: Sequence[str]) -> tuple[list[int], ...]:
    """(steps, values…) of ``names`` in ``rows``: one metric's finite points, or two metrics
    paired on the steps both logged."""
    if len(names) == 1:
        return finite_series(rows, names[0])  # type: ignore[return-value]
    return aligned(rows, names[0], names[1])  # type: ignore[return-value]


def since_of(rule: Rule, names: Sequence[str], series: tuple[list[Any], ...]) -> int | None:
    """``rule`` on the points ``series`` of the metrics ``names``."""
    extra = {}
    if rule.check is reward_hacking:
        extra["window"] = EVAL_WINDOW if names[1].startswith("eval/") else WINDOW
    return rule.check(*series, **extra)


def check(rows: Sequence[Row], rule: Rule) -> Finding | None:
    """``rule`` on ``rows`` as they stand (what the live warning reads after each iteration)."""
    names = [first_metric(rows, candidates) for candidates in rule.metrics]
    if any(n is None for n in names):
        return None
    since = since_of(rule, names, points(rows, names))  # type: ignore[arg-type]
    if since is None:
        return None
    return Finding(rule.name, " vs ".join(names), since, rule.what, rule.remedy)  # type: ignore[arg-type]


def first_firing(rows: Sequence[Row], rule: Rule) -> Finding | None:
    """The finding ``rule`` gave on the shortest prefix of ``rows`` it fired on: the one the
    live warning printed. A causal rule's whole-series answer is that finding already; the
    others are re-read on each prefix's points (the whole series' points cut at the prefix's
    last step, where the prefix reads the metrics the whole series does)."""
    names = [first_metric(rows, candidates) for candidates in rule.metrics]
    if rule.causal or any(n is None for n in names):
        return check(rows, rule)
    series = points(rows, names)  # type: ignore[arg-type]
    first_row = {  # where each candidate metric is first logged: a prefix reads the first of
        name: next((i for i, r in enumerate(rows) if finite_series([r], name)[0]), len(rows))
        for candidates in rule.metrics
        for name in candidates
    }
    for end in range(1, len(rows) + 1):
        last = int(rows[end - 1].get("step", 0))
        if last <= WARMUP:
            continue  # no rule fires during warm-up
        prefix_names = [
            next((n for n in candidates if first_row[n] < end), None) for candidates in rule.metrics
        ]
        if prefix_names != names:  # an earlier prefix reads other metrics (eval/ not yet logged)
            finding = check(rows[:end], rule)
        else:
            n = sum(1 for step in series[0] if step <= last)
            since = since_of(rule, names, tuple(column[:n] for column in series))  # type: ignore[arg-type]
            finding = (
                None
                if since is None
                else Finding(rule.name, " vs ".join(names), since, rule.what, rule.remedy)  # type: ignore[arg-type]
            )
        if finding is not None:
            return finding
    return None


def diagnose(rows: Sequence[Row]) -> list[Finding]:
    """Every rule that fires on ``rows``, in reading order (KL, value, reward), each with the
    "since" the live warning gave (``first_firing``)."""
    return [f for rule in RULES if (f := first_firing(rows, rule)) is not None]


def render_markdown(runs: Mapping[str, Sequence[Row]]) -> list[str]:
    """The report's "Health" section: each run's findings in reading order."""
    lines = [
        "## Health",
        "",
        "Rules read in order: KL first, then the value loss, then the reward "
        "(thresholds: `proxrl.runtime.health`).",
        "",
    ]
    for name, rows in runs.items():
        if not any(all(first_metric(rows, c) for c in rule.metrics) for rule in RULES):
            continue  # a run none of the rules reads (SFT, a reward model)
        findings = diagnose(rows)
        if not findings:
            lines.append(f"- **{name}**: no rule fired.")
            continue
        lines.append(f"- **{name}**:")
        lines += [
            f"  - `{f.rule}` since iteration {f.since} ({f.metric}): {f.what}. Try: {f.remedy}."
            for f in findings
        ]
    return lines + [""]


class HealthMonitor:
    """The rules during training: ``observe(step, row)`` returns the findings that fired for
    the first time (each rule warns once per run), and logs each as one warning line."""

    def __init__(self, rows: Sequence[Row] = ()) -> None:
        self.rows: list[Row] = list(rows)
        self.warned = {f.rule for f in diagnose(self.rows)}  # a resumed run does not repeat

    def observe(self, step: int, row: Mapping[str, float]) -> list[Finding]:
        self.rows.append({"step": step, **row})
        fresh = (check(self.rows, r) for r in RULES if r.name not in self.warned)
        new = [f for f in fresh if f is not None]
        for finding in new:
            self.warned.add(finding.rule)
            log.warning("health: %s", finding.line())
        return new
