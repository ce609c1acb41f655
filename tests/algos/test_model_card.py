"""The saved model directory as other tools load it: a model card with the hub's metadata for
every command, a policy tokenizer that batches ``generate`` correctly, a reward model scored by
plain transformers as its card says, and push_to_hub up to the hub call."""

from __future__ import annotations

import json
import re

import pytest
import torch
import yaml
from huggingface_hub import ModelCard
from huggingface_hub.utils import filter_repo_objects
from transformers import AutoModelForCausalLM, AutoTokenizer

import proxrl
from proxrl import model_card
from proxrl.data.formats import PromptExample
from proxrl.models.scalar_head import load_score_model
from proxrl.models.tokenizer import load_tokenizer
from proxrl.rollout.rewards import RewardModelReward
from proxrl.runtime.errors import ProxrlError

WORDS = ["abc", "bca", "cab", "dab", "bad", "fed", "ace", "cafe"]
SFT_ROWS = [{"prompt": f"copy: {w} =", "completion": f" {w}"} for w in WORDS]
PAIRS = [
    {"prompt": f"say: {w} ->", "chosen": " abcd.", "rejected": f" wxyz{i}."}
    for i, w in enumerate(WORDS)
]
PROMPTS = [{"prompt": f"say: {w} ->"} for w in WORDS]
OFFLINE = dict(batch_size=4, max_steps=2, progress=False, report_to="none")
ONLINE = dict(
    iterations=1,
    rollout_batch_size=4,
    mini_batch_size=4,
    max_new_tokens=4,
    progress=False,
    report_to="none",
)


def constant(prompts, completions, **columns):
    return [1.0] * len(completions)


@pytest.fixture(scope="module")
def runs(tiny_lm, tmp_path_factory) -> dict[str, proxrl.Run]:
    """One tiny run of every model command, chained as a user would: sft → rm → ppo/grpo/dpo
    from the SFT model (whose saved tokenizer pads on the left)."""
    root = tmp_path_factory.mktemp("cards")
    sft = proxrl.sft(
        model=tiny_lm, data=SFT_ROWS, output_dir=root / "sft", learning_rate=3e-3, **OFFLINE
    )
    policy = str(sft.output_dir)
    rm = proxrl.rm(model=tiny_lm, data=PAIRS, output_dir=root / "rm", **OFFLINE)
    return {
        "sft": sft,
        "rm": rm,
        "dpo": proxrl.dpo(model=policy, data=PAIRS, output_dir=root / "dpo", **OFFLINE),
        "ppo": proxrl.ppo(
            model=policy,
            reward_model=str(rm.output_dir),
            prompts=PROMPTS,
            output_dir=root / "ppo",
            **ONLINE,
        ),
        "grpo": proxrl.grpo(
            model=policy,
            reward_fn=constant,
            prompts=PROMPTS,
            estimator="rloo",
            group_size=2,
            output_dir=root / "grpo",
            **ONLINE,
        ),
    }


TAGS = {
    "sft": ["proxrl", "sft"],
    "rm": ["proxrl", "rlhf", "rm", "reward-model"],
    "dpo": ["proxrl", "rlhf", "dpo"],
    "ppo": ["proxrl", "rlhf", "ppo"],
    "grpo": ["proxrl", "rlhf", "grpo", "rloo"],
}


@pytest.mark.parametrize("command", list(TAGS))
def test_every_command_saves_a_model_card_with_hub_metadata(runs, command):
    run = runs[command]
    card = ModelCard.load(run.output_dir / "README.md")
    assert card.data.tags == TAGS[command]
    assert card.data.library_name == "transformers"
    want_pipeline = "text-classification" if command == "rm" else "text-generation"
    assert card.data.pipeline_tag == want_pipeline
    assert card.data.base_model is None  # a local directory is no hub id
    config = yaml.safe_load(re.search(r"```yaml\n(.*?)```", card.text, re.S).group(1))
    assert config == yaml.safe_load((run.output_dir / "config.yaml").read_text())
    shown = dict(re.findall(r"^\| `([^`]+)` \| ([^|]+) \|$", card.text, re.M))
    assert shown.keys() == run.metrics.keys()
    for key, value in run.metrics.items():
        assert float(shown[key]) == pytest.approx(value, rel=1e-5)
    assert run.model is not None  # plain transformers loads the directory the card sits in


def test_hub_names_become_metadata_and_local_paths_do_not(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert model_card._hub_id("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert model_card._hub_id("trl-lib/ultrafeedback_binarized:train") == (
        "trl-lib/ultrafeedback_binarized"
    )
    for local in ("runs/sft", "./x", "/abs/path", "a/b/c", "python:data@12345678", "", None):
        assert model_card._hub_id(local) is None, local


@pytest.mark.parametrize("command", ["sft", "dpo", "ppo", "grpo"])
def test_a_saved_policy_generates_a_batch_as_it_generates_each_prompt(runs, command):
    """The saved tokenizer pads on the left: greedy completions of a padded batch equal those of
    each prompt alone (with right padding the shorter prompts would continue after pad tokens)."""
    path = runs[command].output_dir
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = ["copy: abc =", "copy: a much longer prompt cab cab =", "say: fed ->"]
    settings = dict(max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    assert len({len(tokenizer(p)["input_ids"]) for p in prompts}) == 3  # padding matters
    with torch.no_grad():
        out = model.generate(**batch, **settings)
        batched = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :])
        alone = []
        for prompt in prompts:
            one = tokenizer(prompt, return_tensors="pt")
            ids = model.generate(**one, **settings)[0, one["input_ids"].shape[1] :]
            alone.append(tokenizer.decode(ids))
    strip = lambda texts: [t.replace(tokenizer.pad_token, "") for t in texts]  # noqa: E731
    assert strip(batched) == strip(alone)
    assert load_tokenizer(str(path)).padding_side == "right"  # training still pads on the right


def test_the_reward_model_card_scores_as_the_trainer_does(runs):
    """The code in the reward model's card, run with plain transformers, gives the score PPO
    trains on (normalised, at the EOS after the response)."""
    path = runs["rm"].output_dir
    card = (path / "README.md").read_text()
    code = re.search(r"## How to use.*?```python\n(.*?)```", card, re.S).group(1)
    prompts, responses = ["say: abc ->", "say: fed ->"], [" abcd.", " wxyz3."]
    reward = RewardModelReward(
        load_score_model(str(path), new_head=None), load_tokenizer(str(path))
    )
    trainer = reward([PromptExample(p, None, "test") for p in prompts], responses, {})
    for prompt, response, want in zip(prompts, responses, trainer.tolist(), strict=True):
        namespace = {"path": str(path), "prompt": prompt, "response": response}
        exec(code, namespace)  # noqa: S102 (the card proxrl itself wrote)
        assert namespace["score"] == pytest.approx(want, abs=1e-6)
        assert namespace["raw"] != pytest.approx(want, abs=1e-3)  # the offset matters here
    assert "Bradley–Terry log-odds" in card and "reward_offset" in card


class FakeHub:
    """Stands in for ``huggingface_hub.HfApi``: records the calls, uploads nothing."""

    calls: list[tuple[str, dict]] = []
    fail = False

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))

    def upload_folder(self, **kwargs):
        self.calls.append(("upload_folder", kwargs))
        if self.fail:
            raise OSError("401 Client Error: Unauthorized\nmore lines")
        return type("Commit", (), {"commit_url": "https://hub/commit/1"})()


def test_push_to_hub_uploads_the_model_without_checkpoints(tiny_lm, tmp_path, monkeypatch):
    import huggingface_hub

    FakeHub.calls = []
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHub)
    run = proxrl.sft(
        model=tiny_lm,
        data=SFT_ROWS,
        output_dir=tmp_path / "sft",
        push_to_hub=True,
        hub_model_id="me/tiny-sft",
        hub_private=True,
        save_every=1,
        **OFFLINE,
    )
    (create, created), (upload, uploaded) = FakeHub.calls
    assert (create, created["repo_id"], created["private"]) == ("create_repo", "me/tiny-sft", True)
    assert uploaded["repo_id"] == "me/tiny-sft" and uploaded["folder_path"] == str(run.output_dir)
    files = [str(p.relative_to(run.output_dir)) for p in run.output_dir.rglob("*") if p.is_file()]
    sent = set(filter_repo_objects(files, ignore_patterns=uploaded["ignore_patterns"]))
    assert {"README.md", "model.safetensors", "tokenizer.json", "config.yaml"} <= sent
    assert any(f.startswith("checkpoints/") for f in files)
    assert not any(f.startswith("checkpoints/") for f in sent)


def test_a_failed_push_says_where_the_model_is(tiny_lm, tmp_path, monkeypatch):
    import huggingface_hub

    FakeHub.calls, FakeHub.fail = [], True
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHub)
    try:
        with pytest.raises(ProxrlError) as raised:
            proxrl.sft(
                model=tiny_lm, data=SFT_ROWS, output_dir=tmp_path / "s", push_to_hub=True, **OFFLINE
            )
    finally:
        FakeHub.fail = False
    assert str(raised.value) == (
        f"push_to_hub: uploading {tmp_path / 's'} to s failed (401 Client Error: Unauthorized); "
        "the model is saved there, push it later with `hf upload`"
    )
    assert (tmp_path / "s" / "model.safetensors").is_file()


def test_a_lora_run_card_names_the_merged_model_and_its_adapter(tiny_lm, tmp_path):
    """A LoRA run saves the merged model at the top (plain transformers) and the adapter in
    adapter/ (peft): the card says both, and each loads as it says."""
    from peft import PeftModel

    run = proxrl.sft(
        model=tiny_lm, data=SFT_ROWS, output_dir=tmp_path / "lora", lora_r=2, **OFFLINE
    )
    card = ModelCard.load(run.output_dir / "README.md")
    assert card.data.library_name == "transformers" and "`adapter/`" in card.text
    assert not isinstance(run.model, PeftModel)
    base = AutoModelForCausalLM.from_pretrained(tiny_lm)
    assert isinstance(PeftModel.from_pretrained(base, run.output_dir / "adapter"), PeftModel)


CHAT_PAIRS = [
    {
        "prompt": [{"role": "user", "content": f"say: {w}"}],
        "chosen": [{"role": "assistant", "content": " abcd."}],
        "rejected": [{"role": "assistant", "content": f" wxyz{i}."}],
    }
    for i, w in enumerate(WORDS)
]


def card_code(path) -> str:
    card = (path / "README.md").read_text()
    return re.search(r"## How to use.*?```python\n(.*?)```", card, re.S).group(1)


def test_a_conversational_reward_model_card_scores_through_the_chat_template(tiny_lm, tmp_path):
    """Trained on conversational pairs, the reward model read its texts through the chat
    template: the card's code applies it, and gives the trainer's ids and scores for the chosen
    and the rejected reply."""
    from proxrl.data.encoding import encode_preferences
    from proxrl.data.formats import preference_examples
    from proxrl.data.readers import Row
    from proxrl.models.scalar_head import sequence_scores

    run = proxrl.rm(model=tiny_lm, data=CHAT_PAIRS, output_dir=tmp_path / "rm", **OFFLINE)
    path = run.output_dir
    code = card_code(path)
    assert "apply_chat_template" in code and "conversational" in (path / "README.md").read_text()
    tokenizer = load_tokenizer(str(path))
    model = load_score_model(str(path), new_head=None).eval()
    rows = [Row(r, f"row {i}") for i, r in enumerate(CHAT_PAIRS[:3])]
    pairs = encode_preferences(preference_examples(rows, "t"), tokenizer, 64)
    for pair, row in zip(pairs, rows, strict=True):
        for encoded, reply in ((pair.chosen, "chosen"), (pair.rejected, "rejected")):
            ids = torch.tensor([encoded.input_ids])
            with torch.no_grad():
                want = sequence_scores(model, ids, torch.ones_like(ids), normalize=True).item()
            response = row.data[reply][0]["content"]
            namespace = {"path": str(path), "prompt": row.data["prompt"], "response": response}
            exec(code, namespace)  # noqa: S102 (the card proxrl itself wrote)
            assert namespace["ids"] == encoded.input_ids
            assert namespace["score"] == pytest.approx(want, abs=1e-6)


def test_the_card_renders_as_proxrl_does_without_a_chat_template(tiny_lm, tmp_path):
    """Conversational data on a tokenizer without a template: proxrl renders `role: content`
    lines; the card's code does the same."""
    from proxrl.data.encoding import render_conversation

    tokenizer = load_tokenizer(tiny_lm)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(tmp_path)
    cfg = type("Cfg", (), {"data": str(tmp_path / "d.jsonl"), "output_dir": str(tmp_path)})()
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CHAT_PAIRS))
    words, code = model_card.encoding_usage(cfg)
    assert "apply_chat_template" not in code and "no template" in words
    prompt, reply = CHAT_PAIRS[0]["prompt"], CHAT_PAIRS[0]["chosen"]
    namespace = {"tokenizer": tokenizer, "prompt": prompt, "response": reply[0]["content"]}
    exec(code, namespace)  # noqa: S102
    assert namespace["prompt_text"] == render_conversation(tokenizer, prompt, True)
    assert namespace["full_text"] == render_conversation(tokenizer, prompt + reply, False)
