"""The traffic fluid of one inference pool, one second at a time.

Arrivals join a bounded queue (beyond it: 429), are admitted into free decode slots
(``max_running_requests`` per ready replica) and complete at the per-request frame rate the
class's capacity curve gives for the current concurrency. Each second yields the time to first
audio of its requests as a range: the curve's value at that concurrency plus the queueing delay
seen by the first and by the last arrival of the second (FIFO, drained at the completion rate),
so percentiles include the queueing spread within a second.

GPU busy (what NVML reports) of a replica is the curve's measured busy fraction at its
concurrency, averaged over the Poisson spread of requests in flight around the fluid's mean: a
replica that averages one request in flight is empty ~37% of the time.

Co-location: ``colocated`` serving replicas share their GPU with a running fill co-tenant. In a
second whose per-replica concurrency is at most the policy's limit (``co_max_k``, in lookup
steps) the co-tenant runs: those replicas keep ``co_throughput`` of their frames/s, take that
share of the arrivals, and their requests see the curve's time to first audio times
``co_latency`` (plus the pool's queueing), kept apart (:attr:`PoolTraffic.co_last`); the
co-tenant fills the GPU time the replica leaves idle (``co_idle_s`` adds ``1 - busy`` per
co-tenant). Above the limit the co-tenants yield — in the same second, or after ``co_yield_s``
seconds above it — and neither slow the replica nor work (``co_paused_s``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ttsfleet.catalog import CapacityCurve

LUT_STEPS = 4  # concurrency lookup table resolution: 1/4 request

#: GPU busy of a replica decoding k >= 1 requests, where its capacity curve carries no measured
#: busy figure (the write-up's seed curves). From our engine on the H200
#: (benchmarks/inference_h200/baseline.json, 2026-11-30, codes-only): GPU time per second of
#: serving = CUDA-graph decode steps (step time x steps/s) + 512-token prefills (25.5 ms x
#: requests/s) is 0.98, 0.96, 0.95, 0.93, 0.91, 0.93, 0.92 of the wall time at c = 1 ... 64; the
#: rest is host time between launches. An autoregressive decode loop is never "idle with one
#: request"; the median, 0.93, is used.
UNMEASURED_DECODE_BUSY = 0.93

#: Time to first audio counted for a request that arrives while its pool has no ready replica.
NO_REPLICA_TTFA_S = 60.0


def _poisson_mean(mean: float, f) -> float:  # noqa: ANN001 - f: int -> float
    """E[f(K)] for K ~ Poisson(mean), f(0) = 0."""
    if mean <= 0:
        return 0.0
    hi = int(mean + 12 * math.sqrt(mean) + 30)
    log_m = math.log(mean)
    return sum(math.exp(k * log_m - mean - math.lgamma(k + 1)) * f(k) for k in range(1, hi))


def busy_lut(curve: CapacityCurve, max_running: int) -> list[float]:
    """GPU busy fraction of a replica by mean in-flight requests (index = in_flight * LUT_STEPS)."""
    def closed_loop(k: int) -> float:
        measured = curve.gpu_busy(min(k, max_running))
        return UNMEASURED_DECODE_BUSY if measured is None else measured

    return [_poisson_mean(i / LUT_STEPS, closed_loop) for i in range(max_running * LUT_STEPS + 1)]


@dataclass
class PoolTraffic:
    """One pool's requests: queue, in flight, and what it has produced so far."""

    key: str
    gpu_class: str
    target: float  # the policy's in-flight target per replica
    max_running: int
    queue_cap: int  # waiting beyond free slots, per ready replica (plus one replica's worth)
    fps_lut: list[float]
    ttfa_lut: list[float]
    busy_lut: list[float]
    peak_fps: float
    ready: int = 0
    in_flight: float = 0.0
    in_flight_obs: float = 0.0  # in flight during the last second (before its completions)
    queue: float = 0.0
    # this observation window's TTFA ranges and arrivals (what the pods' histograms hold)
    window: list[tuple[float, float, float]] = field(default_factory=list)
    frames: float = 0.0
    busy_s: float = 0.0  # GPU-busy replica-seconds
    rejected: float = 0.0
    # co-location (set by the fleet; the interference cost by the scenario)
    colocated: int = 0  # serving replicas with a running fill co-tenant on their GPU
    co_max_k: int = -1  # the co-tenants run while in flight per replica <= this / LUT_STEPS
    co_yield_s: int = 0  # seconds above the limit before they yield
    co_throughput: float = 1.0
    co_latency: float = 1.0
    co_idle_s: float = 0.0  # GPU time the replicas left idle beside active co-tenants
    co_active_s: float = 0.0  # co-tenant-seconds running beside a serving replica
    co_paused_s: float = 0.0  # co-tenant-seconds yielded to a busy replica
    co_over: int = 0  # consecutive seconds above the limit
    #: The co-located replicas' share of the last second: (TTFA first, last, arrivals) or None.
    co_last: tuple[float, float, float] | None = None

    @classmethod
    def build(cls, key: str, gpu_class: str, curve: CapacityCurve, target: float,
              max_running: int, queue_cap: int) -> PoolTraffic:
        n = max_running * LUT_STEPS + 1
        fps = [curve.frames_per_s(i / LUT_STEPS) for i in range(n)]
        ttfa = [curve.ttfa_s(max(i / LUT_STEPS, 1.0)) for i in range(n)]
        return cls(key, gpu_class, target, max_running, queue_cap, fps, ttfa,
                   busy_lut(curve, max_running), curve.peak_frames_per_s)

    def per_request_fps(self, concurrency: float) -> float:
        """Frames/s one request gets when ``concurrency`` share a replica."""
        k = min(int(concurrency * LUT_STEPS), len(self.fps_lut) - 1)
        return self.fps_lut[k] / max(concurrency, 1e-9)

    def second(self, arrivals: float, mean_frames: float) -> tuple[float, float]:
        """Advance one second; return the TTFA of the second's first and last arrival."""
        q0 = self.queue
        self.queue += arrivals
        slots = self.ready * self.max_running - self.in_flight
        if slots > 0 and self.queue > 0:
            admitted = self.queue if self.queue < slots else slots
            self.queue -= admitted
            self.in_flight += admitted
        # The server's bounded queue (inference/engine.py: refused only when the requests waiting
        # beyond the free decode slots reach max_queue): what finds a slot is never refused, so
        # the cap applies after admission; beyond it 429 + Retry-After.
        cap = (self.ready + 1) * self.queue_cap
        if self.queue > cap:
            self.rejected += self.queue - cap
            self.queue = cap
        self.in_flight_obs = self.in_flight
        if self.ready == 0 or self.in_flight <= 0:
            if self.colocated:  # an empty replica leaves its GPU to the co-tenant
                self.co_idle_s += self.colocated
                self.co_active_s += self.colocated
                self.co_over = 0
            base = self.ttfa_lut[LUT_STEPS]
            lo = base + (NO_REPLICA_TTFA_S if q0 > 0 else 0.0)
            hi = base + (NO_REPLICA_TTFA_S if self.queue > 0 else 0.0)
            if arrivals > 0:
                self.window.append((lo, hi, arrivals))
            return lo, hi
        k = int(self.in_flight / self.ready * LUT_STEPS)
        if k >= len(self.fps_lut):
            k = len(self.fps_lut) - 1
        co = self.colocated
        if co:
            if k <= self.co_max_k:
                self.co_over = 0
            else:
                self.co_over += 1
                if self.co_over > self.co_yield_s:  # yielded: no interference, no fill work
                    self.co_paused_s += co
                    co = 0
        serving = self.ready - co * (1.0 - self.co_throughput) if co else self.ready
        produced = self.fps_lut[k] * serving
        done = produced / mean_frames
        if done > self.in_flight:
            done = self.in_flight
            produced = done * mean_frames
        self.in_flight -= done
        self.frames += produced
        self.busy_s += self.busy_lut[k] * self.ready
        base = self.ttfa_lut[k]
        # done is 0 only when the pool's in flight per replica rounds to the LUT's 0 (the
        # queue then all went into free slots this second: the first arrival did not queue)
        wait_lo = q0 / done if q0 > 0 and done > 0 else 0.0
        wait_hi = self.queue / done if self.queue > 0 else 0.0
        lo, hi = base + wait_lo, base + wait_hi
        if co:
            return self._colocated_second(arrivals, k, co, serving, lo, hi, wait_lo, wait_hi)
        if arrivals > 0:
            self.window.append((lo, hi, arrivals))
        return lo, hi

    def _colocated_second(self, arrivals: float, k: int, co: int, serving: float, lo: float,
                          hi: float, wait_lo: float, wait_hi: float) -> tuple[float, float]:
        """The second's TTFA split between the plain and the co-located replicas (by the share
        of the arrivals each takes: their decode capacity); returns the plain part's range."""
        self.co_idle_s += (1.0 - self.busy_lut[k]) * co
        self.co_active_s += co
        share = co * self.co_throughput / serving
        slow = self.ttfa_lut[k] * self.co_latency
        co_w = arrivals * share
        self.co_last = (slow + wait_lo, slow + wait_hi, co_w)
        if arrivals > 0:
            self.window.append((lo, hi, arrivals - co_w))
            self.window.append((slow + wait_lo, slow + wait_hi, co_w))
        return lo, hi

    def take_window_p99(self) -> float | None:
        """p99 TTFA of the requests since the last call (None without requests), then reset:
        what the operator reads from the pods' histogram deltas at each pass."""
        win, self.window = self.window, []
        if not win:
            return None
        if all(lo == hi for lo, hi, _ in win):  # no queueing spread: a weighted sort suffices
            goal, seen = 0.99 * sum(w for _, _, w in win), 0.0
            for value, _, w in sorted(win):
                seen += w
                if seen >= goal:
                    return value
            return max(lo for lo, _, _ in win)
        lo, hi, w = (np.fromiter((x[k] for x in win), float, len(win)) for k in range(3))
        return ttfa_quantile(lo, hi, w, 0.99)


def ttfa_quantile(lo: np.ndarray, hi: np.ndarray, w: np.ndarray, q: float) -> float:
    """Quantile of per-request TTFA when each second's requests spread uniformly over [lo, hi]."""
    keep = w > 0
    lo, hi, w = lo[keep], hi[keep], w[keep]
    if not len(w):
        return float("nan")
    point = hi - lo < 1e-9
    pv, pw = lo[point], w[point]
    order = np.argsort(pv, kind="stable")
    pv, pcw = pv[order], np.cumsum(pw[order])
    rlo, rhi, rw = lo[~point], hi[~point], w[~point]
    goal = q * w.sum()

    def cdf(x: float) -> float:
        i = int(np.searchsorted(pv, x, side="right"))
        below = float(pcw[i - 1]) if i else 0.0
        if len(rw):
            below += float((rw * np.clip((x - rlo) / (rhi - rlo), 0.0, 1.0)).sum())
        return below

    a, b = float(lo.min()), float(hi.max())
    for _ in range(60):
        if b - a < 1e-5:
            break
        mid = 0.5 * (a + b)
        a, b = (mid, b) if cdf(mid) < goal else (a, mid)
    return b
