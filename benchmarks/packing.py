"""Packed against padded micro-batches on the spread lengths, side by side in one process.

    .venv/bin/python benchmarks/packing.py                     # float32, 128 x 2
    .venv/bin/python benchmarks/packing.py --precision bf16 --sizes 128x2 256x4

Where packing acts, without the sampling it cannot change (``vs_trl.py --workload spread``
runs whole iterations): on vs_trl.py's model (a Qwen2-style LM built locally) and its spread
lengths (``vs_trl.SPREAD_LENGTHS``: 32 responses stopping uniformly between 8 and 256 tokens),

- ``grpo update`` / ``ppo update``: ``update()`` of vs_trl.py's GRPO (32 responses, 2 micro-
  batches of 16, one step) and PPO (4 epochs × 2 minibatches of 16, a separate critic) on a
  rollout of those lengths, padded against ``max_tokens_per_micro_batch``;
- ``rollout forward``: the rollout's π_old + reference + critic passes over the same batch;
- ``sft epoch``: SFT on 64 examples (prompts 8-16, completions 8-256 tokens), length-bucketed
  padded batches of 8 (the trainer's default) against ``packing`` (rows of 512 tokens, 8 each);
- ``dpo epoch``: DPO on 32 pairs of such responses, bucketed batches of 8 pairs, padded
  against ``packing``.

Printed per workload: median seconds of padded / packed over alternated rounds, the speed-up
(median of the rounds' padded/packed ratios of wall time and of the process's CPU time, each
with its range: with ``--threads 1`` the CPU time is the work this process did, which other
jobs on the machine slow far less than the wall clock), the padding share (pad positions
over all positions the forwards computed) of each side, and the 1-minute load average at the
start and end of the workload's rounds (on a shared machine the ratios are what to read).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from vs_trl import PROMPTS, SPREAD_LENGTHS, build_models  # noqa: E402

from proxrl.algos.offline import dpo, sft  # noqa: E402
from proxrl.algos.offline.loop import accumulate_gradients  # noqa: E402
from proxrl.algos.online import grpo, ppo  # noqa: E402
from proxrl.algos.online.roles import load_models, role_settings  # noqa: E402
from proxrl.algos.online.update import UpdateStep, update  # noqa: E402
from proxrl.data.batching import (  # noqa: E402
    bucket_batches,
    collate,
    collate_packed,
    pack_sequences,
)
from proxrl.data.encoding import EncodedPair, EncodedSequence  # noqa: E402
from proxrl.rollout.experience import Experience  # noqa: E402
from proxrl.rollout.forward import critic_forward, policy_forward  # noqa: E402
from proxrl.rollout.packing import micro_batch_plan  # noqa: E402
from proxrl.runtime.guard import NonFiniteGuard  # noqa: E402

BUDGET = 4096  # max_tokens_per_micro_batch of the packed side


class PadCount:
    """Pad positions (id 0, the packed filler too) and all positions of every forward."""

    def __init__(self) -> None:
        self.pads = self.positions = 0
        self.handle = torch.nn.modules.module.register_module_forward_hook(self.hook)

    def hook(self, module, args, output) -> None:  # type: ignore[no-untyped-def]
        if isinstance(module, torch.nn.Embedding) and args and args[0].dim() == 2:
            self.positions += args[0].numel()
            self.pads += int((args[0] == 0).sum())

    def share(self) -> float:
        return self.pads / max(self.positions, 1)


def rollout_batch(vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(32, P+T) ids and mask: left-padded prompts of 7-10 tokens, SPREAD_LENGTHS responses."""
    g = torch.Generator().manual_seed(seed)
    prompts = [7 + i % 4 for i in range(32)]
    P, T = max(prompts), max(SPREAD_LENGTHS)
    prompt = (torch.arange(P)[None] >= P - torch.tensor(prompts)[:, None]).long()
    response = (torch.arange(T)[None] < torch.tensor(SPREAD_LENGTHS)[:, None]).long()
    mask = torch.cat([prompt, response], 1)
    return torch.randint(3, vocab, mask.shape, generator=g) * mask, mask, P


def experience(vocab: int) -> Experience:
    ids, mask, P = rollout_batch(vocab, 0)
    g = torch.Generator().manual_seed(1)
    fmask = mask[:, P:].float()
    B, T = fmask.shape
    advantages = torch.randn(B, T, generator=g) * fmask
    return Experience(
        prompt_ids=ids[:, :P],
        prompt_mask=mask[:, :P],
        response_ids=ids[:, P:],
        response_mask=mask[:, P:],
        logprobs=-2 + 0.1 * torch.randn(B, T, generator=g) * fmask,
        ref_logprobs=-2 + 0.1 * torch.randn(B, T, generator=g) * fmask,
        values=torch.zeros(B, T),
        scores=torch.randn(B, generator=g),
        rewards=torch.zeros(B, T),
        advantages=advantages,
        returns=advantages,
    )


def online_cases(paths: dict[str, str], precision: str, work: Path) -> dict[str, Callable]:
    """name → (packed: bool) → None, each one update (or the rollout's passes)."""
    common = dict(
        model=paths["model"],
        prompts=paths["prompts"],
        output_dir=str(work / "run"),
        max_new_tokens=256,
        temperature=1.0,
        learning_rate=1e-5,
        progress=False,
        mixed_precision="bf16" if precision == "bf16" else "no",
    )
    configs = {
        "grpo update": (
            grpo,
            grpo.Config(
                **common,
                reward_fn=("vs_trl:letter_share",),
                rollout_batch_size=8,
                group_size=4,
                mini_batch_size=32,
                grad_accum=2,
                kl_coef=0.0,
                track_kl=False,
            ),
        ),
        "ppo update": (
            ppo,
            ppo.Config(
                **common,
                reward_model=paths["reward"],
                critic_model=paths["reward"],
                rollout_batch_size=32,
                ppo_epochs=4,
                mini_batch_size=16,
                kl_coef=0.05,
            ),
        ),
    }
    cases: dict[str, Callable] = {}
    for name, (module, cfg) in configs.items():
        algo = module.build(cfg)
        models = load_models(role_settings(cfg).models, algo)
        params = [p for p in models.actor.parameters() if p.requires_grad]
        optimizers = [torch.optim.AdamW(params, lr=1e-5)] + models.critic.optimizers()
        batch = experience(len(models.tokenizer))

        def run(  # type: ignore[no-untyped-def]
            packed: bool, cfg=cfg, algo=algo, models=models, opts=optimizers, batch=batch
        ) -> None:
            run_cfg = replace(cfg, max_tokens_per_micro_batch=BUDGET if packed else 0)
            if hasattr(models.critic, "settings"):  # a separate critic reads its own switch
                models.critic.settings = replace(models.critic.settings, packed=packed)
            update(
                run_cfg,
                algo,
                models,
                batch,
                opts,
                UpdateStep(0.05, True, 1),
                torch.Generator().manual_seed(0),
                NonFiniteGuard(),
            )

        cases[name] = run
        if name == "ppo update":
            cases["rollout forward"] = rollout_forwards(models, cfg, batch)
    return cases


def rollout_forwards(models, cfg, batch: Experience) -> Callable:  # type: ignore[no-untyped-def]
    ids, mask, P = batch.input_ids, batch.attention_mask, batch.prompt_ids.shape[1]

    @torch.no_grad()
    def run(packed: bool) -> None:
        with cfg.autocast():
            for rows in micro_batch_plan(mask, 16, BUDGET if packed else 0):
                for model in (models.actor, models.reference):
                    policy_forward(model, ids[rows], mask[rows], P, 1.0, True, packed=packed)
                critic_forward(models.critic.module, ids[rows], mask[rows], P, packed)

    return run


def offline_cases(paths: dict[str, str], precision: str) -> dict[str, Callable]:
    from proxrl.models.causal_lm import load_causal_lm

    rng = random.Random(0)
    examples = []
    for _ in range(64):
        prompt, completion = rng.randint(8, 16), rng.randint(8, 256)
        ids = [rng.randint(3, 300) for _ in range(prompt + completion)]
        examples.append(EncodedSequence(ids, [0] * prompt + [1] * completion, prompt))
    model = load_causal_lm(paths["model"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    padded_sft = [
        collate([examples[i] for i in b], 0)
        for b in bucket_batches([len(x) for x in examples], 8, seed=0)
    ]
    rows = pack_sequences(examples, 512)
    packed_sft = [collate_packed(rows[i : i + 8], 0) for i in range(0, len(rows), 8)]

    def epoch(batches, loss_fn, units) -> None:  # type: ignore[no-untyped-def]
        for batch in batches:
            with autocast:
                accumulate_gradients(model, [batch], loss_fn, units)
            optimizer.step()
            optimizer.zero_grad()

    pairs = [EncodedPair(examples[2 * i], examples[2 * i + 1], None) for i in range(32)]
    order = bucket_batches([len(p) for p in pairs], 8, seed=0)
    ref = (torch.full((32,), -200.0), torch.full((32,), -210.0))
    dpo_batches = [dpo.make_batch(pairs, b, ref, 0, torch.float32) for b in order]
    configs = {
        packed: dpo.Config(model=paths["model"], data="unused", packing=packed)
        for packed in (False, True)
    }
    return {
        "sft epoch": lambda packed: epoch(
            packed_sft if packed else padded_sft, sft.completion_loss, sft.completion_tokens
        ),
        "dpo epoch": lambda packed: epoch(
            dpo_batches,
            lambda m, b: dpo.preference_loss(m, b, configs[packed]),
            lambda b: b.pairs.num_pairs,
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="packed vs padded micro-batches, alternated")
    parser.add_argument("--sizes", nargs="+", default=["128x2"], help="hidden x layers")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--rounds", type=int, default=3, help="alternated padded/packed pairs")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="+", help="run only these workloads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"{args.precision}; spread lengths mean {statistics.mean(SPREAD_LENGTHS):.0f} "
        f"(8-256); {len(PROMPTS)} prompts; packed budget {BUDGET} tokens",
        flush=True,
    )
    print(
        f"{'size':<6} {'workload':<16} {'s padded/packed':>18} {'speed-up':>9} {'range':>11} "
        f"{'cpu-time':>9} {'range':>11} "
        f"{'padding':>12} {'load':>10}"
    )
    for size in args.sizes:
        hidden, layers = (int(x) for x in size.split("x"))
        work = Path(tempfile.mkdtemp(prefix="packing_"))
        paths = build_models(work / size, hidden, layers)
        cases = online_cases(paths, args.precision, work) | offline_cases(paths, args.precision)
        for name, run in cases.items():
            if args.only and name not in args.only:
                continue
            run(False)  # warm-up, both sides
            run(True)
            times: dict[bool, list[float]] = {False: [], True: []}
            cpu: dict[bool, list[float]] = {False: [], True: []}
            shares = {}
            load_start = os.getloadavg()[0]
            for round_ in range(args.rounds):
                for packed in (False, True) if round_ % 2 == 0 else (True, False):
                    count = PadCount()
                    started, cpu_started = time.perf_counter(), time.process_time()
                    run(packed)
                    times[packed].append(time.perf_counter() - started)
                    cpu[packed].append(time.process_time() - cpu_started)
                    count.handle.remove()
                    shares[packed] = count.share()
            ratios = [a / b for a, b in zip(times[False], times[True], strict=True)]
            cpu_ratios = [a / b for a, b in zip(cpu[False], cpu[True], strict=True)]
            padded, packed_s = (statistics.median(times[k]) for k in (False, True))
            print(
                f"{size:<6} {name:<16} {padded:>8.2f}/{packed_s:<8.2f} "
                f"{statistics.median(ratios):>9.2f} {min(ratios):>5.2f}-{max(ratios):<5.2f} "
                f"{statistics.median(cpu_ratios):>9.2f} "
                f"{min(cpu_ratios):>5.2f}-{max(cpu_ratios):<5.2f} "
                f"{shares[False]:>5.2f}/{shares[True]:<5.2f} "
                f"{load_start:>4.1f}-{os.getloadavg()[0]:<4.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
