"""proxrl against TRL on the identical PPO and GRPO workload, side by side, on this machine.

    .venv/bin/python benchmarks/vs_trl.py                 # both trainers, both sizes, 3 pairs
    .venv/bin/python benchmarks/vs_trl.py --trainers ppo --sizes 128x2 --pairs 1

TRL 1.12.0 (the last release with PPO; it also has GRPO) is installed into its own virtual
environment, ``benchmarks/.venv-trl``, with the same torch and transformers as proxrl. Runs
alternate A B A B … in fresh processes so machine noise hits both alike. The workload is the
same on both sides: the same locally built Qwen2-style model, tokenizer, prompts, reward model
(PPO) or reward function (GRPO), rollout batch, response length (generation runs to
``max_new_tokens``: the random model almost never says EOS), PPO epochs and minibatches,
learning rate and seed, the same precision on both sides (``--precision fp32``, the default: TRL's
bf16 autocast is turned off; ``--precision bf16``: bfloat16 autocast on both, proxrl's
``mixed_precision=bf16`` and TRL's ``bf16=True``; TRL's gradient checkpointing is off either way),
and the same model calls per update — PPO: generate, reference, value
and reward forward passes, then epochs × (policy + value forward and backward); GRPO with β = 0:
generate, reward function, one forward and backward, no reference pass. proxrl takes π_old
from the sampler's logits (``sampler_logprobs``), as TRL does.

Each pair also runs the floor (``worker_floor``, unless ``--no-floor``): the same model calls in
a bare loop, in proxrl's environment. Its tokens per second over TRL's is the ceiling, the
ratio a trainer with no overhead at all would reach with those calls.

Printed per trainer, size and pair: median seconds per update of proxrl / TRL / floor (the
first update of each run is warm-up and dropped; two with ``--compile-sampler``), the response
tokens each kept per update (counted, not assumed: up to and including EOS), peak RSS, the
proxrl/TRL tokens-per-second ratio, the ceiling, and the dtype each side's transformer layers
actually produced in the warm-up update (a ratio between different precisions is flagged in
the summary). ``cpu rt/pd`` gives the ratio and the padded side's ratio again by the process's
CPU time instead of the wall clock (with ``--threads 1`` the work each process did, which other
jobs on a shared machine slow far less), and ``load`` the 1-minute load average after the pair.
TRL 1.12's PPOTrainer ignores ``bf16=True`` on a CPU, so under
``--precision bf16`` its loop runs inside ``torch.autocast``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROXRL_PYTHON = Path(os.environ.get("PROXRL_PYTHON", ROOT / ".venv" / "bin" / "python"))
# TRL 1.12 is the last release with PPO; its GRPO is compared at 1.16, in a venv of its own.
TRL_VENVS = {
    "ppo": (ROOT / "benchmarks" / ".venv-trl", "1.12.0"),
    "grpo": (ROOT / "benchmarks" / ".venv-trl116", "1.16.0"),
}
WORDS = ["abc", "def", "ghi", "jkl", "mno", "pqr", "stu", "vwx"]
PROMPTS = [f"say: {w} ->" for w in WORDS]
# A forward at most this wide is a generation call (prompts of 7-10 tokens plus what the
# trainer's encoding adds); a wider one is a training or scoring pass (prompt + response).
PROMPT_TOKENS = 16
# The spread workload: response j of every 32 stops after SPREAD_LENGTHS[j] tokens (EOS
# included), 32 lengths drawn once, uniformly between 8 and 256, the same on every side.
_DRAW = random.Random(0)
SPREAD_LENGTHS = [_DRAW.randint(8, 256) for _ in range(32)]
assert min(SPREAD_LENGTHS) + 7 > PROMPT_TOKENS  # every training pass is told from a prefill


def letter_share(prompts: list[str], completions: list[str], **columns: object) -> list[float]:
    """The GRPO reward function on both sides: share of characters among a..m."""
    return [sum(ch in "abcdefghijklm" for ch in c) / max(len(c), 1) for c in completions]


# ------------------------------------------------------------------------------------------
# Setup (runs in proxrl's environment)


def ensure_trl_venv(trainer: str) -> None:
    venv, version = TRL_VENVS[trainer]
    if (venv / "bin" / "python").exists():
        return
    import peft
    import transformers

    print(f"installing TRL {version} into {venv} …", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "install", "--quiet"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)  # the CPU build on this machine's disk
    # requests: GRPOTrainer imports it and TRL does not declare it; peft: vs_trl_05b.py's LoRA.
    subprocess.run(
        [
            *pip,
            f"trl=={version}",
            f"transformers=={transformers.__version__}",
            f"peft=={peft.__version__}",
            "requests",
        ],
        check=True,
    )


def build_models(
    work: Path, hidden: int, layers: int, prompts: Callable | None = None, **shape: object
) -> dict[str, str]:
    """A Qwen2-style causal LM, a reward model with the same body and a random head, both
    with the locally trained tokenizer; ``shape`` replaces config fields and ``prompts``
    (tokenizer → prompt texts) replaces PROMPTS (vs_trl_05b.py; saved as ``prompt_list``)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

    sys.path.insert(0, str(ROOT / "tests" / "algos"))
    from lm_tasks import CORPUS

    from proxrl.models.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer(CORPUS)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(hidden // 64, 2),
        num_key_value_heads=max(hidden // 64, 2),
        # prompt + 256 response tokens: proxrl refuses a run longer than the model's context
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        num_labels=1,
    )
    for field, value in shape.items():
        setattr(config, field, value)
    torch.manual_seed(0)
    paths = {"model": work / "policy", "reward": work / "reward"}
    Qwen2ForCausalLM(config).save_pretrained(paths["model"])
    Qwen2ForSequenceClassification(config).save_pretrained(paths["reward"])
    for path in paths.values():
        tokenizer.save_pretrained(path)
    if prompts is not None:
        PROMPTS[:] = prompts(tokenizer)
    prompt_file = work / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS * 4))
    if max(len(tokenizer(p)["input_ids"]) for p in PROMPTS) > PROMPT_TOKENS:
        raise SystemExit("PROMPT_TOKENS: a prompt is longer; raise it")
    return {
        "model": str(paths["model"]),
        "reward": str(paths["reward"]),
        "prompts": str(prompt_file),
        "eos": str(tokenizer.eos_token_id),
        "vocab": str(config.vocab_size),  # the LM head's width (the tokenizer's by default)
        "prompt_list": json.dumps(PROMPTS),
    }


# ------------------------------------------------------------------------------------------
# Workers (one process per run; each prints one JSON line)


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# Where a generation call is told from the other passes: with MARK_GENERATION (the default), by
# the sampling function each side calls (Workload.mark_generation), since a group's prompt
# forwarded once (proxrl's shared prefix) makes narrow training passes and a prefill of fewer
# rows; else by the width of its first forward (at most PROMPT_TOKENS columns), as before it.
MARK_GENERATION = True


class Workload:
    """What every side's model calls see, hooked into every module (both frameworks alike).

    - The spread workload (``forced``): response j of each generation call, counted over calls
      mod 32, stops after ``SPREAD_LENGTHS[j]`` tokens — EOS is impossible before and certain
      there, the same lengths on every side whatever the model samples. A generation call is a
      prompt-wide forward (at most PROMPT_TOKENS columns) followed by one-token steps; the
      training and scoring passes are wider and left alone. With ``MARK_GENERATION`` a
      generation call is what runs inside ``transformers``' ``generate``, proxrl's
      ``CachedSampler.sample`` or ``generation()`` (the floor's loop), its rows counted there.
    - The padding share of the training and scoring passes: pad positions (id 0, also the
      packed filler) over all positions those passes computed."""

    def __init__(self, forced: bool, eos: int, vocab: int) -> None:
        import torch

        self.torch, self.forced, self.eos, self.vocab = torch, forced, eos, vocab
        self.lengths = torch.tensor(SPREAD_LENGTHS)
        self.offset, self.step, self.rows, self.width = 0, 0, None, 0
        self.positions, self.pads = 0, 0
        self.decode_steps, self.decode_rows = 0, 0  # one-token forwards and their rows
        self.marked, self.generating = MARK_GENERATION, False
        if self.marked:
            self.mark_generation()
        self.handle = torch.nn.modules.module.register_module_forward_hook(self.hook)

    @contextlib.contextmanager
    def generation(self, rows: int) -> Iterator[None]:
        """A generation call of ``rows`` rows runs inside (MARK_GENERATION)."""
        self.generating, self.step = True, 0
        self.rows = (self.offset + self.torch.arange(rows)) % len(self.lengths)
        self.offset += rows
        try:
            yield
        finally:
            self.generating, self.rows = False, None

    def mark_generation(self) -> None:
        """Wrap the sampling functions this process has in ``generation``."""
        import transformers

        def wrap(owner: type, name: str, rows_of: Callable[..., int]) -> None:
            original = getattr(owner, name)

            def marked(*args, **kwargs):  # type: ignore[no-untyped-def]
                with self.generation(rows_of(*args, **kwargs)):
                    return original(*args, **kwargs)

            setattr(owner, name, marked)

        def generate_rows(model, inputs=None, *args, **kwargs):  # type: ignore[no-untyped-def]
            ids = inputs if inputs is not None else kwargs["input_ids"]
            return int(ids.shape[0])

        wrap(transformers.GenerationMixin, "generate", generate_rows)
        if "proxrl.rollout.generation" in sys.modules:  # (not in TRL's environment)
            from proxrl.rollout.generation import CachedSampler

            wrap(CachedSampler, "sample", lambda sampler, ids, *a, **k: int(ids.shape[0]))

    def hook(self, module, args, output) -> None:  # type: ignore[no-untyped-def]
        torch = self.torch
        if isinstance(module, torch.nn.Embedding) and args and args[0].dim() == 2:
            n, self.width = args[0].shape
            if self.width > PROMPT_TOKENS if not self.marked else not self.generating:
                self.positions += args[0].numel()
                self.pads += int((args[0] == 0).sum())
            elif self.width > 1:  # a generation call starts: token 0 comes out of this pass
                if not self.marked:  # (marked: its rows were counted as the call began)
                    self.rows = (self.offset + torch.arange(n)) % len(self.lengths)
                    self.offset += n
                self.step = 0
            else:
                self.step += 1
                self.decode_steps, self.decode_rows = self.decode_steps + 1, self.decode_rows + n
                if self.rows is not None and n < len(self.rows):
                    # the sampler left its stopped rows out of the batch (``drop_stopped``):
                    # those whose last token came before this step
                    self.rows = self.rows[self.lengths[self.rows] - 1 >= self.step]
                    assert len(self.rows) == n, (len(self.rows), n)
        elif (
            self.forced
            and isinstance(module, torch.nn.Linear)
            and self.vocab <= module.out_features <= self.vocab + 8  # (proxrl adds a token)
            and (self.width <= PROMPT_TOKENS if not self.marked else self.generating)
            and self.rows is not None
            and not torch.is_grad_enabled()
        ):
            stop = self.lengths[self.rows].to(output.device) - 1 == self.step
            last = output[:, -1]
            if len(last) != len(stop):  # a prefill of the distinct prompts (shared prefill)
                assert self.step == 0 and not bool(stop.any()), "a response of 1 token"
                last[:, self.eos] = float("-inf")
                return
            last[:, self.eos] = torch.where(stop, 1e4, float("-inf")).to(last.dtype)

    @property
    def padding_share(self) -> float:
        return self.pads / max(self.positions, 1)

    @property
    def rows_per_step(self) -> float:
        """Mean rows of a decoding step: below the batch where stopped rows leave it."""
        return self.decode_rows / max(self.decode_steps, 1)


class ComputeDtypes:
    """The dtypes the transformer's linear layers produced during the first (warm-up) update, to
    check both sides really computed in the precision asked for (a flag a trainer ignores would
    make the ratio compare different work). The d → 1 scalar heads are left out: proxrl keeps
    them in float32 under bf16, TRL does not, and their cost is nil. Removed at the first
    update's end: no cost after it."""

    def __init__(self) -> None:
        import torch

        self.seen: set[str] = set()
        self.linear, self.tensor = torch.nn.Linear, torch.Tensor
        self.handle = torch.nn.modules.module.register_module_forward_hook(self.record)

    def record(self, module, args, output) -> None:  # type: ignore[no-untyped-def]
        if (
            isinstance(module, self.linear)
            and module.out_features > 1
            and isinstance(output, self.tensor)
        ):
            self.seen.add(str(output.dtype).removeprefix("torch."))

    def stop(self) -> None:
        self.handle.remove()


def worker_proxrl(args: argparse.Namespace, paths: dict[str, str]) -> dict:
    import proxrl.runtime.metrics as metrics
    from proxrl.algos.online import grpo, ppo

    stamps: list[float] = []
    cpu_stamps: list[float] = []
    original_log = metrics.MetricsLogger.log
    dtypes = ComputeDtypes()

    def stamped_log(self, step, row):  # type: ignore[no-untyped-def]
        result = original_log(self, step, row)
        stamps.append(time.perf_counter())
        cpu_stamps.append(time.process_time())
        dtypes.stop()
        return result

    metrics.MetricsLogger.log = stamped_log  # type: ignore[method-assign]
    spread = getattr(args, "workload", "fixed") == "spread"  # (benchmarks/old_logprobs.py)
    workload = Workload(spread, int(paths["eos"]), int(paths["vocab"]))
    if getattr(args, "packed", False):  # padding-free micro-batches, the rest as padded
        args.overrides = getattr(args, "overrides", {})
        args.overrides["max_tokens_per_micro_batch"] = args.max_tokens
    common = dict(
        model=paths["model"],
        prompts=paths["prompts"],
        output_dir=args.out,
        overwrite=True,
        seed=1,
        iterations=args.updates,
        max_new_tokens=args.tokens,
        temperature=1.0,
        learning_rate=1e-5,
        progress=False,
        sample_every=0,
        sampler_logprobs=True,
        lr_schedule="linear",
        mixed_precision="bf16" if args.precision == "bf16" else "no",
        compile_sampler=args.compile_sampler,
    )
    if args.trainer == "ppo":
        fields = dict(
            reward_model=paths["reward"],
            critic_model=paths["reward"],
            rollout_batch_size=32,
            group_size=1,
            ppo_epochs=4,
            mini_batch_size=16,
            grad_accum=1,
            kl_coef=0.05,
            critic_learning_rate=1e-5,
            max_grad_norm=0.0,
        )
    else:
        sys.modules.setdefault("vs_trl", sys.modules[__name__])
        fields = dict(
            reward_fn=("vs_trl:letter_share",),
            estimator="grpo",
            rollout_batch_size=8,
            group_size=4,
            ppo_epochs=1,
            mini_batch_size=32,
            grad_accum=2,
            kl_coef=0.0,
            max_grad_norm=1.0,
            track_kl=False,
        )
    # benchmarks/old_logprobs.py's variants, vs_trl_05b.py's shape (they may replace any field)
    fields = common | fields | getattr(args, "overrides", {})
    algo = ppo if args.trainer == "ppo" else grpo
    cfg = algo.Config(**fields)
    started, cpu_started = time.perf_counter(), time.process_time()
    algo.train(cfg)
    rows = metrics.read_metrics(args.out)
    responses = cfg.rollout_batch_size * cfg.group_size  # the same count on every side
    tokens = [r["response/length_mean"] * responses for r in rows]
    split = {  # where an update's time goes (the warm-up left out)
        key.removeprefix("time/").removesuffix("_s"): statistics.median(r[key] for r in rows[1:])
        for key in (
            "time/rollout_s",
            "time/score_s",
            "time/forward_s",
            "time/update_s",
            "time/weight_sync_s",
        )
        if len(rows) > 1 and key in rows[1]
    }
    return {
        "update_s": [b - a for a, b in zip([started, *stamps], stamps, strict=False)],
        "update_cpu_s": [
            b - a for a, b in zip([cpu_started, *cpu_stamps], cpu_stamps, strict=False)
        ],
        "tokens": tokens,
        "peak_mb": _peak_mb(),
        "dtypes": sorted(dtypes.seen),
        "padding_share": workload.padding_share,
        "rows_per_step": workload.rows_per_step,
        "split": split,
        "weight_sync_s": [r["time/weight_sync_s"] for r in rows if "time/weight_sync_s" in r],
    }


def worker_trl(args: argparse.Namespace, paths: dict[str, str]) -> dict:
    import torch
    from datasets import Dataset
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        TrainerCallback,
    )

    stamps: list[float] = []
    cpu_stamps: list[float] = []
    tokens: list[float] = []
    # vs_trl_05b.py's shape: config fields, a LoRA config and the rollout's size replace these
    overrides = getattr(args, "trl_overrides", {})
    peft_config = getattr(args, "peft_config", None)
    responses = getattr(args, "responses", 32)  # responses per update, the same on every side

    dtypes = ComputeDtypes()

    class Stamp(TrainerCallback):
        def on_step_end(self, *a, **k):  # type: ignore[no-untyped-def]
            stamps.append(time.perf_counter())
            cpu_stamps.append(time.process_time())
            dtypes.stop()

        def on_log(self, args, state, control, logs=None, **k):  # type: ignore[no-untyped-def]
            if logs and "completions/mean_length" in logs:  # GRPO: the kept completion tokens
                tokens.append(logs["completions/mean_length"] * responses)

    tokenizer = AutoTokenizer.from_pretrained(paths["model"], padding_side="left")
    workload = Workload(args.workload == "spread", int(paths["eos"]), int(paths["vocab"]))
    common = dict(
        output_dir=args.out,
        learning_rate=1e-5,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        seed=1,
        use_cpu=not torch.cuda.is_available(),  # (gpu_check.sh runs vs_trl_05b.py on a GPU)
        disable_tqdm=True,
        lr_scheduler_type="linear",
        gradient_checkpointing=False,
        bf16=args.precision == "bf16",
    )
    torch.manual_seed(1)
    if args.trainer == "ppo":
        import trl.experimental.ppo.ppo_trainer as ppo_module
        from trl.experimental.ppo import PPOConfig, PPOTrainer

        truncate = ppo_module.truncate_response
        kept: list[float] = []
        fields = (
            dict(
                per_device_train_batch_size=16,
                gradient_accumulation_steps=2,
                num_mini_batches=2,
                num_ppo_epochs=4,
                response_length=args.tokens,
                stop_token="eos",
                temperature=1.0,
                total_episodes=responses * args.updates,
                local_rollout_forward_batch_size=16,
                kl_coef=0.05,
                num_sample_generations=0,
                missing_eos_penalty=None,
                max_grad_norm=None,
            )
            | overrides
        )
        chunks = responses // fields["local_rollout_forward_batch_size"]

        def counting_truncate(stop_token_id, pad_token_id, responses):  # type: ignore[no-untyped-def]
            out = truncate(stop_token_id, pad_token_id, responses)
            kept.append(float((out != pad_token_id).sum()))  # tokens up to and including EOS
            if len(kept) % chunks == 0:  # the rollout's chunks of one update
                tokens.append(sum(kept[-chunks:]))
            return out

        ppo_module.truncate_response = counting_truncate

        dataset = Dataset.from_dict(
            {"input_ids": [tokenizer(p)["input_ids"] for p in PROMPTS * (responses // 8)]}
        )
        config = PPOConfig(**common, **fields)
        value_model = AutoModelForSequenceClassification.from_pretrained(
            paths["reward"], num_labels=1
        )
        if peft_config is not None:  # LoRA on the critic too (TRL puts it on the policy only)
            from peft import inject_adapter_in_model

            # in place, so TRL still finds the backbone and the score head by their names
            value_model = inject_adapter_in_model(peft_config(None), value_model)
            for name, weight in value_model.named_parameters():
                weight.requires_grad_("lora_" in name or name.startswith("score."))
        trainer = PPOTrainer(
            args=config,
            processing_class=tokenizer,
            model=AutoModelForCausalLM.from_pretrained(paths["model"]),
            # with LoRA the reference is the adapter-disabled policy, as in proxrl
            ref_model=None
            if peft_config is not None
            else AutoModelForCausalLM.from_pretrained(paths["model"]),
            reward_model=AutoModelForSequenceClassification.from_pretrained(
                paths["reward"], num_labels=1
            ),
            value_model=value_model,
            train_dataset=dataset,
            callbacks=[Stamp()],
            peft_config=None if peft_config is None else peft_config(),
        )
    else:
        from trl import GRPOConfig, GRPOTrainer

        dataset = Dataset.from_dict({"prompt": PROMPTS * 8})
        fields = (
            dict(
                per_device_train_batch_size=16,
                gradient_accumulation_steps=2,
                num_generations=4,
                max_completion_length=args.tokens,
                temperature=1.0,
                beta=0.0,
                num_iterations=1,
                max_steps=args.updates,
                log_completions=False,
                max_grad_norm=1.0,
            )
            | overrides
        )
        config = GRPOConfig(**common, **fields)
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(paths["model"]),
            reward_funcs=letter_share,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[Stamp()],
            peft_config=None if peft_config is None else peft_config(),
        )
    # TRL 1.12's experimental PPOTrainer leaves its bf16 flag unapplied on a CPU (ComputeDtypes
    # saw float32 throughout): autocast around its loop gives it the bf16 compute it asks for.
    ppo_needs_autocast = args.precision == "bf16" and args.trainer == "ppo"
    started, cpu_started = time.perf_counter(), time.process_time()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=ppo_needs_autocast):
        trainer.train()
    return {
        "update_s": [b - a for a, b in zip([started, *stamps], stamps, strict=False)],
        "update_cpu_s": [
            b - a for a, b in zip([cpu_started, *cpu_stamps], cpu_stamps, strict=False)
        ],
        "tokens": tokens,
        "peak_mb": _peak_mb(),
        "dtypes": sorted(dtypes.seen),
        "padding_share": workload.padding_share,
        "rows_per_step": workload.rows_per_step,
    }


def worker_floor(args: argparse.Namespace, paths: dict[str, str]) -> dict:
    """The model calls of one update of the workload in a bare loop, nothing around them: what
    no trainer can go below, so TRL's time over it bounds what any trainer can gain on TRL.
    PPO: sample with log-probs, the reward, reference and value passes, then 4 epochs × 2
    minibatches of policy + value forward, backward and two AdamW steps. GRPO: sample with
    log-probs, the reward function, then two micro-batches of policy forward and backward, one
    clipped AdamW step. ``args.floor_shape`` (vs_trl_05b.py) gives another shape: prompts and
    group per update, minibatch and micro-batch rows, epochs, a LoRA rank (on the policy and the
    critic; the reference is then the adapter-disabled policy) and ``engine``, the options of a
    vLLM engine to sample with instead of the bare cached loop (its weights synced after each
    update, as any vLLM trainer must). The bare loop decodes every row until the last stops, as
    TRL does: on the spread workload proxrl's sampler, which drops stopped rows, decodes fewer
    (``rows_per_step``), so there it can run below this floor."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from proxrl.core import (
        gae,
        group_scaled_advantages,
        logprobs_from_logits,
        ppo_clip_loss,
        shaped_rewards,
        value_loss,
    )
    from proxrl.models.lora import adapter_disabled, apply_lora
    from proxrl.models.scalar_head import sequence_scores
    from proxrl.rollout.forward import critic_forward, policy_forward, position_ids
    from proxrl.rollout.generation import distinct_rows, draw_tokens, response_mask_after_stop

    ppo = args.trainer == "ppo"
    shape = {
        "prompts": 32 if ppo else 8,
        "group": 1 if ppo else 4,
        "mini": 16 if ppo else 32,
        "micro": 16,
        "epochs": 4 if ppo else 1,
        "lora_r": 0,
        "engine": None,
        "shared": None,
    } | getattr(args, "floor_shape", {})
    torch.manual_seed(1)
    workload = Workload(args.workload == "spread", int(paths["eos"]), int(paths["vocab"]))
    tokenizer = AutoTokenizer.from_pretrained(paths["model"], padding_side="left")
    policy = AutoModelForCausalLM.from_pretrained(paths["model"])
    if shape["lora_r"]:
        policy = apply_lora(policy, shape["lora_r"])
    prompts = [p for p in (PROMPTS * 8)[: shape["prompts"]] for _ in range(shape["group"])]
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    P, eos, pad = batch.input_ids.shape[1], tokenizer.eos_token_id, tokenizer.pad_token_id
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizers = [torch.optim.AdamW(params, lr=1e-5)]
    if ppo:
        ref = (
            policy
            if shape["lora_r"]
            else AutoModelForCausalLM.from_pretrained(paths["model"]).requires_grad_(False)
        )
        reward = AutoModelForSequenceClassification.from_pretrained(
            paths["reward"], num_labels=1
        ).requires_grad_(False)
        critic = AutoModelForSequenceClassification.from_pretrained(paths["reward"], num_labels=1)
        if shape["lora_r"]:
            critic = apply_lora(critic, shape["lora_r"], task="seq_cls")
        optimizers.append(
            torch.optim.AdamW([p for p in critic.parameters() if p.requires_grad], lr=1e-5)
        )
    engine = None
    if shape["engine"] is not None:
        from proxrl.rollout.vllm_sampler import start_engine, sync_weights

        engine = start_engine(shape["engine"])
        sync_weights(engine, policy)
    dtypes = ComputeDtypes()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")

    def sample() -> tuple[torch.Tensor, torch.Tensor]:  # (B, T) ids, (B, T) log-probs
        marked = workload.generation(len(prompts)) if workload.marked else contextlib.nullcontext()
        with marked:
            return sample_rows()

    def sample_rows() -> tuple[torch.Tensor, torch.Tensor]:
        attention = batch.attention_mask.clone()
        positions = position_ids(attention)
        # shape["shared"]: a group's prompt prefilled once, its cache copied to the group's rows
        found = distinct_rows(batch.input_ids, attention) if shape["shared"] else None
        first, inverse = found if found is not None else (slice(None), None)
        out = policy(
            input_ids=batch.input_ids[first],
            attention_mask=attention[first],
            position_ids=positions[first],
            use_cache=True,
            logits_to_keep=1,
        )
        cache, logits, step = out.cache, out.logits[:, -1], positions[:, -1:] + 1
        if inverse is not None:
            cache.reorder_cache(inverse)
            logits = logits[inverse]
        done = torch.zeros(len(prompts), dtype=torch.bool)
        tokens, logprobs = [], []
        for _ in range(args.tokens):
            log_p = torch.log_softmax(logits.float(), -1)
            token = torch.where(done, pad, draw_tokens(log_p.exp()))
            tokens.append(token)
            logprobs.append(log_p.gather(-1, token[:, None]).squeeze(-1))
            done |= token == eos
            if done.all():
                break
            attention = torch.cat([attention, torch.ones_like(attention[:, :1])], 1)
            out = policy(
                input_ids=token[:, None],
                attention_mask=attention,
                position_ids=step,
                cache=cache,
                use_cache=True,
            )
            cache, logits, step = out.cache, out.logits[:, -1], step + 1
        response = torch.stack(tokens, 1)
        return response, torch.stack(logprobs, 1)

    def sample_vllm() -> tuple[torch.Tensor, torch.Tensor]:  # (B, T) ids, (B, T) log-probs
        from vllm import SamplingParams

        from proxrl.rollout.vllm_sampler import outputs_as_tensors

        rows = [
            ids[m.bool()].tolist()
            for ids, m in zip(batch.input_ids, batch.attention_mask, strict=True)
        ]
        params = [
            SamplingParams(
                max_tokens=args.tokens, logprobs=0, stop_token_ids=[eos], temperature=1.0, seed=s
            )
            for s in torch.randint(0, 2**31 - 1, (len(rows),)).tolist()
        ]
        outputs = engine.generate(
            [{"prompt_token_ids": row} for row in rows], params, use_tqdm=False
        )
        return outputs_as_tensors(outputs, pad, True)

    def rollout() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        response, logprobs = sample_vllm() if engine is not None else sample()
        response_mask = response_mask_after_stop(response, eos, pad)
        return (
            torch.cat([batch.input_ids, response], 1),
            torch.cat([batch.attention_mask, response_mask], 1),
            logprobs * response_mask,
        )

    def policy_logprobs(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if shape["shared"] is not None:  # the response positions' logits alone, as both sides
            return policy_forward(policy, ids, mask, P, 1.0, shared_prefix=shape["shared"]).logprobs
        logits = policy(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits[
            :, P - 1 : -1
        ]
        return logprobs_from_logits(logits, ids[:, P:])

    def micro_batches(rows: torch.Tensor) -> list[tuple[torch.Tensor, float]]:
        """One minibatch's micro-batches, each with its share of the minibatch's rows."""
        return [(micro, len(micro) / len(rows)) for micro in rows.split(shape["micro"])]

    update_s, update_cpu_s, tokens, splits = [], [], [], []
    for _ in range(args.updates):
        started, cpu_started = time.perf_counter(), time.process_time()
        with torch.no_grad(), autocast:
            ids, mask, old = rollout()
            sampled = time.perf_counter()
            response_mask = mask[:, P:].float()
            completions = tokenizer.batch_decode(
                ids[:, P:] * mask[:, P:] + pad * (1 - mask[:, P:]), skip_special_tokens=True
            )
            if ppo:
                scores = sequence_scores(reward, ids, mask)
                with adapter_disabled(ref):
                    ref_logprobs = policy_logprobs(ids, mask) if ref is policy else None
                if ref_logprobs is None:
                    ref_logprobs = logprobs_from_logits(
                        ref(
                            input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)
                        ).logits[:, P - 1 : -1],
                        ids[:, P:],
                    )
                old_values = critic_forward(
                    critic, ids, mask, P, shared_prefix=bool(shape["shared"])
                )
            else:
                scores = torch.tensor(letter_share(prompts, completions))
        scored = time.perf_counter()
        if ppo:  # KL-shaped rewards and GAE, as both trainers compute them
            rewards = shaped_rewards(scores, old, ref_logprobs, response_mask, 0.05)
            advantages, returns = gae(rewards, old_values, response_mask, gamma=1.0, lam=0.95)
            for _ in range(shape["epochs"]):
                for minibatch in torch.randperm(len(prompts)).split(shape["mini"]):
                    for rows, share in micro_batches(minibatch):
                        with autocast:
                            loss = ppo_clip_loss(
                                policy_logprobs(ids[rows], mask[rows]),
                                old[rows],
                                advantages[rows],
                                response_mask[rows],
                            )[0]
                            values = critic_forward(
                                critic,
                                ids[rows],
                                mask[rows],
                                P,
                                shared_prefix=bool(shape["shared"]),
                            )
                            loss = (
                                loss
                                + 0.1
                                * value_loss(
                                    values,
                                    old_values[rows],
                                    returns[rows],
                                    response_mask[rows],
                                    0.2,
                                )[0]
                            )
                        (loss * share).backward()
                    for opt in optimizers:
                        opt.step()
                        opt.zero_grad()
        else:
            advantages = group_scaled_advantages(scores, shape["group"])[:, None].expand_as(old)
            for _ in range(shape["epochs"]):
                for minibatch in torch.arange(len(prompts)).split(shape["mini"]):
                    for rows, share in micro_batches(minibatch):
                        with autocast:
                            loss = ppo_clip_loss(
                                policy_logprobs(ids[rows], mask[rows]),
                                old[rows],
                                advantages[rows],
                                response_mask[rows],
                            )[0]
                        (loss * share).backward()
                    torch.nn.utils.clip_grad_norm_(params, 1.0)
                    optimizers[0].step()
                    optimizers[0].zero_grad()
        updated = time.perf_counter()
        if engine is not None:
            sync_weights(engine, policy)
        update_s.append(time.perf_counter() - started)
        update_cpu_s.append(time.process_time() - cpu_started)
        splits.append(
            {
                "rollout": sampled - started,
                "score+forward": scored - sampled,
                "update": updated - scored,
            }
            | ({"weight_sync": time.perf_counter() - updated} if engine is not None else {})
        )
        tokens.append(float(response_mask.sum()))
        dtypes.stop()
    return {
        "update_s": update_s,
        "update_cpu_s": update_cpu_s,
        "tokens": tokens,
        "peak_mb": _peak_mb(),
        "dtypes": sorted(dtypes.seen),
        "padding_share": workload.padding_share,
        "rows_per_step": workload.rows_per_step,
        "split": {k: statistics.median(s[k] for s in splits[1:]) for k in splits[-1]}
        if len(splits) > 1
        else {},
    }


# ------------------------------------------------------------------------------------------
# Orchestration


def run_worker(
    framework: str, trainer: str, paths: dict[str, str], args: argparse.Namespace, out: Path
) -> dict:
    python = TRL_VENVS[trainer][0] / "bin" / "python" if framework == "trl" else PROXRL_PYTHON
    command = [
        str(python),
        __file__,
        "--worker",
        "proxrl" if framework == "packed" else framework,
        *(["--packed"] if framework == "packed" else []),
        "--workload",
        args.workload,
        "--max-tokens",
        str(args.max_tokens),
        "--trainer",
        trainer,
        "--paths",
        json.dumps(paths),
        "--updates",
        str(args.updates),
        "--tokens",
        str(args.tokens),
        "--out",
        str(out),
        "--precision",
        args.precision,
        *(["--compile-sampler"] if args.compile_sampler else []),
    ]
    env = os.environ | {
        "OMP_NUM_THREADS": str(args.threads),
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": f"{Path(__file__).parent}:{ROOT / 'src'}",
    }
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise SystemExit(f"{framework} {trainer} failed:\n{result.stderr[-3000:]}")
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description="proxrl vs TRL, same workload, alternating runs")
    parser.add_argument("--trainers", nargs="+", default=["ppo", "grpo"], choices=["ppo", "grpo"])
    parser.add_argument("--sizes", nargs="+", default=["128x2", "256x4"], help="hidden x layers")
    parser.add_argument("--pairs", type=int, default=3, help="A/B pairs per trainer and size")
    parser.add_argument(
        "--updates", type=int, default=5, help="updates per run (the first is warm-up)"
    )
    parser.add_argument(
        "--tokens", type=int, default=None, help="response length (fixed: 32; spread: 256 max)"
    )
    parser.add_argument(
        "--workload",
        choices=["fixed", "spread"],
        default="fixed",
        help="fixed: every response runs to --tokens; spread: SPREAD_LENGTHS, 8 to 256",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=4096,
        help="proxrl packed side: max_tokens_per_micro_batch",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="compute precision, both sides",
    )
    parser.add_argument(
        "--compile-sampler",
        action="store_true",
        help=(
            "proxrl's compile_sampler (its compiles land in the first two updates: "
            "warm-up, printed apart)"
        ),
    )
    parser.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help="skip the bare-loop floor runs (the ceiling column is then nan)",
    )
    parser.add_argument("--worker", choices=["proxrl", "trl", "floor"], help=argparse.SUPPRESS)
    parser.add_argument("--trainer", choices=["ppo", "grpo"], help=argparse.SUPPRESS)
    parser.add_argument("--paths", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--packed", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tokens is None:
        args.tokens = 256 if args.workload == "spread" else 32

    if args.worker:
        import logging

        import torch

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
        logging.disable(logging.WARNING)
        work = {"proxrl": worker_proxrl, "trl": worker_trl, "floor": worker_floor}[args.worker]
        print(json.dumps(work(args, json.loads(args.paths))))
        return

    import tempfile

    for trainer in args.trainers:
        ensure_trl_venv(trainer)
    root = Path(tempfile.mkdtemp(prefix="vs_trl_"))
    # proxrl padded, proxrl packed (max_tokens_per_micro_batch), TRL, the bare-loop floor
    frameworks = ("proxrl", "packed", "trl") + (("floor",) if args.floor else ())
    sides = "/".join(frameworks)
    print(
        f"workload {args.workload} ({args.tokens} tokens at most), {args.precision}; sides "
        f"{sides}; ratio = packed/TRL tokens per second, packed/padded = packed/proxrl",
        flush=True,
    )
    print(
        f"{'trainer':<6} {'size':<6} {'pair':<4} {'s/update':>26} {'tokens/update':>20} "
        f"{'padding share':>16} {'peak MB':>15} {'ratio':>6} {'padded':>6} {'pk/pd':>6} "
        f"{'ceiling':>7} {'cpu rt/pd':>11} {'load':>4}  proxrl time split (padded | packed)  "
        "computed in",
        flush=True,
    )
    # Removing ComputeDtypes' hook after update 1 makes torch.compile recompile the sampler's
    # step once, in update 2: with compile_sampler the first two updates are warm-up.
    warmup = 2 if args.compile_sampler else 1
    if args.updates <= warmup:
        raise SystemExit(f"--updates: expected more than the {warmup} warm-up update(s)")
    summary = []
    for size in args.sizes:
        hidden, layers = (int(x) for x in size.split("x"))
        paths = build_models(root / size, hidden, layers)
        for trainer in args.trainers:
            ratios, ceilings, computed = [], [], set()
            padded_ratios, packing_gains = [], []
            cpu_ratios, cpu_padded = [], []  # the same ratios of tokens per CPU second
            for pair in range(args.pairs):
                runs = {}
                for framework in frameworks:  # A B (C) within every pair
                    runs[framework] = Run.of(
                        run_worker(
                            framework,
                            trainer,
                            paths,
                            args,
                            root / size / f"{trainer}-{framework}-{pair}",
                        ),
                        warmup,
                    )
                ratios.append(runs["packed"].tokens_per_s / runs["trl"].tokens_per_s)
                cpu_ratios.append(runs["packed"].cpu_tokens_per_s / runs["trl"].cpu_tokens_per_s)
                cpu_padded.append(runs["proxrl"].cpu_tokens_per_s / runs["trl"].cpu_tokens_per_s)
                padded_ratios.append(runs["proxrl"].tokens_per_s / runs["trl"].tokens_per_s)
                packing_gains.append(runs["packed"].tokens_per_s / runs["proxrl"].tokens_per_s)
                ceilings.append(
                    runs["floor"].tokens_per_s / runs["trl"].tokens_per_s
                    if args.floor
                    else float("nan")
                )
                computed.add(tuple(run.dtypes for run in runs.values()))
                trained = [runs[k] for k in ("proxrl", "packed", "trl")]
                split = " | ".join(
                    " ".join(f"{k} {v:.2f}" for k, v in runs[k].split.items())
                    for k in ("proxrl", "packed")
                )
                print(
                    f"{trainer:<6} {size:<6} {pair:<4} "
                    f"{'/'.join(f'{r.seconds:.3f}' for r in runs.values()):>26} "
                    f"{'/'.join(f'{r.tokens:.0f}' for r in runs.values()):>20} "
                    f"{'/'.join(f'{r.padding_share:.2f}' for r in trained):>16} "
                    f"{'/'.join(f'{r.peak_mb:.0f}' for r in trained):>15} "
                    f"{ratios[-1]:>6.2f} {padded_ratios[-1]:>6.2f} {packing_gains[-1]:>6.2f} "
                    f"{ceilings[-1]:>7.2f} {cpu_ratios[-1]:>5.2f}/{cpu_padded[-1]:<5.2f} "
                    f"{os.getloadavg()[0]:>4.1f}  {split}  "
                    f"{' / '.join(run.dtypes for run in runs.values())}  rows/decoding step "
                    f"{'/'.join(f'{r.rows_per_step:.1f}' for r in runs.values())}",
                    flush=True,
                )
            summary.append(
                (
                    trainer,
                    size,
                    statistics.median(ratios),
                    statistics.median(padded_ratios),
                    statistics.median(packing_gains),
                    statistics.median(ceilings),
                    computed,
                    statistics.median(cpu_ratios),
                    statistics.median(cpu_padded),
                )
            )
    print(
        f"\nmedians ({args.workload}, {args.precision} on every side): ratio = proxrl packed/TRL "
        "tokens per second, padded = proxrl padded/TRL, packing = packed/padded; "
        "ceiling = floor/TRL, the ratio a trainer with no overhead at all would reach"
    )
    for trainer, size, ratio, padded_ratio, gain, ceiling, computed, cpu, cpu_pd in summary:
        alike = all(len(set(c)) == 1 for c in computed)
        note = (
            ""
            if alike
            else "   NOT like for like: computed in " + ", ".join(" vs ".join(c) for c in computed)
        )
        print(
            f"  {trainer:<5} {size:<7} ratio {ratio:.2f}   padded {padded_ratio:.2f}   "
            f"packing {gain:.2f}   ceiling {ceiling:.2f}   by CPU time: ratio {cpu:.2f} "
            f"padded {cpu_pd:.2f}{note}"
        )


@dataclass
class Run:
    """One worker's numbers, warm-up updates left out."""

    seconds: float  # median seconds per update
    tokens_per_s: float  # median over updates of the tokens kept / seconds
    tokens: float  # mean response tokens kept per update
    peak_mb: float
    dtypes: str  # what its linear layers computed in
    warmup_s: float  # the warm-up updates together (compiles land here)
    padding_share: float  # pad positions / positions of the training and scoring passes
    split: dict[str, float]  # proxrl: median seconds of rollout, score, forward, update
    cpu_tokens_per_s: float  # the same per second of the process's CPU time
    rows_per_step: float  # mean rows per decoding step (the built-in samplers' and TRL's)

    @classmethod
    def of(cls, numbers: dict, warmup: int) -> Run:
        seconds, tokens = numbers["update_s"][warmup:], numbers["tokens"][warmup:]
        return cls(
            statistics.median(seconds),
            statistics.median(n / t for n, t in zip(tokens, seconds, strict=True)),
            statistics.mean(tokens),
            numbers["peak_mb"],
            "+".join(numbers["dtypes"]),
            sum(numbers["update_s"][:warmup]),
            numbers.get("padding_share", float("nan")),
            numbers.get("split", {}),
            statistics.median(
                n / t for n, t in zip(tokens, numbers["update_cpu_s"][warmup:], strict=True)
            ),
            numbers.get("rows_per_step", float("nan")),
        )


if __name__ == "__main__":
    main()
