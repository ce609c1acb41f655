"""Reward functions of the Ray tests that also kill a role actor mid-run, as a crash would.

They run in the reward actor, which counts its calls: the kill comes at a fixed point of the
run (after the sampling of a given iteration), and a resumed run's fresh reward actor counts
from zero again.
"""

from __future__ import annotations

from pathlib import Path

from tests.algos.online_rewards import target_fraction

CALLS = {"n": 0}


def _kill(suffix: str) -> None:
    import ray

    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["namespace"] == "proxrl" and actor["name"].endswith(suffix):
            ray.kill(ray.get_actor(actor["name"], namespace="proxrl"), no_restart=False)
            return
    raise RuntimeError(f"no actor named *{suffix}")


def _kill_process(suffix: str) -> None:
    """SIGKILL the process of the actor named *suffix and return once it is gone: unlike
    ``ray.kill``, whose request may land after the trainer's next call to that actor on a loaded
    machine (the restart then went unseen in that iteration), the crash precedes the next call."""
    import os
    import signal
    import time

    import ray

    name = next(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == "proxrl" and a["name"].endswith(suffix)
    )
    handle = ray.get_actor(name, namespace="proxrl")
    pid = ray.get(handle.__ray_call__.remote(lambda self: os.getpid()), timeout=60)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:  # gone, or a zombie its parent (the raylet) has not reaped yet
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return
        except (FileNotFoundError, ProcessLookupError):
            return
        time.sleep(0.05)
    raise RuntimeError(f"actor {name} (process {pid}) still alive 30 s after SIGKILL")


def kill_engine_at_second_call(prompts: list[str], completions: list[str], **columns: list):
    """target_fraction; at its second call, generation engine 0 is killed (Ray restarts it)."""
    CALLS["n"] += 1
    if CALLS["n"] == 2:
        _kill_process("-engine-0")
    return target_fraction(prompts, completions, **columns)


def kill_trainer_at_third_call(prompts: list[str], completions: list[str], **columns: list):
    """target_fraction; at its third call, the trainer actor is killed (the run stops)."""
    CALLS["n"] += 1
    if CALLS["n"] == 3:
        _kill("-trainer")
    return target_fraction(prompts, completions, **columns)


def kill_engine_at_second_call_then_trainer_at_fourth_call(
    prompts: list[str], completions: list[str], **columns: list
):
    """kill_engine_at_second_call (which counts the call), and at the fourth call the trainer
    actor is killed (the run stops)."""
    scores = kill_engine_at_second_call(prompts, completions, **columns)
    if CALLS["n"] == 4:
        _kill("-trainer")
    return scores


def _signal_driver(driver: int, signum: int) -> None:
    """Send ``signum`` to the driver and return once it has forwarded it to the trainer actor
    (rank 0's, named *-trainer)."""
    import os
    import time

    import ray

    os.kill(driver, signum)
    trainer = next(
        ray.get_actor(a["name"], namespace="proxrl")
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == "proxrl" and a["name"].endswith("-trainer")
    )
    deadline = time.time() + 60  # (a trainer of one thread would not even answer)
    while ray.get(trainer.stop_signal.remote(), timeout=60) != signum:
        assert time.time() < deadline, "the driver did not forward the signal"
        time.sleep(0.02)


def signal_driver_at_second_call(
    prompts: list[str], completions: list[str], driver: list[int], signum: list[int], **columns
):
    """target_fraction; at its second call, ``signum`` is sent to the driver (the process whose
    pid the prompts' ``driver`` column holds), as Ctrl-C or a scheduler would, and the call
    returns once the driver has forwarded it to the trainer actor: the stop comes in the
    second iteration, on every machine load."""
    CALLS["n"] += 1
    if CALLS["n"] == 2:
        _signal_driver(driver[0], signum[0])
    return target_fraction(prompts, completions, **columns)


def signal_driver_at_call(
    prompts: list[str],
    completions: list[str],
    driver: list[int],
    signum: list[int],
    signal_at: list[int],
    **columns,
):
    """signal_driver_at_second_call at the call the prompts' ``signal_at`` column names (with
    several trainers each rank's batch is a call of its own)."""
    CALLS["n"] += 1
    if CALLS["n"] == signal_at[0]:
        _signal_driver(driver[0], signum[0])
    return target_fraction(prompts, completions, **columns)


def record_pids_at_first_call(
    prompts: list[str], completions: list[str], pids: list[str], **columns: list
):
    """target_fraction; at its first call, the processes of the trainer and the critic actor are
    written to the file the prompts' ``pids`` column names (as JSON)."""
    import json
    import os

    import ray

    CALLS["n"] += 1
    if CALLS["n"] == 1:
        found = {}
        for actor in ray.util.list_named_actors(all_namespaces=True):
            for role in ("trainer", "critic"):
                if actor["namespace"] == "proxrl" and actor["name"].endswith(f"-{role}"):
                    handle = ray.get_actor(actor["name"], namespace="proxrl")
                    found[role] = ray.get(
                        handle.__ray_call__.remote(lambda _: os.getpid()), timeout=60
                    )
        found["reward"] = os.getpid()
        with open(pids[0], "w") as f:
            json.dump(found, f)
    return target_fraction(prompts, completions, **columns)


def list_actors(prompts: list[str], completions: list[str], actors: list[str], **columns: list):
    """target_fraction; in a Ray worker (the reward actor) also writes the names of the run's
    actors, and this process's id, to the file the prompts' ``actors`` column names (JSON),
    at every call: the file holds what the last call saw."""
    import json
    import os

    import ray

    if ray.is_initialized():
        names = sorted(
            actor["name"]
            for actor in ray.util.list_named_actors(all_namespaces=True)
            if actor["namespace"] == "proxrl"
        )
        with open(actors[0], "w") as f:
            json.dump({"names": names, "pid": os.getpid()}, f)
    return target_fraction(prompts, completions, **columns)


def record_pids_then_kill_critic_at_third_call(
    prompts: list[str], completions: list[str], pids: list[str], **columns: list
):
    """record_pids_at_first_call (which counts the call), and at the third call the critic
    actor is killed (the run stops)."""
    scores = record_pids_at_first_call(prompts, completions, pids=pids, **columns)
    if CALLS["n"] == 3:
        _kill("-critic")
    return scores


def list_actors_and_signal_driver_at_call(
    prompts: list[str], completions: list[str], actors: list[str], **columns: list
):
    """list_actors, and signal_driver_at_call's signal at the call ``signal_at`` names."""
    signal_driver_at_call(prompts, completions, **columns)
    return list_actors(prompts, completions, actors, **columns)
