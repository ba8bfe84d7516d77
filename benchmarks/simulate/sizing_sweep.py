"""The scenario's replica sizing swept: in-flight target per replica on the default, bursty, flat and
Azure code hour cases (the last needs fetch_traces.sh; skipped without its file).

Run:  python -P benchmarks/simulate/sizing_sweep.py [--targets 16,24,...] [--cases default,bursty,...]
                                                     [--suffix b]
Writes sizing-sweep-<date><suffix>.json beside this file and prints the table. Each target runs the case's
inference-only and policy runs with the scenario's other defaults (20% burst head-room), on the
catalog's curves (a one-hour case after its uncounted warm-up, as the benchmark runs it). The
sizing itself is derived from the served curve's first audio against the SLO
(``Scenario.autoscale``); this sweep is what the choice costs and buys on the benchmark's traces.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", default="16,24,32,40,48,56,64")
    ap.add_argument("--cases", default="default,bursty,flat,azure-code-1h")
    ap.add_argument("--suffix", default="", help="appended to the record's date (a second record "
                    "of the day: sizing-sweep-<date>b.json)")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from bench_simulate import scenario_for
    from cases import public, synthetic
    from ttsfleet.inference.bench import machine

    from ttsfleet.sim.engine import simulate
    from ttsfleet.sim.summary import summarize

    cases = {c.name: c for c in [*synthetic(True), *public()[0]]}
    targets = [float(t) for t in args.targets.split(",")]
    out: dict = {}
    print("| case | target in flight | GPU-busy inf-only / policy | load-weighted policy | p99 TTFA ms "
          "inf-only / policy | SLO-violation min inf-only / policy | 429 % policy | fill lost % | "
          "training wait s policy |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.cases.split(","):
        if name not in cases:
            print(f"skipping {name} (trace file missing: run fetch_traces.sh)")
            continue
        case = cases[name]
        base = scenario_for(case)
        for t in targets:
            sc = base.model_copy(update={"autoscale": base.autoscale.model_copy(
                update={"target_in_flight_per_replica": t})})
            row = {}
            for mode in ("inference-only", "policy"):
                s = summarize(simulate(sc, case.trace, mode=mode, warmup_s=case.warmup_s))
                row[mode] = {"gpu_busy": s["utilization"]["overall"]["gpu_busy"],
                             "load_weighted": s["utilization"]["overall"]["load_weighted"],
                             "ttfa_p99_ms": s["inference"]["ttfa_p99_ms"],
                             "slo_violation_minutes": s["inference"]["slo_violation_minutes"],
                             "rejected_pct": s["inference"]["rejected_pct"],
                             "fill_lost_pct": s["fill"]["lost_pct"],
                             "training_mean_wait_s": s["training"]["mean_wait_s"]}
            out.setdefault(name, {})[f"{t:g}"] = row
            a, b = row["inference-only"], row["policy"]
            print(f"| {name} | {t:g} | {a['gpu_busy']:.1%} / {b['gpu_busy']:.1%} | "
                  f"{b['load_weighted']:.1%} | "
                  f"{a['ttfa_p99_ms']:.0f} / {b['ttfa_p99_ms']:.0f} | {a['slo_violation_minutes']} / "
                  f"{b['slo_violation_minutes']} | {b['rejected_pct']:.2f} | {b['fill_lost_pct']:.2f} | "
                  f"{b['training_mean_wait_s']:.0f} |", flush=True)
    stamp = dt.date.today().isoformat()
    doc = {"date": stamp, "machine": machine(),
           "h200_curve": base.catalog.get("h200").capacity.source, "results": out}
    path = HERE / f"sizing-sweep-{stamp}{args.suffix}.json"
    path.write_text(json.dumps(doc, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
