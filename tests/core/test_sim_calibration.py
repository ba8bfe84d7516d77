"""The traces' load calibration: the solver, and the benchmark's shares against their record.

The premise the simulator is read against — the inference-only fleet at ~50% GPU-busy, the 40-60%
band ``check_targets`` judges, fill raising it towards 90%+ — holds only for the curves, sizing and
traces the shares were solved on (ttsfleet/sim/calibrate.py). These tests fail when that drifts:
the embedded default trace is run (one day of it, inference-only) and every benchmark case's share
and inputs are compared with benchmarks/simulate/calibrate_load.py's record.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ttsfleet.catalog import GpuCatalog
from ttsfleet.sim.calibrate import (
    BUSY_TOLERANCE,
    SHARE_STEP,
    TARGET_INFERENCE_ONLY_BUSY,
    calibrate_peak_load,
    inference_only_run,
    peak_share_limit,
    solve_share,
)
from ttsfleet.sim.scenario import DEFAULT_FLEET, Scenario, default_training
from ttsfleet.sim.trace import EMBEDDED_DAYS, EMBEDDED_PEAK_LOAD, EMBEDDED_SEED, diurnal, peak_rps_for

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "simulate"
BAND = (0.40, 0.60)


def _on_grid(s: float) -> bool:
    return abs(s / SHARE_STEP - round(s / SHARE_STEP)) < 1e-6


def test_solver_returns_a_share_it_ran_within_tolerance():
    calls: list[float] = []

    def busy(s: float) -> float:  # a training floor, then roughly proportional, slightly concave
        calls.append(s)
        return 0.035 + 0.9 * s - 0.1 * s * s

    cal = solve_share(busy, 0.3)
    assert cal.converged and abs(cal.busy - TARGET_INFERENCE_ONLY_BUSY) <= BUSY_TOLERANCE
    assert cal.busy == busy(cal.share) and cal.share in [s for s, _ in cal.runs]
    assert all(_on_grid(s) for s, _ in cal.runs) and len(cal.runs) <= 4
    assert cal.runs[0] == (0.3, busy(0.3))  # the first run is the starting share's ("before")
    assert solve_share(busy, 0.3) == cal  # the same path every time
    above = solve_share(busy, 0.9)  # from above too
    assert above.converged and above.runs[0][1] > TARGET_INFERENCE_ONLY_BUSY


def test_solver_says_when_the_target_is_out_of_reach_or_jumped_over():
    low = solve_share(lambda s: 0.2 * s, 0.3)  # even share 1 reads 20%
    assert not low.converged and low.share == 1.0
    step = solve_share(lambda s: 0.3 if s < 0.4 else 0.7, 0.1, max_runs=30)  # none reads 50%
    assert not step.converged and {0.399, 0.4} <= {s for s, _ in step.runs}
    with pytest.raises(ValueError):
        solve_share(lambda s: s, 0.3, target=1.5)


def test_peak_share_limit_is_where_the_peak_minute_fills_the_fleet():
    cat, fleet = GpuCatalog.default(), {"h200": 8}
    capacity = 8 * cat.get("h200").capacity.peak_frames_per_s

    def trace_at(s: float):
        return diurnal(0.1, peak_rps=peak_rps_for(s, cat, fleet), seed=1)

    limit = peak_share_limit(trace_at, cat, fleet)
    assert _on_grid(limit)
    assert trace_at(limit).peak_frames_per_s() <= capacity
    assert trace_at(limit + SHARE_STEP).peak_frames_per_s() > capacity


def test_calibration_on_a_tiny_fleet_lands_its_inference_only_run_on_the_target():
    cat, fleet = GpuCatalog.default(), {"h200": 8}
    sc = Scenario(catalog=cat, fleet=fleet)

    def trace_at(s: float):
        return diurnal(0.25, peak_rps=peak_rps_for(s, cat, fleet), seed=2, peak_hour=3.0)

    cal = calibrate_peak_load(sc, trace_at, 0.2)
    assert not cal.capped and cal.solved.converged
    assert cal.share == cal.solved.share <= cal.limit
    assert inference_only_run(sc, trace_at(cal.share))["gpu_busy"] == cal.busy  # a measurement, reproducible
    assert abs(cal.busy - TARGET_INFERENCE_ONLY_BUSY) <= BUSY_TOLERANCE


def test_embedded_default_trace_keeps_inference_only_near_half_the_fleet():
    """`ttsfleet simulate` with no options: its inference-only run reads inside the band. One day of
    the embedded trace (the 3-day run reads within ~3 points of it: the record's 49.6%)."""
    cat = GpuCatalog.default()
    tr = diurnal(EMBEDDED_DAYS, peak_rps=peak_rps_for(EMBEDDED_PEAK_LOAD, cat, DEFAULT_FLEET),
                 seed=EMBEDDED_SEED).window(0, 86400)
    sc = Scenario(catalog=cat, fleet=DEFAULT_FLEET,
                  training=default_training(DEFAULT_FLEET, 1.0, EMBEDDED_SEED, cat))
    busy = inference_only_run(sc, tr)["gpu_busy"]
    assert BAND[0] <= busy <= BAND[1], f"inference-only {busy:.1%}: run calibrate_load.py again"


@pytest.fixture(scope="module")
def bench_cases():
    sys.path.insert(0, str(BENCH))
    try:
        import cases
    finally:
        sys.path.remove(str(BENCH))
    return cases


def _record() -> dict:
    files = sorted(BENCH.glob("load-calibration-*.json"))
    assert files, "no load-calibration record: run benchmarks/simulate/calibrate_load.py"
    return json.loads(files[-1].read_text())


def _same_inputs(now: dict, recorded: dict) -> bool:
    now = json.loads(json.dumps(now))  # tuples as lists, as the record holds them
    key = "trace_at_share_1"  # figures of float arrays: equal to rounding
    return ({k: v for k, v in now.items() if k != key} == {k: v for k, v in recorded.items() if k != key}
            and now[key] == pytest.approx(recorded[key], rel=1e-9))


def _stepped_at_the_grid(solved: dict) -> bool:
    """A case whose inference-only busy jumps over the tolerance band between two neighbouring
    shares of the solver's grid (azure-conv-1h on 2026-12-04: 48.5 % at 0.261, 50.7 % at 0.262)
    cannot converge; it is solved to the grid when both neighbours were run, they straddle the
    target, and the share taken is the nearer of the two."""
    runs = {round(r["share"], 3): r["inference_only_busy"] for r in solved["runs"]}
    share = round(solved["share"], 3)
    for other in (round(share - 0.001, 3), round(share + 0.001, 3)):
        if other in runs:
            pair = (runs[share], runs[other])
            straddle = min(pair) < solved["target"] < max(pair)
            nearer = abs(runs[share] - solved["target"]) <= abs(runs[other] - solved["target"])
            if straddle and nearer:
                return True
    return False


def test_benchmark_cases_run_at_their_recorded_calibration(bench_cases):
    """Every calibrated case's share is the record's, the record read inside the band (or the case
    is capped at its peak-minute limit, computed again here), and the record was solved on today's
    curves, sizing and traces: a change to any of them fails here until calibrate_load.py is re-run."""
    rec = _record()
    assert (rec["target"], rec["tolerance"]) == (TARGET_INFERENCE_ONLY_BUSY, BUSY_TOLERANCE)
    assert bench_cases.PEAK_LOAD["default"] == EMBEDDED_PEAK_LOAD
    pub, _missing = bench_cases.public()
    cases = [*bench_cases.synthetic(False), *pub]
    checked = 0
    for case in cases:
        row = rec["cases"][case.name]
        assert row["calibrated"] == case.calibrated, case.name
        assert case.peak_load == row["share"], (case.name, case.peak_load, row["share"])
        if not case.calibrated:
            continue
        assert case.name in bench_cases.PEAK_LOAD
        assert _same_inputs(bench_cases.calibration_inputs(case), row["inputs"]), (
            f"{case.name}: curves, sizing or trace changed since the record; run calibrate_load.py")
        cat = case.catalog or GpuCatalog.default()
        limit = peak_share_limit(case.trace_at, cat, case.fleet)
        assert row["peak_share_limit"] == limit, case.name
        if row["capped_at_peak_limit"]:
            assert case.peak_load == limit < row["solved"]["share"], case.name
        else:
            solved = row["solved"]
            assert solved["converged"] or _stepped_at_the_grid(solved), case.name
            assert case.peak_load == solved["share"], case.name
            assert BAND[0] <= row["inference_only_busy"] <= BAND[1], case.name
        checked += 1
    assert checked >= len(bench_cases.SYNTHETIC)
