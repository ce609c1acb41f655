"""Other libraries' names (``runtime.foreign_names``) at the parse layer: a name of the same
meaning is an alias in flags, YAML and mappings (the Python API) wherever the command has its
option; one whose meaning differs is refused with what to use instead; every unknown name of a
command line and its config file is reported in one error; and an option given under two of its
names is refused. No training: configs only."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from proxrl.algos.offline import dpo, sft
from proxrl.algos.online import grpo, ppo
from proxrl.api import COMMANDS, command_module
from proxrl.runtime.config import config_from_mapping, field_table, parse_config
from proxrl.runtime.errors import ProxrlError
from proxrl.runtime.foreign_names import DIFFERENT, SAME

CONFIGS = {c: command_module(c).Config for c in COMMANDS if hasattr(command_module(c), "Config")}
GRPO = ["--model", "m", "--prompts", "p", "--reward-fn", "proxrl.demo.task:gold"]
DOC = Path(__file__).resolve().parents[2] / "docs" / "coming_from_trl.md"


def test_each_same_name_is_an_alias_wherever_its_option_is_and_nowhere_else():
    reached = set()
    for cls in CONFIGS.values():
        table = field_table(cls)
        for name, (option, _) in SAME.items():
            aliased = option in table and name in table[option].aliases
            assert aliased == (option in table and name not in table), (cls, name)
            reached |= {option} if option in table else set()
    assert reached == {option for option, _ in SAME.values()}  # no option misspelt


@pytest.mark.parametrize(
    ("cls", "given", "option", "value"),
    [
        (grpo.Config, "model_name_or_path", "model", "org/model"),
        (grpo.Config, "mask_truncated_completions", "mask_truncated", True),
        (grpo.Config, "total_training_steps", "iterations", 7),
        (ppo.Config, "cliprange_value", "value_clip", 0.3),
        (ppo.Config, "lambd", "lam", 0.9),
        (sft.Config, "num_train_epochs", "epochs", 3),
        (sft.Config, "gradient_accumulation_steps", "grad_accum", 2),
        (dpo.Config, "loss_type", "loss", "ipo"),
    ],
)
def test_a_foreign_name_sets_its_option_by_flag_yaml_and_mapping(
    cls, given, option, value, monkeypatch
):
    monkeypatch.setattr(cls, "validate", lambda self: None)  # no model to look for
    base = {"model": "m", "prompts": "p", "data": "d"}
    base = {k: v for k, v in base.items() if k in field_table(cls) and k != option}
    flag = ["--" + given.replace("_", "-"), str(value).lower()]
    argv = [a for k, v in base.items() for a in ("--" + k, v)] + flag
    assert getattr(parse_config(cls, argv, "p"), option) == value
    mapping = config_from_mapping(cls, base | {given: value}, "proxrl.x()", validate=False)
    assert getattr(mapping, option) == value


def test_a_dpo_beta_stays_dpos_own(monkeypatch):
    monkeypatch.setattr(dpo.Config, "validate", lambda self: None)
    assert "beta" in field_table(dpo.Config) and "beta" not in field_table(grpo.Config)
    assert (
        parse_config(dpo.Config, ["--model", "m", "--data", "d", "--beta", "0.3"], "p").beta == 0.3
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (  # was: did you mean --kl-loss-type?
            ["--loss-type", "dr_grpo"],
            "unknown option --loss-type: in TRL GRPO it picks the loss aggregation or a policy "
            "loss: loss_aggregation takes grpo, dapo, bnpo and dr_grpo, policy_loss takes cispo "
            "and sapo (TRL's importance_sampling_level sequence is policy_loss gspo)",
        ),
        (  # was: did you mean --max-staleness?
            ["--max-steps", "10"],
            "unknown option --max-steps: in TRL it counts optimizer steps; ppo and grpo count "
            "iterations (a rollout and its updates): iterations",
        ),
        (
            ["--critic-pretrain", "c"],
            "unknown option --critic-pretrain: in OpenRLHF it is critic_model, which this "
            "command does not have",
        ),
        (
            ["--num-generation", "2"],
            "unknown option --num-generation; did you mean --num-generations?",
        ),
    ],
)
def test_an_unknown_name_is_explained_from_the_table_before_spelling(argv, message):
    with pytest.raises(ProxrlError) as e:
        parse_config(grpo.Config, [*GRPO, *argv], "grpo")
    assert str(e.value) == message


def test_every_unknown_key_and_flag_is_reported_at_once(tmp_path):
    """A TRL config used to take a run per unknown key: now one error, on one line, names each
    (the file's first, each hint in brackets), a name given twice once; a flag's value is not
    taken for a stray argument."""
    trl = tmp_path / "trl.yaml"
    keys = {"model_name_or_path": "m", "num_generations": 4, "max_steps": 9, "warmup_ratio": 0.1}
    trl.write_text(yaml.safe_dump(keys | {"bogus_key": 1}, sort_keys=False))
    with pytest.raises(ProxrlError) as e:
        parse_config(grpo.Config, ["--config", str(trl), "--prompts", "p", "--epsilonn", "1"], "g")
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"4 unknown keys and options: config file {trl}: max_steps (in TRL")
    places = [message.index(f"config file {trl}: {key}") for key in ("warmup_ratio", "bogus_key")]
    assert places == sorted(places) and message.endswith("; --epsilonn (did you mean --epsilon?)")
    with pytest.raises(ProxrlError) as e:
        parse_config(grpo.Config, ["--config", str(trl), "--prompts", "p"], "g")
    assert str(e.value).startswith(f"config file {trl}: 3 unknown keys: max_steps (in TRL")
    with pytest.raises(ProxrlError, match=r"^2 unknown options: --a-b; --c$"):
        parse_config(grpo.Config, [*GRPO, "--a-b", "1", "2", "--c", "--a-b"], "g")
    with pytest.raises(ProxrlError, match="^unexpected argument 'stray'"):
        parse_config(grpo.Config, ["stray", *GRPO, "--a-b"], "g")


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("flags", "kl_coef given twice, as --beta and --kl-coef; keep one"),
        ("yaml", "config file {path}: kl_coef given twice, as kl_coef and beta; keep one"),
        ("mapping", "proxrl.grpo(): kl_coef given twice, as kl_coef and beta; keep one"),
    ],
)
def test_an_option_under_two_of_its_names_is_refused(how, message, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("kl_coef: 0.2\nbeta: 0.1\n")
    with pytest.raises(ProxrlError) as e:
        if how == "flags":
            parse_config(grpo.Config, [*GRPO, "--beta", "0.1", "--kl-coef", "0.2"], "g")
        elif how == "yaml":
            parse_config(grpo.Config, [*GRPO, "--config", str(path)], "g")
        else:
            config_from_mapping(grpo.Config, {"kl_coef": 0.2, "beta": 0.1}, "proxrl.grpo()")
    assert str(e.value) == message.format(path=path)


def test_a_flag_beside_a_file_still_wins_under_either_name(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("kl_coef: 0.2\n")
    assert (
        parse_config(grpo.Config, [*GRPO, "--config", str(path), "--beta", "0.1"], "g").kl_coef
        == 0.1
    )


def test_the_docs_table_names_every_foreign_name():
    text = DOC.read_text()
    missing = [n for n in (*SAME, *DIFFERENT) if f"`{n}`" not in text]
    assert not missing, f"docs/coming_from_trl.md lacks {missing}"
