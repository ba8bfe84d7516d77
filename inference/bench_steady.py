"""The server's side of a closed-loop level's steady window: /metrics read live at its two edges.

Why: the stage breakdown read before and after a whole level (``ttfa_stages_ms``, ``_p99_ms``)
counts the first wave too, and at high concurrency the first wave dominates its tail: on the H200
(2026-12-04, c=64) the first wave's 64 simultaneous arrivals waited 0.7-1.4 s for admission, the
level's queue p99 read 677 ms while the steady window's first-audio p99 was 150-350 ms, so the
breakdown could not say what makes the *steady* p99 miss 250 ms. The server's counters are
cumulative and the window's edges are only known as they happen (:mod:`.bench_window`: the first
wave's last first audio, the first client leaving), so the reads must be taken live, at those
events; each runs in a worker thread so that the clients' event loop never waits on it. The live
route's benchmark (``benchmarks/inference_serve/live_prefix.py``) takes its reads at its own
window's edges (its sessions' events, in threads) and sums them with :func:`span_reading`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .bench_stages import StageBuckets, stage_buckets, stage_quantiles_ms

if TYPE_CHECKING:
    from .bench_window import Window


@dataclass(frozen=True)
class Read:
    """One read of the server's /metrics: when it was sent (``perf_counter``) and its samples."""

    at: float
    samples: list[Any]


def read_now(url: str) -> Read:
    """Read /metrics now (blocking: call it in a thread while clients run)."""
    from .bench import server_samples

    at = time.perf_counter()
    return Read(at, server_samples(url))


class EdgeReads:
    """Starts a /metrics read at each edge of one closed-loop run's steady window, as it happens.

    The start edge is the first audio of the last of the ``first_wave`` requests (a failed one
    counts at its end: no earlier moment is known live); the end edge is the first client leaving.
    An end before the start leaves no window: no start read then."""

    def __init__(self, url: str, first_wave: int) -> None:
        self.url = url
        self._first_wave = first_wave
        self._seen: set[int] = set()
        self._tasks: dict[str, asyncio.Task[Read]] = {}

    def first_audio(self, i: int) -> None:
        """First-wave request ``i`` got its first audio or ended (idempotent per request)."""
        self._seen.add(i)
        if len(self._seen) == self._first_wave and not self._tasks:
            self._start("start")

    def client_left(self) -> None:
        """A client sent its last request and got its reply: the first one to do so ends the window."""
        if "end" not in self._tasks:
            self._start("end")

    def _start(self, edge: str) -> None:
        self._tasks[edge] = asyncio.create_task(asyncio.to_thread(read_now, self.url))

    async def collect(self) -> tuple[Read, Read] | None:
        """The start and end reads once both finished; None when the run had no such pair."""
        reads = {edge: await task for edge, task in self._tasks.items()}
        if set(reads) != {"start", "end"} or not reads["start"].samples or not reads["end"].samples:
            return None
        return reads["start"], reads["end"]


@dataclass
class Counts:
    """What the server's counters grew by between two reads (or over several such spans, summed)."""

    stages: dict[str, tuple[float, float]] = field(default_factory=dict)  # {stage: (sum_s, count)}
    buckets: StageBuckets = field(default_factory=dict)  # {stage: {le: requests}}
    waits: dict[str, float] = field(default_factory=dict)  # admission waits by cause
    codec: dict[str, float] = field(default_factory=dict)  # codec pushes, frames, busy_s
    engine: dict[str, float] = field(default_factory=dict)  # engine seconds by phase, steps, rows
    seconds: float = 0.0

    @classmethod
    def between(cls, before: list[Any], after: list[Any], seconds: float) -> Counts:
        """The growth between two /metrics reads' samples taken ``seconds`` apart."""
        from .bench import codec_totals, readings_of
        from .bench_engine_loop import engine_totals

        (s0, w0), (s1, w1) = readings_of(before), readings_of(after)
        b0, b1 = stage_buckets(before), stage_buckets(after)
        return cls(
            stages=_pairs(s1, s0, -1.0),
            buckets={k: _minus(cum, b0.get(k, {})) for k, cum in b1.items()},
            waits=_minus(w1, w0), codec=_minus(codec_totals(after), codec_totals(before)),
            engine=_minus(engine_totals(after), engine_totals(before)), seconds=seconds)

    def plus(self, other: Counts) -> Counts:
        """Two spans' growth together (the steady windows of a level's repeated runs)."""
        return Counts(stages=_pairs(self.stages, other.stages, 1.0),
                      buckets={k: _plus(self.buckets.get(k, {}), other.buckets.get(k, {}))
                               for k in dict.fromkeys([*self.buckets, *other.buckets])},
                      waits=_plus(self.waits, other.waits), codec=_plus(self.codec, other.codec),
                      engine=_plus(self.engine, other.engine), seconds=self.seconds + other.seconds)


def _pairs(a: dict[str, tuple[float, float]], b: dict[str, tuple[float, float]],
           sign: float) -> dict[str, tuple[float, float]]:
    """``a + sign * b`` of ``{stage: (sum_s, count)}`` (a stage missing from either counts 0)."""
    zero = (0.0, 0.0)
    return {k: (a.get(k, zero)[0] + sign * b.get(k, zero)[0], a.get(k, zero)[1] + sign * b.get(k, zero)[1])
            for k in dict.fromkeys([*a, *b])}


def _minus(after: dict[Any, float], before: dict[Any, float]) -> dict[Any, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def _plus(a: dict[Any, float], b: dict[Any, float]) -> dict[Any, float]:
    return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in dict.fromkeys([*a, *b])}


@dataclass
class ServerView:
    """The server's account of a span: time to first audio by stage (means and p99s, in ms), the
    admission waits by cause, the codec's work, the engine loop's steps by phase and how many
    requests got their first audio in it."""

    stage_means_ms: dict[str, float]
    stage_p99_ms: dict[str, float]
    waits: dict[str, float]
    codec: dict[str, float]
    requests: int
    seconds: float
    engine: dict[str, Any] = field(default_factory=dict)


def view_of(counts: Counts) -> ServerView:
    """The figures ``bench serve`` reports from a span's :class:`Counts`."""
    from .bench import codec_use, stage_means_ms
    from .bench_engine_loop import engine_use

    return ServerView(
        stage_means_ms=stage_means_ms(counts.stages),
        stage_p99_ms=stage_quantiles_ms(counts.buckets, 0.99),
        waits={k: v for k, v in counts.waits.items() if v},
        codec=codec_use(counts.codec, counts.seconds),
        engine=engine_use(counts.engine, counts.seconds),
        requests=int(max((n for _, n in counts.stages.values()), default=0)),
        seconds=round(counts.seconds, 4))


@dataclass
class SteadyReading:
    """A level's :class:`ServerView` over its runs' steady windows, and how late the live reads
    were sent after the window's edges (:func:`.bench_window.steady_window`, the worst run's)."""

    view: ServerView
    start_lag_ms: float
    end_lag_ms: float


def steady_reading(runs: list[tuple[list[Any], tuple[Read, Read] | None]]) -> SteadyReading | None:
    """The server's figures over the steady windows of a level's runs ``(samples, edge reads)``;
    None unless every run has a steady window and both its reads (the whole level's figures then
    stand alone)."""
    from .bench_window import steady_window

    return span_reading([(steady_window(samples), reads) for samples, reads in runs])


def span_reading(spans: list[tuple[Window | None, tuple[Read, Read] | None]]) -> SteadyReading | None:
    """The server's figures summed over spans ``(window, edge reads)`` — the window's edges as the
    benchmark defines them (``perf_counter``), the reads it took live at them — and how late the
    reads were sent after the edges (the worst span's); None unless every span has a window of
    positive length and both its reads. ``bench serve``'s windows come from its samples
    (:func:`steady_reading`), the live benchmark's from its sessions' events."""
    total, lags = Counts(), []
    for w, reads in spans:
        if reads is None or w is None or w.seconds <= 0:
            return None
        start, end = reads
        total = total.plus(Counts.between(start.samples, end.samples, end.at - start.at))
        lags.append((start.at - w.start, end.at - w.end))
    if not lags:
        return None
    return SteadyReading(view_of(total), round(1000 * max(a for a, _ in lags), 2),
                         round(1000 * max(b for _, b in lags), 2))
