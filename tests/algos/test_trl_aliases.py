"""TRL's spellings of the online options, accepted as aliases where the meaning is the same:
in flags and in YAML, on grpo and ppo alike (grpo re-declares group_size and kl_coef, ppo
re-declares ppo_epochs: the alias holds there too); config.yaml keeps the canonical name; and a
near-miss of a TRL spelling is now sent to it, not to an unrelated field (before: "did you
mean --max-prompt-length" for --max-completion-length, "--iterations" for --num-generations)."""

from __future__ import annotations

import pytest
import yaml

from proxrl.algos.online import grpo, ppo
from proxrl.runtime.config import load_config_file, parse_config, save_config_file
from proxrl.runtime.errors import ProxrlError

BASE = ["--model", "m", "--prompts", "p", "--reward-fn", "proxrl.demo.task:gold"]
TRL = {
    "max_completion_length": ("max_new_tokens", 48),
    "num_generations": ("group_size", 6),
    "epsilon": ("clip", 0.1),
    "epsilon_high": ("clip_high", 0.28),
    "beta": ("kl_coef", 0.02),
    "num_iterations": ("ppo_epochs", 3),
}
COMMANDS = {"grpo": grpo.Config, "ppo": ppo.Config}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("trl", TRL)
def test_a_trl_flag_sets_the_canonical_field(command, trl):
    field, value = TRL[trl]
    for flag in ("--" + trl.replace("_", "-"), "--" + trl):
        cfg = parse_config(COMMANDS[command], [*BASE, flag, str(value)], command)
        assert getattr(cfg, field) == value


@pytest.mark.parametrize("command", COMMANDS)
def test_trl_keys_in_yaml_and_the_saved_config_uses_the_canonical_names(command, tmp_path):
    given = tmp_path / "trl.yaml"
    rows = {"model": "m", "prompts": "p", "reward_fn": ["proxrl.demo.task:gold"]}
    given.write_text(yaml.safe_dump(rows | {trl: value for trl, (_, value) in TRL.items()}))
    cfg = load_config_file(COMMANDS[command], given)
    assert {field: getattr(cfg, field) for field, _ in TRL.values()} == dict(TRL.values())
    save_config_file(cfg, tmp_path / "config.yaml")
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert not set(TRL) & set(saved)
    assert {field: saved[field] for field, _ in TRL.values()} == dict(TRL.values())


@pytest.mark.parametrize(
    ("typed", "suggested"),
    [
        ("--max-completion-lenght", "--max-completion-length"),
        ("--num-generation", "--num-generations"),
        ("--num-iteration", "--num-iterations"),
        ("--epsilon-hi", "--epsilon-high"),
    ],
)
def test_a_near_miss_suggests_the_trl_spelling(typed, suggested):
    with pytest.raises(ProxrlError) as e:
        parse_config(grpo.Config, [*BASE, typed, "2"], "grpo")
    assert str(e.value) == f"unknown option {typed}; did you mean {suggested}?"


def test_help_lists_the_aliases(capsys):
    with pytest.raises(SystemExit):
        parse_config(grpo.Config, ["--help"], "grpo")
    shown = capsys.readouterr().out
    for trl in TRL:
        assert "--" + trl.replace("_", "-") in shown
