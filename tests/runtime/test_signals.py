"""GracefulStop: SIGINT/SIGTERM become a flag, the exit code is 128 + signal, a second signal is
not swallowed, handlers are restored, and `proxrl` prints the stop as one line."""

from __future__ import annotations

import os
import signal
import sys
import types

import pytest

from proxrl import cli
from proxrl.runtime.errors import Interrupted, ProxrlError
from proxrl.runtime.signals import GracefulStop
from tests.runtime.test_cli import add_command


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_becomes_a_flag_and_the_exit_code_is_128_plus_signal(signum, code, tmp_path):
    before = signal.getsignal(signum)
    with GracefulStop() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signum)  # delivered to the main thread before kill() returns
        assert stop.requested and stop.signum == signum
        err = stop.interrupted(tmp_path / "checkpoints" / "step_000000003")
    assert signal.getsignal(signum) is before  # restored on exit
    assert isinstance(err, Interrupted) and isinstance(err, ProxrlError)
    assert err.exit_code == code
    assert str(err) == (
        f"received {signal.Signals(signum).name}; checkpoint saved in "
        f"{tmp_path / 'checkpoints' / 'step_000000003'}; continue with --resume"
    )


def test_second_sigint_raises_keyboard_interrupt_at_once():
    with pytest.raises(KeyboardInterrupt), GracefulStop() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested
        os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_forwarded_signal_is_a_stop_like_one_received_and_the_first_one_counts():
    """``request``: a signal another process caught (placement ray's driver), with nothing
    installed here (``signals=()``)."""
    before = signal.getsignal(signal.SIGINT)
    with GracefulStop(signals=()) as stop:
        assert signal.getsignal(signal.SIGINT) is before and not stop.requested
        stop.request(signal.SIGTERM)
        stop.request(signal.SIGINT)
        assert stop.requested and stop.signum == signal.SIGTERM
        err = stop.interrupted("out/checkpoints/step_000000002")
    assert err.exit_code == 143
    assert str(err).startswith("received SIGTERM; checkpoint saved in out/checkpoints/step_")


def test_ignored_signal_stays_ignored():
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with GracefulStop() as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            assert not stop.requested
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_cli_prints_a_stop_as_one_line_with_the_signal_exit_code(monkeypatch, capsys):
    module = types.ModuleType("proxrl_fake_stop")

    def main(argv):
        raise Interrupted(
            "received SIGTERM; checkpoint saved in out/checkpoints/step_000000002; "
            "continue with --resume",
            signal.SIGTERM,
        )

    module.main = main
    monkeypatch.setitem(sys.modules, "proxrl_fake_stop", module)
    add_command(monkeypatch, "fake", ("proxrl_fake_stop", "a test command"))
    assert cli.main(["fake"]) == 143
    err = capsys.readouterr().err
    assert err == (
        "proxrl fake: stopped: received SIGTERM; checkpoint saved in "
        "out/checkpoints/step_000000002; continue with --resume\n"
    )
