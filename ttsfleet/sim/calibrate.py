"""Load calibration: the trace level at which the inference-only fleet reads a chosen GPU-busy.

Why a solver and not a number. A trace's load is set as a share of its fleet's peak decode capacity
(:func:`~ttsfleet.sim.trace.peak_rps_for`, :meth:`~ttsfleet.sim.trace.Trace.with_peak_load`), but
what the inference-only baseline reads on NVML depends on far more than that share: how many
replicas the autoscaler holds for the load, which follows from the served curve's frames/s at the
concurrency the replicas are sized for (``AutoscaleConfig.target_in_flight_per_replica`` less the
burst head-room) against its curve's peak (the H200's at c=128 since 2026-12-04, c=64 before); the
curve's busy fraction; the trace's shape (trough, weekends, bursts); min replicas, the scale-down
window and the training stream. A share chosen by hand on one curve and one sizing keeps its meaning
only while they hold: the 0.3 chosen on 2026-12-01 (16 in flight on that day's served curve: ~41%
busy on the default trace) read 24-35% on the 3- and 7-day cases once the curve was refreshed and
replicas were sized for 40 (2026-12-03), and the simulator's premise — inference alone holds about
half the fleet, fill raises it towards 90%+ — no longer held.

So the share is solved for, on the simulator itself: the case's inference-only run (its own
scenario, fleet, curves and trace shape; the busy figure :func:`~ttsfleet.sim.summary.check_targets`
judges) is measured at a share, and the share moves until the run reads the target: first in
proportion (busy is roughly proportional to the load), then secant steps inside the bracket the runs
so far establish, bisection when a step would leave it (busy rises with the share). Every share
tried is rounded to ``step`` and the answer is a share that was run, so its busy figure is a
measurement, not an interpolation, and the result is reproducible (the simulator is deterministic).

One bound: the share never goes past the one at which the trace's peak minute fills the fleet's
peak decode capacity (:func:`peak_share_limit`). Above it no sizing carries the peak — every replica at
its slots and the queue still growing — and the case would measure an overloaded fleet rather than the
policy. A trace whose peak over its mean is too high for both (the bursty case: 2.2x bursts on a
diurnal with a 0.12 trough) is calibrated to that limit and reads under the band; the solution it
could not take is kept in the result (``solved``), with what the inference-only run reads there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ttsfleet.catalog import GpuCatalog
from ttsfleet.sim.scenario import Scenario
from ttsfleet.sim.trace import Trace

#: The inference-only GPU-busy the traces are calibrated to: the middle of the 40-60% band
#: ``check_targets`` judges (``inference_only_busy_near_50pct``), the source write-up's starting point.
TARGET_INFERENCE_ONLY_BUSY = 0.50
#: Half a point of GPU-busy: well inside the band, and a few runs of the solver.
BUSY_TOLERANCE = 0.005
#: Shares are tried (and recorded) at this resolution.
SHARE_STEP = 0.001


@dataclass(frozen=True)
class Calibration:
    """A solved peak-load share and the runs that found it."""

    share: float  # the peak-load share chosen (one that was run)
    busy: float  # the inference-only GPU-busy measured at it
    target: float
    tolerance: float
    runs: tuple[tuple[float, float], ...]  # (share, inference-only GPU-busy), in the order run

    @property
    def converged(self) -> bool:
        return abs(self.busy - self.target) <= self.tolerance

    def as_dict(self) -> dict:
        return {"share": self.share, "inference_only_busy": self.busy, "target": self.target,
                "tolerance": self.tolerance, "converged": self.converged,
                "runs": [{"share": s, "inference_only_busy": b} for s, b in self.runs]}


def inference_only_run(scenario: Scenario, trace: Trace, warmup_s: int = 0) -> dict:
    """The inference-only run's figures the calibration reads and records: fleet GPU-busy (what
    ``check_targets`` judges) and the latency and rejections it comes with."""
    from ttsfleet.sim.engine import simulate
    from ttsfleet.sim.summary import summarize

    s = summarize(simulate(scenario, trace, mode="inference-only", warmup_s=warmup_s))
    inf = s["inference"]
    return {"gpu_busy": s["utilization"]["overall"]["gpu_busy"], "ttfa_p99_ms": inf["ttfa_p99_ms"],
            "slo_violation_minutes": inf["slo_violation_minutes"], "rejected_pct": inf["rejected_pct"]}


def peak_share_limit(trace_at: Callable[[float], Trace], catalog: GpuCatalog,
                     fleet: Mapping[str, int], step: float = SHARE_STEP) -> float:
    """The largest share (a multiple of ``step``) at which ``trace_at(share)``'s peak minute fits
    ``fleet``'s peak decode capacity (a trace's demand scales with its share)."""
    capacity = sum(n * catalog.get(c).capacity.peak_frames_per_s for c, n in fleet.items())
    per_share = trace_at(1.0).peak_frames_per_s() / capacity
    return round(math.floor(1.0 / per_share / step + 1e-9) * step, 9)


def solve_share(busy_at: Callable[[float], float], start: float, *,
                target: float = TARGET_INFERENCE_ONLY_BUSY, tolerance: float = BUSY_TOLERANCE,
                step: float = SHARE_STEP, lo: float = SHARE_STEP, hi: float = 1.0,
                max_runs: int = 12) -> Calibration:
    """The share in [lo, hi] at which ``busy_at(share)`` (rising with the share) reads ``target``
    within ``tolerance``, found from ``start``; every share tried is a multiple of ``step``.

    Returns the run closest to the target: converged when within the tolerance; not converged
    when ``max_runs`` ran out, the bracket shrank to one step (busy jumps across the target) or
    the target lies outside what [lo, hi] can reach.
    """
    if not 0 < target < 1:
        raise ValueError(f"target busy must be in (0, 1), got {target}")
    if not 0 < lo < hi:
        raise ValueError(f"need 0 < lo < hi, got {lo}, {hi}")

    def snap(s: float) -> float:
        return round(min(max(round(s / step) * step, lo), hi), 9)

    runs: list[tuple[float, float]] = []
    below: tuple[float, float] | None = None  # the highest share read under the target
    above: tuple[float, float] | None = None  # the lowest share read over it

    s = snap(start)
    while len(runs) < max_runs:
        b = float(busy_at(s))
        runs.append((s, b))
        if abs(b - target) <= tolerance:
            break
        if b < target:
            below = (s, b) if below is None or s > below[0] else below
        else:
            above = (s, b) if above is None or s < above[0] else above
        if below is not None and above is not None:
            (s0, b0), (s1, b1) = below, above
            guess = s0 + (target - b0) * (s1 - s0) / (b1 - b0) if b1 > b0 else 0.5 * (s0 + s1)
            nxt = snap(guess)
            if not s0 < nxt < s1:  # the secant step rounds onto an end: bisect instead
                nxt = snap(0.5 * (s0 + s1))
            if not s0 < nxt < s1:  # the bracket is one step wide
                break
        else:  # one side only: scale in proportion to the busy read (busy ~ share)
            nxt = snap(s * target / b) if b > 0 else snap(2 * s)
            if nxt == s:
                nxt = snap(s + step if b < target else s - step)
            if nxt == s or any(nxt == r[0] for r in runs):  # at lo or hi: out of reach
                break
        s = nxt
    best = min(runs, key=lambda r: (abs(r[1] - target), r[0]))
    return Calibration(best[0], best[1], target, tolerance, tuple(runs))


@dataclass(frozen=True)
class LoadCalibration:
    """A case's peak load: the share solved for the target, the limit its peak minute sets, the
    share taken (the lower of the two) and its inference-only run."""

    solved: Calibration
    limit: float  # peak_share_limit
    share: float
    inference: dict  # inference_only_run at ``share``
    #: inference_only_run at the solved share (the same as ``inference`` unless capped)
    inference_at_solved: dict

    @property
    def capped(self) -> bool:
        return self.share < self.solved.share

    @property
    def busy(self) -> float:
        return self.inference["gpu_busy"]

    def as_dict(self) -> dict:
        return {"share": self.share, "inference_only_busy": self.busy, "inference_only": self.inference,
                "capped_at_peak_limit": self.capped, "peak_share_limit": self.limit,
                "solved": {**self.solved.as_dict(), "inference_only": self.inference_at_solved}}


def calibrate_peak_load(scenario: Scenario, trace_at: Callable[[float], Trace], start: float, *,
                        warmup_s: int = 0, target: float = TARGET_INFERENCE_ONLY_BUSY,
                        tolerance: float = BUSY_TOLERANCE, max_runs: int = 12) -> LoadCalibration:
    """The peak-load share at which ``scenario``'s inference-only run of ``trace_at(share)`` (the
    case's trace at that share of its fleet's peak decode capacity) reads ``target`` GPU-busy, not past
    the share whose peak minute fills the fleet (:func:`peak_share_limit`)."""
    seen: dict[float, dict] = {}

    def run(share: float) -> dict:
        if share not in seen:
            seen[share] = inference_only_run(scenario, trace_at(share), warmup_s)
        return seen[share]

    solved = solve_share(lambda s: run(s)["gpu_busy"], start, target=target, tolerance=tolerance,
                         max_runs=max_runs)
    limit = peak_share_limit(trace_at, scenario.catalog, scenario.fleet)
    share = min(solved.share, limit)
    return LoadCalibration(solved, limit, share, run(share), run(solved.share))
