"""Simulator benchmark: the default scenario's targets, other traces, and the speed target.

Run:  python benchmarks/simulate/bench_simulate.py [--out benchmarks/simulate]
Prints a table and writes results-<date>.json, the default run's PNG and README.md's numbers.

Cases:
* default   — the embedded scenario `ttsfleet simulate` runs (32 H200 + 32 RTX 5090, 3 days);
* bursty    — 30 bursts/day of 1.4–2.2x for 1–8 min (not what the defaults were tuned on);
* flat      — a shallow diurnal curve (trough 60% of peak);
* mixed     — 48 H200 + 8 RTX 5090 + 8 RTX 6000 PRO, morning peak, 7 days;
* speed     — 512 GPUs (256 H200 + 192 RTX 5090 + 64 RTX 6000 PRO), 7 days at 1 s, policy every
              15 s: wall time of the policy run on one core (target < 60 s).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ttsfleet.sim.engine import check_targets, simulate, summarize
from ttsfleet.sim.report import plot
from ttsfleet.sim.scenario import Scenario, default_pools_for, default_training
from ttsfleet.sim.trace import diurnal


def pair(fleet: dict[str, int], trace, days: float, training: bool = True):
    sc = Scenario(fleet=fleet, pools=default_pools_for(fleet),
                  training=default_training(fleet, days, 7) if training else [])
    t0 = time.perf_counter()
    pol = simulate(sc, trace, fill=True)
    t1 = time.perf_counter()
    base = simulate(sc, trace, fill=False)
    return sc, pol, base, t1 - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).parent))
    ap.add_argument("--skip-speed", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    small = {"h200": 32, "rtx5090": 32}
    cases = {
        "default": (small, diurnal(3.0, peak_rps=1200.0, seed=7), 3.0),
        "bursty": (small, diurnal(3.0, peak_rps=900.0, burst_per_day=30, burst_gain=(1.4, 2.2),
                                  burst_minutes=(1, 8), seed=3), 3.0),
        "flat": (small, diurnal(3.0, peak_rps=800.0, trough_ratio=0.6, seed=5), 3.0),
        "mixed": ({"h200": 48, "rtx5090": 8, "rtx6000pro": 8},
                  diurnal(7.0, peak_rps=1300.0, seed=11, peak_hour=9.0), 7.0),
    }
    if not args.skip_speed:
        cases["speed"] = ({"h200": 256, "rtx5090": 192, "rtx6000pro": 64},
                          diurnal(7.0, peak_rps=9600.0, seed=13), 7.0)
    results = {}
    table = Table(title="ttsfleet simulate: inference-only vs policy (inference + fill)")
    for col in ("case", "GPUs", "days", "active base→policy", "allocated", "load-weighted",
                "p99 TTFA ms base/policy", "SLO min base/policy", "429 % base/policy", "fill lost %",
                "targets", "policy run s"):
        table.add_column(col, justify="right")
    for name, (fleet, trace, days) in cases.items():
        sc, pol, base, secs = pair(fleet, trace, days)
        sp, sb = summarize(pol), summarize(base)
        tg = check_targets(sp, sb)
        results[name] = {"fleet": fleet, "days": days, "policy": sp, "baseline": sb, "targets": tg,
                         "policy_run_seconds": round(secs, 2)}
        if name == "default":
            plot([("inference-only", base), ("policy (inference + fill)", pol)],
                 out / "default-run.png")
        o, ob = sp["utilization"]["overall"], sb["utilization"]["overall"]
        met = sum(bool(v) for v in tg.values())
        table.add_row(name, str(sum(fleet.values())), f"{days:g}",
                      f"{ob['active_total']:.1%} → {o['active_total']:.1%}",
                      f"{o['allocated_busy']:.1%}", f"{o['load_weighted']:.1%}",
                      f"{sb['inference']['ttfa_p99_ms']:.0f} / {sp['inference']['ttfa_p99_ms']:.0f}",
                      f"{sb['inference']['slo_violation_minutes']} / "
                      f"{sp['inference']['slo_violation_minutes']}",
                      f"{sb['inference']['rejected_pct']:.2f} / {sp['inference']['rejected_pct']:.2f}",
                      f"{sp['fill']['lost_pct']:.3f}", f"{met}/{len(tg)}", f"{secs:.1f}")
    Console(width=200).print(table)
    stamp = dt.date.today().isoformat()
    doc = {"date": stamp, "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                      "python": platform.python_version()},
           "note": "policy run wall time is single-threaded Python on a shared 2-core machine",
           "results": results}
    path = out / f"results-{stamp}.json"
    path.write_text(json.dumps(doc, indent=2))
    Console().print(f"wrote {path}")


if __name__ == "__main__":
    main()
