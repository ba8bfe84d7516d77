"""Before/after: the benchmark's cases through an older revision of the simulator and this one.

Run:  python -P benchmarks/simulate/before_after.py [--before 398c193] [--cases default,bursty,...]
                                                    [--suffix b]
Writes before-after-<date><suffix>.json beside this file and prints the table (fill lost GPU-hours by
cause, admissions and evictions per hour, GPU-busy, p99 time to first audio).

The older revision's ``ttsfleet`` package is extracted with ``git archive`` and run in a child
process on the very same traces (saved as arrays; a public trace's requests replayed exactly,
as this revision does). The older code has no warm-up, so one-hour cases are compared cold
(from the first minute's steady state) on both sides; this revision's warm-up figures (what
the benchmark records) are added beside them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def child(src: str, npz: str, fleet: str, writeup: bool, days: float) -> None:
    """Run in the older tree: inference-only and policy summaries of one case, as JSON."""
    sys.path.insert(0, src)
    import numpy as np

    from ttsfleet.catalog import GpuCatalog
    from ttsfleet.sim.engine import simulate
    from ttsfleet.sim.scenario import Scenario, default_training
    from ttsfleet.sim.summary import summarize
    from ttsfleet.sim.trace import EMBEDDED_SEED, Trace

    d = np.load(npz)
    counts = d["counts"]

    class Replayed(Trace):  # the requests of a public trace exactly, as the new reader replays them
        def arrivals(self, seed: int) -> np.ndarray:
            return counts.astype(np.float64) if len(counts) else super().arrivals(seed)

    cat = GpuCatalog.default()
    if writeup:
        cat = cat.with_named_curve("h200", "writeup").with_named_curve("rtx5090", "writeup")
    fl = json.loads(fleet)
    sc = Scenario(catalog=cat, fleet=fl, training=default_training(fl, days, EMBEDDED_SEED, cat))
    tr = Replayed(rate=d["rate"], mean_frames=d["mean_frames"], name="case")
    print(json.dumps({m: summarize(simulate(sc, tr, mode=m)) for m in ("inference-only", "policy")}))


def brief(s: dict) -> dict:
    """The before/after figures of one run (either revision's summary)."""
    f, hours = s["fill"], s["duration_h"] or 1.0
    return {"gpu_busy": s["utilization"]["overall"]["gpu_busy"],
            "ttfa_p99_ms": s["inference"]["ttfa_p99_ms"],
            "slo_violation_minutes": s["inference"]["slo_violation_minutes"],
            "fill_gpu_hours_held": f["gpu_hours_held"], "fill_lost_pct": f["lost_pct"],
            "fill_lost_by_h": f["lost_by_h"],
            "admissions_per_h": round(f["admissions"] / hours, 1),
            "evictions_per_h": round((f["evictions"] + f["preemptions_by_scheduler"]) / hours, 1),
            "evicted_while_starting": f["evicted_while_starting"]}


def main() -> None:  # noqa: C901 - one linear script
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default="398c193", help="git revision of the 'before' code")
    ap.add_argument("--cases", default="default,bursty,flat,multi-day,writeup-curves,azure-code-1h,"
                                       "azure-code-1h-writeup,azure-conv-1h,mooncake-conv-1h")
    ap.add_argument("--suffix", default="", help="appended to the record's date (a second record "
                                                  "of the day)")
    ap.add_argument("--child", nargs=5, metavar=("SRC", "NPZ", "FLEET", "WRITEUP", "DAYS"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        src, npz, fleet, writeup, days = args.child
        child(src, npz, fleet, writeup == "1", float(days))
        return
    sys.path.insert(0, str(HERE))
    from bench_simulate import colocated, scenario_for
    from cases import public, save_trace, synthetic

    from ttsfleet.sim.engine import simulate
    from ttsfleet.sim.summary import summarize

    pub, missing = public()
    cases = {c.name: c for c in [*synthetic(True), *pub] if c.name in args.cases.split(",")}
    out: dict = {"date": dt.date.today().isoformat(), "before": args.before,
                 "after": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                         capture_output=True, text=True).stdout.strip() + " + worktree",
                 "machine": "2-core CPU VM (shared)", "skipped": missing, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "before"
        src.mkdir()
        tar = subprocess.run(["git", "-C", str(ROOT), "archive", args.before, "ttsfleet"],
                             capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=tar, check=True)
        for name, case in cases.items():
            print(f"running {name} …", flush=True)
            npz = Path(tmp) / f"{name}.npz"
            save_trace(case, npz)
            res = subprocess.run([sys.executable, "-P", __file__, "--child", str(src), str(npz),
                                  json.dumps(case.fleet), "1" if case.catalog else "0",
                                  str(case.days)], capture_output=True, text=True, check=True)
            before = json.loads(res.stdout)
            sc = scenario_for(case)
            row = {"before": {m: brief(s) for m, s in before.items()},
                   "after": {"policy": brief(summarize(simulate(sc, case.trace))),
                             "policy-colocated": brief(summarize(simulate(colocated(sc), case.trace)))}}
            if case.warmup_s:
                row["after_warm"] = {
                    "inference-only": brief(summarize(simulate(sc, case.trace, mode="inference-only",
                                                               warmup_s=case.warmup_s))),
                    "policy": brief(summarize(simulate(sc, case.trace, warmup_s=case.warmup_s))),
                    "policy-colocated": brief(summarize(simulate(colocated(sc), case.trace,
                                                                 warmup_s=case.warmup_s)))}
            out["cases"][name] = row
    path = HERE / f"before-after-{out['date']}{args.suffix}.json"
    path.write_text(json.dumps(out, indent=2))
    print_table(out)
    print(f"wrote {path}")


def print_table(doc: dict) -> None:
    """The before/after table as Markdown (what the README records)."""
    print("| case | run | GPU-busy | p99 TTFA ms | fill lost % | lost GPU-h restarts / stopping / "
          "abandoned / checkpoints | admissions / evictions per h | evicted while starting |")
    print("|---|---|---|---|---|---|---|---|")
    for name, row in doc["cases"].items():
        runs = [("before", row["before"]["policy"]), ("after", row["after"]["policy"]),
                ("after, co-located", row["after"]["policy-colocated"])]
        if "after_warm" in row:
            runs += [("after, warm", row["after_warm"]["policy"]),
                     ("after, warm, co-located", row["after_warm"]["policy-colocated"])]
        for label, r in runs:
            lost = " / ".join(f"{v:.2f}" for v in r["fill_lost_by_h"].values())
            print(f"| {name} | {label} | {r['gpu_busy']:.1%} | {r['ttfa_p99_ms']:.0f} | "
                  f"{r['fill_lost_pct']:.2f} | {lost} | {r['admissions_per_h']:.1f} / "
                  f"{r['evictions_per_h']:.1f} | {r['evicted_while_starting']} |")


if __name__ == "__main__":
    if os.environ.get("PYTHONSAFEPATH") is None and sys.flags.safe_path is False:
        print("run with python -P (the repository's operator/ folder shadows the standard library)",
              file=sys.stderr)
    main()
