"""How late an asyncio event loop wakes: the bench client's own, and the server's.

Why: first audio leaves the server through its event loop (HTTP, the codec's audio handed to each
stream) and is timed on the client by another (``ttsfleet bench serve``: one asyncio process reading
every stream through httpx). At c=128 on 2026-12-07c the client's first-audio p99 (313-695 ms) sat well
above the sum of the server's own stage p99s (~250 ms); a loop kept late — the server's by the engine
thread holding the interpreter, the client's by parsing thousands of chunks a second — adds its lateness
to every first audio that passes through it. A ticker that asks to wake every few milliseconds measures
that lateness directly: the client keeps its lags (:func:`lag_summary`), the server observes them into
``inference_event_loop_lag_seconds``.

A client of threads has no loop, but its threads share one interpreter: the live bench
(``benchmarks/inference_serve/live_prefix.py``) runs each session as the fish-audio SDK's sync
websocket, a reader and a sender thread apiece (~190 threads at c=64), and a thread that got its audio
must win the interpreter lock back before it can time it. :class:`ThreadLag` is the same ticker as a
thread: a wake-up from ``time.sleep`` is late by the scheduler and by the wait for the lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

#: How often the ticker asks to wake (s): short against the tails it must see, long enough that its
#: own wake-ups cost the loop nothing measurable (200 a second).
TICK_S = 0.005


@dataclass
class LoopLag:
    """Started inside the loop it watches (:meth:`start`), stopped after (:meth:`stop`): the lags of its
    wake-ups past their due time, kept in ``lags_s`` or, where ``on_lag`` is given, handed to it (the
    server's histogram: a server runs for days)."""

    tick_s: float = TICK_S
    lags_s: list[float] = field(default_factory=list)
    on_lag: Callable[[float], None] | None = None
    _task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.tick_s
            await asyncio.sleep(self.tick_s)
            lag = max(0.0, loop.time() - due)
            if self.on_lag is None:
                self.lags_s.append(lag)
            else:
                self.on_lag(lag)


@dataclass
class ThreadLag:
    """A daemon thread that asks to sleep ``tick_s`` again and again (:meth:`start` .. :meth:`stop`)
    and keeps how late each wake-up came (``lags_s``) and when (``at_s``, ``time.perf_counter``: one
    clock for every process of a Linux host, so a parent can cut a child's lags to its own window)."""

    tick_s: float = TICK_S
    lags_s: list[float] = field(default_factory=list)
    at_s: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._tick, name="thread-lag", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def _tick(self) -> None:
        while not self._stop.is_set():
            due = time.perf_counter() + self.tick_s
            time.sleep(self.tick_s)
            now = time.perf_counter()  # after the lock is back: sleep returns holding it
            self.at_s.append(now)
            self.lags_s.append(max(0.0, now - due))


def lags_between(at_s: list[float], lags_s: list[float], start: float, end: float) -> list[float]:
    """The lags of the wake-ups at ``start`` .. ``end`` (one window of a :class:`ThreadLag`'s run)."""
    return [lag for at, lag in zip(at_s, lags_s, strict=True) if start <= at <= end]


def lag_summary(lags_s: list[float]) -> dict[str, float]:
    """p50 / p99 / max of the lags in ms and how many wake-ups they are (NaN where there were none)."""
    if not lags_s:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan"), "ticks": 0}
    ms = np.asarray(lags_s) * 1000
    p50, p99 = (round(float(np.percentile(ms, q)), 2) for q in (50, 99))
    return {"p50_ms": p50, "p99_ms": p99, "max_ms": round(float(ms.max()), 2), "ticks": int(ms.size)}
