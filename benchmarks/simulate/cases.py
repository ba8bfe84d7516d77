"""The benchmark's cases: fleets, traces and targets (shared by bench_simulate.py and before_after.py).

Each case's trace peaks at a share of its own fleet's c=64 decode capacity (`peak_rps_for`, or
`Trace.with_peak_load` for a replayed trace), so a case keeps its load whatever the catalog's curves.

Synthetic, 3 or 7 days (the embedded generator):
* default   — the embedded scenario `ttsfleet simulate` runs (32 H200 + 32 RTX 5090, 3 days, peak
  0.3); bursty — 30 bursts/day of 1.4-2.2x for 1-8 min, peak 0.225; flat — trough at 60% of
  peak, peak 0.2; multi-day — 48 H200 + 8 RTX 5090 + 8 RTX 6000 PRO, 7 days; writeup-curves —
  the default case on the source write-up's curves; speed — 512 GPUs, 7 days.

Public one-hour traces (request-level, replayed exactly; `fetch_traces.sh` fetches them), on the
default fleet, each replayed after an uncounted warm-up of the same hour (the hour taken as
periodic, so the controllers start with the history its traffic leaves):
* azure-code-1h — Azure LLM inference trace 2023, code service (2023-11-16 18:17-19:14 UTC,
  8,819 requests, peak/mean 12.8 at 10 s, 26 at 1 s), peak minute at 0.06 of capacity: the
  bursty case of issue 24 (targets: >= 80% GPU-busy, <= 2% fill lost);
* azure-code-1h-writeup — the same on the write-up's curves at 0.04 (the setup issue 24 reports);
* azure-conv-1h — the 2023 conversation service (19,366 requests, peak/mean 1.8 at 10 s), 0.3;
* mooncake-conv-1h — Mooncake's FAST'25 conversation trace (12,031 requests, 1.9 at 10 s), 0.3.
Generated tokens are decoded frames one to one (both are one autoregressive decode step).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ttsfleet.catalog import GpuCatalog
from ttsfleet.sim.trace import EMBEDDED_DAYS, EMBEDDED_PEAK_LOAD, EMBEDDED_SEED, Trace, diurnal, peak_rps_for

TRACE_DIR = Path(__file__).resolve().parent / "traces"
SMALL = {"h200": 32, "rtx5090": 32}
MIXED = {"h200": 48, "rtx5090": 8, "rtx6000pro": 8}
BIG = {"h200": 256, "rtx5090": 192, "rtx6000pro": 64}
#: public trace files (fetch_traces.sh): case -> (file, peak share, writeup curves)
PUBLIC = {
    "azure-code-1h": ("azure-code-2023.csv", 0.06, False),
    "azure-code-1h-writeup": ("azure-code-2023.csv", 0.04, True),
    "azure-conv-1h": ("azure-conv-2023.csv", 0.3, False),
    "mooncake-conv-1h": ("mooncake-conversation.jsonl", 0.3, False),
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


def writeup_catalog() -> GpuCatalog:
    return GpuCatalog.default().with_named_curve("h200", "writeup").with_named_curve("rtx5090", "writeup")


def burstiness(trace: Trace, window_s: int = 10) -> float:
    """Peak over mean of the request rate in ``window_s`` windows."""
    r = trace.arrivals(0)
    n = len(r) // window_s * window_s
    w = r[:n].reshape(-1, window_s).mean(axis=1)
    return float(w.max() / max(w.mean(), 1e-12))


def synthetic(skip_speed: bool) -> list[Case]:
    cat, wu = GpuCatalog.default(), writeup_catalog()

    def peak(share: float, fleet: dict, catalog: GpuCatalog = cat) -> float:
        return peak_rps_for(share, catalog, fleet)

    d = EMBEDDED_DAYS
    out = [
        Case("default", SMALL, diurnal(d, peak_rps=peak(EMBEDDED_PEAK_LOAD, SMALL), seed=EMBEDDED_SEED), d),
        Case("bursty", SMALL, diurnal(d, peak_rps=peak(0.225, SMALL), burst_per_day=30,
                                      burst_gain=(1.4, 2.2), burst_minutes=(1, 8), seed=3), d),
        Case("flat", SMALL, diurnal(d, peak_rps=peak(0.2, SMALL), trough_ratio=0.6, seed=5), d),
        Case("multi-day", MIXED, diurnal(7.0, peak_rps=peak(EMBEDDED_PEAK_LOAD, MIXED), seed=11,
                                         peak_hour=9.0), 7.0),
        Case("writeup-curves", SMALL, diurnal(d, peak_rps=peak(EMBEDDED_PEAK_LOAD, SMALL, wu),
                                              seed=EMBEDDED_SEED), d, wu),
    ]
    if not skip_speed:
        out.append(Case("speed", BIG, diurnal(7.0, peak_rps=peak(EMBEDDED_PEAK_LOAD, BIG), seed=13), 7.0))
    return out


def public(trace_dir: Path = TRACE_DIR) -> tuple[list[Case], list[str]]:
    """The one-hour public-trace cases whose files are present, and the names of those missing."""
    from ttsfleet.sim.tracefiles import load_trace

    cases, missing = [], []
    for name, (file, share, wu) in PUBLIC.items():
        path = trace_dir / file
        if not path.is_file():
            missing.append(f"{name} ({path} missing: run benchmarks/simulate/fetch_traces.sh)")
            continue
        catalog = writeup_catalog() if wu else GpuCatalog.default()
        raw = load_trace(path)
        trace = raw.with_peak_load(share, catalog, SMALL)
        targets = ONE_HOUR_BURSTY_TARGETS if name.startswith("azure-code") else {}
        source = {"file": file, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                  "requests": str(int(raw.counts.sum())), "peak_share": str(share),
                  "peak_over_mean_10s": f"{burstiness(raw):.1f}",
                  "peak_over_mean_1s": f"{burstiness(raw, 1):.1f}",
                  "scale": f"{float(trace.counts.sum() / raw.counts.sum()):.2f}"}
        cases.append(Case(name, SMALL, trace, trace.seconds / 86400, catalog if wu else None,
                          warmup_s=trace.seconds, targets=targets, source=source))
    return cases, missing


def save_trace(case: Case, path: Path) -> None:
    """The case's trace as arrays (for the before/after runner, which runs older code)."""
    t = case.trace
    np.savez(path, rate=t.rate, mean_frames=t.mean_frames,
             counts=t.counts if t.counts is not None else np.array([]))
