"""Simulator benchmark: issue 16's targets on the default and other traces, and the speed case.

Run:  python -P benchmarks/simulate/bench_simulate.py [--out benchmarks/simulate] [--skip-speed]
Prints tables and writes results-<date>.json and the default run's PNG (default-run.png).

Every case replays one trace three times: static-warm (always-on fleet sized for the peak, no
autoscaling, no fill), inference-only (the autoscaler, no fill) and the policy (autoscaler +
fill). Cases:

* default   — the embedded scenario `ttsfleet simulate` runs (32 H200 + 32 RTX 5090, 3 days,
  peak at 0.3 of the fleet's c=64 capacity; the catalog's default curves: our served H200 curve,
  benchmarks/inference_h200/2026-12-01-served, and an RTX 5090 estimate from it);
* bursty    — 30 bursts/day of 1.4-2.2x for 1-8 min, peak share 0.225 (not what the defaults
  were tuned on);
* flat      — a shallow diurnal curve (trough 60% of peak), peak share 0.2;
* multi-day — 48 H200 + 8 RTX 5090 + 8 RTX 6000 PRO, morning peak, 7 days;
* writeup-curves — the default case with the source write-up's H200 and RTX 5090 curves
  (borrowed, ~4.9x ours at c=64) instead of ours;
* speed     — 512 GPUs (256 H200 + 192 RTX 5090 + 64 RTX 6000 PRO), 7 days at 1 s, policy every
  15 s: wall time of the policy run on one core.

A sensitivity sweep runs the default case's policy at other fill busy fractions, from the
measured CPU-stage fill of issue 16 (0.2% NVML) to 0.9.

Every case also runs the policy node-blind (the adapter hides the node topology from the policy,
as before 2026-12-01), for the training wait fill causes. The burst-rule ablation replays the
bursty and default cases with the autoscaler's burst rules off, the trend forecast alone, burst
head-room alone and both (inference-only and policy runs).
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

from ttsfleet.catalog import GpuCatalog
from ttsfleet.sim.engine import simulate
from ttsfleet.sim.report import plot
from ttsfleet.sim.scenario import FILL_BUSY_FRACTION, FillWorkload, Scenario, default_training
from ttsfleet.sim.summary import check_targets, summarize
from ttsfleet.sim.trace import EMBEDDED_DAYS, EMBEDDED_PEAK_LOAD, EMBEDDED_SEED, diurnal, peak_rps_for

ROOT = Path(__file__).resolve().parents[2]
MODES = ("static-warm", "inference-only", "policy")
#: Fill busy fractions of the sweep: issue 16's H200 measurement of today's CPU-stage fill
#: (`ttsfleet fill run`, decode,hash,loudness,features: 0.2% mean NVML), and design points.
SWEEP = (0.002, 0.5, 0.85, 0.88, 0.9, 0.95)
#: Burst-rule variants of the ablation: AutoscaleConfig updates over the scenario's default.
ABLATION = {
    "off (before 2026-12-01)": {"burst_headroom": 0.0, "forecast": False},
    "forecast only": {"burst_headroom": 0.0, "forecast": True},
    "forecast only, min growth 0.1": {"burst_headroom": 0.0, "forecast": True,
                                      "forecast_min_growth": 0.1},
    "head-room 0.1": {"burst_headroom": 0.1, "forecast": False},
    "head-room 0.15": {"burst_headroom": 0.15, "forecast": False},
    "head-room 0.2 (default)": {},
    "head-room 0.2 + forecast": {"forecast": True},
}


def scenario_for(fleet: dict[str, int], days: float, catalog: GpuCatalog | None = None) -> Scenario:
    catalog = catalog or GpuCatalog.default()
    return Scenario(catalog=catalog, fleet=fleet,
                    training=default_training(fleet, days, EMBEDDED_SEED, catalog))


def run_case(sc: Scenario, trace) -> tuple[dict, dict, float]:  # noqa: ANN001 - Trace
    results, summaries, secs = {}, {}, 0.0
    for mode in MODES:
        t0 = time.perf_counter()
        results[mode] = simulate(sc, trace, mode=mode)
        if mode == "policy":
            secs = time.perf_counter() - t0
        summaries[mode] = summarize(results[mode])
    blind = sc.model_copy(update={"observe_nodes": False})
    summaries["policy-node-blind"] = summarize(simulate(blind, trace, mode="policy"))
    return results, summaries, secs


def cases(skip_speed: bool) -> dict:
    """Each case's trace peaks at a share of its own fleet's peak decode capacity (the embedded
    default: ``EMBEDDED_PEAK_LOAD``), so a case keeps its load whatever the catalog's curves."""
    cat = GpuCatalog.default()
    writeup = cat.with_named_curve("h200", "writeup").with_named_curve("rtx5090", "writeup")
    small = {"h200": 32, "rtx5090": 32}
    mixed = {"h200": 48, "rtx5090": 8, "rtx6000pro": 8}

    def peak(share: float, fleet: dict, catalog: GpuCatalog = cat) -> float:
        return peak_rps_for(share, catalog, fleet)

    d = EMBEDDED_DAYS
    out = {
        "default": (small, diurnal(d, peak_rps=peak(EMBEDDED_PEAK_LOAD, small), seed=EMBEDDED_SEED), d, None),
        "bursty": (small, diurnal(d, peak_rps=peak(0.225, small), burst_per_day=30, burst_gain=(1.4, 2.2),
                                  burst_minutes=(1, 8), seed=3), d, None),
        "flat": (small, diurnal(d, peak_rps=peak(0.2, small), trough_ratio=0.6, seed=5), d, None),
        "multi-day": (mixed, diurnal(7.0, peak_rps=peak(EMBEDDED_PEAK_LOAD, mixed), seed=11,
                                     peak_hour=9.0), 7.0, None),
        "writeup-curves": (small, diurnal(d, peak_rps=peak(EMBEDDED_PEAK_LOAD, small, writeup),
                                          seed=EMBEDDED_SEED), d, writeup),
    }
    if not skip_speed:
        big = {"h200": 256, "rtx5090": 192, "rtx6000pro": 64}
        out["speed"] = (big, diurnal(7.0, peak_rps=peak(EMBEDDED_PEAK_LOAD, big), seed=13), 7.0, None)
    return out


def case_table() -> Table:
    table = Table(title="ttsfleet simulate: static-warm / inference-only / policy (inference + fill)")
    for col in ("case", "GPUs", "days", "GPU-busy static / inf-only / policy", "allocated (policy)",
                "load-weighted (policy)", "p99 TTFA ms static / inf-only / policy",
                "SLO min inf-only / policy", "429 % inf-only / policy", "fill lost %",
                "training wait s inf-only / policy / node-blind", "targets", "policy run s"):
        table.add_column(col, justify="right")
    return table


def add_row(table: Table, name: str, fleet: dict, days: float, s: dict, tg: dict, secs: float) -> None:
    b = {m: s[m]["utilization"]["overall"] for m in MODES}
    inf = {m: s[m]["inference"] for m in MODES}
    table.add_row(
        name, str(sum(fleet.values())), f"{days:g}",
        " / ".join(f"{b[m]['gpu_busy']:.1%}" for m in MODES),
        f"{b['policy']['allocated_busy']:.1%}", f"{b['policy']['load_weighted']:.1%}",
        " / ".join(f"{inf[m]['ttfa_p99_ms']:.0f}" for m in MODES),
        f"{inf['inference-only']['slo_violation_minutes']} / {inf['policy']['slo_violation_minutes']}",
        f"{inf['inference-only']['rejected_pct']:.2f} / {inf['policy']['rejected_pct']:.2f}",
        f"{s['policy']['fill']['lost_pct']:.3f}",
        " / ".join(f"{s[m]['training']['mean_wait_s']:.0f}"
                   for m in ("inference-only", "policy", "policy-node-blind")),
        f"{sum(tg.values())}/{len(tg)}", f"{secs:.1f}")


def sweep(fleet: dict, trace, days: float) -> dict:  # noqa: ANN001 - Trace
    out = {}
    base = scenario_for(fleet, days)
    for f in SWEEP:
        sc = base.model_copy(update={"fill": FillWorkload(busy_fraction=dict.fromkeys(fleet, f))})
        s = summarize(simulate(sc, trace, mode="policy"))
        out[str(f)] = {"gpu_busy": s["utilization"]["overall"]["gpu_busy"],
                       "gpu_busy_by": s["utilization"]["overall"]["gpu_busy_by"],
                       "load_weighted": s["utilization"]["overall"]["load_weighted"]}
    return out


def ablation(all_cases: dict) -> dict:
    """The burst rules on and off, on the bursty and default cases."""
    out: dict = {}
    for case in ("bursty", "default"):
        fleet, trace, days, catalog = all_cases[case]
        base = scenario_for(fleet, days, catalog)
        for name, update in ABLATION.items():
            sc = base.model_copy(update={"autoscale": base.autoscale.model_copy(update=update)})
            runs = {m: summarize(simulate(sc, trace, mode=m)) for m in ("inference-only", "policy")}
            row = {"autoscale": sc.autoscale.model_dump(include={
                "burst_headroom", "forecast", "forecast_min_growth"})}
            for m, r in runs.items():
                row[m] = {"gpu_busy": r["utilization"]["overall"]["gpu_busy"],
                          "load_weighted": r["utilization"]["overall"]["load_weighted"],
                          "ttfa_p99_ms": r["inference"]["ttfa_p99_ms"],
                          "slo_violation_minutes": r["inference"]["slo_violation_minutes"],
                          "rejected_pct": r["inference"]["rejected_pct"],
                          "fill_lost_pct": r["fill"]["lost_pct"],
                          "training_mean_wait_s": r["training"]["mean_wait_s"],
                          "scale_events": r["inference"]["scale_events"]}
            out.setdefault(case, {})[name] = row
    return out


def nodes_without_burst_rules(all_cases: dict) -> dict:
    """The 512-GPU case with the burst rules off (the autoscaler of 2026-11-30): training wait
    without fill, and with fill node-aware and node-blind."""
    fleet, trace, days, catalog = all_cases["speed"]
    base = scenario_for(fleet, days, catalog)
    sc = base.model_copy(update={"autoscale": base.autoscale.model_copy(update=ABLATION[
        "off (before 2026-12-01)"])})
    runs = {"inference-only": simulate(sc, trace, mode="inference-only"),
            "policy": simulate(sc, trace, mode="policy"),
            "policy-node-blind": simulate(sc.model_copy(update={"observe_nodes": False}), trace,
                                          mode="policy")}
    return {m: {"training_mean_wait_s": summarize(r)["training"]["mean_wait_s"],
                "training_jobs": summarize(r)["training"]["jobs_started"],
                "gpu_busy": summarize(r)["utilization"]["overall"]["gpu_busy"]}
            for m, r in runs.items()}


def ablation_table(ab: dict) -> Table:
    t = Table(title="burst rules: inference-only / policy")
    for col in ("case", "variant", "p99 TTFA ms", "SLO min", "GPU-busy", "load-weighted (policy)",
                "fill lost %", "training wait s"):
        t.add_column(col, justify="right")
    for case, rows in ab.items():
        for name, row in rows.items():
            a, b = row["inference-only"], row["policy"]
            t.add_row(case, name, f"{a['ttfa_p99_ms']:.0f} / {b['ttfa_p99_ms']:.0f}",
                      f"{a['slo_violation_minutes']} / {b['slo_violation_minutes']}",
                      f"{a['gpu_busy']:.1%} / {b['gpu_busy']:.1%}", f"{b['load_weighted']:.1%}",
                      f"{b['fill_lost_pct']:.2f}",
                      f"{a['training_mean_wait_s']:.0f} / {b['training_mean_wait_s']:.0f}")
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).parent))
    ap.add_argument("--skip-speed", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    console = Console(width=220)
    results = {}
    table = case_table()
    for name, (fleet, trace, days, catalog) in cases(args.skip_speed).items():
        console.print(f"[dim]running {name} …[/dim]")
        sc = scenario_for(fleet, days, catalog)
        runs, s, secs = run_case(sc, trace)
        tg = check_targets(s["policy"], s["inference-only"])
        results[name] = {"fleet": fleet, "days": days, "trace_seconds": trace.seconds,
                         "h200_curve": sc.catalog.get("h200").capacity.source if "h200" in fleet else None,
                         "runs": s, "targets": tg, "policy_run_seconds": round(secs, 2)}
        if name == "default":
            plot([(m, runs[m]) for m in MODES], out / "default-run.png")
        add_row(table, name, fleet, days, s, tg, secs)
    console.print(table)
    fleet, trace, days, _ = cases(True)["default"]
    sens = sweep(fleet, trace, days)
    st = Table(title="default case, policy run: GPU-busy by fill busy fraction")
    for col in ("fill busy fraction", "GPU-busy", "of it fill", "load-weighted"):
        st.add_column(col, justify="right")
    for f, v in sens.items():
        st.add_row(f, f"{v['gpu_busy']:.1%}", f"{v['gpu_busy_by']['fill']:.1%}", f"{v['load_weighted']:.1%}")
    console.print(st)
    console.print("[dim]running the burst-rule ablation …[/dim]")
    ab = ablation(cases(True))
    console.print(ablation_table(ab))
    nodes = {}
    if not args.skip_speed:
        console.print("[dim]running the 512-GPU case without burst rules, node-aware and node-blind …[/dim]")
        nodes = nodes_without_burst_rules(cases(False))
        nt = Table(title="speed case, burst rules off: training wait")
        for col in ("run", "training mean wait s", "jobs", "GPU-busy"):
            nt.add_column(col, justify="right")
        for m, v in nodes.items():
            nt.add_row(m, f"{v['training_mean_wait_s']:.1f}", str(v["training_jobs"]), f"{v['gpu_busy']:.1%}")
        console.print(nt)
    stamp = dt.date.today().isoformat()
    doc = {"date": stamp, "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                      "python": platform.python_version(),
                                      "load_average_1m": round(os.getloadavg()[0], 2)},
           "note": "policy run wall time is single-threaded Python on a shared 2-core machine",
           "fill_busy_fraction_default": FILL_BUSY_FRACTION,
           "results": results, "fill_busy_sweep_default_case": sens, "burst_rule_ablation": ab,
           "speed_case_burst_rules_off_nodes": nodes}
    path = out / f"results-{stamp}.json"
    path.write_text(json.dumps(doc, indent=2))
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
