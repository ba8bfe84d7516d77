"""Where one case's GPU-time, lost fill and refused requests go: the breakdown behind a row of the
benchmark's table (2026-12-04d: why azure-code-1h reads low at 6% load).

Run:  python -P benchmarks/simulate/diagnose.py [--cases azure-code-1h,azure-code-1h-writeup]
                                                [--burst-hold 0,1800] [--suffix d]
Writes diagnose-<date><suffix>.json beside this file and prints one summary line per run.

Each case's policy run (the benchmark's scenario, ``AutoscaleConfig.burst_hold_s`` as given) is
replayed once, watching the simulator's adapter (``policy_step``) and traffic second
(``_traffic_second``) from outside: nothing of the simulator or the policy changes. Recorded:
GPU-hours per holding state and per workload busy (the simulator's ledger), the trace's per-second
arrivals (how concentrated), the autoscaler's load samples at its passes, panic onsets and the
reasons of its decisions, the seconds with refused requests (and the ready replicas then), and
fill's admissions, evictions and lost GPU-hours by cause.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cases.py beside this file

from bench_simulate import scenario_for  # noqa: E402
from cases import Case, public  # noqa: E402
from ttsfleet.inference.bench import machine  # noqa: E402

import ttsfleet.sim.engine as engine  # noqa: E402
from ttsfleet.sim.summary import summarize  # noqa: E402


class Watch:
    """The adapter's passes and the traffic's seconds of one run, recorded as they happen."""

    def __init__(self) -> None:
        self.passes: list[dict[str, Any]] = []
        self.seconds: list[tuple[int, float, float, int]] = []  # t, arrivals, refused, ready

    def policy_step(self, t, fleet, ctl, *, fill):  # noqa: ANN001, ANN201 - engine's signature
        d = self._policy_step(t, fleet, ctl, fill=fill)
        self.passes.append({"t": t, "panic": d.panic, "panic_load": d.panic_load,
                            "reasons": [p.reason for p in d.pools],
                            "inference": sum(cl.inference_gpus for cl in fleet.classes.values())})
        return d

    def traffic_second(self, fleet, rec, t, arrivals, mean_frames):  # noqa: ANN001, ANN201
        before = sum(h.traffic.rejected for h in fleet.pools)
        self._traffic_second(fleet, rec, t, arrivals, mean_frames)
        self.seconds.append((t, arrivals, sum(h.traffic.rejected for h in fleet.pools) - before,
                             sum(h.traffic.ready for h in fleet.pools)))

    def run(self, case: Case, burst_hold_s: float) -> engine.SimResult:
        """The case's policy run with the engine's two hooks pointed here, then restored."""
        base = scenario_for(case)
        sc = base.model_copy(update={"autoscale": base.autoscale.model_copy(
            update={"burst_hold_s": burst_hold_s})})
        self._policy_step, self._traffic_second = engine.policy_step, engine._traffic_second
        engine.policy_step, engine._traffic_second = self.policy_step, self.traffic_second
        try:
            return engine.simulate(sc, case.trace, mode="policy", warmup_s=case.warmup_s)
        finally:
            engine.policy_step, engine._traffic_second = self._policy_step, self._traffic_second


def gpu_hours(r: engine.SimResult) -> dict[str, dict[str, float]]:
    """GPU-hours held per state and busy per workload, summed over the classes."""
    held: Counter[str] = Counter()
    busy: Counter[str] = Counter()
    for c in r.holdings_s:
        held.update({k: v / 3600 for k, v in r.holdings_s[c].items()})
        busy.update({k: v / 3600 for k, v in r.busy_s[c].items()})
    return {"held": {k: round(v, 2) for k, v in held.items()},
            "busy": {k: round(v, 2) for k, v in busy.items()}}


def arrivals_profile(seconds: np.ndarray) -> dict[str, Any]:
    """How concentrated the counted part's requests are, second by second."""
    a = seconds[:, 1]
    out: dict[str, Any] = {"seconds": len(a), "requests": round(float(a.sum())),
                           "seconds_without_requests_pct": round(100 * float((a == 0).mean()), 1),
                           "peak_second": round(float(a.max()))}
    for th in (500, 1000, 2000):
        big = a >= th
        out[f"seconds_ge_{th}"] = int(big.sum())
        out[f"requests_in_seconds_ge_{th}_pct"] = round(100 * float(a[big].sum() / a.sum()), 1)
    return out


def autoscaler_profile(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """The load the autoscaler saw at its passes, its panics and why it decided what it did."""
    load = np.array([p["panic_load"] for p in passes])
    onsets = [p["t"] for i, p in enumerate(passes) if p["panic"] and (i == 0 or not passes[i - 1]["panic"])]
    inf = np.array([p["inference"] for p in passes])
    return {"passes": len(passes), "samples_zero_pct": round(100 * float((load == 0).mean()), 1),
            "samples_ge_500": int((load >= 500).sum()), "sample_max": round(float(load.max()), 1),
            "panic_onsets": len(onsets), "panic_gaps_s": [round(g) for g in np.diff(onsets)],
            "decision_reasons": dict(Counter(r for p in passes for r in p["reasons"])),
            "inference_gpus_min_median_max": [int(inf.min()), float(np.median(inf)), int(inf.max())]}


def refusals(seconds: np.ndarray) -> dict[str, Any]:
    """The seconds in which requests were refused (429) and the replicas ready then."""
    hit = seconds[seconds[:, 2] > 0]
    out: dict[str, Any] = {"refused": round(float(seconds[:, 2].sum())), "seconds": len(hit)}
    if len(hit):
        out["arrivals_min_max"] = [round(float(hit[:, 1].min())), round(float(hit[:, 1].max()))]
        out["ready_min_max"] = [int(hit[:, 3].min()), int(hit[:, 3].max())]
    return out


def diagnose(case: Case, burst_hold_s: float) -> dict[str, Any]:
    w = Watch()
    r = w.run(case, burst_hold_s)
    counted = np.array([s for s in w.seconds if s[0] >= 0], dtype=float)
    s = summarize(r)
    f = s["fill"]
    return {"burst_hold_s": burst_hold_s, "gpu_hours": gpu_hours(r), "arrivals": arrivals_profile(counted),
            "autoscaler": autoscaler_profile([p for p in w.passes if p["t"] >= case.warmup_s]),
            "refusals": refusals(counted),
            "fill": {k: f[k] for k in ("gpu_hours_held", "lost_pct", "lost_by_h", "admissions",
                                       "evictions", "evicted_while_starting")},
            "summary": {"gpu_busy": s["utilization"]["overall"]["gpu_busy"],
                        "ttfa_p99_ms": s["inference"]["ttfa_p99_ms"],
                        "slo_violation_minutes": s["inference"]["slo_violation_minutes"],
                        "rejected_pct": s["inference"]["rejected_pct"]}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="azure-code-1h,azure-code-1h-writeup")
    ap.add_argument("--burst-hold", default="0,1800", help="burst_hold_s values, comma-separated")
    ap.add_argument("--suffix", default="")
    args = ap.parse_args()
    cases = {c.name: c for c in public()[0]}
    out: dict[str, Any] = {}
    for name in args.cases.split(","):
        for hold in (float(x) for x in args.burst_hold.split(",")):
            d = diagnose(cases[name], hold)
            out.setdefault(name, {})[f"{hold:g}"] = d
            g = d["gpu_hours"]["held"]
            print(f"{name} hold {hold:g}: " + ", ".join(f"{k} {v:.2f}" for k, v in g.items())
                  + f" GPU-h; {d['summary']}; panics {d['autoscaler']['panic_onsets']}; "
                  f"fill {d['fill']['admissions']} admitted, lost {d['fill']['lost_by_h']}")
    stamp = dt.date.today().isoformat()
    path = Path(__file__).parent / f"diagnose-{stamp}{args.suffix}.json"
    path.write_text(json.dumps({"date": stamp, "machine": machine(), "runs": out}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
