"""``ttsfleet bench serve``: a load generator for a running TTS server, closed and open loop.

Why closed loop: the autoscaler and the capacity curves in the GPU catalog are stated per
concurrency (requests decoding at once), so each level keeps exactly ``c`` streaming requests in
flight and measures aggregate frames/s, per-request frames/s and time to first audio — in the
level's steady window (:mod:`.bench_window`: after the first wave's burst, before the drain), with
the first wave's first audio reported apart. The JSON carries ``points`` in the shape
``GpuCatalog.with_measured_file`` reads, so a run on a GPU can replace a class's seed curve
directly, and ``capacity``: the largest concurrency meeting the serving SLO.

Why open loop too (``rates``): users do not wait for each other; Poisson arrivals at a fixed rate
show what a closed loop hides — queueing when the offered load nears capacity.

The server's own split of time to first audio (stage means and p99s, admission waits, codec use)
comes from its /metrics, read around each level and, live, at the edges of its steady window
(:mod:`.bench_steady`): the first wave's burst would otherwise dominate the stages' tail.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .bench_clients import ListenerClients
from .bench_engine_loop import engine_line
from .bench_playback import Playback, first_stall_p50, underrun_tail
from .bench_trace import RequestTrace

if TYPE_CHECKING:
    from .bench_steady import EdgeReads, Read, ServerView, SteadyReading
    from .loop_lag import LoopLag


@dataclass
class BenchConfig:
    url: str
    levels: list[int]
    requests: int = 0
    text: str = "The quick brown fox jumps over the lazy dog."
    max_new_tokens: int = 128
    fmt: str = "pcm"
    api_key: str | None = None
    timeout_s: float = 300.0
    seed: int = 1
    #: Runs of every level; the level reports the median frames/s and the spread (the gate's noise).
    repeats: int = 1
    #: Request i asks for ``max_new_tokens * (1 + frames_spread * u_i)`` frames, u_i uniform in [-1, 1].
    frames_spread: float = 0.0
    #: Closed-loop requests per client when ``requests`` is 0 (>= 3 leaves a steady window).
    per_client: int = 10
    #: Open-loop levels after the closed-loop ones: Poisson arrivals at each rate (requests/s) ...
    rates: list[float] = field(default_factory=list)
    #: ... for this long each (arrivals = rate x duration, at least 1).
    open_duration_s: float = 30.0
    #: ``own``: each listener its own client and connection; ``shared``: one pooled client for all, whose
    #: pool kept requests waiting before they were written (:mod:`.bench_clients`)
    connections: str = "own"

    def requests_at(self, c: int) -> int:
        return self.requests or max(self.per_client * c, 4)

    def frames_of(self, i: int) -> int:
        return spread_frames(self.max_new_tokens, self.frames_spread, self.seed, i)


def spread_frames(frames: int, spread: float, seed: int, i: int) -> int:
    """Request ``i``'s frame budget: ``frames * (1 + spread * u)``, ``u`` uniform in [-1, 1] and fixed
    by ``(seed, i)``. Why: requests of one length finish together and a closed loop then sends the
    next ones together, a burst every request's length that no live traffic has (the live route's
    sessions on the H200 stayed in such waves for a whole run, 2026-12-04)."""
    if spread <= 0:
        return frames
    import random

    u = random.Random(seed * 7919 + i).uniform(-1.0, 1.0)
    return max(1, int(round(frames * (1 + spread * u))))


#: ``Sample.status`` of a streamed reply that answered 200 and ended without a byte of audio.
EMPTY_REPLY = 204


@dataclass
class Sample:
    ok: bool
    status: int
    ttfa_s: float
    duration_s: float
    frames: float
    audio_s: float = 0.0  # seconds of audio the request delivered
    start_s: float = 0.0  # submit time (perf_counter): places the request in the run's steady window
    client: int = 0  # the closed-loop worker that sent it
    wave: int = 0  # its index among that worker's requests (0: the first wave)
    stalls: int = 0  # underruns of a listener playing pcm from its first byte (:mod:`.bench_playback`)
    stall_s: float = 0.0  # their summed silence
    first_stall_at_s: float | None = None  # audio seconds played before the first underrun
    #: submit to the response's headers (s): the server sends them once its handler has taken the
    #: request (validated, submitted); its own first audio counts from its app receiving the request
    #: (the ``intake`` stage, since 2026-12-07e), so what this has beyond intake is before the app
    headers_s: float = float("nan")
    #: the server's own time from its app receiving the request to the response's start (s; its
    #: ``Server-Timing: app;dur=`` header, 2026-12-07e on): ``headers_s`` less this is the request's
    #: time outside the app, its way in (connect, send, accept, parse) and the headers' way out
    app_s: float = float("nan")
    #: the client's side of that wait (:mod:`.bench_trace`): start -> the request written out whole (the
    #: wait for a pooled or new connection, and the send), whether it opened a TCP connection of its own,
    #: and that connect (s; 0 on a pooled one)
    sent_s: float = float("nan")
    new_connection: bool = False
    connect_s: float = float("nan")


def server_timing(header: str, name: str) -> float:
    """The ``dur`` (ms -> s) of metric ``name`` in a W3C ``Server-Timing`` header, or nan."""
    for metric in header.split(","):
        parts = [p.strip() for p in metric.split(";")]
        if parts[0] != name:
            continue
        for param in parts[1:]:
            key, _, value = param.partition("=")
            if key.strip() == "dur":
                try:
                    return float(value.strip().strip('"')) / 1000
                except ValueError:
                    return float("nan")
    return float("nan")


@dataclass
class Level:
    """One concurrency level: frames/s is the median over ``repeats`` runs (``runs_frames_per_s``);
    latencies are percentiles over every request of every run. ``frames_per_s_spread`` is the runs'
    (max - min) / median, what :func:`ttsfleet.inference.bench_engine.regressions` derives its
    tolerance from. Real-time factor per request = its wall time / the audio it got (< 1: faster than
    real time)."""

    concurrency: int
    requests: int
    errors: int
    wall_s: float
    frames_per_s: float
    per_request_frames_per_s: float
    ttfa_p50_s: float
    ttfa_p99_s: float
    duration_p50_s: float
    statuses: dict[str, int] = field(default_factory=dict)
    rtf_p50: float = float("nan")
    rtf_p99: float = float("nan")
    repeats: int = 1
    runs_frames_per_s: list[float] = field(default_factory=list)
    frames_per_s_spread: float = 0.0
    #: "steady": frames/s, its runs and spread are the steady window's (``bench_window``), latencies
    #: of the requests started in it; "whole-run": every request from the first submit to the last
    #: end (a run without a steady window: one request per client, or open loop).
    method: str = "whole-run"
    whole_run_frames_per_s: float = 0.0  # median of the runs' frames from first submit to last end
    runs_whole_run_frames_per_s: list[float] = field(default_factory=list)
    steady_window_s: float = 0.0
    steady_requests: int = 0
    first_wave_ttfa_p50_s: float = float("nan")
    first_wave_ttfa_p99_s: float = float("nan")
    #: The timed requests' underruns (pcm only, :mod:`.bench_playback`): the share with one or more,
    #: and the p99 over requests of their summed silence.
    stalled_share: float = float("nan")
    stall_p99_s: float = float("nan")
    #: The median over the requests that stalled of the audio seconds played before their first gap.
    first_stall_at_p50_s: float = float("nan")
    #: The timed requests' submit -> response headers (p50 / p99, s): what of the client's first audio
    #: lies before the server's handler (its accept, parse and body read; the stream's own wait).
    headers_p50_s: float = float("nan")
    headers_p99_s: float = float("nan")
    #: Of that wait, the time outside the server's app (``headers_s - app_s`` per request, p50 / p99, s):
    #: the request's way in before the app received it and the headers' way out.
    outside_p50_s: float = float("nan")
    outside_p99_s: float = float("nan")
    #: Of the time outside the app, the client's own part: start -> the request written (p50 / p99, s),
    #: and the timed requests that opened a TCP connection of their own, with the longest such connect.
    sent_p50_s: float = float("nan")
    sent_p99_s: float = float("nan")
    new_connections: int = 0
    connect_max_s: float = float("nan")
    #: The timed requests with the longest waits for the headers, each with where its wait went
    #: (:func:`slowest_headers`): a tail of a few requests is read request by request.
    slowest_headers: list[dict[str, Any]] = field(default_factory=list)
    #: This client's own event-loop lag over the level's runs (:mod:`.loop_lag`: p50 / p99 / max ms,
    #: ticks): a client reading its streams late would count its delay as the server's first audio.
    client_loop_lag: dict[str, float] = field(default_factory=dict)
    #: This client's own garbage collections over the level's runs (:mod:`.gc_pauses`: per generation
    #: ``gen0`` / ``gen1`` / ``gen2`` the count, summed, p50, p99 and longest pause in ms; ``frozen``: the
    #: objects its heap froze before the level): each stops the client's loop, its reads with it.
    client_gc: dict[str, Any] = field(default_factory=dict)


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


async def _one(client: Any, cfg: BenchConfig, i: int, worker: int = 0, wave: int = 0,
               edges: EdgeReads | None = None) -> Sample:
    """Request ``i`` as ``worker``'s ``wave``-th; a first-wave one tells ``edges`` of its first audio
    as it comes (or of its end, when none came), where the steady window may open."""
    hook = (lambda: edges.first_audio(i)) if edges is not None and wave == 0 else None
    s = await _request(client, cfg, i, hook)
    if hook is not None:
        hook()
    s.client, s.wave = worker, wave
    return s


async def _request(client: Any, cfg: BenchConfig, i: int,
                   on_first_audio: Callable[[], None] | None = None) -> Sample:
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    body = {"text": cfg.text, "format": cfg.fmt, "streaming": True, "max_new_tokens": cfg.frames_of(i),
            "seed": cfg.seed + i, "latency": "low"}
    trace = RequestTrace()
    t0 = time.perf_counter()
    first = None
    nbytes = 0
    play = Playback()
    try:
        async with client.stream("POST", f"{cfg.url}/v1/tts", json=body, headers=headers,
                                 extensions={"trace": trace}) as resp:
            if resp.status_code != 200:
                await resp.aread()
                return Sample(False, resp.status_code, 0.0, time.perf_counter() - t0, 0.0, start_s=t0)
            headers_s = time.perf_counter() - t0
            app = server_timing(resp.headers.get("server-timing", ""), "app")
            fps = float(resp.headers.get("x-frames-per-second", "0") or 0)
            rate = int(resp.headers.get("x-sample-rate", "44100"))
            async for chunk in resp.aiter_bytes():
                if chunk and first is None:
                    first = time.perf_counter()
                    if on_first_audio is not None:
                        on_first_audio()
                nbytes += len(chunk)
                if cfg.fmt == "pcm":
                    play.feed(time.perf_counter(), len(chunk) / 2 / rate)
    except Exception:  # refused connection, a transfer the server aborted, a timeout
        return Sample(False, 0, 0.0, time.perf_counter() - t0, 0.0, start_s=t0)
    end = time.perf_counter()
    if nbytes == 0:  # a 200 that carried no audio is no success (2026-12-04: every request of a
        return Sample(False, EMPTY_REPLY, 0.0, end - t0, 0.0, start_s=t0)  # run was, and read 0 errors)
    seconds = (nbytes / 2 / rate) if cfg.fmt == "pcm" else 0.0
    return Sample(True, 200, (first or end) - t0, end - t0, seconds * fps, seconds, start_s=t0,
                  stalls=play.stalls, stall_s=play.stall_s, first_stall_at_s=play.first_stall_at_s,
                  headers_s=headers_s, app_s=app, sent_s=trace.sent_s(t0),
                  new_connection=trace.new_connection, connect_s=trace.connect_s())


async def _run_level(cfg: BenchConfig, c: int, n: int, edges: EdgeReads | None = None,
                     lag: LoopLag | None = None) -> tuple[list[Sample], float]:
    """``c`` clients sending ``n`` requests in all, each its next once the last one ended; ``edges``
    hears of the first wave's first audios and of the first client leaving; ``lag`` times this
    client's own event loop meanwhile."""
    samples: list[Sample] = []
    counter = iter(range(n))
    if lag is not None:
        lag.start()
    async with ListenerClients(cfg.connections, cfg.timeout_s, limit=c + 4) as clients:
        own = [clients.take() for _ in range(c)]  # made before the clock starts

        async def worker(k: int) -> None:
            sent = 0
            for wave, i in enumerate(counter):  # the level's shared counter: each worker's draws
                samples.append(await _one(own[k], cfg, i, k, wave, edges))
                sent += 1
            if sent and edges is not None:
                edges.client_left()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(c)))
        wall = time.perf_counter() - t0
    if lag is not None:
        await lag.stop()
    return samples, wall


async def _run_read(cfg: BenchConfig, c: int, n: int,
                    lag: LoopLag | None = None) -> tuple[list[Sample], float, tuple[Read, Read] | None]:
    """One run of a level with /metrics read live at its steady window's edges
    (:class:`.bench_steady.EdgeReads`): its samples, wall time and the pair of reads (or None)."""
    from .bench_steady import EdgeReads

    edges = EdgeReads(cfg.url, min(c, n))
    samples, wall = await _run_level(cfg, c, n, edges, lag)
    return samples, wall, await edges.collect()


def _level(cfg: BenchConfig, c: int, n: int) -> tuple[Level, SteadyReading | None]:
    """A level's ``repeats`` runs: its report (with this client's event-loop lag and garbage collections
    over all of them), and the server's figures over their steady windows. The client's heap (torch,
    httpx, the earlier levels' samples) is frozen while the level runs, so its own full collections do
    not walk it, and thawed after (a caller that goes on, a test session, keeps no frozen garbage)."""
    import gc

    from .bench_steady import steady_reading
    from .gc_pauses import GcPauses, freeze_heap, pause_summary
    from .loop_lag import LoopLag, lag_summary

    lag, collections = LoopLag(), GcPauses()
    frozen, _ = freeze_heap()
    collections.start()
    try:
        runs = [asyncio.run(_run_read(cfg, c, n, lag)) for _ in range(max(cfg.repeats, 1))]
    finally:
        collections.stop()
        gc.unfreeze()
    level = summarize_runs(c, n, [(samples, wall, None) for samples, wall, _ in runs])
    level.client_loop_lag = lag_summary(lag.lags_s)
    level.client_gc = {**pause_summary(collections.pauses), "frozen": frozen}
    return level, steady_reading([(samples, reads) for samples, _, reads in runs])


def arrivals(rate: float, n: int, seed: int) -> list[float]:
    """Seconds after the start at which the ``n`` requests of a Poisson process of ``rate``/s arrive."""
    import random

    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


async def _run_open(cfg: BenchConfig, rate: float, n: int) -> tuple[list[Sample], float]:
    """``n`` requests sent at Poisson arrival times (each its own listener: a client and connection of
    its own, reused once free), whatever is in flight."""
    async with ListenerClients(cfg.connections, cfg.timeout_s) as clients:
        async def listener(i: int) -> Sample:
            client = clients.take()
            try:
                return await _one(client, cfg, i, worker=i)
            finally:
                clients.give(client)

        t0 = time.perf_counter()
        tasks = []
        for i, at in enumerate(arrivals(rate, n, cfg.seed)):
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            tasks.append(asyncio.create_task(listener(i)))
        samples = list(await asyncio.gather(*tasks))
        wall = time.perf_counter() - t0
    return samples, wall


def open_level(cfg: BenchConfig, rate: float) -> dict[str, Any]:
    """One open-loop level: offered vs carried load, latencies, and the mean number in flight."""
    n = max(1, int(round(rate * cfg.open_duration_s)))
    samples, wall = asyncio.run(_run_open(cfg, rate, n))
    lv = summarize_runs(0, n, [(samples, wall, None)], closed=False)
    in_flight = sum(s.duration_s for s in samples) / wall if wall > 0 else 0.0
    return {"arrival_rate_per_s": rate, "in_flight_mean": round(in_flight, 2), **asdict(lv)}


def summarize_level(c: int, n: int, samples: list[Sample], wall: float, frames: float | None = None) -> Level:
    """One run's report from its samples; ``frames`` defaults to the successful samples' frames."""
    return summarize_runs(c, n, [(samples, wall, frames)])


def summarize_runs(c: int, n: int, runs: list[tuple[list[Sample], float, float | None]],
                   closed: bool = True) -> Level:
    """A level's report from ``repeats`` runs ``(samples, wall, frames or None)`` of ``n`` requests each.

    Where every run of a closed loop has a steady window (:mod:`.bench_window`), frames/s, its
    spread and the latencies are the steady state's; the whole run's frames/s and the first wave's
    first audio are kept beside them."""
    from .bench_window import frames_in, started_in, steady_window

    whole = []
    for samples, wall, frames in runs:
        got = sum(s.frames for s in samples if s.ok) if frames is None else frames
        whole.append(got / wall if wall > 0 else 0.0)
    windows = [steady_window(samples) if closed else None for samples, _, _ in runs]
    steady = all(w is not None and w.seconds > 0 for w in windows)
    fps = ([frames_in(samples, w) / w.seconds for (samples, _, _), w in zip(runs, windows, strict=True)]
           if steady else whole)
    every = [s for samples, _, _ in runs for s in samples]
    ok = [s for s in every if s.ok]
    timed = ([s for (samples, _, _), w in zip(runs, windows, strict=True) for s in started_in(samples, w)]
             if steady else ok) or ok
    statuses: dict[str, int] = {}
    for s in every:
        statuses[str(s.status)] = statuses.get(str(s.status), 0) + 1
    med = float(np.median(fps))
    rtf = [s.duration_s / s.audio_s for s in timed if s.audio_s > 0]
    wave0 = [s.ttfa_s for s in ok if s.wave == 0]
    return Level(
        concurrency=c, requests=n, errors=len(every) - len(ok),
        wall_s=float(np.median([w for _, w, _ in runs])),
        frames_per_s=med,
        per_request_frames_per_s=float(np.mean([s.frames / s.duration_s for s in ok if s.duration_s > 0]))
        if ok else 0.0,
        ttfa_p50_s=_pct([s.ttfa_s for s in timed], 50), ttfa_p99_s=_pct([s.ttfa_s for s in timed], 99),
        duration_p50_s=_pct([s.duration_s for s in timed], 50), statuses=statuses,
        rtf_p50=_pct(rtf, 50), rtf_p99=_pct(rtf, 99), repeats=len(runs),
        runs_frames_per_s=[round(f, 3) for f in fps],
        frames_per_s_spread=(max(fps) - min(fps)) / med if med > 0 else 0.0,
        method="steady" if steady else "whole-run",
        whole_run_frames_per_s=float(np.median(whole)),
        runs_whole_run_frames_per_s=[round(f, 3) for f in whole],
        steady_window_s=float(np.median([w.seconds for w in windows])) if steady else 0.0,
        steady_requests=len(timed) if steady else 0,
        first_wave_ttfa_p50_s=_pct(wave0, 50), first_wave_ttfa_p99_s=_pct(wave0, 99),
        **_headers(timed), **_underruns(timed))


def _headers(timed: list[Sample]) -> dict[str, float]:
    """The :class:`Level` fields of the timed requests' wait for the response headers."""
    waits = [s.headers_s for s in timed if s.ok and not math.isnan(s.headers_s)]
    outside = [s.headers_s - s.app_s for s in timed if s.ok and not math.isnan(s.headers_s - s.app_s)]
    sent = [s.sent_s for s in timed if s.ok and not math.isnan(s.sent_s)]
    connects = [s.connect_s for s in timed if s.ok and s.new_connection]
    completed = [x for x in connects if not math.isnan(x)]
    return {"headers_p50_s": _pct(waits, 50), "headers_p99_s": _pct(waits, 99),
            "outside_p50_s": _pct(outside, 50), "outside_p99_s": _pct(outside, 99),
            "sent_p50_s": _pct(sent, 50), "sent_p99_s": _pct(sent, 99), "new_connections": len(connects),
            "connect_max_s": max(completed, default=math.nan), "slowest_headers": slowest_headers(timed)}


def slowest_headers(timed: list[Sample], count: int = 8) -> list[dict[str, Any]]:
    """The ``count`` timed requests that waited longest for the headers: when each started (s after the
    first timed one), its client and wave, and its wait split (ms): the client's own until written, the
    app's, the rest outside the app, its new connection's connect (or none) and its first audio."""
    waited = sorted((s for s in timed if s.ok and not math.isnan(s.headers_s)), key=lambda s: -s.headers_s)
    t0 = min((s.start_s for s in timed), default=0.0)

    def ms(x: float) -> float | None:
        return None if math.isnan(x) else round(x * 1000, 1)

    return [{"at_s": round(s.start_s - t0, 3), "client": s.client, "wave": s.wave,
             "headers_ms": ms(s.headers_s), "sent_ms": ms(s.sent_s), "app_ms": ms(s.app_s),
             "outside_ms": ms(s.headers_s - s.app_s),
             "connect_ms": ms(s.connect_s) if s.new_connection else None, "ttfa_ms": ms(s.ttfa_s)}
            for s in waited[:count]]


def _underruns(timed: list[Sample]) -> dict[str, float]:
    """The :class:`Level` fields of the timed requests' underruns (NaN without pcm audio to play)."""
    played = [s for s in timed if s.audio_s > 0]
    share, p99 = underrun_tail((s.stalls, s.stall_s) for s in played)
    return {"stalled_share": share, "stall_p99_s": p99,
            "first_stall_at_p50_s": first_stall_p50(s.first_stall_at_s for s in played)}


#: The serving SLO a level must meet to count towards a replica's capacity (issue #25's definition):
#: real-time factor p99 and time to first audio p99.
SLO_RTF_P99 = 0.5
SLO_TTFA_P99_S = 0.25


def points(levels: list[Level]) -> list[dict[str, Any]]:
    """The report's ``points`` (what ``GpuCatalog.with_measured_file`` reads; the gate compares them)."""
    return [{"concurrency": lv.concurrency, "frames_per_s": round(lv.frames_per_s, 3),
             "ttfa_s": round(lv.ttfa_p50_s, 5), "ttfa_p99_s": round(lv.ttfa_p99_s, 5),
             "rtf_p99": round(lv.rtf_p99, 4), "method": lv.method}
            for lv in levels if lv.frames_per_s > 0 and lv.ttfa_p50_s > 0]


def capacity(levels: list[Level], rtf_p99: float = SLO_RTF_P99,
             ttfa_p99_s: float = SLO_TTFA_P99_S) -> dict[str, Any]:
    """The largest measured concurrency whose RTF p99 and first-audio p99 meet the SLO (0: none does).

    A level with errors never counts: a replica that refuses work has not carried it."""
    ok = [lv.concurrency for lv in levels
          if not lv.errors and lv.rtf_p99 <= rtf_p99 and lv.ttfa_p99_s <= ttfa_p99_s]
    return {"concurrency": max(ok, default=0), "rtf_p99_max": rtf_p99, "ttfa_p99_max_s": ttfa_p99_s,
            "levels_meeting_slo": sorted(ok)}


def machine() -> dict[str, Any]:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "load_average_1m": round(os.getloadavg()[0], 2)}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return info


StageTotals = dict[str, tuple[float, float]]  # {stage: (seconds summed, requests)}


def readings_of(samples: list[Any]) -> tuple[StageTotals, dict[str, float]]:
    """In one read of the server's /metrics (:func:`server_samples`): its
    ``inference_ttfa_stage_seconds`` totals, ``{stage: (sum_s, count)}``, and its
    ``inference_admission_waits`` counts, ``{reason: iterations}`` (what held waiting requests back:
    the "queue" stage's why). Each {} when the server has none or cannot be read (an older server,
    or another implementation)."""
    return _stage_totals(samples), _admission_counts(samples)


def _stage_totals(samples: list[Any]) -> StageTotals:
    from ttsfleet.metrics import spec

    base = spec("inference_ttfa_stage_seconds").name
    out: dict[str, list[float]] = {}
    for smp in samples:
        if smp.name in (base + "_sum", base + "_count"):
            pair = out.setdefault(smp.labels.get("stage", "?"), [0.0, 0.0])
            pair[0 if smp.name.endswith("_sum") else 1] += smp.value
    return {k: (v[0], v[1]) for k, v in out.items()}


def _admission_counts(samples: list[Any]) -> dict[str, float]:
    from ttsfleet.metrics import spec

    name = spec("inference_admission_waits").exposed_names[0]
    out: dict[str, float] = {}
    for smp in samples:
        if smp.name == name:
            reason = smp.labels.get("reason", "?")
            out[reason] = out.get(reason, 0.0) + smp.value
    return out


def server_samples(url: str) -> list[Any]:
    """Every sample of the server's /metrics ([] when it cannot be read)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(f"{url}/metrics", timeout=10).text
    except httpx.HTTPError:
        return []
    return [smp for fam in text_string_to_metric_families(text) for smp in fam.samples]


#: The server's codec counters (:mod:`ttsfleet.metrics`) by the key :func:`codec_totals` gives each.
CODEC_SERIES = {"pushes": "inference_codec_pushes", "frames": "inference_codec_frames",
                "busy_s": "inference_codec_busy_seconds", "rounds": "inference_codec_rounds"}


def codec_totals(samples: list[Any]) -> dict[str, float]:
    """The server's codec counters in its /metrics ``samples``: ``{pushes, frames, busy_s}`` ({} from
    a server that does not export them: an older one, or another implementation)."""
    from ttsfleet.metrics import spec

    keys = {spec(name).exposed_names[0]: key for key, name in CODEC_SERIES.items()}
    out: dict[str, float] = {}
    for smp in samples:
        if smp.name in keys:
            out[keys[smp.name]] = out.get(keys[smp.name], 0.0) + smp.value
    return out


def codec_use(grown: dict[str, float], wall_s: float) -> dict[str, float]:
    """The codec's work over a span of ``wall_s``, from how much its :func:`codec_totals` grew in it
    (:meth:`.bench_steady.Counts.between`; a server's totals alone: since it started): its pushes,
    mean frames per push (small pushes cost the GPU most per frame) and busy share (its busy seconds
    per wall second: its load). {} when the server has no codec counters or the codec pushed nothing."""
    pushes = grown.get("pushes", 0.0)
    if pushes <= 0 or wall_s <= 0:
        return {}
    use = {"pushes": int(pushes), "frames_per_push": round(grown.get("frames", 0.0) / pushes, 2),
           "busy_share": round(grown.get("busy_s", 0.0) / wall_s, 4)}
    rounds = grown.get("rounds", 0.0)
    if rounds > 0:  # a server from before the rounds counter has none
        use |= {"rounds": int(rounds), "frames_per_round": round(grown.get("frames", 0.0) / rounds, 2)}
    return use


def codec_line(use: dict[str, Any], span: str = "the level's wall time") -> str:
    """One level's :func:`codec_use` (with its ``concurrency``) as the line the table is followed by."""
    rounds = (f" in {use['rounds']:,} rounds ({use['frames_per_round']:.1f} frames a round)"
              if "rounds" in use else "")
    return (f"c={use['concurrency']} codec: {use['pushes']:,} pushes, {use['frames_per_push']:.1f} frames "
            f"per push{rounds}, busy {use['busy_share']:.0%} of {span}")


def stage_means_ms(grown: StageTotals) -> dict[str, float]:
    """Mean ms per stage of the requests observed in a span, from how much the stage totals of
    :func:`readings_of` grew in it (:meth:`.bench_steady.Counts.between`; a server's totals alone:
    since it started)."""
    return {stage: round(1000 * s / n, 1) for stage, (s, n) in grown.items() if n > 0}


@dataclass
class LevelReading:
    """A level and what the server's /metrics said about it: over the whole level (read before it
    and after it, first wave included) and over its steady window (read live at the window's edges,
    :mod:`.bench_steady`; None where the level has none)."""

    level: Level
    whole: ServerView
    steady: SteadyReading | None


def _level_with_stages(cfg: BenchConfig, c: int) -> LevelReading:
    """A level with the server's stage means and p99s, admission waits by reason and codec work
    (:func:`codec_use`) over the whole level and over its steady window."""
    from .bench_steady import Counts, view_of

    before = server_samples(cfg.url)
    t0 = time.perf_counter()
    lv, steady = _level(cfg, c, cfg.requests_at(c))
    wall = time.perf_counter() - t0
    after = server_samples(cfg.url)
    return LevelReading(level=lv, whole=view_of(Counts.between(before, after, wall)), steady=steady)


def server_report(measured: list[LevelReading]) -> dict[str, Any]:
    """The report's server-side keys: per level, the whole level's figures under the keys older
    reports have (``ttfa_stages_ms`` ...), the steady window's beside them (``..._steady...``), and
    ``steady_reads``: whether the level had one, its span, its requests and how late the reads were."""
    out: dict[str, Any] = {}
    for key, part in (("ttfa_stages{}_ms", "stage_means_ms"), ("ttfa_stages{}_p99_ms", "stage_p99_ms"),
                      ("admission_waits{}", "waits"), ("codec{}", "codec"), ("engine{}", "engine")):
        out[key.format("")] = [{"concurrency": m.level.concurrency, **getattr(m.whole, part)}
                               for m in measured if getattr(m.whole, part)]
        out[key.format("_steady")] = [{"concurrency": m.level.concurrency, **getattr(m.steady.view, part)}
                                      for m in measured if m.steady and getattr(m.steady.view, part)]
    out["steady_reads"] = [_steady_read(m) for m in measured]
    return out


def _steady_read(m: LevelReading) -> dict[str, Any]:
    """One level's ``steady_reads`` entry (``read`` False: no steady window, whole-level figures only)."""
    entry: dict[str, Any] = {"concurrency": m.level.concurrency, "read": m.steady is not None,
                             "level_requests": m.whole.requests}
    if m.steady is not None:
        entry.update(seconds=m.steady.view.seconds, requests=m.steady.view.requests,
                     start_lag_ms=m.steady.start_lag_ms, end_lag_ms=m.steady.end_lag_ms)
    return entry


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """Run every level in turn against ``cfg.url``; returns the report as a dict."""
    import httpx

    try:
        ready = httpx.get(f"{cfg.url}/readyz", timeout=10)
    except httpx.HTTPError as exc:
        from ttsfleet.errors import UserError

        raise UserError(f"cannot reach {cfg.url}: {exc}") from None
    from ttsfleet.metrics import spec

    build: dict[str, str] = {}
    build_series = spec("inference_build").exposed_names[0] + "{"
    try:
        for line in httpx.get(f"{cfg.url}/metrics", timeout=10).text.splitlines():
            if line.startswith(build_series):
                inner = line[line.index("{") + 1:line.rindex("}")]
                build = dict(kv.split("=", 1) for kv in inner.split('",') if "=" in kv)
                build = {k: v.strip('"') for k, v in build.items()}
    except httpx.HTTPError:
        pass
    asyncio.run(_run_level(cfg, 1, 1))  # one unmeasured request: connections, server-side first calls
    measured = [_level_with_stages(cfg, c) for c in cfg.levels]
    levels = [m.level for m in measured]
    base = levels[0].frames_per_s if levels else 0.0
    report = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "server": {"url": cfg.url, "ready_at_start": ready.status_code == 200, "build": build},
        "config": {k: v for k, v in asdict(cfg).items() if k != "api_key"},
        "levels": [asdict(lv) for lv in levels],
        # the server's own split of time to first audio per level: stage means and p99s (from its
        # histogram buckets), admission waits by cause, the codec's pushes, frames per push and busy
        # share; the engine loop's steps a second and each step's interval by phase; over the whole
        # level (first wave included) and over its steady window
        **server_report(measured),
        "open_loop": [open_level(cfg, r) for r in cfg.rates],
        "scaling": (levels[-1].frames_per_s / base) if base > 0 else None,
        "points": points(levels),
        "capacity": capacity(levels),
        "source": f"ttsfleet bench serve {cfg.url}" + (
            f" (model {build['model']}, {build.get('quantization', '?')} on {build.get('device', '?')})"
            if build.get("model") else ""),
    }
    return report


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=report["source"])
    for col in ("c", "requests", "errors", "method", "frames/s", "spread", "per-req frames/s", "TTFA p50 ms",
                "TTFA p99 ms", "1st wave TTFA p50", "RTF p50", "RTF p99"):
        t.add_column(col, justify="right")
    for lv in report["levels"]:
        t.add_row(str(lv["concurrency"]), f"{lv['requests']}x{lv.get('repeats', 1)}", str(lv["errors"]),
                  lv.get("method", "whole-run"), f"{lv['frames_per_s']:.1f}",
                  f"{lv.get('frames_per_s_spread', 0.0):.1%}", f"{lv['per_request_frames_per_s']:.1f}",
                  f"{lv['ttfa_p50_s'] * 1000:.0f}", f"{lv['ttfa_p99_s'] * 1000:.0f}",
                  f"{lv.get('first_wave_ttfa_p50_s', float('nan')) * 1000:.0f}",
                  f"{lv.get('rtf_p50', float('nan')):.3f}", f"{lv.get('rtf_p99', float('nan')):.3f}")
    console = Console(width=max(Console().width, 150))  # the table's columns, even in a pipe
    console.print(t)
    if report.get("open_loop"):
        o = Table(title="open loop (Poisson arrivals)")
        for col in ("rate/s", "requests", "errors", "in flight", "frames/s", "TTFA p50 ms", "TTFA p99 ms",
                    "RTF p99"):
            o.add_column(col, justify="right")
        for lv in report["open_loop"]:
            o.add_row(f"{lv['arrival_rate_per_s']:g}", str(lv["requests"]), str(lv["errors"]),
                      f"{lv['in_flight_mean']:.1f}", f"{lv['frames_per_s']:.1f}",
                      f"{lv['ttfa_p50_s'] * 1000:.0f}", f"{lv['ttfa_p99_s'] * 1000:.0f}",
                      f"{lv['rtf_p99']:.3f}")
        console.print(o)
    for line in server_lines(report):
        console.print(line, highlight=False, soft_wrap=True)
    if report["scaling"] is not None:
        lv = report["levels"]
        console.print(f"scaling c={lv[0]['concurrency']}→{lv[-1]['concurrency']}: {report['scaling']:.2f}x")
    if report.get("capacity"):
        cap = report["capacity"]
        console.print(f"capacity (RTF p99 <= {cap['rtf_p99_max']}, first audio p99 <= "
                      f"{cap['ttfa_p99_max_s'] * 1000:.0f} ms): c={cap['concurrency']}")


STEADY, WHOLE = "steady window", "whole level, first wave included"
#: The server-side lines under the table: (report key, what its figures are, the span they cover).
SERVER_LINES = (
    ("ttfa_stages_steady_ms", "server time to first audio by stage, mean ms", STEADY),
    ("ttfa_stages_steady_p99_ms", "server time to first audio by stage, p99 ms (each its own)", STEADY),
    ("admission_waits_steady", "engine iterations that left requests waiting, by cause", STEADY),
    ("ttfa_stages_ms", "server time to first audio by stage, mean ms", WHOLE),
    ("ttfa_stages_p99_ms", "server time to first audio by stage, p99 ms (each its own)", WHOLE),
    ("admission_waits", "engine iterations that left requests waiting, by cause", WHOLE),
)


def server_lines(report: dict[str, Any]) -> list[str]:
    """The lines under the table: per level, the steady window's server figures first (what the
    steady first-audio p99 is made of), then the whole level's, each labelled with its span."""
    lines: list[tuple[int, int, str]] = []
    for order, (key, what, span) in enumerate(SERVER_LINES):
        for st in report.get(key, []):
            values = ", ".join(f"{k} {v:.0f}" for k, v in st.items() if k != "concurrency")
            lines.append((st["concurrency"], order, f"c={st['concurrency']} {what}, {span}: {values}"))
    for order, (key, span) in enumerate((("codec_steady", "the steady window"), ("codec", "the level's "
                                                                                 "wall time"))):
        lines += [(use["concurrency"], 10 + order, codec_line(use, span)) for use in report.get(key, [])]
    for order, (key, span) in enumerate((("engine_steady", STEADY), ("engine", WHOLE))):
        lines += [(use["concurrency"], 12 + order, engine_line(use, span)) for use in report.get(key, [])]
    lines += [(r["concurrency"], -1, _steady_read_line(r)) for r in report.get("steady_reads", [])]
    lines += [(lv["concurrency"], 20, _underrun_line(lv)) for lv in report.get("levels", [])
              if not math.isnan(lv.get("stalled_share", math.nan))]
    lines += [(lv["concurrency"], 21, _client_lag_line(lv)) for lv in report.get("levels", [])
              if lv.get("client_loop_lag", {}).get("ticks")]
    lines += [(lv["concurrency"], 22, _headers_line(lv)) for lv in report.get("levels", [])
              if not math.isnan(lv.get("headers_p99_s", math.nan))]
    return [text for _, _, text in sorted(lines, key=lambda x: (x[0], x[1]))]


def _underrun_line(lv: dict[str, Any]) -> str:
    line = (f"c={lv['concurrency']} listener underruns (pcm played from its first byte, timed requests): "
            f"{lv['stalled_share']:.1%} of requests, summed silence p99 {lv['stall_p99_s'] * 1000:.0f} ms")
    first = lv.get("first_stall_at_p50_s", math.nan)  # absent in reports written before 2026-12-06
    return line if math.isnan(first) else f"{line}, the first after {first * 1000:.0f} ms of audio (p50)"


def _client_lag_line(lv: dict[str, Any]) -> str:
    lag = lv["client_loop_lag"]
    return (f"c={lv['concurrency']} the bench client's own event loop, late by p50 {lag['p50_ms']:.1f} / "
            f"p99 {lag['p99_ms']:.1f} / max {lag['max_ms']:.0f} ms ({lag['ticks']} ticks): its reads of "
            f"first audio are that much late" + _client_gc_words(lv.get("client_gc") or {}))


def _headers_line(lv: dict[str, Any]) -> str:
    """Where the client's first audio waits: before the response headers or after them, and of the wait
    before them how much lay outside the server's app (before it received the request, or the headers'
    way back), where the server said its own part (``Server-Timing``)."""
    line = (f"c={lv['concurrency']} the client's wait for the response headers, timed requests: p50 "
            f"{lv['headers_p50_s'] * 1000:.0f} / p99 {lv['headers_p99_s'] * 1000:.0f} ms of its first audio "
            f"p50 {lv['ttfa_p50_s'] * 1000:.0f} / p99 {lv['ttfa_p99_s'] * 1000:.0f} ms")
    outside = lv.get("outside_p99_s", math.nan)
    if math.isnan(outside):
        return line + " (the server's first audio starts where its app receives the request)"
    line += (f"; outside the server's app p50 {lv['outside_p50_s'] * 1000:.0f} / p99 "
             f"{outside * 1000:.0f} ms (its way in before the app received it, the headers' way out)")
    sent = lv.get("sent_p99_s", math.nan)
    if math.isnan(sent):
        return line
    connect = lv.get("connect_max_s", math.nan)
    longest = "" if math.isnan(connect) else f", the longest connect {connect * 1000:.0f} ms"
    return (line + f"; of it the client's own, until the request was written: p50 "
            f"{lv['sent_p50_s'] * 1000:.0f} / p99 {sent * 1000:.0f} ms ({lv['new_connections']} new "
            f"connections{longest})")


def _client_gc_words(pauses: dict[str, Any]) -> str:
    """The client's own garbage collections (absent from reports written before 2026-12-07): the full
    ones apart, whose pause every stream's read waits out."""
    if "gen2" not in pauses:
        return ""
    full, young = pauses["gen2"], [pauses[g] for g in ("gen0", "gen1")]
    young_ms = sum(y["total_ms"] for y in young)
    return (f"; its garbage collections paused it {full['count']}x full"
            + (f" (max {full['max_ms']:.0f} ms, {full['total_ms']:.0f} ms in all)" if full["count"] else "")
            + f", {sum(y['count'] for y in young)}x young ({young_ms:.0f} ms in all), "
            f"{pauses.get('frozen', 0):,} objects frozen")


def _steady_read_line(r: dict[str, Any]) -> str:
    """Where a level's steady window was read, or that it had none."""
    if not r["read"]:
        return (f"c={r['concurrency']} no steady window (too few requests per client, or its edges "
                f"not read): the server's figures below are the whole level's only")
    return (f"c={r['concurrency']} steady window read live: {r['seconds']:.2f} s, {r['requests']} of the "
            f"level's {r['level_requests']} first audios, reads {r['start_lag_ms']:.1f}/"
            f"{r['end_lag_ms']:.1f} ms after its edges")


def write_outputs(report: dict[str, Any], out: Path) -> list[Path]:
    """Write ``bench.json`` and ``bench.png`` (frames/s and TTFA against concurrency) into ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    jpath, ppath = out / "bench.json", out / "bench.png"
    jpath.write_text(json.dumps(report, indent=2) + "\n")
    lv = report["levels"]
    cs = [x["concurrency"] for x in lv]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    panels = (
        ("throughput", "frames/s", (("aggregate", "frames_per_s", 1), ("per request",
                                                                       "per_request_frames_per_s", 1))),
        ("time to first audio", "time to first audio (ms)", (("p50", "ttfa_p50_s", 1000),
                                                             ("p99", "ttfa_p99_s", 1000))),
    )
    for ax, (title, ylabel, lines) in zip(axes, panels, strict=True):
        for (label, key, scale), style in zip(lines, ("o-", "s--"), strict=True):
            ax.plot(cs, [x[key] * scale for x in lv], style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(cs, [str(c) for c in cs])
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.legend()
        ax.set_title(title)
    where = report.get("device") or report["machine"].get("cpu_model", report["machine"]["processor"])
    fig.suptitle(f"{report['source']} — {report['date']} — {where}", fontsize=8)
    fig.tight_layout()
    fig.savefig(ppath, dpi=100)
    plt.close(fig)
    return [jpath, ppath]
