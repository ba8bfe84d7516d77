"""Solve each case's peak load so its inference-only run reads 50% GPU-busy; record the runs.

Run:  python -P benchmarks/simulate/calibrate_load.py [--cases default,bursty,...] [--suffix b]
Writes load-calibration-<date><suffix>.json beside this file and prints the table and the
`PEAK_LOAD` lines for cases.py (the default case's share is `EMBEDDED_PEAK_LOAD` in
ttsfleet/sim/trace.py). A few minutes on a 2-core machine (three or four inference-only runs a case;
the 512-GPU, 7-day case is most of it).

Why: a case's load is a share of its fleet's peak decode capacity, and what that share means for the
inference-only fleet moves with the served curve and the replica sizing (ttsfleet/sim/calibrate.py
says how, and how the solver works). Each solve starts from the share the case had before it was
calibrated (the hand-chosen shares of 2026-12-01, `BEFORE`), so the first run of each case is the
"before" figure, and the path, and so the answer, are the same on every run of this script.

The share taken is the solved one, or the largest whose peak minute the fleet carries at its peak where
that is lower (`peak_share_limit`; the record keeps both, and the inference-only run at each).

The record also holds what the solution depends on (the curves, the sizing, a digest of each
trace at share 1): tests/core/test_sim_calibration.py compares them with the code's and fails when
they part, i.e. when this script is due again. The azure-code cases keep issue 24's setup and are
measured at it, not solved (cases.py says why).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # cases.py, bench_simulate.py beside this file

from bench_simulate import scenario_for  # noqa: E402
from cases import PEAK_LOAD, calibration_inputs, public, synthetic  # noqa: E402
from ttsfleet.inference.bench import machine  # noqa: E402

from ttsfleet.sim.calibrate import (  # noqa: E402
    BUSY_TOLERANCE,
    SHARE_STEP,
    TARGET_INFERENCE_ONLY_BUSY,
    calibrate_peak_load,
    inference_only_run,
)

#: The shares before calibration (chosen by hand on 2026-12-01's curve and 16 in flight): the
#: solver's starting points.
BEFORE = {"default": 0.3, "bursty": 0.225, "flat": 0.2, "multi-day": 0.3, "writeup-curves": 0.3,
          "speed": 0.3, "azure-conv-1h": 0.3, "mooncake-conv-1h": 0.3}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=",".join(list(PEAK_LOAD) + ["azure-code-1h",
                                                                   "azure-code-1h-writeup"]))
    ap.add_argument("--suffix", default="", help="appended to the record's date (a second record "
                                                  "of the day)")
    args = ap.parse_args()
    wanted = args.cases.split(",")
    pub, missing = public(peak_load=BEFORE)  # built at the starting shares, solved from there
    cases = {c.name: c for c in [*synthetic("speed" not in wanted, BEFORE), *pub] if c.name in wanted}
    for m in missing:
        print(f"skipping {m}")
    out: dict = {}
    print("| case | GPUs | peak load before → solved (peak-minute limit) | inference-only GPU-busy before "
          "→ solved | runs | taken: share, GPU-busy, p99 TTFA ms, SLO-violation min, 429 % | s |")
    print("|---|---|---|---|---|---|---|")
    for name, case in cases.items():
        sc = scenario_for(case)
        t0 = time.perf_counter()
        row = {"fleet": case.fleet, "warmup_s": case.warmup_s, "inputs": calibration_inputs(case)}
        if case.calibrated:
            cal = calibrate_peak_load(sc, case.trace_at, BEFORE[name], warmup_s=case.warmup_s)
            row.update(calibrated=True, peak_load_before=BEFORE[name], **cal.as_dict())
            sol = cal.solved
            text = (f"{BEFORE[name]:g} → {sol.share:g} ({cal.limit:g}) | {sol.runs[0][1]:.1%} → "
                    f"{sol.busy:.1%} | {len(sol.runs)}")
            inf = cal.inference
            share = f"{cal.share:g}" + (" (the limit)" if cal.capped else "")
        else:
            inf = inference_only_run(sc, case.trace, case.warmup_s)
            row.update(calibrated=False, share=case.peak_load, inference_only_busy=inf["gpu_busy"],
                       inference_only=inf,
                       why="issue 24's setup (cases.py): a trace this bursty cannot hold half the "
                           "fleet on average without its peak far past the fleet")
            text = "– | – | 1"
            share = f"{case.peak_load:g} (issue 24)"
        text += (f" | **{share}**, **{inf['gpu_busy']:.1%}**, {inf['ttfa_p99_ms']:.0f}, "
                 f"{inf['slo_violation_minutes']}, {inf['rejected_pct']:.2f}")
        row["seconds"] = round(time.perf_counter() - t0, 1)
        out[name] = row
        print(f"| {name} | {sum(case.fleet.values())} | {text} | {row['seconds']:.0f} |", flush=True)
    stamp = dt.date.today().isoformat()
    doc = {"date": stamp, "machine": machine(), "target": TARGET_INFERENCE_ONLY_BUSY,
           "tolerance": BUSY_TOLERANCE, "step": SHARE_STEP, "skipped": missing, "cases": out}
    path = HERE / f"load-calibration-{stamp}{args.suffix}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print("\ncases.py PEAK_LOAD (default: trace.py EMBEDDED_PEAK_LOAD):")
    for name, row in out.items():
        if row["calibrated"]:
            print(f'    "{name}": {row["share"]:g},')
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
