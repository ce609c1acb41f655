"""Where one PPO iteration's CPU time and memory go at vs_trl_05b.py's Qwen2-0.5B shape, for
any side of it (proxrl ``cached``, the bare loop ``floor``, TRL 1.12 ``trl``), measured the same
way on every side by hooks that know nothing of either framework:

- every forward of a transformer (each ``*Model`` body, and its ``*ForCausalLM`` /
  ``*ForSequenceClassification`` wrapper: the outermost call counts) is timed by CPU time and
  counted by model, by gradient mode and by width (1: a decoding step; ≤ 16: a prefill; wider:
  a scoring or training pass over prompt + response);
- every ``backward`` and every optimizer step is timed;
- the process's RSS is sampled every 0.1 s, with the stage running at each sample.

The timed iteration is the last one: from its sampling prefill to its last optimizer step (the
run's first iteration is warm-up, as in vs_trl_05b.py). "other" is that span's CPU time outside
the timed calls (the framework's own work: sampling's per-step softmax and draws, losses, the
loop). One JSON line on stdout.

    flock /tmp/proxrl-05b.lock .venv/bin/python benchmarks/ppo_iteration_profile.py \
        --side cached --work /tmp/ppo05b/work
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_trl  # noqa: E402
import vs_trl_05b  # noqa: E402


class Profile:
    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.events: list[tuple] = []  # (kind, label, cpu0, cpu1, wall0, wall1, rss-peak-label)
        self.depth = 0
        self.stage = "setup"
        self.names: dict[int, str] = {}
        self.rss: list[tuple[float, int, str]] = []
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.running = True
        threading.Thread(target=self.sample_rss, daemon=True).start()
        from transformers.models.qwen2 import modeling_qwen2 as qwen2

        for cls in (qwen2.Qwen2Model, qwen2.Qwen2ForCausalLM, qwen2.Qwen2ForSequenceClassification):
            cls.forward = self.wrap(cls.forward)
        backward = torch.Tensor.backward

        def timed_backward(tensor, *args, **kwargs):  # type: ignore[no-untyped-def]
            return self.timed("backward", "backward", backward, tensor, *args, **kwargs)

        torch.Tensor.backward = timed_backward  # type: ignore[method-assign]
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        self.step_started: list[tuple] = []
        register_optimizer_step_pre_hook(lambda *a: self.step_started.append(self.now("step")))
        register_optimizer_step_post_hook(
            lambda *a: self.end("step", "optimizer", self.step_started.pop())
        )

    def now(self, stage: str) -> tuple[float, float, str, int, float]:
        previous = self.stage
        self.stage = stage
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return time.process_time(), time.perf_counter(), previous, usage.ru_minflt, usage.ru_stime

    def end(self, kind: str, label: str, started: tuple) -> None:
        cpu0, wall0, previous, faults0, sys0 = started
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.events.append(
            (kind, label, cpu0, time.process_time(), wall0, time.perf_counter(),
             usage.ru_minflt - faults0, usage.ru_stime - sys0)
        )  # fmt: skip
        self.stage = previous

    def timed(self, kind, label, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        started = self.now(kind)
        self.depth += 1
        try:
            return fn(*args, **kwargs)
        finally:
            self.depth -= 1
            self.end(kind, label, started)

    def wrap(self, forward):  # type: ignore[no-untyped-def]
        def timed_forward(module, *args, **kwargs):  # type: ignore[no-untyped-def]
            if self.depth:
                return forward(module, *args, **kwargs)
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is None and kwargs.get("inputs_embeds") is not None:
                ids = kwargs["inputs_embeds"][..., 0]
            width = ids.shape[-1] if hasattr(ids, "shape") else -1
            rows = ids.shape[0] if hasattr(ids, "shape") and ids.dim() > 1 else 1
            kind = (
                "decode" if width == 1 else "prefill" if width <= vs_trl.PROMPT_TOKENS else "wide"
            )
            kind += ":grad" if self.torch.is_grad_enabled() else ":nograd"
            if id(module) not in self.names:
                self.names[id(module)] = f"{type(module).__name__}#{len(self.names)}"
            label = f"{self.names[id(module)]}:w{width if kind[0] != 'd' else 1}:b{rows}"
            return self.timed(kind, label, forward, module, *args, **kwargs)

        return timed_forward

    def sample_rss(self) -> None:
        with open("/proc/self/statm") as statm:
            while self.running:
                statm.seek(0)
                self.rss.append(
                    (time.perf_counter(), int(statm.read().split()[1]) * self.page, self.stage)
                )
                time.sleep(0.1)

    def report(self, numbers: dict) -> dict:
        self.running = False
        # the last iteration: from the end of the optimizer step before its sampling (its
        # last decoding step's) to its own last optimizer step
        decoding = [e for e in self.events if e[0].startswith("decode")][-1]
        steps = [e for e in self.events if e[0] == "step"]
        before = [e for e in steps if e[3] <= decoding[2]]
        start_cpu, start_wall = before[-1][3], before[-1][5]
        end_cpu, end_wall = steps[-1][3], steps[-1][5]
        timed = [e for e in self.events if e[2] >= start_cpu and e[3] <= end_cpu]
        by_kind: dict[str, float] = defaultdict(float)
        calls: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0, 0.0])
        faults: dict[str, float] = defaultdict(float)
        for kind, label, cpu0, cpu1, _, _, minflt, stime in timed:
            by_kind[kind] += cpu1 - cpu0
            faults[kind] += minflt
            model, _, shape = label.partition(":")
            key = f"{model} {kind}" + (
                "" if kind.startswith(("decode", "backward", "step")) else f" {shape}"
            )
            calls[key][0] += 1
            calls[key][1] += cpu1 - cpu0
            calls[key][2] += minflt
            calls[key][3] += stime
        total = end_cpu - start_cpu
        by_kind["other"] = total - sum(by_kind.values())
        within = [(t, r, s) for t, r, s in self.rss if start_wall <= t <= end_wall]
        earlier = [r for t, r, s in self.rss if t < start_wall]
        peak = max(within, key=lambda x: x[1]) if within else (0, 0, "")
        by_stage_peak: dict[str, int] = defaultdict(int)
        for _, r, s in within:
            by_stage_peak[s] = max(by_stage_peak[s], r)
        return numbers | {
            "iteration_cpu_s": total,
            "iteration_wall_s": end_wall - start_wall,
            "cpu_by_kind": dict(sorted(by_kind.items())),
            # count, CPU s, minor page faults, system CPU s
            "calls": {
                k: [int(v[0]), round(v[1], 3), int(v[2]), round(v[3], 3)]
                for k, v in sorted(calls.items())
            },
            "minor_faults_by_kind": dict(sorted(faults.items())),
            "rss_mb_at_start": (within[0][1] if within else 0) / 2**20,
            "rss_mb_peak_before": max(earlier, default=0) / 2**20,
            "rss_mb_peak_iteration": peak[1] / 2**20,
            "rss_peak_stage": peak[2],
            "rss_mb_peak_by_stage": {k: v / 2**20 for k, v in by_stage_peak.items()},
            "rss_trace": [
                (round(t - start_wall, 1), round(r / 2**20)) for t, r, s in self.rss[::5]
            ],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=["cached", "floor", "trl"], required=True)
    parser.add_argument("--work", required=True, help="vs_trl_05b.py's models (paths.json)")
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import logging

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    logging.disable(logging.WARNING)
    profile = Profile()
    paths = json.loads((Path(args.work) / "paths.json").read_text())
    out = args.out or str(Path(args.work) / f"profile-{args.side}")
    worker_args = argparse.Namespace(
        worker=args.side,
        trainer="ppo",
        paths=json.dumps(paths),
        out=out,
        updates=args.updates,
        tokens=args.tokens,
        trl_vllm=False,
    )
    numbers = vs_trl_05b.worker(worker_args)
    result = profile.report(numbers)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["side"], result["max_rss_mb"] = args.side, vs_trl._peak_mb()
    result["process_minor_faults"], result["process_sys_s"] = usage.ru_minflt, usage.ru_stime
    print(json.dumps(result))


if __name__ == "__main__":
    main()
