"""Every option's value is checked whether or not the run uses it: a tool_call_format no
parser has is refused without an environment too (before, a full default run started)."""

from __future__ import annotations

import pytest

from proxrl.algos.online import grpo, ppo
from proxrl.runtime.errors import ProxrlError


@pytest.mark.parametrize("config", [grpo.Config, ppo.Config])
def test_an_unknown_tool_call_format_without_an_environment_is_refused(config):
    cfg = config(model="m", prompts="p", reward_fn="proxrl.demo.task:gold", tool_call_format="json")
    with pytest.raises(ProxrlError) as e:
        cfg.validate()
    assert str(e.value) == "tool_call_format: expected one of hermes, got 'json'"
