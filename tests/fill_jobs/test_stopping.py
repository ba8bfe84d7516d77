"""The stop flag the fill job's signal handlers set: prompt, and safe to set from a handler."""

from __future__ import annotations

import os
import signal
import threading
import time

from ttsfleet.fill_jobs.stopping import StopFlag


def test_a_signal_during_wait_ends_it_promptly() -> None:
    flag = StopFlag()
    previous = signal.signal(signal.SIGUSR1, flag)
    try:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        t0 = time.monotonic()
        assert flag.wait(10) is True
        assert time.monotonic() - t0 < 2 and flag.is_set() and flag.signal_name == "SIGUSR1"
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_wait_times_out_without_a_signal() -> None:
    flag = StopFlag()
    t0 = time.monotonic()
    assert flag.wait(0.1) is False and not flag.is_set()
    assert time.monotonic() - t0 >= 0.1


def test_the_handler_takes_no_lock() -> None:
    """The handler runs in the main thread, maybe while that thread holds a lock: with the
    threading.Event this flag used to be, a SIGTERM while wait() held the Event's lock deadlocked."""
    flag = StopFlag()
    locks = [v for v in vars(flag).values() if hasattr(v, "acquire") or hasattr(v, "_cond")]
    assert locks == []
    done = threading.Event()
    threading.Thread(target=lambda: (flag(signal.SIGTERM, None), done.set()), daemon=True).start()
    assert done.wait(5) and flag.is_set()
