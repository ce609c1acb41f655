"""One batch's rollout as the loop collects it, from a config: the rollout's settings and the
engine built as ``open_run`` builds them, for the tests that call the rollout stage directly."""

from __future__ import annotations

from typing import Any

from proxrl.algos.online import samplers
from proxrl.algos.online.collect import collect_rollout
from proxrl.algos.online.roles import role_settings
from proxrl.algos.online.run_settings import run_settings


def rollout_of(
    cfg: Any,
    algo: Any,
    models: Any,
    rewards: Any,
    prompts: list[Any],
    prompt_ids: list[list[int]],
    kl_coef: float,
    timings: dict[str, float],
    engine: Any = None,
) -> tuple[Any, list[str], dict[str, float]]:
    """``collect.collect_rollout`` with ``cfg``'s settings and, unless given, its engine
    (``samplers.make_engine``, looked up when called: a test may replace it)."""
    engine = engine or samplers.make_engine(role_settings(cfg).engine, models.tokenizer)
    settings = run_settings(cfg, algo, models.critic).collecting
    return collect_rollout(
        settings, algo, models, rewards, prompts, prompt_ids, kl_coef, timings, engine
    )
