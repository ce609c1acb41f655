"""Sample on every rank from FSDP2-sharded weights and from an unsharded copy of the same
weights, with the same seed, with both built-in samplers; rank r decodes 6 + 5r tokens, so the
ranks run different numbers of forward passes (a collective per forward would hang), and the
script counts the collectives issued while sampling (there must be none).

    accelerate launch --config_file configs/accelerate/cpu_fsdp_2proc.yaml \\
        sharded_generation_script.py MODEL OUT_JSON

Rank 0 writes, per rank and sampler: whether the tokens are equal, max |Δ log-prob|, the
response length, the collectives issued while sampling, and how much of the weights the rank
holds outside generation."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist
from transformers import AutoModelForCausalLM, AutoTokenizer

from proxrl.rollout.generation import CachedSampler, HFSampler, SamplingSettings
from proxrl.runtime import distributed as dist
from proxrl.runtime import fsdp

PROMPTS = ["say: abc ->", "say: def ->", "copy: ghi =", "say: jkl ->"]
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "barrier")


@contextlib.contextmanager
def collectives_issued() -> Iterator[list[str]]:
    """The names of the ``torch.distributed`` collectives called inside the block."""
    issued: list[str] = []
    originals = {name: getattr(torch_dist, name) for name in COLLECTIVES}

    def counted(name: str, collective: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            issued.append(name)
            return collective(*args, **kwargs)

        return call

    for name, collective in originals.items():
        setattr(torch_dist, name, counted(name, collective))
    try:
        yield issued
    finally:
        for name, collective in originals.items():
            setattr(torch_dist, name, collective)


def main(model_path: str, out: str) -> None:
    rank, world = dist.rank(), dist.world_size()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"
    plain = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float64).eval()
    sharded = dist.wrap_model(
        AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float64).eval()
    )
    batch = tokenizer(PROMPTS[rank::world], return_tensors="pt", padding=True)
    settings = SamplingSettings(max_new_tokens=6 + 5 * rank, temperature=1.0)
    report: dict[str, object] = {}
    for name, sampler in (("cached", CachedSampler), ("hf", HFSampler)):
        samples = []
        for model in (plain, sharded):
            torch.manual_seed(100 + rank)
            with dist.gathered_for_generation(model) as whole, collectives_issued() as issued:
                samples.append(
                    sampler(whole, tokenizer).sample(
                        batch.input_ids, batch.attention_mask, settings, with_logprobs=True
                    )
                )
        ref, got = samples
        report[name] = {
            "same_tokens": bool(torch.equal(ref.response_ids, got.response_ids)),
            "logprob_diff": float((ref.logprobs - got.logprobs).abs().max()),
            "length": int(got.response_ids.shape[1]),
            "collectives_while_sampling": issued,  # the sharded model's
        }
    local = sum(p.to_local().numel() for p in sharded.parameters() if fsdp.is_dtensor(p))
    report["held_share"] = local / sum(p.numel() for p in plain.parameters())
    gathered = dist.all_gather_objects(report)
    if dist.is_main():
        Path(out).write_text(json.dumps(gathered))
    dist.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:])
    # As cli.main: a rank that ran FSDP2 ends without C++ teardown (runtime.distributed).
    dist.end_launched_process(0)
