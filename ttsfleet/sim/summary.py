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
    co = r.co_ttfa
    if len(co["w"]):  # requests served beside a co-tenant
        span = np.maximum(co["hi"] - co["lo"], 1e-12)
        co_above = np.where(co["hi"] - co["lo"] < 1e-9, (co["lo"] > slo).astype(float),
                            np.clip((co["hi"] - slo) / span, 0.0, 1.0))
        np.add.at(viol, co["t"], co_above * co["w"])
        np.add.at(weight, co["t"], co["w"])
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


def _lost(starting: float, running: float, stopping: float, abandoned: float, first_ckpts: int,
          r: SimResult) -> dict[str, float]:
    """Fill GPU-seconds lost by cause: start-up of every admission, SIGTERM to a free GPU, the
    abandoned current item, checkpoint writes (periodic and the early first ones)."""
    return {"restarts": starting, "stopping": stopping, "abandoned": abandoned,
            "checkpoints": running * r.checkpoint_overhead
            + first_ckpts * r.scenario.fill.checkpoint_cost_s}


def _fill(r: SimResult) -> dict:
    h = {k: sum(r.holdings_s[c][k] for c in r.holdings_s) for k in ("fill_starting", "fill_running",
                                                                   "fill_stopping")}
    f = r.fill
    lost = _lost(h["fill_starting"], h["fill_running"], h["fill_stopping"], f.abandoned_s,
                 f.first_checkpoints, r)
    co_h = {k: sum(r.co_holdings_s[c][k] for c in r.co_holdings_s) for k in ("starting", "stopping")}
    co_t = {k: sum(r.co_time_s[c][k] for c in r.co_time_s) for k in ("active", "loading", "paused")}
    co_working = co_t["active"] + co_t["loading"]  # a yielded co-tenant holds no GPU time
    co_h["running"] = co_working
    co_lost = _lost(co_h["starting"], co_working, co_h["stopping"], 0.0, 0, r)
    held, co_held = sum(h.values()), sum(co_h.values())
    lost_s, co_lost_s = sum(lost.values()), sum(co_lost.values())
    all_held, all_lost = held + co_held, lost_s + co_lost_s
    hours = r.seconds / 3600 or 1.0
    return {
        # exclusive fill jobs and co-tenants together (co-tenant process-hours count as fill hours)
        "gpu_hours_held": round(all_held / 3600, 1),
        "gpu_hours_done": round(max(all_held - all_lost, 0.0) / 3600, 1),
        "gpu_hours_lost": round(all_lost / 3600, 3),
        "lost_pct": round(100 * all_lost / all_held, 3) if all_held else 0.0,
        "lost_by_h": {k: round((lost[k] + co_lost[k]) / 3600, 3) for k in lost},
        "busy_fraction": {c: r.scenario.fill.busy_for(c) for c in r.holdings_s},
        "admissions": f.admissions,
        "evictions": f.evictions_policy,
        "admissions_per_h": round(f.admissions / hours, 1),
        "evictions_per_h": round((f.evictions_policy + f.evictions_scheduler) / hours, 1),
        "preemptions_by_scheduler": f.evictions_scheduler,
        "evicted_while_starting": f.evictions_starting,
        "exclusive": {"gpu_hours_held": round(held / 3600, 1),
                      "lost_pct": round(100 * lost_s / held, 3) if held else 0.0,
                      "lost_by_h": {k: round(v / 3600, 3) for k, v in lost.items()},
                      "admissions": f.admissions, "evictions": f.evictions_policy,
                      "evicted_while_starting": f.evictions_starting},
        "colocated": {"process_hours_held": round(co_held / 3600, 1),
                      "active_h": round(co_t["active"] / 3600, 1),
                      "loading_h": round(co_t["loading"] / 3600, 1),
                      "yielded_h": round(co_t["paused"] / 3600, 1),
                      "work_gpu_hours": round((co_t["active"] * r.scenario.colocation.fill_throughput
                                               + co_t["loading"]) / 3600, 1),
                      "lost_pct": round(100 * co_lost_s / co_held, 3) if co_held else 0.0,
                      "lost_by_h": {k: round(v / 3600, 3) for k, v in co_lost.items()},
                      "shared": f.shared, "unshared": f.unshared,
                      "interference": r.scenario.colocation.model_dump(
                          include={"inference_throughput", "inference_latency", "fill_throughput"})},
    }


def summarize(r: SimResult) -> dict:
    """The report of one run as plain data (what ``--json`` prints)."""
    classes = list(r.holdings_s)
    total_h = {k: sum(r.holdings_s[c][k] for c in classes) for k in r.holdings_s[classes[0]]}
    total_b = {k: sum(r.busy_s[c][k] for c in classes) for k in WORKLOADS}
    lo, hi, w = r.ttfa_all()
    p50 = ttfa_quantile(lo, hi, w, 0.50)
    p99 = ttfa_quantile(lo, hi, w, 0.99)
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


def check_targets(policy: dict, inference_only: dict | None, *, gpu_busy_min: float = TARGET_GPU_BUSY,
                  lost_pct_max: float = 1.0) -> dict[str, bool]:
    """Issues 16's and 24's targets on a policy run and its inference-only baseline (issue 24 sets
    ≥ 80% GPU-busy and ≤ 2% fill lost on one-hour bursty traces: pass them)."""
    o = policy["utilization"]["overall"]
    inf = policy["inference"]
    out = {
        "gpu_busy_with_fill_ge_90pct": o["gpu_busy"] >= gpu_busy_min,
        "p99_ttfa_within_slo": inf["ttfa_p99_ms"] <= inf["slo_ms"],
        "lost_fill_le_1pct": policy["fill"]["lost_pct"] <= lost_pct_max,
    }
    if inference_only is not None:
        b = inference_only["inference"]["ttfa_p99_ms"]
        out["p99_ttfa_within_5pct_of_inference_only"] = (
            not math.isnan(b) and inf["ttfa_p99_ms"] <= 1.05 * b)
        # issue 24: no worse than inference-only (the figures are rounded to 0.1 ms)
        out["p99_ttfa_no_worse_than_inference_only"] = (
            not math.isnan(b) and inf["ttfa_p99_ms"] <= b + 0.1)
        busy = inference_only["utilization"]["overall"]["gpu_busy"]
        out["inference_only_busy_near_50pct"] = 0.40 <= busy <= 0.60
    return out
