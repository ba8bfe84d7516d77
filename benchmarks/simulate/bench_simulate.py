"""Simulator benchmark: issues 16's and 24's targets on the synthetic and public-trace cases.

Run:  benchmarks/simulate/fetch_traces.sh   (once: the public one-hour traces, git-ignored)
      python -P benchmarks/simulate/bench_simulate.py [--out DIR] [--skip-speed] [--skip-ablations]
                                                      [--suffix b]
Prints tables and writes results-<date><suffix>.json and the default run's PNG (default-run.png).
The cases are in cases.py (their peak loads solved by calibrate_load.py); before_after.py compares
this code with an older revision.

Every case replays one trace through: static-warm (always-on fleet sized for the peak, no
autoscaling, no fill), inference-only (the autoscaler, no fill), the policy (autoscaler + fill,
the simulator's default scenario), the policy with co-location (``--colocate``: inference bound
beside fill instead of evicting it, at the measured interference cost) and the policy node-blind
(the adapter hides the node topology, as before 2026-12-01: the training wait fill causes).

Ablations (skip with --skip-ablations): the admission look-back on the bursty, flat, default and
azure-code-1h cases; the fill busy fraction on the default case; the autoscaler's burst rules on
the bursty and default cases; the 512-GPU case with the burst rules off, node-aware and blind;
the autoscaler's burst hold (off in the scenario) on every case but the 512-GPU one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cases.py beside this file

from cases import Case, public, synthetic  # noqa: E402
from ttsfleet.inference.bench import machine  # noqa: E402

from ttsfleet.catalog import GpuCatalog  # noqa: E402
from ttsfleet.sim.engine import simulate  # noqa: E402
from ttsfleet.sim.report import plot  # noqa: E402
from ttsfleet.sim.scenario import FILL_BUSY_FRACTION, FillWorkload, Scenario, default_training  # noqa: E402
from ttsfleet.sim.summary import check_targets, summarize  # noqa: E402
from ttsfleet.sim.trace import EMBEDDED_SEED  # noqa: E402

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
#: Admission look-backs of the ablation (s); the scenario's default is marked in the table.
LOOKBACKS = (0.0, 120.0, 300.0, 600.0)
#: Co-tenant yield delays of the co-location ablation (s).
YIELDS = (0.0, 1.0, 15.0)


def scenario_for(case: Case) -> Scenario:
    catalog = case.catalog or GpuCatalog.default()
    return Scenario(catalog=catalog, fleet=case.fleet,
                    training=default_training(case.fleet, case.days, EMBEDDED_SEED, catalog))


def colocated(sc: Scenario) -> Scenario:
    return sc.model_copy(update={"colocation": sc.colocation.model_copy(update={"enabled": True})})


def run_case(case: Case) -> tuple[dict, dict, float]:
    """The case's runs: results of the plotted modes, summaries of all, the policy run's seconds."""
    sc = scenario_for(case)
    results, summaries, secs = {}, {}, 0.0
    for mode in MODES:
        t0 = time.perf_counter()
        results[mode] = simulate(sc, case.trace, mode=mode, warmup_s=case.warmup_s)
        if mode == "policy":
            secs = time.perf_counter() - t0
        summaries[mode] = summarize(results[mode])
    summaries["policy-colocated"] = summarize(simulate(colocated(sc), case.trace, warmup_s=case.warmup_s))
    blind = sc.model_copy(update={"observe_nodes": False})
    summaries["policy-node-blind"] = summarize(simulate(blind, case.trace, warmup_s=case.warmup_s))
    return results, summaries, secs


def case_table() -> Table:
    table = Table(title="ttsfleet simulate: static-warm / inference-only / policy / policy co-located")
    for col in ("case", "GPUs", "hours", "GPU-busy static / inf-only / policy / co-located",
                "allocated (policy)", "load-weighted policy / co-located",
                "p99 TTFA ms inf-only / policy / co-located", "SLO min inf-only / policy / co-located",
                "fill lost % policy / co-located", "adm/h, ev/h policy (co-located)",
                "training wait s inf-only / policy / node-blind", "targets policy / co-located",
                "policy run s"):
        table.add_column(col, justify="right")
    return table


def add_row(table: Table, case: Case, s: dict, tg: dict, tg_co: dict, secs: float) -> None:
    runs = ("static-warm", "inference-only", "policy", "policy-colocated")
    b = {m: s[m]["utilization"]["overall"] for m in runs}
    inf = {m: s[m]["inference"] for m in runs}
    f, fc = s["policy"]["fill"], s["policy-colocated"]["fill"]
    table.add_row(
        case.name, str(sum(case.fleet.values())), f"{case.days * 24:g}",
        " / ".join(f"{b[m]['gpu_busy']:.1%}" for m in runs),
        f"{b['policy']['allocated_busy']:.1%}",
        f"{b['policy']['load_weighted']:.1%} / {b['policy-colocated']['load_weighted']:.1%}",
        " / ".join(f"{inf[m]['ttfa_p99_ms']:.0f}" for m in runs[1:]),
        " / ".join(str(inf[m]["slo_violation_minutes"]) for m in runs[1:]),
        f"{f['lost_pct']:.2f} / {fc['lost_pct']:.2f}",
        f"{f['admissions_per_h']:.1f}, {f['evictions_per_h']:.1f} ({fc['admissions_per_h']:.1f}, "
        f"{fc['evictions_per_h']:.1f})",
        " / ".join(f"{s[m]['training']['mean_wait_s']:.0f}"
                   for m in ("inference-only", "policy", "policy-node-blind")),
        f"{sum(tg.values())}/{len(tg)} / {sum(tg_co.values())}/{len(tg_co)}", f"{secs:.1f}")


def sweep(case: Case) -> dict:
    out = {}
    base = scenario_for(case)
    for f in SWEEP:
        sc = base.model_copy(update={"fill": FillWorkload(busy_fraction=dict.fromkeys(case.fleet, f))})
        s = summarize(simulate(sc, case.trace, mode="policy"))
        out[str(f)] = {"gpu_busy": s["utilization"]["overall"]["gpu_busy"],
                       "gpu_busy_by": s["utilization"]["overall"]["gpu_busy_by"],
                       "load_weighted": s["utilization"]["overall"]["load_weighted"]}
    return out


def _brief(r: dict) -> dict:
    return {"gpu_busy": r["utilization"]["overall"]["gpu_busy"],
            "allocated_busy": r["utilization"]["overall"]["allocated_busy"],
            "load_weighted": r["utilization"]["overall"]["load_weighted"],
            "ttfa_p99_ms": r["inference"]["ttfa_p99_ms"],
            "slo_violation_minutes": r["inference"]["slo_violation_minutes"],
            "rejected_pct": r["inference"]["rejected_pct"],
            "fill_lost_pct": r["fill"]["lost_pct"], "fill_lost_by_h": r["fill"]["lost_by_h"],
            "fill_gpu_hours_done": r["fill"]["gpu_hours_done"],
            "admissions_per_h": r["fill"]["admissions_per_h"],
            "evictions_per_h": r["fill"]["evictions_per_h"],
            "evicted_while_starting": r["fill"]["evicted_while_starting"],
            "training_mean_wait_s": r["training"]["mean_wait_s"],
            "scale_events": r["inference"]["scale_events"]}


def admission_ablation(cases: dict[str, Case]) -> dict:
    """The admission look-back (0: admission as before issue 24) on the churn-prone cases."""
    out: dict = {}
    for name in ("bursty", "flat", "default", "azure-code-1h"):
        if name not in cases:
            continue
        case = cases[name]
        base = scenario_for(case)
        for lb in LOOKBACKS:
            sc = base.model_copy(update={"fill_policy": base.fill_policy.model_copy(
                update={"admission_lookback_s": lb})})
            out.setdefault(name, {})[f"{lb:g}"] = _brief(summarize(simulate(sc, case.trace,
                                                                            warmup_s=case.warmup_s)))
    return out


def yield_ablation(cases: dict[str, Case]) -> dict:
    """How fast a co-tenant yields (not measured: 0 is the design, within a decode step)."""
    out: dict = {}
    for name in ("bursty", "azure-code-1h", "azure-conv-1h", "mooncake-conv-1h"):
        if name not in cases:
            continue
        case = cases[name]
        sc = colocated(scenario_for(case))
        for y in YIELDS:
            run = sc.model_copy(update={"colocation": sc.colocation.model_copy(update={"yield_s": y})})
            out.setdefault(name, {})[f"{y:g}"] = _brief(summarize(simulate(run, case.trace,
                                                                           warmup_s=case.warmup_s)))
    return out


def yield_table(ab: dict) -> Table:
    t = Table(title="co-location: co-tenant yield delay")
    for col in ("case", "yield s", "GPU-busy", "p99 TTFA ms", "SLO min", "fill lost %"):
        t.add_column(col, justify="right")
    for case, rows in ab.items():
        for y, r in rows.items():
            t.add_row(case, y, f"{r['gpu_busy']:.1%}", f"{r['ttfa_p99_ms']:.0f}",
                      str(r["slo_violation_minutes"]), f"{r['fill_lost_pct']:.2f}")
    return t


def burst_ablation(cases: dict[str, Case]) -> dict:
    """The burst rules on and off, on the bursty and default cases."""
    out: dict = {}
    for name in ("bursty", "default"):
        case = cases[name]
        base = scenario_for(case)
        for label, update in ABLATION.items():
            sc = base.model_copy(update={"autoscale": base.autoscale.model_copy(update=update)})
            row = {"autoscale": sc.autoscale.model_dump(include={
                "burst_headroom", "forecast", "forecast_min_growth"})}
            for m in ("inference-only", "policy"):
                row[m] = _brief(summarize(simulate(sc, case.trace, mode=m)))
            out.setdefault(name, {})[label] = row
    return out


#: The burst hold of the ablation (s): AutoscaleConfig.burst_hold_s, off in the scenario.
BURST_HOLD_S = 1800.0


def burst_hold_ablation(cases: dict[str, Case]) -> dict:
    """Every case but the 512-GPU one with the autoscaler's burst hold on (``burst_hold_s``: a
    panic's replicas kept warm while panics recur), inference-only and policy: what keeping them
    would change against the main runs (off)."""
    out: dict = {}
    for name, case in cases.items():
        if name == "speed":
            continue
        base = scenario_for(case)
        sc = base.model_copy(update={"autoscale": base.autoscale.model_copy(
            update={"burst_hold_s": BURST_HOLD_S})})
        out[name] = {m: _brief(summarize(simulate(sc, case.trace, mode=m, warmup_s=case.warmup_s)))
                     for m in ("inference-only", "policy")}
    return out


def burst_hold_table(ab: dict, results: dict) -> Table:
    t = Table(title=f"burst hold {BURST_HOLD_S:g} s vs off: inference-only / policy")
    for col in ("case", "GPU-busy inf-only off / hold", "GPU-busy policy off / hold",
                "p99 TTFA ms policy off / hold", "SLO min policy off / hold",
                "429 % policy off / hold", "fill lost % off / hold", "adm/h off / hold"):
        t.add_column(col, justify="right")
    for case, row in ab.items():
        off = {m: _brief(results[case]["runs"][m]) for m in ("inference-only", "policy")}
        a, b = off["policy"], row["policy"]
        t.add_row(case, f"{off['inference-only']['gpu_busy']:.1%} / {row['inference-only']['gpu_busy']:.1%}",
                  f"{a['gpu_busy']:.1%} / {b['gpu_busy']:.1%}",
                  f"{a['ttfa_p99_ms']:.0f} / {b['ttfa_p99_ms']:.0f}",
                  f"{a['slo_violation_minutes']} / {b['slo_violation_minutes']}",
                  f"{a['rejected_pct']:.2f} / {b['rejected_pct']:.2f}",
                  f"{a['fill_lost_pct']:.2f} / {b['fill_lost_pct']:.2f}",
                  f"{a['admissions_per_h']:.1f} / {b['admissions_per_h']:.1f}")
    return t


def nodes_without_burst_rules(case: Case) -> dict:
    """The 512-GPU case with the burst rules off (the autoscaler of 2026-11-30): training wait
    without fill, and with fill node-aware and node-blind."""
    base = scenario_for(case)
    sc = base.model_copy(update={"autoscale": base.autoscale.model_copy(update=ABLATION[
        "off (before 2026-12-01)"])})
    runs = {"inference-only": simulate(sc, case.trace, mode="inference-only"),
            "policy": simulate(sc, case.trace, mode="policy"),
            "policy-node-blind": simulate(sc.model_copy(update={"observe_nodes": False}), case.trace)}
    return {m: {"training_mean_wait_s": summarize(r)["training"]["mean_wait_s"],
                "training_jobs": summarize(r)["training"]["jobs_started"],
                "gpu_busy": summarize(r)["utilization"]["overall"]["gpu_busy"]}
            for m, r in runs.items()}


def admission_table(ab: dict, default_lb: float) -> Table:
    t = Table(title="admission look-back: policy runs")
    for col in ("case", "look-back s", "GPU-busy", "allocated", "p99 TTFA ms", "fill lost %",
                "lost GPU-h restarts / stopping / abandoned / checkpoints", "adm/h", "ev/h",
                "evicted starting"):
        t.add_column(col, justify="right")
    for case, rows in ab.items():
        for lb, r in rows.items():
            mark = " (default)" if float(lb) == default_lb else ""
            t.add_row(case, lb + mark, f"{r['gpu_busy']:.1%}", f"{r['allocated_busy']:.1%}",
                      f"{r['ttfa_p99_ms']:.0f}", f"{r['fill_lost_pct']:.2f}",
                      " / ".join(f"{v:.2f}" for v in r["fill_lost_by_h"].values()),
                      f"{r['admissions_per_h']:.1f}", f"{r['evictions_per_h']:.1f}",
                      str(r["evicted_while_starting"]))
    return t


def burst_table(ab: dict) -> Table:
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
    ap.add_argument("--skip-ablations", action="store_true")
    ap.add_argument("--suffix", default="", help="appended to the record's date (a second record "
                                                  "of the day: results-<date>b.json)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    console = Console(width=260)
    pub, missing = public()
    for m in missing:
        console.print(f"[yellow]skipping {m}[/yellow]")
    all_cases = {c.name: c for c in [*synthetic(args.skip_speed), *pub]}
    results = {}
    table = case_table()
    for name, case in all_cases.items():
        console.print(f"[dim]running {name} …[/dim]")
        runs, s, secs = run_case(case)
        tg = check_targets(s["policy"], s["inference-only"], **case.targets)
        tg_co = check_targets(s["policy-colocated"], s["inference-only"], **case.targets)
        sc = scenario_for(case)
        results[name] = {"fleet": case.fleet, "days": case.days, "trace_seconds": case.trace.seconds,
                         "warmup_s": case.warmup_s, "trace_source": case.source,
                         "peak_load": case.peak_load, "peak_load_calibrated": case.calibrated,
                         "target_thresholds": case.targets,
                         "h200_curve": (sc.catalog.get("h200").capacity.source
                                        if "h200" in case.fleet else None),
                         "runs": s, "targets": tg, "targets_colocated": tg_co,
                         "policy_run_seconds": round(secs, 2)}
        if name == "default":
            plot([(m, runs[m]) for m in MODES], out / "default-run.png")
        add_row(table, case, s, tg, tg_co, secs)
    console.print(table)
    doc = {"fill_busy_fraction_default": FILL_BUSY_FRACTION,
           "scenario_fill_policy": Scenario().fill_policy.model_dump(),
           "colocation": Scenario().colocation.model_dump(), "results": results,
           "skipped": missing}
    if not args.skip_ablations:
        console.print("[dim]running the admission look-back ablation …[/dim]")
        doc["admission_ablation"] = admission_ablation(all_cases)
        console.print(admission_table(doc["admission_ablation"],
                                      Scenario().fill_policy.admission_lookback_s))
        console.print("[dim]running the co-tenant yield ablation …[/dim]")
        doc["yield_ablation"] = yield_ablation(all_cases)
        console.print(yield_table(doc["yield_ablation"]))
        sens = sweep(all_cases["default"])
        st = Table(title="default case, policy run: GPU-busy by fill busy fraction")
        for col in ("fill busy fraction", "GPU-busy", "of it fill", "load-weighted"):
            st.add_column(col, justify="right")
        for f, v in sens.items():
            st.add_row(f, f"{v['gpu_busy']:.1%}", f"{v['gpu_busy_by']['fill']:.1%}",
                       f"{v['load_weighted']:.1%}")
        console.print(st)
        doc["fill_busy_sweep_default_case"] = sens
        console.print("[dim]running the burst-rule ablation …[/dim]")
        doc["burst_rule_ablation"] = burst_ablation(all_cases)
        console.print(burst_table(doc["burst_rule_ablation"]))
        console.print("[dim]running the burst-hold ablation …[/dim]")
        doc["burst_hold_ablation"] = burst_hold_ablation(all_cases)
        console.print(burst_hold_table(doc["burst_hold_ablation"], results))
        if "speed" in all_cases:
            doc["speed_case_burst_rules_off_nodes"] = nodes_without_burst_rules(all_cases["speed"])
    stamp = dt.date.today().isoformat()
    doc = {"date": stamp, "machine": machine(),
           "note": "policy run wall time is single-threaded Python on a shared 2-core machine", **doc}
    path = out / f"results-{stamp}{args.suffix}.json"
    path.write_text(json.dumps(doc, indent=2))
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
