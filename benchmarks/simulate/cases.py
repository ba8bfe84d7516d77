"""The benchmark's cases: fleets, traces and targets (shared by bench_simulate.py, before_after.py,
sizing_sweep.py and calibrate_load.py).

Each case's trace peaks at a share of its own fleet's peak decode capacity (`peak_rps_for`, or
`Trace.with_peak_load` for a replayed trace), so a case keeps its load whatever the catalog's curves.
The share is not chosen by hand: `calibrate_load.py` solves it (`ttsfleet.sim.calibrate`) so the
case's inference-only run reads 50% GPU-busy (the middle of the 40-60% band `check_targets` judges:
inference alone holds about half the fleet, the premise fill is measured against) on the catalog's
curves and the scenario's sizing, and records the runs (`load-calibration-<date>.json`); `PEAK_LOAD`
below copies the record, and tests/core/test_sim_calibration.py fails when the two part or the
record's inputs (curves, sizing, traces) no longer match. The two azure-code cases keep issue 24's
setup instead (`PUBLIC`; their peak/mean of 12.8 at 10 s cannot hold half the fleet on average
without a peak far past it).

Synthetic, 3 or 7 days (the embedded generator):
* default   — the embedded scenario `ttsfleet simulate` runs (32 H200 + 32 RTX 5090, 3 days, peak
  `EMBEDDED_PEAK_LOAD`); bursty — 30 bursts/day of 1.4-2.2x for 1-8 min; flat — trough at 60% of
  peak; multi-day — 48 H200 + 8 RTX 5090 + 8 RTX 6000 PRO, 7 days, morning peak; writeup-curves —
  the default case's trace shape on the source write-up's curves; speed — 512 GPUs, 7 days.

Public one-hour traces (request-level, replayed exactly; `fetch_traces.sh` fetches them), on the
default fleet, each replayed after an uncounted warm-up of the same hour (the hour taken as
periodic, so the controllers start with the history its traffic leaves):
* azure-code-1h — Azure LLM inference trace 2023, code service (2023-11-16 18:17-19:14 UTC,
  8,819 requests, peak/mean 12.8 at 10 s, 26 at 1 s), peak minute at 0.06 of capacity: the
  bursty case of issue 24 (targets: >= 80% GPU-busy, <= 2% fill lost); not calibrated;
* azure-code-1h-writeup — the same on the write-up's curves at 0.04 (the setup issue 24 reports);
* azure-conv-1h — the 2023 conversation service (19,366 requests, peak/mean 1.8 at 10 s), calibrated;
* mooncake-conv-1h — Mooncake's FAST'25 conversation trace (12,031 requests, 1.9 at 10 s), calibrated.
Generated tokens are decoded frames one to one (both are one autoregressive decode step).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ttsfleet.catalog import GpuCatalog
from ttsfleet.sim.trace import EMBEDDED_DAYS, EMBEDDED_PEAK_LOAD, EMBEDDED_SEED, Trace, diurnal, peak_rps_for

TRACE_DIR = Path(__file__).resolve().parent / "traces"
SMALL = {"h200": 32, "rtx5090": 32}
MIXED = {"h200": 48, "rtx5090": 8, "rtx6000pro": 8}
BIG = {"h200": 256, "rtx5090": 192, "rtx6000pro": 64}
#: Each calibrated case's peak load (share of its fleet's peak decode capacity: each class's curve
#: peak, since 2026-12-04 the H200's at c=128 and the RTX classes' at c=64), as calibrate_load.py
#: solved it for 50% inference-only GPU-busy: load-calibration-2026-12-08.json, on the H200 curve of
#: run15 (the final defaults: split-KV attention, channels-last codec; the default case's is
#: EMBEDDED_PEAK_LOAD, the CLI's default) and, since 2026-12-08, the RTX 6000 PRO estimate equal to the
#: RTX 5090's (the same memory bandwidth; multi-day 0.466 -> 0.463, speed 0.54 -> 0.537; the rest as in
#: load-calibration-2026-12-04c.json). bursty is the one capped at its peak-minute limit (its
#: 2.2x bursts would take the peak minute past the fleet's capacity at the solved 0.426; at 0.32 its
#: inference-only run reads 39.5%). Before, each was chosen by hand on 2026-12-01's curve and
#: sizing: default, multi-day, speed 0.3; bursty 0.225; flat 0.2; the two conversation hours 0.3.
PEAK_LOAD = {
    "default": EMBEDDED_PEAK_LOAD,
    "bursty": 0.32,
    "flat": 0.262,
    "multi-day": 0.463,
    "writeup-curves": 0.521,
    "speed": 0.537,
    "azure-conv-1h": 0.264,
    "mooncake-conv-1h": 0.245,
}
#: public trace files (fetch_traces.sh): case -> (file, peak share, writeup curves); a share of
#: None is the calibrated one (PEAK_LOAD)
PUBLIC = {
    "azure-code-1h": ("azure-code-2023.csv", 0.06, False),
    "azure-code-1h-writeup": ("azure-code-2023.csv", 0.04, True),
    "azure-conv-1h": ("azure-conv-2023.csv", None, False),
    "mooncake-conv-1h": ("mooncake-conversation.jsonl", None, False),
}
#: issue 24's targets for one-hour bursty traces (peak/mean ~ 14): the default is issue 16's
ONE_HOUR_BURSTY_TARGETS = {"gpu_busy_min": 0.80, "lost_pct_max": 2.0}


@dataclass
class Case:
    name: str
    fleet: dict[str, int]
    trace: Trace
    days: float
    catalog: GpuCatalog | None = None
    warmup_s: int = 0
    targets: dict[str, float] = field(default_factory=dict)  # check_targets thresholds
    source: dict[str, str] = field(default_factory=dict)
    peak_load: float = 0.0  # the trace's peak as a share of the fleet's peak decode capacity
    #: the case's trace at another peak-load share (what the calibration solves over)
    trace_at: Callable[[float], Trace] | None = None
    calibrated: bool = False  # peak_load is PEAK_LOAD's (solved), not a fixed setup


def writeup_catalog() -> GpuCatalog:
    return GpuCatalog.default().with_named_curve("h200", "writeup").with_named_curve("rtx5090", "writeup")


def burstiness(trace: Trace, window_s: int = 10) -> float:
    """Peak over mean of the request rate in ``window_s`` windows."""
    r = trace.arrivals(0)
    n = len(r) // window_s * window_s
    w = r[:n].reshape(-1, window_s).mean(axis=1)
    return float(w.max() / max(w.mean(), 1e-12))


#: The synthetic cases: name -> (fleet, days, write-up curves, diurnal() shape arguments).
SYNTHETIC: dict[str, tuple[dict[str, int], float, bool, dict[str, Any]]] = {
    "default": (SMALL, EMBEDDED_DAYS, False, {"seed": EMBEDDED_SEED}),
    "bursty": (SMALL, EMBEDDED_DAYS, False, {"burst_per_day": 30, "burst_gain": (1.4, 2.2),
                                             "burst_minutes": (1, 8), "seed": 3}),
    "flat": (SMALL, EMBEDDED_DAYS, False, {"trough_ratio": 0.6, "seed": 5}),
    "multi-day": (MIXED, 7.0, False, {"seed": 11, "peak_hour": 9.0}),
    "writeup-curves": (SMALL, EMBEDDED_DAYS, True, {"seed": EMBEDDED_SEED}),
    "speed": (BIG, 7.0, False, {"seed": 13}),
}


def synthetic(skip_speed: bool, peak_load: dict[str, float] | None = None) -> list[Case]:
    """The synthetic cases at their calibrated peak loads (``peak_load`` overrides per case)."""
    loads = {**PEAK_LOAD, **(peak_load or {})}
    out = []
    for name, (fleet, days, wu, shape) in SYNTHETIC.items():
        if skip_speed and name == "speed":
            continue
        catalog = writeup_catalog() if wu else GpuCatalog.default()

        def trace_at(share: float, fleet=fleet, days=days, shape=shape, catalog=catalog) -> Trace:
            return diurnal(days, peak_rps=peak_rps_for(share, catalog, fleet), **shape)

        out.append(Case(name, fleet, trace_at(loads[name]), days, catalog if wu else None,
                        peak_load=loads[name], trace_at=trace_at, calibrated=True))
    return out


def public(trace_dir: Path = TRACE_DIR, peak_load: dict[str, float] | None = None,
           ) -> tuple[list[Case], list[str]]:
    """The one-hour public-trace cases whose files are present, and the names of those missing."""
    from ttsfleet.sim.tracefiles import load_trace

    loads = {**PEAK_LOAD, **(peak_load or {})}
    cases, missing = [], []
    for name, (file, fixed, wu) in PUBLIC.items():
        path = trace_dir / file
        if not path.is_file():
            missing.append(f"{name} ({path} missing: run benchmarks/simulate/fetch_traces.sh)")
            continue
        catalog = writeup_catalog() if wu else GpuCatalog.default()
        raw = load_trace(path)
        share = fixed if fixed is not None else loads[name]

        def trace_at(s: float, raw=raw, catalog=catalog) -> Trace:
            return raw.with_peak_load(s, catalog, SMALL)

        trace = trace_at(share)
        targets = ONE_HOUR_BURSTY_TARGETS if name.startswith("azure-code") else {}
        source = {"file": file, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                  "requests": str(int(raw.counts.sum())), "peak_share": str(share),
                  "peak_over_mean_10s": f"{burstiness(raw):.1f}",
                  "peak_over_mean_1s": f"{burstiness(raw, 1):.1f}",
                  "scale": f"{float(trace.counts.sum() / raw.counts.sum()):.2f}"}
        cases.append(Case(name, SMALL, trace, trace.seconds / 86400, catalog if wu else None,
                          warmup_s=trace.seconds, targets=targets, source=source, peak_load=share,
                          trace_at=trace_at, calibrated=fixed is None))
    return cases, missing


def calibration_inputs(case: Case) -> dict:
    """What a case's calibrated share depends on, as calibrate_load.py records it and
    tests/core/test_sim_calibration.py compares it: the capacity curves of the fleet's classes
    (points and source), the scenario's replica sizing and the case's trace at share 1 (length,
    mean request rate, mean frames, peak minute; figures, not a digest, so a last-bit difference
    in numpy's transcendental functions between machines does not count as a change)."""
    from ttsfleet.sim.scenario import Scenario

    catalog = case.catalog or GpuCatalog.default()
    sizing = Scenario.model_fields["autoscale"].default
    tr = case.trace_at(1.0) if case.trace_at is not None else case.trace
    return {
        "curves": {c: catalog.get(c).capacity.model_dump(include={"points", "source"})
                   for c in sorted(case.fleet)},
        "sizing": sizing.model_dump(include={"target_in_flight_per_replica", "burst_headroom",
                                             "forecast"}),
        "trace_at_share_1": {"seconds": tr.seconds, "rate_mean": float(tr.rate.mean()),
                             "mean_frames_mean": float(tr.mean_frames.mean()),
                             "peak_frames_per_s": tr.peak_frames_per_s()},
    }


def save_trace(case: Case, path: Path) -> None:
    """The case's trace as arrays (for the before/after runner, which runs older code)."""
    t = case.trace
    np.savez(path, rate=t.rate, mean_frames=t.mean_frames,
             counts=t.counts if t.counts is not None else np.array([]))
