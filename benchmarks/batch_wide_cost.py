"""What choosing M2PO's / Clip-Cov's / KL-Cov's tokens over a whole optimizer step costs: the
update phase alone (``online.update.update`` on a fixed synthetic rollout), timed per update,
for a loss without such a choice (``ppo``) and for ``off_policy_mask: m2po``, whose step-wide
second moment needs log π at the step before the micro-batches:

- ``ppo``: PPO-Clip, no step-wide choice;
- ``m2po``: π_old is the trainer's own pass, so the update's first step reads it and every
  later step runs one forward without gradient over its rows;
- ``m2po_sampler``: ``sampler_logprobs`` (π_old is not π): every step runs that forward.

A Llama of ``--hidden`` width and ``--layers`` layers (random weights; float32), ``--rows``
responses of ``--tokens`` tokens, one mini-batch of all rows in ``--grad-accum`` micro-batches,
``--epochs`` epochs (so ``--epochs`` optimizer steps). Variants alternate, ``--repeats`` times,
after one warm-up update each; the median per variant is printed with its ratio to ``ppo``.

    PROXRL_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/batch_wide_cost.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from proxrl.algos.online import grpo  # noqa: E402
from proxrl.algos.online.roles import load_models, role_settings  # noqa: E402
from proxrl.algos.online.update import UpdateStep, update  # noqa: E402
from proxrl.models.tiny import build_tiny_lm  # noqa: E402
from proxrl.rollout.experience import Experience  # noqa: E402
from proxrl.rollout.forward import policy_forward  # noqa: E402
from proxrl.runtime.guard import NonFiniteGuard  # noqa: E402
from tests.algos.lm_tasks import CORPUS  # noqa: E402

VARIANTS = {
    "ppo": {},
    "m2po": {"off_policy_mask": "m2po"},
    "m2po_sampler": {"off_policy_mask": "m2po", "sampler_logprobs": True},
}


def rollout(actor: torch.nn.Module, rows: int, tokens: int) -> Experience:
    """``rows`` responses of ``tokens`` random tokens after a 4-token prompt; π_old = π (the
    trainer's pass), group-style advantages ±1."""
    g = torch.Generator().manual_seed(0)
    vocab = actor.config.vocab_size
    prompt_ids = torch.randint(5, vocab, (rows, 4), generator=g)
    response_ids = torch.randint(5, vocab, (rows, tokens), generator=g)
    mask = torch.ones(rows, tokens, dtype=torch.long)
    with torch.no_grad():
        logprobs = policy_forward(
            actor,
            torch.cat([prompt_ids, response_ids], 1),
            torch.cat([torch.ones_like(prompt_ids), mask], 1),
            4,
            1.0,
        ).logprobs
    sign = torch.where(torch.arange(rows) % 2 == 0, 1.0, -1.0)[:, None]
    return Experience(
        prompt_ids=prompt_ids,
        prompt_mask=torch.ones_like(prompt_ids),
        response_ids=response_ids,
        response_mask=mask,
        logprobs=logprobs,
        ref_logprobs=logprobs.clone(),
        values=torch.zeros(rows, tokens),
        scores=sign[:, 0],
        rewards=torch.zeros(rows, tokens),
        advantages=sign.expand(rows, tokens).clone(),
        returns=sign.expand(rows, tokens).clone(),
    )


def timed_update(model: str, prompts: str, out: str, args: argparse.Namespace, options: dict):
    cfg = grpo.Config(
        model=model,
        prompts=prompts,
        reward_fn=("tests.algos.online_rewards:target_fraction",),
        output_dir=out,
        rollout_batch_size=args.rows // 4,
        group_size=4,
        max_new_tokens=args.tokens,
        mini_batch_size=args.rows,
        grad_accum=args.grad_accum,
        ppo_epochs=args.epochs,
        learning_rate=1e-3,
        progress=False,
        seed=3,
        **options,
    )
    algo = grpo.build(cfg)
    torch.manual_seed(cfg.seed)
    models = load_models(role_settings(cfg).models, algo)
    experience = rollout(models.actor, args.rows, args.tokens)
    params = [p for p in models.actor.parameters() if p.requires_grad]

    def one() -> float:
        started = time.perf_counter()
        update(
            cfg,
            algo,
            models,
            experience,
            [torch.optim.AdamW(params, lr=1e-3)],
            UpdateStep(cfg.kl_coef, True, 1),
            torch.Generator().manual_seed(1),
            NonFiniteGuard(),
        )
        return time.perf_counter() - started

    return one


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--grad-accum", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = str(
            build_tiny_lm(Path(tmp) / "lm", CORPUS, hidden_size=args.hidden, num_layers=args.layers)
        )
        prompts = Path(tmp) / "prompts.jsonl"
        prompts.write_text('{"prompt": "say: abc ->"}\n')
        runs = {
            name: timed_update(model, str(prompts), str(Path(tmp) / name), args, options)
            for name, options in VARIANTS.items()
        }
        for run in runs.values():
            run()  # warm-up
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.repeats):
            for name, run in runs.items():
                times[name].append(run())
    base = statistics.median(times["ppo"])
    print(
        f"hidden {args.hidden}, layers {args.layers}, {args.rows} rows × {args.tokens} tokens, "
        f"{args.epochs} steps of {args.grad_accum} micro-batches"
    )
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:14s} {median:7.3f} s/update ×{median / base:.3f}  ({values})")


if __name__ == "__main__":
    main()
