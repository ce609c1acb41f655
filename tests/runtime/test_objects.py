"""The Python objects given to the API are registered in the run's context, not in a module
global (``runtime.objects``): nested runs see both, the outer one's come back after the inner
one, and a run in another thread sees only its own."""

from __future__ import annotations

import threading

from proxrl.runtime import objects


def test_a_run_sees_its_objects_only_while_it_runs_and_nested_ones_stack():
    outer, inner = object(), object()
    assert not objects.is_handle("python:a")
    with objects.registered({"python:a": objects.Entry(outer)}):
        with objects.registered({"python:a": objects.Entry(inner), "python:b": objects.Entry(1)}):
            assert objects.lookup("python:a") is inner and objects.lookup("python:b") == 1
        assert objects.lookup("python:a") is outer and not objects.is_handle("python:b")
    assert not objects.is_handle("python:a")


def test_a_run_in_another_thread_sees_only_its_own_objects():
    seen: dict[str, object] = {}
    registered, done = threading.Event(), threading.Event()

    def other_run() -> None:
        with objects.registered({"python:fn": objects.Entry("theirs")}):
            registered.set()
            done.wait(timeout=30)
            seen["theirs"] = objects.lookup("python:fn")

    thread = threading.Thread(target=other_run)
    thread.start()
    try:
        assert registered.wait(timeout=30)
        assert not objects.is_handle("python:fn")  # not leaked into this thread's run
        with objects.registered({"python:fn": objects.Entry("mine")}):
            assert objects.lookup("python:fn") == "mine"
    finally:
        done.set()
        thread.join(timeout=30)
    assert seen == {"theirs": "theirs"}
