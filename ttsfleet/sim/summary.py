"""A run's figures as plain data, and the targets of issue 16 judged on them.

Utilization is given three ways, never one as another:

* **GPU-busy** (the headline) — what ``nvidia-smi`` / DCGM report: an inference replica busy by
  its GPU busy fraction at its concurrency (:mod:`ttsfleet.sim.traffic`), a running fill job at
  its measured busy fraction less its checkpoint writes, training at its busy fraction;
* **allocated** — GPU-time held by a workload, whatever it is doing;
* **load-weighted** — work done over capacity: frames decoded over what the replicas decode at
  peak concurrency, plus fill and training busy time.
"""

from __future__ import annotations

import math

import numpy as np

from ttsfleet.sim.engine import SimResult
from ttsfleet.sim.traffic import ttfa_quantile

__all__ = ["check_targets", "slo_violation_minutes", "summarize", "ttfa_quantile"]

WORKLOADS = ("inference", "training", "fill")
TARGET_GPU_BUSY = 0.90


def slo_violation_minutes(r: SimResult) -> int:
    """Minutes in which more than 1% of the requests waited longer than the SLO for audio."""
    slo = r.scenario.autoscale.ttfa_p99_slo_s
    span = np.maximum(r.ttfa_hi - r.ttfa_lo, 1e-12)
    above = np.where(r.ttfa_hi - r.ttfa_lo < 1e-9, (r.ttfa_lo > slo).astype(float),
                     np.clip((r.ttfa_hi - slo) / span, 0.0, 1.0))
    pools = len(r.scenario.pools)
    viol = (above * r.ttfa_w).reshape(r.seconds, pools).sum(axis=1)
    weight = r.ttfa_w.reshape(r.seconds, pools).sum(axis=1)
    minutes = (r.seconds + 59) // 60
    pad = minutes * 60 - r.seconds
    vm = np.pad(viol, (0, pad)).reshape(minutes, 60).sum(axis=1)
    wm = np.pad(weight, (0, pad)).reshape(minutes, 60).sum(axis=1)
    return int(np.sum((wm > 0) & (vm > 0.01 * wm)))


def _utilization(holdings: dict[str, float], busy: dict[str, float], work: float) -> dict:
    total = sum(holdings.values()) or 1.0
    alloc = {"inference": holdings["inference"], "training": holdings["training"],
             "fill": holdings["fill_starting"] + holdings["fill_running"] + holdings["fill_stopping"],
             "idle": holdings["idle"]}
    return {
        "gpu_busy": round(sum(busy.values()) / total, 4),
        "gpu_busy_by": {k: round(busy[k] / total, 4) for k in WORKLOADS},
        "allocated": {k: round(v / total, 4) for k, v in alloc.items()},
        "allocated_busy": round(1 - alloc["idle"] / total, 4),
        "load_weighted": round(work / total, 4),
    }


def _fill(r: SimResult) -> dict:
    h = {k: sum(r.holdings_s[c][k] for c in r.holdings_s) for k in ("fill_starting", "fill_running",
                                                                   "fill_stopping")}
    held = sum(h.values())
    lost = {"restarts": h["fill_starting"], "stopping": h["fill_stopping"],
            "abandoned": r.fill.abandoned_s, "checkpoints": h["fill_running"] * r.checkpoint_overhead}
    lost_s = sum(lost.values())
    return {
        "gpu_hours_held": round(held / 3600, 1),
        "gpu_hours_done": round(max(held - lost_s, 0.0) / 3600, 1),
        "gpu_hours_lost": round(lost_s / 3600, 3),
        "lost_pct": round(100 * lost_s / held, 3) if held else 0.0,
        "lost_by_h": {k: round(v / 3600, 3) for k, v in lost.items()},
        "busy_fraction": {c: r.scenario.fill.busy_for(c) for c in r.holdings_s},
        "admissions": r.fill.admissions,
        "evictions": r.fill.evictions_policy,
        "preemptions_by_scheduler": r.fill.evictions_scheduler,
        "evicted_while_starting": r.fill.evictions_starting,
    }


def summarize(r: SimResult) -> dict:
    """The report of one run as plain data (what ``--json`` prints)."""
    classes = list(r.holdings_s)
    total_h = {k: sum(r.holdings_s[c][k] for c in classes) for k in r.holdings_s[classes[0]]}
    total_b = {k: sum(r.busy_s[c][k] for c in classes) for k in WORKLOADS}
    p50 = ttfa_quantile(r.ttfa_lo, r.ttfa_hi, r.ttfa_w, 0.50)
    p99 = ttfa_quantile(r.ttfa_lo, r.ttfa_hi, r.ttfa_w, 0.99)
    return {
        "mode": r.mode,
        "duration_h": round(r.seconds / 3600, 2),
        "fleet": dict(r.scenario.fleet),
        "gpu_hours": round(sum(total_h.values()) / 3600, 1),
        "utilization": {
            "overall": _utilization(total_h, total_b, sum(r.work_s.values())),
            "per_class": {c: _utilization(r.holdings_s[c], r.busy_s[c], r.work_s[c]) for c in classes},
        },
        "inference": {
            "requests": int(r.requests),
            "rejected_429": int(r.rejected),
            "rejected_pct": round(100 * r.rejected / r.requests, 3) if r.requests else 0.0,
            "frames": int(r.frames),
            "ttfa_p50_ms": round(p50 * 1000, 1),
            "ttfa_p99_ms": round(p99 * 1000, 1),
            "slo_ms": round(r.scenario.autoscale.ttfa_p99_slo_s * 1000, 1),
            "slo_violation_minutes": slo_violation_minutes(r),
            "scale_events": dict(r.scale_events),
        },
        "fill": _fill(r),
        "training": {
            "gpu_hours": round(sum(r.holdings_s[c]["training"] for c in classes) / 3600, 1),
            "jobs_started": len(r.training_wait_s),
            "mean_wait_s": round(float(np.mean(r.training_wait_s)), 1) if r.training_wait_s else 0.0,
        },
    }


def check_targets(policy: dict, inference_only: dict | None) -> dict[str, bool]:
    """Issue 16's targets on a policy run and its inference-only baseline."""
    o = policy["utilization"]["overall"]
    inf = policy["inference"]
    out = {
        "gpu_busy_with_fill_ge_90pct": o["gpu_busy"] >= TARGET_GPU_BUSY,
        "p99_ttfa_within_slo": inf["ttfa_p99_ms"] <= inf["slo_ms"],
        "lost_fill_le_1pct": policy["fill"]["lost_pct"] <= 1.0,
    }
    if inference_only is not None:
        b = inference_only["inference"]["ttfa_p99_ms"]
        out["p99_ttfa_within_5pct_of_inference_only"] = (
            not math.isnan(b) and inf["ttfa_p99_ms"] <= 1.05 * b)
        busy = inference_only["utilization"]["overall"]["gpu_busy"]
        out["inference_only_busy_near_50pct"] = 0.40 <= busy <= 0.60
    return out
