"""How late the bench client's own event loop ran while a level was measured.

Why: ``ttsfleet bench serve`` times first audio and the listener's underruns on the client — one asyncio
process reading every stream through httpx's Python HTTP parser. At c=128 (~6,700 frames/s, thousands
of chunks a second) a saturated client would read each chunk late and count its own delay as the
server's: the first-audio p99 of 2026-12-07c's c=128 levels (313-695 ms) is well above the sum of the
server's own stage p99s (~250 ms). A ticker that asks to wake every few milliseconds measures the
client's lag directly: if its p99 is a few ms, the tail is the server's; if it is hundreds, the client's.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import numpy as np

#: How often the ticker asks to wake (s): short against the tails it must see, long enough that its
#: own wake-ups cost the loop nothing measurable (200 a second).
TICK_S = 0.005


@dataclass
class LoopLag:
    """Started inside the loop a level runs on (:meth:`start`), stopped after it (:meth:`stop`): the
    lags of its wake-ups past their due time."""

    tick_s: float = TICK_S
    lags_s: list[float] = field(default_factory=list)
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
            self.lags_s.append(max(0.0, loop.time() - due))


def lag_summary(lags_s: list[float]) -> dict[str, float]:
    """p50 / p99 / max of the lags in ms and how many wake-ups they are (NaN where there were none)."""
    if not lags_s:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan"), "ticks": 0}
    ms = np.asarray(lags_s) * 1000
    p50, p99 = (round(float(np.percentile(ms, q)), 2) for q in (50, 99))
    return {"p50_ms": p50, "p99_ms": p99, "max_ms": round(float(ms.max()), 2), "ticks": int(ms.size)}
