"""Candidates for a faster update at the Qwen2-0.5B shape (issue 39), one micro-batch step each.

    .venv/bin/python benchmarks/update_candidates.py --reps 5            # every candidate
    .venv/bin/python benchmarks/update_candidates.py --reps 5 --candidates baseline response_logits
    .venv/bin/python benchmarks/update_candidates.py --report runs.jsonl  # the table again

The model: Qwen2-0.5B's configuration (``vs_trl_05b.QWEN2_05B``: hidden 896, 24 layers,
vocabulary 151,936, tied embeddings) with random weights built in the process (nothing saved),
float32, LoRA r 16 alpha 32 on every linear layer (``proxrl.models.lora.apply_lora``). The step
is one micro-batch of vs_trl_05b's update: 4 rows, prompts of 10 tokens (two left-padded to 8
and 9), responses of 29, 19, 27 and 30 tokens (vs_trl_05b's first micro-batch), right-padded;
``policy_forward`` at temperature 1, the GRPO loss (PPO-clip, token-mean, π_old = the first
step's log-probs, advantages ±1), backward, AdamW step (lr 1e-5, weight decay 0, as
``run.make_optimizers``). Each process times one warm-up step and ``--steps`` steps after it.

Candidates (each run a fresh process under ``flock /tmp/proxrl-05b.lock``, the order rotated
every repetition):

- ``baseline``: main's forward before issue 39: logits at every position, then the response
  slice (``rollout.forward.output_head`` made to find no head: the full-logits fallback)
- ``response_logits``: the output head at the T response positions only (``logits_at``)
- ``fused_adamw``: ``response_logits`` + ``torch.optim.AdamW(fused=True)``
- ``foreach_adamw``: ``response_logits`` + ``torch.optim.AdamW(foreach=True)``
- ``compile``: ``response_logits`` + ``torch.compile(dynamic=True)`` of the transformer body
  (the head, its hook and the loss stay eager); its first step is the compile, reported apart,
  and after the timed steps one step at each of 5 other response lengths counts recompiles
- ``packed`` / ``packed_baseline``: the padding-free forward, response positions / full logits

Printed: per candidate the median (min–max) CPU seconds of a step and of its forward, backward
and optimizer step, wall seconds, peak RSS; the ratio of medians to ``baseline``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOCK = os.environ.get("PROXRL_05B_LOCK", "/tmp/proxrl-05b.lock")
CANDIDATES = [
    "baseline", "response_logits", "fused_adamw", "foreach_adamw", "compile", "packed",
    "packed_baseline",
]  # fmt: skip
PROMPTS = [10, 8, 10, 9]  # real prompt tokens per row (left-padded to 10)
RESPONSES = [29, 19, 27, 30]  # vs_trl_05b's first micro-batch of 4
OTHER_RESPONSES = [[12, 20, 15, 11], [33, 25, 40, 18], [16, 16, 16, 16], [22, 35, 28, 10], [45]]


TINY = dict(
    hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
)  # fmt: skip  # --tiny: every candidate's code path in seconds, nothing measured


def build_policy(dtype_name: str = "float32", tiny: bool = False) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from proxrl.models.lora import apply_lora

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from vs_trl_05b import QWEN2_05B

    shape = TINY if tiny else QWEN2_05B
    config = Qwen2Config(**shape, max_position_embeddings=512)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(getattr(torch, dtype_name))
    return apply_lora(model, r=16, alpha=32)


def make_batch(responses: list[int], seed: int = 0) -> tuple[Any, Any, int]:
    import torch

    prompts = (PROMPTS * len(responses))[: len(responses)]
    P, T = max(prompts), max(responses)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 151936, (len(responses), P + T), generator=g)
    mask = torch.zeros_like(ids)
    for row, (p, t) in enumerate(zip(prompts, responses, strict=True)):
        mask[row, P - p : P + t] = 1
    return ids * mask, mask, P


def child(candidate: str, steps: int, tiny: bool = False) -> dict[str, Any]:
    import torch

    import proxrl.rollout.forward as forward
    from proxrl.core.losses import ppo_clip_loss

    torch.set_num_threads(int(os.environ.get("PROXRL_NUM_THREADS", "1")))
    if candidate in ("baseline", "packed_baseline"):
        forward.output_head = lambda model: None  # the full-logits path: main before issue 39
    model = build_policy(tiny=tiny)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    optimizer_kwargs: dict[str, Any] = dict(lr=1e-5, weight_decay=0.0)
    if candidate == "fused_adamw":
        optimizer_kwargs["fused"] = True
    if candidate == "foreach_adamw":
        optimizer_kwargs["foreach"] = True
    optimizer = torch.optim.AdamW(trainable, **optimizer_kwargs)
    compiled = candidate == "compile"
    if compiled:
        body = model.get_base_model().model
        body.forward = torch.compile(body.forward, dynamic=True)
    packed = candidate.startswith("packed")

    def step(responses: list[int], old: Any = None) -> tuple[dict[str, float], Any]:
        ids, mask, P = make_batch(responses)
        response_mask = mask[:, P:].bool()
        times: dict[str, float] = {}
        c0, w0 = time.process_time(), time.perf_counter()
        out = forward.policy_forward(model, ids, mask, P, 1.0, packed=packed)
        old_logprobs = out.logprobs.detach() if old is None else old
        advantages = torch.tensor([(-1.0) ** row for row in range(len(responses))])
        loss, _ = ppo_clip_loss(
            out.logprobs, old_logprobs, advantages[:, None].expand_as(old_logprobs),
            response_mask.float(),
        )  # fmt: skip
        c1 = time.process_time()
        loss.backward()
        c2 = time.process_time()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        c3, w3 = time.process_time(), time.perf_counter()
        times.update(forward=c1 - c0, backward=c2 - c1, optimizer=c3 - c2)
        times.update(cpu=c3 - c0, wall=w3 - w0)
        return times, old_logprobs

    t0 = time.process_time()
    first, old = step(RESPONSES)
    timed = [step(RESPONSES, old)[0] for _ in range(steps)]
    result: dict[str, Any] = dict(
        candidate=candidate,
        first_step_cpu=first["cpu"],
        steps=timed,
        **{k: statistics.median(s[k] for s in timed) for k in timed[0]},
    )
    if compiled:
        from torch._dynamo.utils import counters

        frames_before = counters["stats"]["unique_graphs"]
        others = [step(lengths)[0]["cpu"] for lengths in OTHER_RESPONSES]
        result.update(
            compile_cpu=first["cpu"] - result["cpu"],
            other_lengths_cpu=others,
            graphs_first=frames_before,
            recompiles_other_lengths=counters["stats"]["unique_graphs"] - frames_before,
        )
    result["total_cpu"] = time.process_time() - t0
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def versions() -> dict[str, str]:
    import peft
    import torch
    import transformers

    return dict(
        torch=torch.__version__, transformers=transformers.__version__, peft=peft.__version__
    )


def run_one(candidate: str, steps: int, results: Path, tiny: bool = False) -> dict[str, Any]:
    env = dict(os.environ, PROXRL_NUM_THREADS="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, __file__, "--child", candidate, "--steps", str(steps)]
    command = command + ["--tiny"] if tiny else ["flock", LOCK, *command]
    started = time.time()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if done.returncode or not line.startswith("{"):
        record: dict[str, Any] = dict(
            candidate=candidate, failed=done.returncode, stderr=done.stderr[-2000:]
        )
    else:
        record = json.loads(line)
    record.update(started=started, load=os.getloadavg()[0])
    with open(results, "a") as sink:
        sink.write(json.dumps(record) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k not in ("steps", "stderr")}), flush=True)
    return record


def report(paths: list[Path]) -> None:
    runs = [json.loads(line) for p in paths for line in p.read_text().splitlines() if line]
    ok = [r for r in runs if "failed" not in r]
    by: dict[str, list[dict[str, Any]]] = {}
    for r in ok:
        by.setdefault(r["candidate"], []).append(r)
    base = statistics.median(r["cpu"] for r in by.get("baseline", [])) if "baseline" in by else None
    print(
        "| candidate | runs | step CPU s median (min–max) | forward | backward | optimizer "
        "| wall s | peak RSS MB | CPU vs baseline |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name in [c for c in CANDIDATES if c in by]:
        rs = by[name]

        def cell(key: str, rs: list[dict[str, Any]] = rs) -> str:
            xs = [r[key] for r in rs]
            return f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})"

        ratio = f"{statistics.median(r['cpu'] for r in rs) / base:.3f}" if base else ""
        print(
            f"| {name} | {len(rs)} | {cell('cpu')} | {cell('forward')} | {cell('backward')} | "
            f"{cell('optimizer')} | {cell('wall')} | {cell('peak_rss_mb')} | {ratio} |"
        )
    for r in by.get("compile", []):
        print(
            f"compile: compile CPU {r['compile_cpu']:.1f} s, graphs {r['graphs_first']}, "
            f"recompiles over 5 other lengths {r['recompiles_other_lengths']}, those steps' CPU "
            + ", ".join(f"{x:.1f}" for x in r["other_lengths_cpu"])
        )
    for r in runs:
        if "failed" in r:
            print(f"FAILED {r['candidate']} (rc {r['failed']}): {r['stderr'][-300:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--candidates", nargs="+", choices=CANDIDATES, default=CANDIDATES)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per process")
    parser.add_argument("--results", type=Path, default=Path("update_candidates_runs.jsonl"))
    parser.add_argument("--report", type=Path, nargs="*")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model, no lock: a check")
    parser.add_argument("--child", choices=CANDIDATES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.tiny) | versions()), flush=True)
        return
    if args.report:
        report(args.report)
        return
    print(json.dumps(versions() | dict(candidates=args.candidates, reps=args.reps)), flush=True)
    for rep in range(args.reps):
        shift = rep % len(args.candidates)
        order = args.candidates[shift:] + args.candidates[:shift]
        for candidate in order if rep % 2 == 0 else order[::-1]:
            run_one(candidate, args.steps, args.results, args.tiny)
    report([args.results])


if __name__ == "__main__":
    main()
