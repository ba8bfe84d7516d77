"""How late an asyncio event loop wakes: the bench client's own, and the server's.

Why: first audio leaves the server through its event loop (HTTP, the codec's audio handed to each
stream) and is timed on the client by another (``ttsfleet bench serve``: one asyncio process reading
every stream through httpx). At c=128 on 2026-12-07c the client's first-audio p99 (313-695 ms) sat well
above the sum of the server's own stage p99s (~250 ms); a loop kept late — the server's by the engine
thread holding the interpreter, the client's by parsing thousands of chunks a second — adds its lateness
to every first audio that passes through it. A ticker that asks to wake every few milliseconds measures
that lateness directly: the client keeps its lags (:func:`lag_summary`), the server observes them into
``inference_event_loop_lag_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
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


def lag_summary(lags_s: list[float]) -> dict[str, float]:
    """p50 / p99 / max of the lags in ms and how many wake-ups they are (NaN where there were none)."""
    if not lags_s:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan"), "ticks": 0}
    ms = np.asarray(lags_s) * 1000
    p50, p99 = (round(float(np.percentile(ms, q)), 2) for q in (50, 99))
    return {"p50_ms": p50, "p99_ms": p99, "max_ms": round(float(ms.max()), 2), "ticks": int(ms.size)}
