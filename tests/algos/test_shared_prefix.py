"""Shared-prefix passes (``rollout.prefix``, ``shared_prefix``): a group's prompt forwarded
once gives the repeated forward's results, float64, on ragged groups.

transformers' RMSNorm computes in float32 whatever the weights' dtype, so a float64 model's
gradients carry float32 rounding that differs with the order of the sums; the ``float64_norms``
fixture makes the norms float64 so that the comparison is of the maths (to 1e-10), not of that
rounding. Covered: the policy's log-probs, entropy, hidden state and every parameter's gradient
(Llama, Qwen2, LoRA, with truncation), a separate critic's values and gradients, the frozen
pass, the fallbacks (no shared prompt, gradient checkpointing, packed), and a whole grpo run and
a ppo run with a separate critic, whose weights end equal either way.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
)
from transformers.models.llama import modeling_llama
from transformers.models.qwen2 import modeling_qwen2

from proxrl.core import processed_entropy, processed_logprobs
from proxrl.models.scalar_head import sequence_scores
from proxrl.rollout import prefix
from proxrl.rollout.forward import (
    critic_forward,
    frozen_pass,
    output_head,
    packed_sequence_scores,
    policy_forward,
    position_ids,
    shared_prefix_sequence_scores,
)
from proxrl.rollout.prefix import prompt_groups
from proxrl.runtime.config import narrowed

REL = 1e-10
# Three groups of left-padded prompts (2, 4, 6 real tokens) and a row alone; responses of
# different lengths, right-padded.
PROMPTS = [[0, 0, 0, 0, 3, 4]] * 3 + [[0, 0, 5, 6, 7, 8]] * 2 + [[9, 10, 11, 12, 13, 14]] * 3
PROMPTS += [[0, 0, 0, 15, 16, 17]]
RESPONSE_LENGTHS = [5, 2, 4, 1, 5, 3, 5, 2, 4]


def _rms64(self, hidden):  # type: ignore[no-untyped-def]
    variance = hidden.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden * torch.rsqrt(variance + self.variance_epsilon))


@pytest.fixture
def float64_norms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", _rms64)
    monkeypatch.setattr(modeling_qwen2.Qwen2RMSNorm, "forward", _rms64)


def _config(config_cls, **extra):  # type: ignore[no-untyped-def]
    return config_cls(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        **extra,
    )


def _model(cls, config_cls=LlamaConfig, **extra):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    return cls(_config(config_cls, **extra)).double().eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    prompts = torch.tensor(PROMPTS)
    T = max(RESPONSE_LENGTHS)
    real = (torch.arange(T)[None] < torch.tensor(RESPONSE_LENGTHS)[:, None]).long()
    responses = torch.randint(3, 40, real.shape, generator=g) * real
    ids = torch.cat([prompts, responses], 1)
    mask = torch.cat([(prompts != 0).long(), real], 1)
    return ids, mask, prompts.shape[1], real.double()


def _close(a: torch.Tensor, b: torch.Tensor, name: str) -> None:
    scale = float(a.abs().max())
    assert scale > 0, name
    assert float((a - b).abs().max()) <= REL * scale, name


def _policy_pass(model, shared, **options):  # type: ignore[no-untyped-def]
    ids, mask, P, real = _batch()
    model.zero_grad()
    out = policy_forward(
        model, ids, mask, P, 0.7, True, True, **options, shared_prefix=shared
    )  # fmt: skip
    loss = (out.logprobs * real).sum() + (out.hidden.pow(2) * real[..., None]).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, real, grads


def test_prompt_groups_are_the_distinct_prompts_in_row_order():
    ids, mask, P, _ = _batch()
    groups = prompt_groups(ids, mask, P)
    assert groups is not None
    assert groups.firsts.tolist() == [0, 3, 5, 8]
    assert groups.inverse.tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 3]
    assert prompt_groups(ids[[0, 3, 5, 8]], mask[[0, 3, 5, 8]], P) is None


@pytest.mark.parametrize(
    ("config_cls", "cls", "options"),
    [
        (LlamaConfig, LlamaForCausalLM, {}),
        (LlamaConfig, LlamaForCausalLM, {"top_k": 5, "top_p": 0.9}),
        (Qwen2Config, Qwen2ForCausalLM, {}),
    ],
)
def test_the_policy_pass_and_its_gradients_equal_the_repeated_ones(
    float64_norms, config_cls, cls, options
):
    model = _model(cls, config_cls)
    (repeated, real, grads), (shared, _, shared_grads) = (
        _policy_pass(model, s, **options) for s in (False, True)
    )
    _close(repeated.logprobs * real, shared.logprobs * real, "logprobs")
    _close(repeated.entropy * real, shared.entropy * real, "entropy")
    _close(repeated.hidden * real[..., None], shared.hidden * real[..., None], "hidden")
    assert grads.keys() == shared_grads.keys() and len(grads) > 10
    for name, grad in grads.items():
        _close(grad, shared_grads[name], name)


def test_a_lora_policy_gets_the_repeated_gradients(float64_norms):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        _model(LlamaForCausalLM), LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    )
    for name, p in model.named_parameters():  # B starts at 0: give it values to carry
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    (_, _, grads), (_, _, shared) = (_policy_pass(model, s) for s in (False, True))
    assert any("lora_A" in n for n in grads) and all("lora" in n for n in grads)
    for name, grad in grads.items():
        _close(grad, shared[name], name)


def _lora_model():  # type: ignore[no-untyped-def]
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        _model(LlamaForCausalLM), LoraConfig(r=4, target_modules=["q_proj", "v_proj", "lm_head"])
    )
    for name, p in model.named_parameters():  # B starts at 0: give it values to carry
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    return model


def _every_positions_head(model, options):  # type: ignore[no-untyped-def]
    """The computation the real-token head replaces: the logits at every response position
    (padding included) of one plain forward, the log-probs, entropy and argmax from those."""
    ids, mask, P, real = _batch()
    logits = model(
        input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), use_cache=False
    ).logits[:, P - 1 : -1]
    truncation = (options.get("top_k", 0), options.get("top_p", 1.0), 0.0)
    return (
        processed_logprobs(logits, ids[:, P:], 0.7, *truncation),
        processed_entropy(logits.detach(), 0.7, *truncation),
        logits.argmax(-1),
        logits,
    )


def _head_positions(model) -> list[int]:  # type: ignore[no-untyped-def]
    """The number of positions each call of the model's output head computes."""
    calls: list[int] = []
    head = output_head(model)
    assert head is not None
    head.register_forward_hook(lambda _m, _a, out: calls.append(out[..., 0].numel()))
    return calls


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize(
    ("make", "options"),
    [
        (lambda: _model(LlamaForCausalLM), {}),
        (lambda: _model(LlamaForCausalLM), {"top_k": 5, "top_p": 0.9}),
        (lambda: _model(Qwen2ForCausalLM, Qwen2Config, tie_word_embeddings=True), {}),
        (_lora_model, {}),
    ],
    ids=["llama", "llama-truncated", "qwen2-tied", "lora"],
)
def test_the_head_at_real_response_tokens_equals_every_positions_head(
    float64_norms, make, options, shared
):
    """The padded and the shared-prefix forwards compute the output head at the N real
    response tokens only: the log-probs, entropy, argmax and every parameter's gradient equal
    those of the head at every position (padding included), 0 at the padding."""
    model = make()
    ids, mask, P, real = _batch()
    weights = torch.rand(real.shape, generator=torch.Generator().manual_seed(2), dtype=torch.double)
    model.zero_grad()
    logprobs, entropy, argmax, _ = _every_positions_head(model, options)
    (logprobs * real * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    calls = _head_positions(model)
    out = policy_forward(
        model, ids, mask, P, 0.7, True, **options, with_argmax=True, shared_prefix=shared
    )
    (out.logprobs * real * weights).sum().backward()
    groups = 4  # the prompt's call scores its last position once per distinct prompt
    assert calls == ([groups, int(real[:, 1:].sum())] if shared else [int(real.sum())])
    padding = real == 0
    assert bool(padding.any())
    assert not out.logprobs[padding].any() and not out.entropy[padding].any()
    assert not out.argmax[padding].any()
    _close(logprobs * real, out.logprobs, "logprobs")
    _close(entropy * real, out.entropy, "entropy")
    assert torch.equal(argmax * real.long(), out.argmax)
    assert len(grads) > 4 and grads.keys() == {
        n for n, p in model.named_parameters() if p.grad is not None
    }
    for name, grad in grads.items():
        _close(grad, model.get_parameter(name).grad, name)


@pytest.mark.parametrize("shared", [False, True])
def test_with_logits_still_gives_every_response_positions_logits(float64_norms, shared):
    model = _model(LlamaForCausalLM)
    ids, mask, P, real = _batch()
    with torch.no_grad():
        logprobs, entropy, _, logits = _every_positions_head(model, {})
        out = policy_forward(model, ids, mask, P, 0.7, True, with_logits=True, shared_prefix=shared)
    assert out.logits is not None and out.logits.shape == logits.shape
    _close(logits, out.logits, "logits")
    _close(logprobs, out.logprobs, "logprobs")
    _close(entropy, out.entropy, "entropy")
    with torch.no_grad():
        frozen, _ = frozen_pass(model, ids, mask, P, 0.7, {}, False, shared_prefix=shared)
    _close(logprobs * real, frozen, "frozen pass")


def test_a_separate_critic_and_a_frozen_pass_equal_the_repeated_ones(float64_norms):
    ids, mask, P, real = _batch()
    critic = _model(LlamaForSequenceClassification, num_labels=1)
    values, grads = [], []
    for shared in (False, True):
        critic.zero_grad()
        v = critic_forward(critic, ids, mask, P, shared_prefix=shared) * real
        (v.pow(2)).sum().backward()
        values.append(v.detach())
        grads.append({n: p.grad.clone() for n, p in critic.named_parameters()})
    _close(values[0], values[1], "values")
    for name, grad in grads[0].items():
        _close(grad, grads[1][name], name)
    reference = _model(LlamaForCausalLM)
    with torch.no_grad():
        passes = [
            frozen_pass(reference, ids, mask, P, 0.7, {}, False, True, shared_prefix=s)
            for s in (False, True)
        ]
    _close(passes[0][0] * real, passes[1][0] * real, "reference logprobs")
    assert torch.equal(passes[0][1] * real.long(), passes[1][1] * real.long())


def test_it_runs_the_prompts_once_and_falls_back_where_it_cannot_apply(monkeypatch):
    ids, mask, P, real = _batch()
    model = _model(LlamaForCausalLM)
    widths = []
    model.model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True,
    )
    with torch.no_grad():
        shared = policy_forward(model, ids, mask, P, 1.0, shared_prefix=True)
        assert widths == [(4, P), (len(ids), ids.shape[1] - P)]  # 4 prompts, then responses
        widths.clear()
        distinct = [0, 3, 5, 8]
        policy_forward(model, ids[distinct], mask[distinct], P, 1.0, shared_prefix=True)
        assert widths == [(4, ids.shape[1])]  # nothing to share: the repeated forward
        widths.clear()
        policy_forward(model, ids, mask, P, 1.0, packed=True, shared_prefix=True)
        assert len(widths) == 1  # the packed forward: one call, the prompts repeated
        repeated = policy_forward(model, ids, mask, P, 1.0)
    assert torch.allclose(shared.logprobs * real, repeated.logprobs * real, rtol=1e-6)
    monkeypatch.setattr(prefix.dist, "world_size", lambda: 2)  # several processes: repeated
    widths.clear()
    with torch.no_grad():
        policy_forward(model, ids, mask, P, 1.0, shared_prefix=True)
    assert widths == [(len(ids), ids.shape[1])]
    monkeypatch.undo()
    model.gradient_checkpointing_enable()
    model.train()
    assert prefix.drops_its_cache(model)
    widths.clear()
    policy_forward(model, ids, mask, P, 1.0, shared_prefix=True)
    assert widths == [(len(ids), ids.shape[1])]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    words = ["abc", "bca", "cab", "dab"]
    path.write_text("".join(json.dumps({"prompt": f"say: {w} ->"}) + "\n" for w in words))
    return str(path)


@pytest.mark.parametrize("command", ["grpo", "ppo"])
def test_a_run_reaches_the_same_weights_either_way(
    float64_norms, tiny_lm, prompts, reward_model, tmp_path, command, monkeypatch
):
    """Three iterations of grpo (policy, π_old, reference) and of ppo with a separate critic
    started from the reward model, float64: the weights after training agree to 1e-10, and
    the shared run did share (each pass's prompts, counted)."""
    from safetensors.torch import load_file

    from proxrl.algos.online import grpo, ppo
    from proxrl.rollout import forward

    shared_calls: list[int] = []

    def counted(*args):  # type: ignore[no-untyped-def]
        found = prefix.shared_prefix_inputs(*args)
        shared_calls.append(found is not None)
        return found

    monkeypatch.setattr(forward, "shared_prefix_inputs", counted)
    module = grpo if command == "grpo" else ppo
    runs = {}
    for shared in (False, True):
        shared_calls.clear()
        out = tmp_path / f"shared_{shared}"
        options = dict(
            model=tiny_lm,
            prompts=prompts,
            reward_fn=("tests.algos.online_rewards:target_fraction",),
            output_dir=str(out),
            iterations=3,
            rollout_batch_size=2,
            group_size=3,
            max_new_tokens=6,
            ppo_epochs=2,
            mini_batch_size=3,
            learning_rate=1e-3,
            kl_coef=0.05,
            dtype="float64",
            progress=False,
            save_every=0,
            seed=3,
            shared_prefix=shared,
        )
        if command == "ppo":
            options |= {"reward_model": reward_model, "reward_weights": (1.0, 1.0)}
        cfg = module.Config(**options)
        module.train(replace(cfg))
        # per iteration: π_old, π_ref, each update forward (and the critic's passes, ppo)
        assert sum(shared_calls) >= (0 if not shared else 3 * (3 + 2 * 2)), shared_calls
        assert shared or not shared_calls
        runs[shared] = load_file(out / "model.safetensors")
        if command == "ppo":
            runs[(shared, "critic")] = load_file(out / "critic" / "model.safetensors")
    start = load_file(f"{tiny_lm}/model.safetensors")
    moved = max(float((runs[True][n] - w.double()).abs().max()) for n, w in start.items())
    assert moved > 1e-4  # the runs trained: equal weights are no accident of a no-op
    for key in [k for k in runs if k is False or (isinstance(k, tuple) and k[0] is False)]:
        other = True if key is False else (True, "critic")
        for name, weight in runs[key].items():
            _close(weight, runs[other][name], f"{key} {name}")


def test_the_run_says_in_one_line_where_the_prompt_is_repeated(
    tiny_lm, prompts, tmp_path, caplog, monkeypatch
):
    """shared_prefix is on by default, so where it cannot apply it is not refused: the run says
    why at start-up, in one line (nothing where it applies, or where the user turned it off)."""
    from proxrl.algos.online import grpo, micro_batches, ppo

    options = dict(
        model=tiny_lm,
        prompts=prompts,
        reward_fn=("tests.algos.online_rewards:target_fraction",),
        output_dir=str(tmp_path / "run"),
        iterations=1,
        rollout_batch_size=2,
        max_new_tokens=4,
        progress=False,
        save_every=0,
    )

    def note(config=grpo.Config, **extra):  # type: ignore[no-untyped-def]
        cfg = config(**(options | extra))
        layout = narrowed(micro_batches.PassLayout, cfg, prefix_off=cfg.prefix_off())
        return micro_batches.prefix_note(layout)

    off = "shared_prefix: off for this run"
    assert note() is None and note(shared_prefix=False) is None
    assert (
        note(gradient_checkpointing=True)
        == f"{off} (gradient_checkpointing drops the prompt's cache)"
    )
    assert note(max_tokens_per_micro_batch=64) == (
        f"{off} (max_tokens_per_micro_batch 64 packs rows end to end)"
    )
    assert note(compile_sampler=True) == (
        "shared_prefix: off in the sampler for this run (compile_sampler's loop)"
    )
    alone = f"{off} (group_size 1: no two responses share a prompt)"
    assert note(ppo.Config) == alone
    with monkeypatch.context() as patched:
        patched.setattr(micro_batches.dist, "world_size", lambda: 2)
        assert note() == f"{off} (2 processes)"
    with caplog.at_level(logging.INFO):
        ppo.train(ppo.Config(**options))
    assert [r.getMessage() for r in caplog.records if "shared_prefix" in r.getMessage()] == [alone]


def _refusal(reason: str) -> str:
    return (
        f"shared_prefix: true cannot apply to this run ({reason}); leave it unset (on wherever "
        "it applies) or set it false"
    )


def test_an_explicit_true_is_refused_where_it_cannot_apply(tiny_lm, prompts, tmp_path, monkeypatch):
    """Unset (the default) is on wherever it applies and said at start-up where not; true is
    refused there, in one line naming the reason; false is always accepted."""
    from proxrl.algos.online import grpo, micro_batches, ppo
    from proxrl.runtime.errors import ProxrlError

    options = dict(
        model=tiny_lm,
        prompts=prompts,
        reward_fn=("tests.algos.online_rewards:target_fraction",),
        output_dir=str(tmp_path / "run"),
    )

    def check(config=grpo.Config, **extra):  # type: ignore[no-untyped-def]
        config(**(options | extra)).validate_options()

    cases = [
        ({"gradient_checkpointing": True}, "gradient_checkpointing drops the prompt's cache"),
        ({"max_tokens_per_micro_batch": 64}, "max_tokens_per_micro_batch 64 packs rows end to end"),
        ({"group_size": 1}, "group_size 1: no two responses share a prompt"),
    ]
    for extra, reason in cases:
        with pytest.raises(ProxrlError) as raised:
            check(shared_prefix=True, **extra)
        assert str(raised.value) == _refusal(reason)
        check(**extra)
        check(shared_prefix=False, **extra)
    with pytest.raises(ProxrlError, match="group_size 1"):
        check(ppo.Config, shared_prefix=True)
    check(shared_prefix=True)  # where it applies
    check(shared_prefix=True, max_tokens_per_micro_batch=0, compile_sampler=True)
    monkeypatch.setattr(micro_batches.dist, "world_size", lambda: 2)
    with pytest.raises(ProxrlError, match=r"\(2 processes\)"):
        check(shared_prefix=True)
    check()
    assert grpo.Config(**options).shares_prefix
    assert grpo.Config(**options, shared_prefix=True).shares_prefix
    assert not grpo.Config(**options, shared_prefix=False).shares_prefix


def test_every_way_in_refuses_it_alike(tiny_lm, prompts, tmp_path):
    """A YAML file, the flags, ``proxrl.grpo(...)`` and a TrainingClient: the same refusal,
    before anything loads or is written."""
    import proxrl
    from proxrl.algos.online import grpo
    from proxrl.runtime.config import parse_config
    from proxrl.runtime.errors import ProxrlError

    refusal = _refusal("gradient_checkpointing drops the prompt's cache")
    run = tmp_path / "run"
    argv = ["--model", tiny_lm, "--prompts", prompts, "--output-dir", str(run)]
    argv += ["--reward-fn", "tests.algos.online_rewards:target_fraction"]
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("shared_prefix: true\ngradient_checkpointing: true\n")
    calls = [
        lambda: parse_config(grpo.Config, [*argv, "--config", str(yaml_file)], "proxrl grpo"),
        lambda: parse_config(
            grpo.Config, [*argv, "--shared-prefix", "--gradient-checkpointing"], "proxrl grpo"
        ),
        lambda: proxrl.grpo(
            model=tiny_lm,
            prompts=prompts,
            reward_fn="tests.algos.online_rewards:target_fraction",
            output_dir=str(run),
            shared_prefix=True,
            gradient_checkpointing=True,
        ),
        lambda: proxrl.TrainingClient(tiny_lm, shared_prefix=True, gradient_checkpointing=True),
    ]
    for call in calls:
        with pytest.raises(ProxrlError) as raised:
            call()
        assert str(raised.value).endswith(refusal)
    assert not run.exists()
    cfg = parse_config(grpo.Config, [*argv, "--gradient-checkpointing"], "proxrl grpo")
    assert cfg.shared_prefix is None
    assert parse_config(grpo.Config, [*argv, "--no-shared-prefix"], "p").shared_prefix is False


def test_a_run_saved_with_the_former_default_resumes(tiny_lm, prompts, tmp_path):
    """A run saved when shared_prefix was a bool, true by default: its config.yaml holds true,
    read back on --resume as unset (what it meant), so a run where it cannot apply (here under
    gradient_checkpointing) is neither refused nor reported as changed; a saved false stays."""
    from proxrl.algos.online import grpo
    from proxrl.runtime.config import parse_config, save_config_file
    from proxrl.runtime.errors import ProxrlError
    from proxrl.runtime.resume import check_resume

    run = tmp_path / "run"
    run.mkdir()
    argv = ["--model", tiny_lm, "--prompts", prompts, "--output-dir", str(run), "--resume"]
    argv += ["--reward-fn", "tests.algos.online_rewards:target_fraction"]
    for saved, read in ((True, None), (False, False)):
        started = grpo.Config(
            model=tiny_lm,
            prompts=prompts,
            reward_fn=("tests.algos.online_rewards:target_fraction",),
            output_dir=str(run),
            gradient_checkpointing=True,
        )
        started.shared_prefix = saved  # as an older proxrl saved it (no check then)
        save_config_file(started, run / "config.yaml")
        assert f"shared_prefix: {str(saved).lower()}" in (run / "config.yaml").read_text()
        cfg = parse_config(grpo.Config, argv, "proxrl grpo")
        assert cfg.shared_prefix is read and cfg.gradient_checkpointing
        assert check_resume(cfg) == {}
    with pytest.raises(ProxrlError, match="shared_prefix is None but the run .* ran with False"):
        check_resume(grpo.Config(**{**vars(cfg), "shared_prefix": None}))


def _whole_rows(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``_batch``'s rows with their real tokens moved to the left: the layout a reward model
    scores whole (right-padded)."""
    lengths = mask.sum(-1)
    whole = torch.zeros_like(ids)
    for i, row in enumerate(ids[mask.bool()].split(lengths.tolist())):
        whole[i, : len(row)] = row
    return whole, (torch.arange(ids.shape[1])[None] < lengths[:, None]).long()


@pytest.mark.parametrize(
    ("config_cls", "cls"),
    [(LlamaConfig, LlamaForSequenceClassification), (Qwen2Config, Qwen2ForSequenceClassification)],
)
def test_a_reward_models_shared_prefix_scores_equal_the_whole_rows(float64_norms, config_cls, cls):
    """``shared_prefix_sequence_scores`` on ragged groups (and a row alone) equals the padded and
    the packed scores of the whole rows to 1e-10, and forwards each distinct prompt once."""
    ids, mask, P, _ = _batch()
    model = _model(cls, config_cls, num_labels=1)
    widths = []
    model.model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True,
    )
    with torch.no_grad():
        shared = shared_prefix_sequence_scores(model, ids, mask, P)
        assert shared is not None
        assert widths == [(4, P), (len(ids), ids.shape[1] - P)]  # 4 prompts, then responses
        whole, whole_mask = _whole_rows(ids, mask)
        padded = sequence_scores(model, whole, whole_mask)
        packed = packed_sequence_scores(model, whole, whole_mask)
        distinct = [0, 3, 5, 8]  # nothing to share
        assert shared_prefix_sequence_scores(model, ids[distinct], mask[distinct], P) is None
    assert len(set(padded.tolist())) == len(ids)
    _close(padded, shared, "scores against the padded rows")
    _close(packed, shared, "scores against the packed rows")


def test_a_reward_model_scores_a_groups_prompt_once_and_as_the_whole_rows(
    float64_norms, reward_model, monkeypatch
):
    """``RewardModelReward`` (float64, the tests' tiny reward model): groups of 3 and 2 rows and
    a row alone, ragged responses. With ``shared_prefix`` each forward's distinct prompts run
    once (the body's input widths, counted); its scores equal the whole rows' (packed by
    default, and padded) to 1e-10; ``shared_prefix`` False scores the rows whole."""
    from proxrl.data.formats import PromptExample
    from proxrl.models.scalar_head import load_score_model
    from proxrl.models.tokenizer import load_tokenizer
    from proxrl.rollout.rewards import RewardModelReward

    model = load_score_model(reward_model).double().eval()
    tokenizer = load_tokenizer(reward_model)
    texts = ["say: abc ->"] * 3 + ["say: a longer prompt ->"] * 2 + ["say: bca ->"]
    prompts = [PromptExample(t, None, f"row {i}") for i, t in enumerate(texts)]
    completions = ["a", "abc def ghi jkl", "mno pqr", "", "stu vwx abc", "def ghi"]
    widths = []
    model.model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True,
    )
    scores = {}
    for shared in (True, False):
        for budget in (None, 0):
            widths.clear()
            reward = RewardModelReward(model, tokenizer, max_tokens=budget, shared_prefix=shared)
            scores[shared, budget] = reward(prompts, completions, {}).double()
            if shared:  # the 3 distinct prompts, then the 6 responses
                assert [w[0] for w in widths] == [3, 6], widths
            else:  # one forward of the whole rows (packed or padded)
                assert len(widths) == 1, widths
                assert budget is None or widths[0][0] == 6, widths
    assert len(set(scores[False, 0].tolist())) == len(prompts)
    for key, value in scores.items():
        _close(scores[False, 0], value, str(key))


def test_the_switch_reaches_the_reward_model(tiny_lm, reward_model, monkeypatch):
    """``shared_prefix`` unset or true: the reward model shares its rows' prompts; false, or a
    sharded run (whose ranks must run their forwards alike): it scores them whole."""
    from proxrl.algos.online import grpo, roles
    from proxrl.algos.online.placement.base import LocalPlacement

    def shares(**options) -> bool:  # type: ignore[no-untyped-def]
        cfg = grpo.Config(model=tiny_lm, prompts="p", reward_model=[reward_model], **options)
        (source,) = LocalPlacement().rewards(roles.role_settings(cfg)).sources
        return bool(source.shared_prefix)

    assert shares() and shares(shared_prefix=True) and not shares(shared_prefix=False)
    monkeypatch.setattr(roles.dist, "is_sharded", lambda: True)
    assert not shares()
