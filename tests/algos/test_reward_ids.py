"""A reward model with the policy's tokenizer scores the sampled token ids, not their text
encoded again (issue 53): a byte-level BPE response cut inside a multi-byte character decodes to
U+FFFD, which encodes to other bytes. With another tokenizer it scores the text, and the share
of responses whose text is not what was sampled is logged (``reward/reencoded_mismatch``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from proxrl.algos.online import grpo
from proxrl.algos.online.placement.base import LocalPlacement
from proxrl.algos.online.roles import load_rewards, role_settings
from proxrl.data.formats import PromptExample
from proxrl.models.scalar_head import load_score_model
from proxrl.models.tokenizer import load_tokenizer, tokenizer_difference
from proxrl.rollout.forward import packed_sequence_scores, shared_prefix_sequence_scores
from proxrl.rollout.rewards import REENCODED_MISMATCH, TrainerState, with_extras

PROMPTS = [PromptExample("say: a ->", None, "row 0", {})] * 3
EOS = 2  # the tiny tokenizer's
# ' café' is [223, 69, 67, 72, 130, 105] ('Ġ', 'c', 'a', 'f', 'Ã', '©'): 'é' is two byte tokens
CUT = [223, 69, 67, 72, 130]  # cut inside 'é': decodes to ' caf\ufffd', encodes to … 174, 126, 124
STOPPED = [223, 69, 67, 72, 130, 105, EOS]  # ' café' and its EOS
SPLIT = [223, 69, 67, 72]  # ' caf', cut at max_new_tokens: the reward model adds the EOS


def _save_rm(tiny_lm: str, out: Path, seed: int, chat_template: str | None = None) -> str:
    torch.manual_seed(seed)
    load_score_model(tiny_lm, new_head="reward").save_pretrained(out)
    tokenizer = load_tokenizer(tiny_lm)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"reward_std": 0.5 + seed}))
    return str(out)


@pytest.fixture(scope="module")
def rms(tiny_lm: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("rms")
    return {
        "same": _save_rm(tiny_lm, root / "same", 0),
        "same_2": _save_rm(tiny_lm, root / "same_2", 1),
        "template": _save_rm(tiny_lm, root / "template", 0, chat_template="{{ messages }}"),
    }


def _rewards(tiny_lm: str, *paths: str):
    """The run's reward sources as the local placement loads them (with the policy's tokenizer)."""
    cfg = grpo.Config(model=tiny_lm, prompts="p", reward_model=list(paths))
    return LocalPlacement().rewards(role_settings(cfg))


def _call(rewards, ids: list[list[int]], tokenizer):
    completions = [tokenizer.decode(r, skip_special_tokens=True) for r in ids]
    columns = with_extras({}, ids, TrainerState())
    scored = rewards(PROMPTS[: len(ids)], completions, columns)
    return scored.total, scored.parts


@torch.no_grad()
def _direct(path: str, ids: list[list[int]], prompt_text: str = PROMPTS[0].prompt) -> torch.Tensor:
    """(B,) the reward model's scores of prompt ids + the sampled ids + EOS, built by hand, as
    the reward role runs them by default: rows that share their prompt (here all, when there
    are several) in one shared-prefix forward, the prompt once; a row alone in one packed
    forward (its unset budget holds these rows)."""
    tokenizer, model = load_tokenizer(path), load_score_model(path).eval()
    prompt = tokenizer(prompt_text)["input_ids"]
    rows = [prompt + r + ([] if r[-1] == EOS else [EOS]) for r in ids]
    width = max(len(r) for r in rows)
    padded = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    if len(rows) > 1:
        return shared_prefix_sequence_scores(
            model, padded, mask, len(prompt), normalize=True
        ).float()
    return packed_sequence_scores(model, padded, mask, normalize=True).float()


def test_a_response_cut_inside_a_character_is_scored_as_its_sampled_ids(tiny_lm, rms, caplog):
    tokenizer = load_tokenizer(tiny_lm)
    assert tokenizer(tokenizer.decode(CUT), add_special_tokens=False)["input_ids"] != CUT
    with caplog.at_level(logging.INFO, logger="proxrl.algos.online.roles"):
        rewards = _rewards(tiny_lm, rms["same"])
    assert f"reward_model {rms['same']}: the policy's tokenizer; scores the sampled token ids" in (
        caplog.messages
    )
    ids = [CUT, STOPPED, SPLIT]
    scores, parts = _call(rewards, ids, tokenizer)
    torch.testing.assert_close(scores, _direct(rms["same"], ids), rtol=0, atol=0)
    assert REENCODED_MISMATCH not in parts  # nothing re-encoded, nothing to count


def test_an_ensemble_scores_the_sampled_ids_too(tiny_lm, rms):
    tokenizer = load_tokenizer(tiny_lm)
    rewards = _rewards(tiny_lm, rms["same"], rms["same_2"])
    scores, parts = _call(rewards, [CUT], tokenizer)
    expected = (_direct(rms["same"], [CUT]) / 0.5 + _direct(rms["same_2"], [CUT]) / 1.5) / 2
    torch.testing.assert_close(scores, expected, rtol=1e-6, atol=1e-6)
    assert REENCODED_MISMATCH not in parts


def test_responses_that_round_trip_score_the_same_either_way(tiny_lm, rms):
    """No change where the text is the sampled ids: the ids path and the text path (its
    ``policy_tokenizer`` unset: the start-up decision never made) agree bit for bit."""
    tokenizer = load_tokenizer(tiny_lm)
    reading = _rewards(tiny_lm, rms["same"])
    cfg = grpo.Config(model=tiny_lm, prompts="p", reward_model=[rms["same"]])
    text_rewards = load_rewards(
        role_settings(cfg).rewards
    )  # no policy tokenizer: the text bridge, as before
    assert reading.sources[0].reads_ids and not text_rewards.sources[0].reads_ids
    ids = [STOPPED, SPLIT]
    torch.testing.assert_close(
        _call(reading, ids, tokenizer)[0], _call(text_rewards, ids, tokenizer)[0], rtol=0, atol=0
    )


def test_another_tokenizer_scores_text_and_counts_what_did_not_round_trip(tiny_lm, rms, caplog):
    tokenizer = load_tokenizer(tiny_lm)
    with caplog.at_level(logging.INFO):
        rewards = _rewards(tiny_lm, rms["template"])
        (source,) = rewards.sources
        assert not source.reads_ids
        scores, parts = _call(rewards, [CUT, STOPPED], tokenizer)
        _call(rewards, [CUT, SPLIT], tokenizer)  # over the share again: no second warning
    assert parts[REENCODED_MISMATCH] == 0.5  # CUT's text encodes to other ids; STOPPED's not
    said = [m for m in caplog.messages if "as other token ids than were sampled" in m]
    assert said == [
        "the reward model scored 50% of 2 responses as other token ids than were sampled: their "
        "text does not encode back to them (reward/reencoded_mismatch); a reward model with the "
        "policy's tokenizer scores the sampled ids"
    ]
    assert (
        f"reward_model {rms['template']}: another chat template than the policy's; scores the "
        "responses' text, re-encoded (reward/reencoded_mismatch counts where it is not what was "
        "sampled)"
    ) in caplog.messages
    # the text bridge: CUT (and STOPPED, scored in the same forward) as the ids its text encodes to
    reencoded = [
        tokenizer(tokenizer.decode(r, skip_special_tokens=True), add_special_tokens=False)[
            "input_ids"
        ]
        for r in (CUT, STOPPED)
    ]
    assert reencoded[0] != CUT
    torch.testing.assert_close(scores, _direct(rms["template"], reencoded), rtol=0, atol=0)


def test_tokenizer_difference_names_what_differs(tiny_lm):
    policy = load_tokenizer(tiny_lm)
    assert tokenizer_difference(policy, load_tokenizer(tiny_lm)) is None
    other = load_tokenizer(tiny_lm)
    other.chat_template = "{{ messages }}"
    assert tokenizer_difference(policy, other) == "another chat template"
    other = load_tokenizer(tiny_lm)
    other.add_tokens(["<|new|>"])
    n = len(policy)
    assert tokenizer_difference(policy, other) == (
        f"another vocabulary ({n + 1} vs {n} tokens, 0 of the policy's mapped to another id or "
        "missing)"
    )
    other = load_tokenizer(tiny_lm)
    other.eos_token = "<|bos|>"
    assert tokenizer_difference(policy, other) == "another EOS token (id 1 vs the policy's 2)"


def test_the_demos_held_out_evaluation_scores_the_sampled_ids(tiny_lm, rms, monkeypatch):
    """``demo.evaluate.evaluate_policy`` hands the reward model the sampled ids: a response cut
    inside a character gets the score of its ids (the text path scores other tokens)."""
    from proxrl.demo import evaluate
    from proxrl.demo.task import make_prompt
    from proxrl.rollout.generation import Samples
    from proxrl.rollout.rewards import RewardModelReward

    tokenizer = load_tokenizer(tiny_lm)
    rows = [CUT, STOPPED, SPLIT]

    class Fixed:  # the sampler: these three responses, whatever the policy
        def __init__(self, policy, tokenizer):
            pass

        def sample(self, prompt_ids, prompt_mask, settings, with_logprobs=False):
            width = max(map(len, rows))
            pad = tokenizer.pad_token_id
            ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
            mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
            return Samples(ids, mask)

    monkeypatch.setattr(evaluate, "HFSampler", Fixed)
    path = rms["same"]
    rm = RewardModelReward(load_score_model(path).eval(), load_tokenizer(path), reads_ids=True)
    policy = torch.nn.Linear(1, 1)  # (never called: the policy is the SFT model, no KL)
    prompt = PromptExample(make_prompt([3, 1, 4]), None, "row 0", {})  # (gold reads the task's)
    scores = evaluate.evaluate_policy(policy, policy, rm, tokenizer, [prompt], 3, 8)
    expected = _direct(path, rows, prompt.prompt)
    assert [s["proxy"] for s in scores.samples] == [round(float(x), 4) for x in expected]
    assert scores.proxy == pytest.approx(float(expected.mean()), abs=1e-6)
