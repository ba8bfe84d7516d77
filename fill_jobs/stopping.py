"""The stop request: SIGTERM, SIGUSR1 and SIGINT set a flag the job loop polls.

Installed first thing in ``ttsfleet fill run`` (before torch and the manifest load), so a
preemption that arrives during start-up still ends in an orderly stop with exit code 99 instead
of the signal's default action.
"""

from __future__ import annotations

import signal
import time

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class StopFlag:
    """Set by the stop signals; the loop polls it, and waits on it instead of sleeping.

    Lock-free on purpose: a Python signal handler runs in the main thread between two bytecodes,
    possibly while that thread holds a lock. The flag used to be a ``threading.Event``, whose
    ``set()`` takes the lock its ``wait()`` holds for a moment on entry and exit (the job's item
    wait runs in the main thread): a stop signal in that moment would deadlock the job.
    """

    #: how often :meth:`wait` looks at the flag (a stop is seen within this)
    POLL_S = 0.02

    def __init__(self) -> None:
        self._stopped = False
        self.signal_name: str | None = None

    def __call__(self, signum: int, _frame: object) -> None:
        if not self._stopped:
            self.signal_name = signal.Signals(signum).name
        self._stopped = True

    def is_set(self) -> bool:
        return self._stopped

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` s, less once stopped; whether the stop came."""
        end = time.monotonic() + timeout
        while not self._stopped:
            left = end - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, self.POLL_S))
        return True

    def install(self) -> StopFlag:
        """Route the stop signals to this flag (main thread only)."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, self)
        return self

    @staticmethod
    def ignore_from_now() -> None:
        """Ignore stop signals once the exit code is decided: a SIGTERM during interpreter
        shutdown would otherwise turn exit 0 or 99 into death by signal (Python restores the
        default handlers as it finalizes, but leaves ignored signals ignored)."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)

    @classmethod
    def ignore_at_exit(cls) -> None:
        """Ignore stop signals from interpreter shutdown on (atexit), not at once.

        Ignoring them at once would leak into an embedding process: SIG_IGN is inherited by
        every child it starts later, and a shell started with USR1 ignored cannot trap it (this
        broke a wrapper test that ran after an in-process ``fill run``). Until exit, this flag's
        own handler stays installed and only records the signal, so the decided exit code
        stands.
        """
        if not getattr(cls, "_atexit_registered", False):
            import atexit

            atexit.register(cls.ignore_from_now)
            cls._atexit_registered = True
