"""Python's cyclic garbage collector, timed: every collection's stop-the-world pause by generation, and
a one-off freeze of the heap a process has built by the time it serves.

Why: the collector holds the interpreter (the GIL) for its whole pass, so while it runs no other thread
of the process runs — not the engine thread launching decode steps, not the event loop writing first
audio, not the bench client reading it. A full pass walks every tracked object: after ``import torch,
triton, fastapi, uvicorn`` and the server's own modules a process tracks ~219k objects and one
generation-2 ``gc.collect()`` takes ~80 ms (the 2-core CPU box, 2026-12-07: those imports, then the
collect timed). Requests that live for seconds outlast generations 0 and 1 and fill the oldest one
toward automatic full collections, so a 100-300 ms pause every few seconds in the server or the bench
client would land squarely in the c=128 first-audio p99 (313-695 ms at the client against ~250 ms of the
server's own stage p99s, benchmarks/inference_h200/README.md, 2026-12-07c). :class:`GcPauses` times each
pause on ``gc.callbacks`` (the server observes them into ``inference_gc_pause_seconds``, the bench client
keeps them: :func:`pause_summary`); :func:`freeze_heap` moves what start-up built (modules, the model,
warm-up) out of the collector's reach, as vLLM does after start-up, so later full passes walk only what
requests made (the tiny CPU server: 240k objects frozen in ~100 ms; unfrozen, a 97-99 ms full pass under
load: benchmarks/inference_serve/README.md, gc-pauses-2026-12-07).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: The collector's generations (0 youngest; 2 the full pass that walks every tracked object).
GENERATIONS = (0, 1, 2)


@dataclass
class GcPauses:
    """Times every collection of this process from :meth:`start` to :meth:`stop` (both idempotent):
    ``(generation, seconds)`` kept in ``pauses`` or, where ``on_pause`` is given, handed to it (the
    server's histogram: a server runs for days). ``on_pause`` runs inside the collector's callback, in
    whichever thread's allocation set the collection off: it must be quick and must not wait on
    anything the process's other threads hold for long."""

    on_pause: Callable[[int, float], None] | None = None
    pauses: list[tuple[int, float]] = field(default_factory=list)
    _started_at: float | None = None

    @property
    def running(self) -> bool:
        return self._callback in gc.callbacks

    def start(self) -> None:
        if not self.running:
            gc.callbacks.append(self._callback)

    def stop(self) -> None:
        while self._callback in gc.callbacks:  # the bound method compares equal, not identical
            gc.callbacks.remove(self._callback)
        self._started_at = None

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started_at = time.perf_counter()
            return
        if self._started_at is None:  # started watching mid-collection
            return
        seconds = time.perf_counter() - self._started_at
        self._started_at = None
        if self.on_pause is None:
            self.pauses.append((int(info["generation"]), seconds))
        else:
            self.on_pause(int(info["generation"]), seconds)


def pause_summary(pauses: list[tuple[int, float]]) -> dict[str, Any]:
    """Per generation (``"gen0"``, ``"gen1"``, ``"gen2"``): how many collections, their summed, p50,
    p99 and longest pause in ms (NaN where none ran), the percentiles as :func:`.loop_lag.lag_summary`
    gives a loop's lag."""
    from .loop_lag import lag_summary

    out: dict[str, Any] = {}
    for gen in GENERATIONS:
        seconds = [s for g, s in pauses if g == gen]
        summary = lag_summary(seconds)
        total_ms = round(float((np.asarray(seconds, dtype=float) * 1000).sum()), 2)
        out[f"gen{gen}"] = {"count": summary.pop("ticks"), "total_ms": total_ms, **summary}
    return out


def freeze_heap() -> tuple[int, float]:
    """One full collection, then every object left moved to the collector's permanent generation
    (``gc.freeze``), which later passes skip: ``(objects frozen now in all, ms the two took)`` for the
    caller's log. Call it once start-up's objects are built and before requests come: an object frozen
    is never collected by the cyclic collector again (its reference count still frees it)."""
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count(), (time.perf_counter() - t0) * 1000
