"""StopRequested, the training loop's signal handling: SIGINT/SIGTERM set a flag (the loop then saves and
exits), a second Ctrl-C aborts, the previous handlers come back, and a SIGINT ignored at start stays ignored.
In-process; tests/training/test_checkpoint_reliability.py sends the same signals to a real train.py."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from training.stop import StopRequested


def raise_and_wait(sig: signal.Signals) -> None:
    os.kill(os.getpid(), sig)
    for _ in range(100):  # Python runs the handler between bytecodes of the main thread: give it a moment
        time.sleep(0.001)


def test_stop_requested_flags_sigint_and_sigterm_and_a_second_ctrl_c_aborts():
    # Python's own Ctrl-C handler, as in a process started from a terminal (a test run launched in the
    # background starts with SIGINT ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        with StopRequested() as stop:
            raise_and_wait(signal.SIGTERM)
            assert stop.signal_name == "SIGTERM"
            with pytest.raises(KeyboardInterrupt):
                raise_and_wait(signal.SIGINT)
        assert {sig: signal.getsignal(sig) for sig in before} == before
        with StopRequested() as stop:
            raise_and_wait(signal.SIGINT)
            assert stop.signal_name == "SIGINT"
    finally:
        signal.signal(signal.SIGINT, previous)


def test_stop_requested_leaves_a_sigint_ignored_at_start_ignored():
    """`nohup train.py ... &`: the process starts with SIGINT ignored, and the loop keeps it so (SIGTERM still
    stops it)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with StopRequested() as stop:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            raise_and_wait(signal.SIGINT)
            assert stop.signal_name is None
            raise_and_wait(signal.SIGTERM)
            assert stop.signal_name == "SIGTERM"
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_stop_requested_outside_the_main_thread_leaves_signals_alone():
    """Python lets only the main thread set handlers: a loop run from another thread (a notebook's worker,
    a test harness) trains without the clean stop rather than failing."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    outcome = []

    def enter_and_exit():
        try:
            with StopRequested() as stop:
                outcome.append(stop.signal_name)
        except BaseException as e:  # handed to the test's thread
            outcome.append(e)

    worker = threading.Thread(target=enter_and_exit)
    worker.start()
    worker.join()
    assert outcome == [None]
    assert {sig: signal.getsignal(sig) for sig in before} == before
