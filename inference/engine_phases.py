"""Where the engine thread's time goes, iteration by iteration, split by phase for /metrics.

Why: at c=64 a served H100 makes ~53 decode steps a second (one every ~19 ms) while one step's CUDA
graph replays in ~9.6 ms, NVML says the GPU is 91-98 % busy, and the engine alone (no codec) made
4,494 frames/s on an H200 (14 ms a step): whether the rest is the GPU (the codec process's kernels
beside the step under MPS, prefill) or the host (admission, hand-offs, Python) decides which lever
comes next, and NVML's busy counts both processes' kernels, so it cannot say. The engine already
times its phases (``_Stats.prefill_s``, ``decode_s``, ``wait_s``); this splits every busy
iteration's wall time into them and what is left, and exports it as
``inference_engine_seconds{phase}``, which ``bench serve`` reads over each level's steady window
(:mod:`.bench_engine_loop`).
"""

from __future__ import annotations

import time
from typing import Any, Protocol

#: The phases of an engine iteration, the ``phase`` label's values: ``prefill`` — prompt pieces
#: through the model (its host time, waits inside included); ``launch`` — queueing decode steps (graph
#: replays and their copies); ``gpu_wait`` — waiting for a step's frames to reach the host (with the
#: pipeline on: the GPU setting the pace); ``other`` — the rest: taking new requests, admission,
#: handing codes to the codec, retiring requests, publishing gauges.
ENGINE_PHASES = ("prefill", "launch", "gpu_wait", "other")


class PhaseTimes(Protocol):
    """The engine's running totals the phases are read from (its ``_Stats``)."""

    prefill_s: float
    decode_s: float
    wait_s: float
    busy_s: float


class PhaseClock:
    """Splits each busy engine iteration's wall time by phase: :meth:`start` marks the totals,
    :meth:`stop` adds the iteration to ``stats.busy_s`` and hands each phase's share to the counters
    :meth:`export_to` gave (none before: a warm-up is not traffic)."""

    def __init__(self, stats: PhaseTimes) -> None:
        self.stats = stats
        self._counters: dict[str, Any] = {}
        self._t0 = 0.0
        self._marks = (0.0, 0.0, 0.0)

    def export_to(self, counters: dict[str, Any]) -> None:
        """``counters``: one labelled counter child per phase (``.inc(seconds)``)."""
        self._counters = counters

    def start(self) -> None:
        s = self.stats
        self._t0 = time.perf_counter()
        self._marks = (s.prefill_s, s.decode_s, s.wait_s)

    def stop(self) -> dict[str, float]:
        """The iteration's seconds by phase (``other``: the wall time the timed phases leave)."""
        s = self.stats
        wall = time.perf_counter() - self._t0
        timed = {"prefill": s.prefill_s - self._marks[0], "launch": s.decode_s - self._marks[1],
                 "gpu_wait": s.wait_s - self._marks[2]}
        split = {**timed, "other": max(wall - sum(timed.values()), 0.0)}
        s.busy_s += wall
        for phase, seconds in split.items():
            if seconds > 0 and phase in self._counters:
                self._counters[phase].inc(seconds)
        return split
