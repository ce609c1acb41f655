"""Seconds from publishing the policy's weights to every engine holding them, by the two
``ray_weight_transport`` options side by side in one run (``placement: ray``).

    .venv/bin/python benchmarks/weight_transport.py                     # tiny and 42M
    .venv/bin/python benchmarks/weight_transport.py --engines 2 --rounds 10

Per shape (the ones of benchmarks/vllm_rollout.py, random weights built locally, fp32): a local
Ray, ``--engines`` built-in sampler engines (``EngineActor``), and the policy in this process
(the trainer's side). Each round changes the weights, then publishes them by object store
(``ray.put``, every engine reading the object and loading it) and by process group (a gloo
broadcast of one flat buffer per dtype, received into the engine's buffers and loaded), in an
order that alternates from round to round, each timed until every engine answers after its
load; the ratio is taken within each round. The process group is built (and its first broadcast
run) before the rounds, so its set-up is printed on its own line. The load average is printed
beside every row: the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from vllm_rollout import SHAPES, build, load  # noqa: E402


def publish_to_loaded(pool, engines, policy, version: int) -> float:
    """Seconds from ``publish`` until every engine has loaded ``version``: each engine's next
    call from here runs after the load (an actor runs one caller's calls in order)."""
    import ray

    started = time.perf_counter()
    pool.publish(policy, version)
    pool.settle()
    ray.get([engine.ready.remote() for engine in engines])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["tiny", "42m"], choices=list(SHAPES))
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    import ray
    import torch

    from proxrl.algos.online import ppo
    from proxrl.algos.online.placement.ray_roles import EngineActor, EnginePool
    from proxrl.algos.online.placement.ray_weights import TRANSPORTS
    from proxrl.algos.online.roles import role_settings
    from proxrl.models.causal_lm import load_causal_lm

    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    root = Path(tempfile.mkdtemp(prefix="weight_transport-"))
    for name in args.shapes:
        shape = SHAPES[name]
        path, params = build(shape, root)
        cfg = ppo.Config(model=path, prompts="unused.jsonl", dtype="float32", placement="ray")
        roles = role_settings(cfg)
        engines = [
            ray.remote(EngineActor)
            .options(num_cpus=0.25)
            .remote(list(sys.path), roles.models, roles.engine)
            for _ in range(args.engines)
        ]
        assert all(error is None for error in ray.get([e.ready.remote() for e in engines]))
        pools = {t: EnginePool(engines, 0, transport) for t, transport in TRANSPORTS.items()}
        policy = load_causal_lm(path, dtype="float32")
        megabytes = sum(t.numel() * t.element_size() for t in policy.state_dict().values()) / 1e6
        print(
            f"[{name}] {params / 1e6:.1f}M parameters ({megabytes:.1f} MB fp32), "
            f"{args.engines} engines; {load()}",
            flush=True,
        )
        version = 0
        setup = publish_to_loaded(pools["process_group"], engines, policy, version)
        print(f"  process group set-up and first broadcast: {setup:.3f} s", flush=True)
        times: dict[str, list[float]] = {t: [] for t in pools}
        ratios = []
        for round_ in range(args.rounds):
            order = list(pools) if round_ % 2 == 0 else list(pools)[::-1]
            with torch.no_grad():
                for p in policy.parameters():
                    p.add_(1e-3)
            for transport in order:
                version += 1
                times[transport].append(
                    publish_to_loaded(pools[transport], engines, policy, version)
                )
            ratios.append(times["process_group"][-1] / times["object_store"][-1])
        store, group = (statistics.median(times[t]) for t in ("object_store", "process_group"))
        print(
            f"  publish to loaded, median of {args.rounds}: object_store {store:.4f} s, "
            f"process_group {group:.4f} s, process_group / object_store "
            f"{statistics.median(ratios):.2f} (per-round range {min(ratios):.2f}-"
            f"{max(ratios):.2f}); {load()}",
            flush=True,
        )
        for engine in engines:
            ray.kill(engine)
    ray.shutdown()
    os.environ.pop("RAY_ADDRESS", None)


if __name__ == "__main__":
    main()
