"""How far the sampler's log-probs sit from the trainer's, as the rollout correction sees them.

    .venv/bin/python benchmarks/rollout_mismatch.py               # 256x4, 64 prompts x 32 tokens
    .venv/bin/python benchmarks/rollout_mismatch.py --sizes 128x2 256x4

For each size: a Qwen2-style model built locally (as in ``vs_trl.py``, random weights), 64
left-padded prompts, 32 new tokens at temperature 0.7 drawn by the cached sampler with its own
log-probs (π_sampler), then the trainer's forward pass over the same tokens (π_old), both in
float32 or both under bf16 autocast (``mixed_precision: bf16``). Printed per row, over valid
tokens: ``correction_stats`` with tis at cap 2 — the k3 mismatch KL(π_sampler‖π_old), the token
ratio π_old/π_sampler's mean/min/max and the share truncated at the cap. The last row of each
size scores the truncated sampler's tokens with the untruncated distribution (the trainer
before the fix, TRL #6789): its ratio mean is the kept probability mass, not 1.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_trl import build_models  # noqa: E402

from proxrl.core import correction_stats, tis_weights  # noqa: E402
from proxrl.models.causal_lm import load_causal_lm  # noqa: E402
from proxrl.models.tokenizer import load_tokenizer  # noqa: E402
from proxrl.rollout.forward import policy_forward  # noqa: E402
from proxrl.rollout.generation import CachedSampler, SamplingSettings  # noqa: E402

ROWS = [
    # (label, bf16, sampling settings, the trainer replays the truncation)
    ("fp32, T only", False, SamplingSettings(32, 0.7), True),
    ("fp32, k50 p.9", False, SamplingSettings(32, 0.7, top_k=50, top_p=0.9), True),
    ("bf16, T only", True, SamplingSettings(32, 0.7), True),
    ("bf16, k50 p.9", True, SamplingSettings(32, 0.7, top_k=50, top_p=0.9), True),
    ("fp32, k50 p.9, trainer untruncated", False, SamplingSettings(32, 0.7, 50, 0.9), False),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["256x4"], help="hidden x layers")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="rollout_mismatch_"))
    header = f"{'size':<7} {'setting':<36} {'KL k3':>9} {'ρ mean':>7} {'ρ min':>7} {'ρ max':>7}"
    print(header + f" {'cut@2':>6}")
    for size in args.sizes:
        hidden, layers = (int(x) for x in size.split("x"))
        path = build_models(root / size, hidden, layers)["model"]
        model, tokenizer = load_causal_lm(path), load_tokenizer(path)
        n = args.prompts
        generator = torch.Generator().manual_seed(0)
        lengths = torch.randint(4, 12, (n,), generator=generator)
        ids = torch.full((n, 12), tokenizer.pad_token_id)
        mask = torch.zeros_like(ids)
        for row, length in enumerate(lengths.tolist()):
            ids[row, 12 - length :] = torch.randint(  # (the tokenizer has one id beyond V)
                5, model.config.vocab_size, (length,), generator=generator
            )
            mask[row, 12 - length :] = 1
        for label, bf16, settings, replay in ROWS:
            torch.manual_seed(0)
            precision = (
                torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
            )
            with precision, torch.no_grad():
                s = CachedSampler(model, tokenizer).sample(ids, mask, settings, with_logprobs=True)
                trainer = policy_forward(
                    model,
                    torch.cat([ids, s.response_ids], 1),
                    torch.cat([mask, s.response_mask], 1),
                    ids.shape[1],
                    settings.temperature,
                    **(settings.truncation if replay else {}),
                ).logprobs.float()
            valid = s.response_mask.float()
            sampler = s.logprobs.float()  # type: ignore[union-attr]
            weights = tis_weights(trainer - sampler, valid, 2.0)
            st = {
                k: float(v)
                for k, v in correction_stats(trainer, sampler, weights, valid, 2.0).items()
            }
            print(
                f"{size:<7} {label:<36} {st['mismatch_kl']:>9.2e} {st['is_ratio_mean']:>7.4f} "
                f"{st['is_ratio_min']:>7.4f} {st['is_ratio_max']:>7.4f} "
                f"{st['truncated_share']:>6.3f}"
            )


if __name__ == "__main__":
    main()
