"""Issue 49: each model role is checked by its head before any training. A policy, reference
or teacher must be a causal LM whose LM head came from its checkpoint (transformers loads a
reward model as a causal LM with a random head and only warns: students distilled towards
noise); a reward model must bring its scalar head. Each refusal is one line naming the role
and the path, and comes before the output directory is made."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from proxrl.algos.online import grpo
from proxrl.algos.online.roles import load_reward_model, role_settings
from proxrl.cli import main
from proxrl.models.causal_lm import check_causal_lm, check_lm_head, load_causal_lm
from proxrl.models.lora import apply_lora
from proxrl.models.scalar_head import load_score_model
from proxrl.models.tokenizer import load_tokenizer
from proxrl.runtime import objects
from proxrl.runtime.errors import ProxrlError

NOT_LM = "not a causal LM with its LM head"
RM_KIND = "is a LlamaForSequenceClassification checkpoint (a scalar-head reward model)"


@pytest.fixture(scope="module")
def checkpoints(tiny_lm: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The tiny Llama (``lm``, untied head) and, beside it, ``rm``: its body as a reward model
    (a sequence classifier), ``no_head``: it without ``lm_head.weight`` in its checkpoint,
    ``tied``: a Llama whose head is its input embedding (no lm_head weight saved), and a
    LoRA adapter on ``rm`` (``adapter_on_rm``) and one trained for a reward model
    (``seq_cls_adapter``). Each directory has the tiny tokenizer."""
    root = tmp_path_factory.mktemp("roles")
    tokenizer = load_tokenizer(tiny_lm)
    paths = {"lm": tiny_lm}

    def save(name: str, model: torch.nn.Module) -> None:
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        paths[name] = str(root / name)

    save("rm", load_score_model(tiny_lm, new_head="reward"))
    shutil.copytree(tiny_lm, root / "no_head")
    weights = root / "no_head" / "model.safetensors"
    kept = {k: v for k, v in load_file(weights).items() if not k.startswith("lm_head.")}
    save_file(kept, weights, metadata={"format": "pt"})
    paths["no_head"] = str(root / "no_head")
    tied = load_causal_lm(tiny_lm)
    tied.config.tie_word_embeddings = True
    tied.lm_head.weight = tied.model.embed_tokens.weight
    save("tied", tied)
    save("adapter_on_rm", apply_lora(load_causal_lm(tiny_lm), r=2))
    config = root / "adapter_on_rm" / "adapter_config.json"
    config.write_text(
        json.dumps({**json.loads(config.read_text()), "base_model_name_or_path": paths["rm"]})
    )
    save("seq_cls_adapter", apply_lora(load_score_model(tiny_lm), r=2, task="seq_cls"))
    return paths


# -- the checks themselves ---------------------------------------------------------------------


@pytest.mark.parametrize("role", ["model", "teacher_model", "ref_model"])
def test_a_reward_model_is_refused_by_its_config_before_any_weight_loads(
    role, checkpoints, monkeypatch
):
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(
        AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("weights loaded")
    )
    rm = checkpoints["rm"]
    with pytest.raises(ProxrlError) as refused:
        load_causal_lm(rm, role=role)
    assert str(refused.value) == f"{role}: {rm} {RM_KIND}, {NOT_LM}"


def test_a_transformer_body_without_a_head_is_refused(checkpoints, tmp_path):
    from transformers import AutoModel

    AutoModel.from_pretrained(checkpoints["lm"]).save_pretrained(tmp_path / "body")
    with pytest.raises(ProxrlError) as refused:
        check_causal_lm(str(tmp_path / "body"), "teacher_model")
    assert str(refused.value) == (
        f"teacher_model: {tmp_path / 'body'} is a LlamaModel checkpoint (a transformer body "
        f"without an LM head), {NOT_LM}"
    )


def test_a_causal_lm_whose_checkpoint_lacks_its_lm_head_is_refused_at_load(checkpoints):
    """The config says LlamaForCausalLM (nothing to refuse before loading); the load report
    says lm_head.weight was newly initialised (the head is not tied)."""
    no_head = checkpoints["no_head"]
    check_causal_lm(no_head, "teacher_model")  # (the config alone cannot tell)
    with pytest.raises(ProxrlError) as refused:
        load_causal_lm(no_head, role="teacher_model")
    assert str(refused.value) == (
        f"teacher_model: {no_head} is a LlamaForCausalLM checkpoint without lm_head.weight "
        f"(its LM head would be newly initialised), {NOT_LM}"
    )


def test_a_tied_embedding_causal_lm_is_accepted(checkpoints):
    """No lm_head weight is saved for a head tied to the input embedding: that is its head."""
    model = load_causal_lm(checkpoints["tied"], role="teacher_model")
    assert model.lm_head.weight is model.model.embed_tokens.weight
    # a transformers version that reports a tied head missing does not make it random either
    check_lm_head(model, {"missing_keys": ["lm_head.weight"]}, checkpoints["tied"])


def test_a_causal_lm_and_a_lora_adapter_on_one_still_load(checkpoints, tmp_path):
    assert load_causal_lm(checkpoints["lm"]).lm_head.weight.shape[0] > 0
    apply_lora(load_causal_lm(checkpoints["lm"]), r=2).save_pretrained(tmp_path / "adapter")
    assert load_causal_lm(str(tmp_path / "adapter"), role="model") is not None


def test_a_lora_adapter_on_a_reward_model_or_for_one_is_refused(checkpoints):
    on_rm, seq_cls = checkpoints["adapter_on_rm"], checkpoints["seq_cls_adapter"]
    with pytest.raises(ProxrlError) as refused:
        load_causal_lm(on_rm, role="model")
    assert str(refused.value) == (
        f"model: {on_rm} is a LoRA adapter on {checkpoints['rm']}, a "
        f"LlamaForSequenceClassification checkpoint (a scalar-head reward model), {NOT_LM}"
    )
    with pytest.raises(ProxrlError) as refused:
        load_causal_lm(seq_cls, role="model")
    assert str(refused.value) == (
        f"model: {seq_cls} is a LoRA adapter for a sequence classifier (task_type SEQ_CLS), "
        f"{NOT_LM}"
    )


def test_a_model_object_is_checked_by_its_class(checkpoints):
    """A model given to the Python API: a sequence classifier is refused as a teacher; a causal
    LM object is taken as it is."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    classifier = AutoModelForSequenceClassification.from_pretrained(checkpoints["rm"])
    lm = AutoModelForCausalLM.from_pretrained(checkpoints["lm"])
    entries = {
        "python:teacher_model": objects.Entry(classifier),
        "python:model": objects.Entry(lm),
    }
    with objects.registered(entries):
        with pytest.raises(ProxrlError) as refused:
            load_causal_lm("python:teacher_model", role="teacher_model")
        assert load_causal_lm("python:model") is lm
    assert str(refused.value) == (
        "teacher_model: python:teacher_model is a LlamaForSequenceClassification object "
        f"(a scalar-head reward model), {NOT_LM}"
    )


def test_a_causal_lm_given_as_reward_model_is_still_refused(checkpoints):
    lm = checkpoints["lm"]
    cfg = grpo.Config(model=lm, prompts="p", reward_model=[lm])
    with pytest.raises(ProxrlError) as refused:
        load_reward_model(role_settings(cfg).rewards, lm)
    assert str(refused.value) == (
        f"reward_model: {lm} holds a causal LM (LlamaForCausalLM) without a score head; "
        "train one with `proxrl rm`"
    )
    assert load_reward_model(role_settings(cfg).rewards, checkpoints["rm"]).model is not None


# -- through the command line: exit 2, one line, no output directory ---------------------------


def _spy_loads(monkeypatch: pytest.MonkeyPatch, module: object) -> list[str]:
    """Record each ``load_causal_lm`` call made through ``module`` (its path)."""
    loaded: list[str] = []
    real = module.load_causal_lm  # type: ignore[attr-defined]

    def spy(name_or_path: str, **kwargs: object) -> object:
        loaded.append(name_or_path)
        return real(name_or_path, **kwargs)

    monkeypatch.setattr(module, "load_causal_lm", spy)
    return loaded


@pytest.mark.parametrize(
    ("command", "role", "bad", "refused_before_loading"),
    [
        ("grpo", "teacher_model", "rm", True),
        ("grpo", "teacher_model", "no_head", False),
        ("grpo", "model", "rm", True),
        ("sft", "model", "rm", False),  # (refused by its config in its loader, before weights)
        ("dpo", "model", "rm", False),
        ("dpo", "ref_model", "rm", True),
        ("dpo", "ref_model", "no_head", False),
    ],
)
def test_the_command_line_refuses_a_role_in_one_line_and_makes_no_output_directory(
    command, role, bad, refused_before_loading, checkpoints, tmp_path, monkeypatch, capsys
):
    """A reward model (by its config) is refused before any weight loads, and as a teacher or a
    reference before the policy loads; a causal LM without its head when it loads. Either way
    the run's output directory is never made."""
    from proxrl.algos.offline import dpo, sft
    from proxrl.algos.online import roles

    lm, path = checkpoints["lm"], checkpoints[bad]
    data = tmp_path / "data.jsonl"
    words = ["abc", "bca", "cab", "dab"]
    rows = {
        "grpo": [{"prompt": f"copy: {w} ="} for w in words],
        "sft": [{"prompt": f"copy: {w} =", "completion": f" {w}"} for w in words],
        "dpo": [{"prompt": f"say: {w} ->", "chosen": " ab.", "rejected": f" {w}."} for w in words],
    }[command]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    argv = [command, "--output-dir", str(out), "--model", path if role == "model" else lm]
    argv += ["--prompts" if command == "grpo" else "--data", str(data)]
    if command == "grpo":
        argv += ["--teacher-model", path if role == "teacher_model" else lm]
        argv += ["--max-new-tokens", "4", "--iterations", "1"]
    if role == "ref_model":
        argv += ["--ref-model", path]
    loaded = _spy_loads(monkeypatch, {"grpo": roles, "sft": sft, "dpo": dpo}[command])

    assert main(argv) == 2

    err = capsys.readouterr().err
    assert "Traceback" not in err
    what = RM_KIND if bad == "rm" else "is a LlamaForCausalLM checkpoint without lm_head.weight"
    assert (
        err.strip().splitlines()[-1].startswith(f"proxrl {command}: error: {role}: {path} {what}")
    )
    assert err.strip().endswith(NOT_LM)
    assert not out.exists()
    if refused_before_loading:  # (no model of the run was asked for)
        assert loaded == []
