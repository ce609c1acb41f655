"""Where one proxrl PPO (or GRPO) update's peak memory is set, stage by stage, at
vs_trl_05b.py's shape (issue 50's user lengths: ``--prompt-tokens 256 --tokens 256 --shortest 16
--layers 4 --ppo-group 8``), for the ``cached`` side (shared prefix) or ``repeated``
(``shared_prefix: false``). One update, one fresh process per call, one JSON line on stdout:

- the run's stages are named by wrapping the loop's functions: ``load`` (open_run), ``sample``
  (split by the policy's calls: ``prefill``, ``decode``), ``score`` (the reward model),
  ``passes`` (π_ref and V_old: each model's call), ``estimate``, ``update`` (each micro-batch's
  forwards, ``backward`` and the optimizer ``step``) and ``finish`` (the final checkpoint and the
  merged policy and critic saved);
- the process's RSS (/proc/self/statm) is read every 5 ms by a thread, and its highest reading
  kept per label (stage, and the call inside it); ``ru_maxrss`` and the RSS are recorded after
  every model call, backward and step (``events``), so the stage where ``ru_maxrss`` reached
  its final value is the one that set the run's peak;
- ``--census``: at each stage's end (and after each backward), the Python-visible tensors
  (``gc``, storages counted once, parameters apart) by size: what is alive there.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ppo_stage_memory.py --side cached \
        --work runs/mem          # vs_trl_05b.py's --work (its paths.json)

Environment knobs pass through: ``MALLOC_ARENA_MAX=2`` (fewer glibc arenas), and
``--trim`` calls ``malloc_trim(0)`` at every stage's end and after every backward (freed heap
pages returned), to tell
allocator fragmentation from live tensors.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import resource
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_trl  # noqa: E402
import vs_trl_05b  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")
MB = 2**20


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


def maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class StageMemory:
    def __init__(self, census: bool, trim: bool) -> None:
        import torch

        self.torch = torch
        self.census_on, self.trim = census, trim
        self.stage, self.sub = "import", ""
        self.peak: dict[str, int] = defaultdict(int)  # label → highest sampled RSS
        self.events: list[dict[str, Any]] = []
        self.censuses: list[dict[str, Any]] = []
        self.names: dict[int, str] = {}
        self.depth = 0
        self.libc = ctypes.CDLL("libc.so.6")
        self.running = True
        threading.Thread(target=self.sample, daemon=True).start()

    @property
    def label(self) -> str:
        return f"{self.stage}/{self.sub}" if self.sub else self.stage

    def sample(self) -> None:
        with open("/proc/self/statm") as statm:
            while self.running:
                statm.seek(0)
                value = int(statm.read().split()[1]) * PAGE
                label = self.label
                if value > self.peak[label]:
                    self.peak[label] = value
                time.sleep(0.005)

    def event(self, what: str) -> None:
        self.events.append(
            {"label": self.label, "what": what, "rss_mb": rss() / MB, "maxrss_mb": maxrss() / MB}
        )

    def census(self, where: str) -> None:
        if not self.census_on:
            return
        torch = self.torch
        seen: set[int] = set()
        params = tensors = 0
        big: dict[str, int] = defaultdict(int)
        for obj in gc.get_objects():
            if not isinstance(obj, torch.Tensor):
                continue
            try:
                storage = obj.untyped_storage()
            except Exception:
                continue
            key = storage.data_ptr()
            if key in seen or storage.device.type != "cpu":
                continue
            seen.add(key)
            size = storage.nbytes()
            if isinstance(obj, torch.nn.Parameter):
                params += size
                continue
            tensors += size
            if size >= 8 * MB:
                big[f"{tuple(obj.shape)} {str(obj.dtype).removeprefix('torch.')}"] += size
        self.censuses.append(
            {
                "where": where,
                "rss_mb": rss() / MB,
                "maxrss_mb": maxrss() / MB,
                "parameters_mb": params / MB,
                "tensors_mb": tensors / MB,
                "big": {k: round(v / MB, 1) for k, v in sorted(big.items(), key=lambda x: -x[1])},
            }
        )

    def staged(self, stage: str, fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            outer, outer_sub = self.stage, self.sub
            self.stage, self.sub = stage, ""
            self.event(f"{stage} begins")
            try:
                return fn(*args, **kwargs)
            finally:
                self.sub = "end"
                self.event(f"{stage} ends")
                self.census(f"{stage} ends")
                if self.trim:
                    self.libc.malloc_trim(0)
                self.stage, self.sub = outer, outer_sub

        return run

    def model_call(self, forward: Any) -> Any:
        torch = self.torch

        def call(module: Any, *args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return forward(module, *args, **kwargs)
            ids = kwargs.get("input_ids", args[0] if args else None)
            width = ids.shape[-1] if hasattr(ids, "shape") else -1
            rows = ids.shape[0] if hasattr(ids, "shape") and ids.dim() > 1 else 1
            name = self.names.setdefault(id(module), f"{type(module).__name__}#{len(self.names)}")
            kind = "decode" if width == 1 else f"w{width}b{rows}"
            grad = "grad" if torch.is_grad_enabled() else "nograd"
            self.sub = f"{name}:{'decode' if width == 1 else 'fwd'}:{grad}"
            self.depth += 1
            try:
                return forward(module, *args, **kwargs)
            finally:
                self.depth -= 1
                if width != 1:
                    self.event(f"{name} {kind} {grad}")
                self.sub = f"after {name}:{'decode' if width == 1 else 'fwd'}"

        return call

    def install(self) -> None:
        torch = self.torch
        from transformers.models.qwen2 import modeling_qwen2 as qwen2

        for cls in (qwen2.Qwen2Model, qwen2.Qwen2ForCausalLM, qwen2.Qwen2ForSequenceClassification):
            cls.forward = self.model_call(cls.forward)
        backward = torch.Tensor.backward

        def timed_backward(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            self.sub = "backward"
            try:
                return backward(tensor, *args, **kwargs)
            finally:
                self.event("backward")
                self.sub = "after backward"
                if self.trim:
                    self.libc.malloc_trim(0)
                    self.event("backward, trimmed")
                self.census(f"{self.stage} after backward")

        torch.Tensor.backward = timed_backward  # type: ignore[method-assign]
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        def pre(*_: Any) -> None:
            self.sub = "step"

        def post(*_: Any) -> None:
            self.event("step")
            self.sub = "after step"

        register_optimizer_step_pre_hook(pre)
        register_optimizer_step_post_hook(post)
        from proxrl.algos.online import collect, loop

        loop.open_run = self.staged("load", loop.open_run)
        collect.sample = self.staged("sample", collect.sample)
        collect.score = self.staged("score", collect.score)
        collect.forward_passes = self.staged("passes", collect.forward_passes)
        loop.estimate = self.staged("estimate", loop.estimate)
        loop.update = self.staged("update", loop.update)
        loop.finish = self.staged("finish", loop.finish)

    def report(self) -> dict[str, Any]:
        self.running = False
        final = maxrss()
        # the stage whose event first shows the final ru_maxrss set the peak
        setter = next((e for e in self.events if e["maxrss_mb"] * MB >= final), None)
        return {
            "maxrss_mb": final / MB,
            "peak_set_by": setter,
            "peak_by_label_mb": {k: round(v / MB) for k, v in self.peak.items()},
            "events": self.events,
            "censuses": self.censuses,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=["cached", "repeated"], required=True)
    parser.add_argument("--trainer", choices=["ppo", "grpo"], default="ppo")
    parser.add_argument("--work", required=True, help="vs_trl_05b.py's --work (paths.json)")
    parser.add_argument("--census", action="store_true", help="live tensors at each stage's end")
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) at each stage's end")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--shortest", type=int, default=16)
    parser.add_argument("--ppo-group", type=int, default=8)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import logging

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    logging.disable(logging.WARNING)
    profile = StageMemory(args.census, args.trim)
    profile.install()
    paths = json.loads((Path(args.work) / "paths.json").read_text())
    out = args.out or str(
        Path(args.work) / f"stage-memory-{args.trainer}-{args.side}-{os.getpid()}"
    )
    worker_args = argparse.Namespace(
        worker=args.side,
        trainer=args.trainer,
        paths=json.dumps(paths),
        out=out,
        updates=1,
        tokens=args.tokens,
        shortest=args.shortest,
        prompt_tokens=args.prompt_tokens,
        ppo_group=args.ppo_group,
        trl_vllm=False,
    )
    try:
        numbers = vs_trl_05b.worker(worker_args)
    finally:
        import shutil

        shutil.rmtree(out, ignore_errors=True)
    result = profile.report() | {
        "side": args.side,
        "trainer": args.trainer,
        "peak_mb": vs_trl._peak_mb(),
        "update_cpu_s": numbers["update_cpu_s"],
        "malloc_arena_max": os.environ.get("MALLOC_ARENA_MAX"),
        "trim": args.trim,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
