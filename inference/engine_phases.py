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
from collections.abc import Callable
from typing import Any, Protocol

#: The phases of an engine iteration, the ``phase`` label's values: ``prefill`` — prompt pieces
#: through the model (its host time, waits inside included); ``launch`` — queueing decode steps (graph
#: replays and their copies; a mixed step's prompt pieces with them, :mod:`.mixed_step`);
#: ``gpu_wait`` — waiting for a step's frames to reach the host (with the pipeline on: the GPU setting
#: the pace); ``other`` — the rest: taking new requests, admission, handing codes to the codec,
#: retiring requests, publishing gauges.
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


#: The engine's GPU work timed in situ, the ``work`` label's values (``inference_engine_gpu_seconds``).
GPU_WORK = ("decode", "prefill")


class GpuSpans:
    """The GPU time of the engine's own work where it runs, from a pair of timing CUDA events around
    each decode step and prefill call on the engine's stream.

    Why: at c=64 on an H100 a served decode step comes every 17.5 ms against a 9.6 ms replay alone,
    and the host split (:class:`PhaseClock`) shows 4.5 ms of it waiting for the GPU: the GPU sets the
    pace, but the phases cannot say whether its extra time is the step slowed by the codec process's
    kernels beside it (under MPS), the prefill, or gaps. An event pair's elapsed time is the span from
    the stream reaching the first event to reaching the second, read without a sync once both are
    done. Pairs are harvested when a later step's copy has been waited for (the stream is in order,
    so everything recorded before it is done), and at most :data:`MAX_PENDING` wait unread."""

    MAX_PENDING = 64

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(GPU_WORK, 0.0)
        self._pending: list[tuple[str, Any, Any]] = []
        self._counters: dict[str, Any] = {}

    def export_to(self, counters: dict[str, Any]) -> None:
        """``counters``: one labelled counter child per kind of work (``.inc(seconds)``)."""
        self._counters = counters

    @staticmethod
    def mark() -> Any:
        """A timing CUDA event recorded now on the current stream."""
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def time(self, work: str, call: Callable[[], Any]) -> Any:
        """``call()`` between two marks on the current stream, its span added as ``work``: the end
        event (done once the call's GPU work is)."""
        start = self.mark()
        call()
        end = self.mark()
        self.add(work, start, end)
        return end

    def add(self, work: str, start: Any, end: Any) -> None:
        """One span to read once its end is done (the oldest dropped past :data:`MAX_PENDING`)."""
        self._pending.append((work, start, end))
        del self._pending[:-self.MAX_PENDING]

    def harvest(self) -> None:
        """Read every span whose end event is done (all of them after a later event's sync)."""
        left = []
        for work, start, end in self._pending:
            if not end.query():
                left.append((work, start, end))
                continue
            seconds = start.elapsed_time(end) / 1000.0
            self.seconds[work] += seconds
            if work in self._counters:
                self._counters[work].inc(seconds)
        self._pending = left


class GilProbe:
    """How long the engine thread waits to get the interpreter back after letting go of it, sampled.

    Why: every torch call and every wait on the GPU lets go of the GIL, and the thread then waits for
    it while another thread of the server holds it (the event loop writing audio, the codec process's
    receiving thread): up to the switch interval (5 ms) each time. The phases count that wait inside
    whichever phase let go, so they cannot show it; the served ``other`` phase grows ~0.11 ms a row
    from c=64 to c=128 on an H100 (2026-12-06c) while the engine's own host work outside the step
    is ~0.5 ms a step at batch 63, ~8 us a row (the tiny model on the CPU, codes only, nothing else
    in the process: ``benchmarks/inference_h200/2026-12-06c/cpu-engine-codes-only``). Every
    :attr:`every`-th busy iteration, :meth:`tick` lets go of the GIL once (``time.sleep(0)``) and
    times getting it back: ~microseconds when no other thread wants it, and the wait any release
    costs when one does (CPU: 0.07 ms free, 10.2 ms beside a spinning thread at a 10 ms switch
    interval). Sampling keeps the probe's own cost (one such wait) to 1/``every`` of an iteration's."""

    def __init__(self, every: int = 16) -> None:
        self.every = every
        self.count = 0
        self.total_s = 0.0
        self._iterations = 0
        self._histogram: Any = None

    def export_to(self, histogram: Any) -> None:
        """``histogram``: the labelled histogram child each probe is observed into."""
        self._histogram = histogram

    def tick(self) -> None:
        self._iterations += 1
        if self._iterations % self.every:
            return
        t0 = time.perf_counter()
        time.sleep(0)  # lets go of the GIL and takes it back
        waited = time.perf_counter() - t0
        self.count += 1
        self.total_s += waited
        if self._histogram is not None:
            self._histogram.observe(waited)
