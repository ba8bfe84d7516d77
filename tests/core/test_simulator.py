"""The simulator: same policy, measurable effects, conservation of GPU time, determinism."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.catalogs import B200_YAML
from tests.served_runs import SERVED_RUN, served_points
from ttsfleet.catalog import NAMED_CURVES, GpuCatalog
from ttsfleet.config import AutoscaleConfig, FillPolicyConfig
from ttsfleet.errors import UserError
from ttsfleet.sim.engine import build_pools, simulate
from ttsfleet.sim.fleet import Fleet
from ttsfleet.sim.scenario import FILL_BUSY_FRACTION, FillWorkload, Scenario, TrainingJob, parse_fleet
from ttsfleet.sim.summary import check_targets, summarize, ttfa_quantile
from ttsfleet.sim.trace import FRAMES_PER_AUDIO_SECOND, Trace, diurnal, load_csv
from ttsfleet.sim.traffic import UNMEASURED_DECODE_BUSY, busy_lut

FLEET = {"h200": 16, "rtx5090": 8}
#: The mechanics tests run on a fixed, named curve pair (the write-up's), so their request rates
#: keep their meaning when our served measurement (the catalog's default) moves.
WRITEUP = GpuCatalog.default().with_named_curve("h200", "writeup").with_named_curve("rtx5090", "writeup")
MECH = {"catalog": WRITEUP, "autoscale": Scenario.model_fields["autoscale"].default.model_copy(
    update={"target_in_flight_per_replica": 40})}


@pytest.fixture(scope="module")
def small_trace() -> Trace:
    # 8 hours of a small fleet ramping towards its daily peak, bursty
    return diurnal(0.34, peak_rps=200, burst_per_day=20, seed=3, peak_hour=6.0)


@pytest.fixture(scope="module")
def runs(small_trace):
    sc = Scenario(**MECH, fleet=FLEET, training=[TrainingJob(gpu_class="h200", nodes=1, submit_s=3600,
                                                     duration_s=3600)])
    return sc, {m: summarize(simulate(sc, small_trace, mode=m))
                for m in ("policy", "inference-only", "static-warm")}


def test_fill_raises_gpu_busy_without_hurting_inference(runs):
    _, r = runs
    pol, base = r["policy"], r["inference-only"]
    gain = pol["utilization"]["overall"]["gpu_busy"] - base["utilization"]["overall"]["gpu_busy"]
    assert gain > 0.2
    assert pol["utilization"]["overall"]["gpu_busy_by"]["fill"] > 0.2
    assert base["fill"]["gpu_hours_held"] == 0
    assert pol["inference"]["ttfa_p99_ms"] <= 1.05 * base["inference"]["ttfa_p99_ms"]
    assert pol["inference"]["frames"] == pytest.approx(base["inference"]["frames"], rel=0.01)
    t = check_targets(pol, base)
    assert t["lost_fill_le_1pct"] and t["p99_ttfa_within_5pct_of_inference_only"]


def test_fill_losses_count_restarts_stops_and_checkpoints(runs):
    sc, r = runs
    f = r["policy"]["fill"]
    lost = f["lost_by_h"]
    # every admission pays its start (20 s) unless evicted during it
    assert lost["restarts"] == pytest.approx(f["admissions"] * sc.fill.start_s / 3600, rel=0.05)
    assert lost["stopping"] > 0 and lost["abandoned"] > 0
    ovh = sc.fill.checkpoint_cost_s / sc.fill_policy.checkpoint_interval_s
    assert lost["checkpoints"] == pytest.approx(f["gpu_hours_held"] * ovh, rel=0.05)
    assert f["gpu_hours_lost"] == pytest.approx(sum(lost.values()), abs=2e-3)
    assert f["gpu_hours_done"] + f["gpu_hours_lost"] == pytest.approx(f["gpu_hours_held"], abs=0.1)


def test_three_utilization_figures_are_distinct_and_ordered(runs):
    _, r = runs
    o = r["policy"]["utilization"]["overall"]
    assert o["load_weighted"] < o["gpu_busy"] < o["allocated_busy"] <= 1.0
    assert sum(o["allocated"].values()) == pytest.approx(1.0, abs=1e-3)


def test_static_warm_holds_the_peak_fleet_and_never_scales(runs):
    _, r = runs
    st, base = r["static-warm"], r["inference-only"]
    assert st["inference"]["scale_events"] == {"up": 0, "down": 0}
    assert st["fill"]["admissions"] == 0
    o, ob = st["utilization"]["overall"], base["utilization"]["overall"]
    assert o["allocated"]["inference"] > ob["allocated"]["inference"] + 0.1
    # NVML calls a half-empty replica busy: the static fleet reads busier than its work
    assert o["gpu_busy"] > ob["gpu_busy"] and o["load_weighted"] < 0.5 * o["gpu_busy"]


def test_fill_busy_fraction_scales_fill_busy_only(small_trace):
    sc = Scenario(**MECH, fleet=FLEET)
    assert sc.fill.busy_for("h200") == FILL_BUSY_FRACTION
    lo = sc.model_copy(update={"fill": FillWorkload(busy_fraction={"h200": 0.4, "rtx5090": 0.4})})
    hi = sc.model_copy(update={"fill": FillWorkload(busy_fraction={"h200": 0.8, "rtx5090": 0.8})})
    a, b = (summarize(simulate(s, small_trace))["utilization"]["overall"] for s in (lo, hi))
    assert b["gpu_busy_by"]["fill"] == pytest.approx(2 * a["gpu_busy_by"]["fill"], rel=1e-3)
    assert a["allocated"] == b["allocated"] and a["gpu_busy_by"]["inference"] == b["gpu_busy_by"]["inference"]
    with pytest.raises(ValueError, match="busy fraction"):
        FillWorkload(busy_fraction={"h200": 1.5})


def test_replica_busy_follows_concurrency_not_one_request():
    measured_curve = GpuCatalog.default().get("h200").capacity
    curve = measured_curve.model_copy(update={"points": tuple(
        p.model_copy(update={"gpu_busy": None}) for p in measured_curve.points)})
    lut = busy_lut(curve, 64)
    assert lut[0] == 0.0
    # one request on average: empty e^-1 of the time, decoding otherwise
    assert lut[4] == pytest.approx((1 - np.exp(-1)) * UNMEASURED_DECODE_BUSY, rel=1e-6)
    assert lut[40 * 4] == pytest.approx(UNMEASURED_DECODE_BUSY, abs=1e-6)
    assert all(a <= b + 1e-12 for a, b in zip(lut, lut[1:], strict=False))
    # a curve with measured busy fractions is used as measured
    measured = curve.model_copy(update={"points": tuple(
        p.model_copy(update={"gpu_busy": 0.5}) for p in curve.points)})
    assert busy_lut(measured, 64)[40 * 4] == pytest.approx(0.5, abs=1e-6)


def test_scenario_sizing_is_the_config_default_on_the_served_curve():
    """The simulated deployment sizes replicas by AutoscaleConfig's default (one source of truth),
    and the premise it was derived on holds for the recorded served H200 run the built-in curve
    comes from (Scenario.autoscale): the limit is the largest measured concurrency that keeps
    real-time headroom (RTF p99 <= 0.5) with first audio p99 under the SLO, taken at 2026-12-01's
    margin (16 in flight of a ~25.5 SLO crossing)."""
    sc = Scenario()
    target = sc.autoscale.target_in_flight_per_replica
    assert target == AutoscaleConfig().target_in_flight_per_replica == 40
    h200 = sc.catalog.get("h200")
    slots = h200.serving.max_running_requests
    assert h200.capacity.max_concurrency == slots
    assert SERVED_RUN.name in h200.capacity.source
    points = served_points()
    assert sorted(points) == [p.concurrency for p in h200.capacity.points]
    limit = max(c for c, p in points.items()
                if p["rtf_p99"] <= 0.5 and p["ttfa_p99_s"] < sc.autoscale.ttfa_p99_slo_s)
    assert limit < slots  # the slots admit more than keeps headroom: the sizing, not the slots, binds
    assert target == round(limit * 16 / 25.5)


def test_measured_curve_path_and_the_named_writeup_curve(tmp_path):
    """The served benchmark's JSON replaces a curve (its own extra keys ignored, gpu_busy used);
    the write-up's curve stays selectable by name."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    ours = GpuCatalog.default().with_measured_file("h200", root / "benchmarks/inference_h200/baseline.json")
    assert ours.get("h200").capacity.peak_frames_per_s < 0.5 * 8006
    back = ours.with_named_curve("h200", "writeup")
    assert back.get("h200").capacity == NAMED_CURVES["writeup"]["h200"]
    with pytest.raises(KeyError, match="named curves"):
        ours.with_named_curve("h200", "nope")
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"source": "t", "points": [
        {"concurrency": 1, "frames_per_s": 100.0, "ttfa_s": 0.05, "gpu_busy": 0.6, "ttfa_p99_s": 0.1},
        {"concurrency": 64, "frames_per_s": 3000.0, "ttfa_s": 0.2, "gpu_busy": 0.9, "ttfa_p99_s": 0.4}]}))
    cat = GpuCatalog.default().with_measured_file("h200", bench)
    assert cat.get("h200").capacity.gpu_busy(64) == 0.9
    sc = Scenario(catalog=cat, fleet={"h200": 8})
    s = summarize(simulate(sc, diurnal(0.05, peak_rps=60, seed=2), mode="inference-only"))
    o = s["utilization"]["overall"]
    assert o["gpu_busy"] < 0.9 * o["allocated_busy"]  # busy as measured, not 100% per replica


def test_gpu_time_is_conserved_minute_by_minute(small_trace):
    r = simulate(Scenario(**MECH, fleet=FLEET), small_trace)
    s = r.minute_series
    total = s["alloc_inference"] + s["alloc_training"] + s["alloc_fill"] + s["alloc_idle"]
    assert np.allclose(total, sum(FLEET.values()))
    assert (s["alloc_idle"] >= -1e-9).all()  # never more pods than GPUs
    assert (s["busy"] <= total + 1e-9).all()
    assert sum(sum(h.values()) for h in r.holdings_s.values()) == pytest.approx(
        small_trace.seconds * sum(FLEET.values()))


def test_warm_start_is_steady_state():
    """Little's law at t=0 with seeded history: a flat trace gives a flat fleet from the start."""
    flat = Trace(rate=np.full(1800, 300.0), mean_frames=np.full(1800, 220.0), name="flat")
    sc = Scenario(**MECH, fleet=FLEET)
    r = simulate(sc, flat, mode="inference-only")
    reps = r.minute_series["replicas_h200"]
    # within one replica of the start throughout (Poisson arrivals around the ceiling)
    assert reps[0] >= 2 and np.abs(reps - reps[0]).max() <= 1
    s = summarize(r)
    assert s["inference"]["ttfa_p99_ms"] < 150


def test_deterministic(small_trace):
    sc = Scenario(**MECH, fleet=FLEET, seed=5)
    assert summarize(simulate(sc, small_trace)) == summarize(simulate(sc, small_trace))


def test_policy_knobs_drive_the_outcome(small_trace):
    """The simulator carries out the policy's decisions: change the policy, change the result."""
    base = Scenario(**MECH, fleet=FLEET)
    no_fill = base.model_copy(update={"fill_policy": FillPolicyConfig(max_fill_gpus=0)})
    assert summarize(simulate(no_fill, small_trace))["fill"]["admissions"] == 0
    headroom = base.model_copy(update={"fill_policy": FillPolicyConfig(min_free_gpus=3)})
    s = summarize(simulate(headroom, small_trace))
    assert s["utilization"]["overall"]["allocated"]["idle"] > 0.05


def test_training_takes_whole_nodes_and_preempts_fill(runs):
    _, r = runs
    pol = r["policy"]
    assert pol["training"]["jobs_started"] == 1
    assert pol["training"]["gpu_hours"] == pytest.approx(8.0, rel=0.02)  # one 8-GPU node, 1 h
    assert pol["fill"]["preemptions_by_scheduler"] >= 1


def _fleet(fill: FillWorkload | None = None, **kw) -> Fleet:
    sc = Scenario(fleet={"h200": 16}, fill=fill or FillWorkload(), **kw)
    return Fleet(sc, build_pools(sc))


def _run(f: Fleet, t0: int, t1: int) -> None:
    for t in range(t0, t1):
        f.run_events(t)
        f.schedule(t)


def test_eviction_to_bind_waits_for_stop_and_release():
    f = _fleet(FillWorkload(stop_s=3.0), release_s=2.0)
    cl, pool = f.classes["h200"], f.pools[0]
    assert f.admit_fill(0, "h200", 16) == 16 and cl.idle == 0
    _run(f, 0, 30)
    f.set_replicas(30, pool, 1)
    f.evict_fill(30, "h200", [next(iter(cl.fill_jobs))])
    _run(f, 30, 35)
    assert pool.pending == 1 and not pool.starting  # the GPU is not free before stop + release
    _run(f, 35, 36)
    assert len(pool.starting) == 1
    load = f.scenario.catalog.get("h200").model_load_s
    _run(f, 36, 35 + int(load))
    assert pool.traffic.ready == 0
    _run(f, 35 + int(load), 36 + int(load))
    assert pool.traffic.ready == 1


def test_nodes_pack_inference_and_leave_whole_nodes_for_training():
    f = _fleet()
    cl, pool = f.classes["h200"], f.pools[0]
    f.set_replicas(0, pool, 3)
    _run(f, 0, 1)
    assert sorted(n.inference for n in cl.nodes) == [0, 3]  # packed on one node
    f.push(1, f.on_train_submit, TrainingJob(gpu_class="h200", nodes=1, submit_s=1, duration_s=60))
    _run(f, 1, 2)
    assert cl.train_gpus == 8 and f.train_wait == [0.0]


def test_ttfa_quantile_spreads_a_queued_second():
    lo, hi, w = np.array([0.1, 0.1]), np.array([0.1, 1.1]), np.array([100.0, 100.0])
    # half the requests at 0.1 s, half spread over [0.1, 1.1]: the median is the first, p99 near 1.1
    assert ttfa_quantile(lo, hi, w, 0.5) == pytest.approx(0.1, abs=1e-4)
    assert ttfa_quantile(lo, hi, w, 0.75) == pytest.approx(0.6, abs=1e-4)
    assert ttfa_quantile(lo, hi, w, 0.99) == pytest.approx(1.08, abs=1e-4)


def test_pool_signal_is_the_p99_of_the_windows_requests():
    """As the operator's histogram deltas: a p99 over the requests since the last pass, not a max."""
    p = build_pools(Scenario(fleet={"h200": 8}))[0]
    p.window = [(0.1, 0.1, 99.0), (2.0, 2.0, 1.0)]
    assert p.take_window_p99() == 0.1 and p.window == []
    assert p.take_window_p99() is None
    p.window = [(0.1, 0.1, 99.0), (2.0, 2.0, 2.0)]
    assert p.take_window_p99() == 2.0
    p.window = [(0.1, 0.1, 50.0), (0.1, 1.1, 50.0)]  # a queued second spreads its requests
    assert p.take_window_p99() == pytest.approx(1.08, abs=1e-4)


def test_csv_trace(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("t,rate,mean_frames\n0,10,200\n60,20,150\n120,0,150\n")
    tr = load_csv(f)
    assert tr.seconds == 180
    assert tr.rate[59] == 10 and tr.rate[60] == 20 and tr.mean_frames[61] == 150
    f.write_text("t,rate,text_chars\n0,10,150\n60,0,150\n")
    # ~15 characters per second of speech
    assert load_csv(f).mean_frames[0] == pytest.approx(10 * FRAMES_PER_AUDIO_SECOND)
    f.write_text("t,rate\n0,10\n60,abc\n")
    with pytest.raises(UserError, match=r"t.csv:3: malformed"):
        load_csv(f)
    f.write_text("t,rate\n0,10\n60,-5\n")
    with pytest.raises(UserError, match="negative"):
        load_csv(f)
    f.write_text("time,load\n0,1\n")
    with pytest.raises(UserError, match="header"):
        load_csv(f)
    with pytest.raises(UserError, match="not found"):
        load_csv(tmp_path / "missing.csv")


def test_fleet_parsing():
    cat = GpuCatalog.default()
    assert parse_fleet("h200=4, rtx5090=2", cat) == {"h200": 4, "rtx5090": 2}
    for bad, msg in (("a100=4", "unknown GPU class"), ("h200=-1", ">= 0"), ("h200", "CLASS=COUNT"),
                     ("h200=x", "integer"), ("h200=0", "empty")):
        with pytest.raises(UserError, match=msg):
            parse_fleet(bad, cat)


def test_b200_added_by_one_catalog_file_runs_through_simulate(tmp_path):
    f = tmp_path / "b200.yaml"
    f.write_text(B200_YAML)
    cat = GpuCatalog.load(f)
    tr = diurnal(0.1, peak_rps=150, seed=1)
    sc = Scenario(catalog=cat, fleet={"b200": 8})
    assert [p.gpu_class for p in sc.pools] == ["b200"]
    s = summarize(simulate(sc, tr))
    assert s["fleet"] == {"b200": 8} and s["inference"]["frames"] > 0
    assert s["utilization"]["per_class"]["b200"]["gpu_busy"] > 0.5
    # the same through the CLI, and bad input is one line with exit 2
    cli = [sys.executable, "-P", "-m", "ttsfleet.cli", "simulate", "--catalog", str(f), "--days", "0.05",
           "--peak-rps", "100", "--no-plot", "--json", "--quiet"]
    p = subprocess.run([*cli, "--fleet", "b200=8"], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["runs"]["policy (inference + fill)"]["fleet"] == {"b200": 8}
    p = subprocess.run([*cli, "--fleet", "b200=8", "--measured", "h200=writeup", "--runs", "policy"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0 and set(json.loads(p.stdout)["runs"]) == {"policy (inference + fill)"}, p.stderr
    for bad, msg in ((["--fleet", "b300=8"], "unknown GPU class 'b300'"),
                     (["--fleet", "b200=8", "--measured", "b200=writeup"], "no 'writeup' curve for 'b200'"),
                     (["--fleet", "b200=8", "--fill-busy", "2"], "busy fraction"),
                     (["--fleet", "b200=8", "--runs", "cold"], "--runs")):
        p = subprocess.run([*cli, *bad], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1


def _scattered_fleet(observe_nodes: bool):
    """24 H200 (3 nodes) full of fill, 2 inference pods on node 0; the policy runs one pass
    that scales inference up by 3."""
    from ttsfleet.sim.adapter import Controllers, policy_step

    f = _fleet(observe_nodes=observe_nodes)
    f = Fleet(f.scenario.model_copy(update={"fleet": {"h200": 24}}), build_pools(f.scenario))
    cl, pool = f.classes["h200"], f.pools[0]
    f.bind_ready(pool, 2)
    # fill on every other GPU; node 0's (beside inference) have the most un-checkpointed work
    assert f.admit_fill(0, "h200", 22) == 22
    _run(f, 0, 100)
    for j in cl.fill_jobs.values():
        j.run_start = 50.0 if j.node.idx == 0 else 90.0  # 50 s vs 10 s since a checkpoint
    # 4 replicas' load with the scenario's 20% burst head-room: 5 replicas
    pool.traffic.in_flight = pool.traffic.in_flight_obs = 4 * pool.traffic.target
    policy_step(100.0, f, Controllers(), fill=True)
    return f, cl


def test_node_aware_adapter_evicts_fill_beside_inference_and_binds_inference_there():
    f, cl = _scattered_fleet(observe_nodes=True)
    stopping = [j for j in cl.fill_jobs.values() if j.state == "stopping"]
    assert len(stopping) == 3 and {j.node.idx for j in stopping} == {0}
    _run(f, 100, 110)
    assert [n.inference for n in cl.nodes] == [5, 0, 0]  # nodes 1 and 2 stay whole for training
    # node-blind, the youngest checkpoints (nodes 1 and 2) are evicted and inference scatters
    f, cl = _scattered_fleet(observe_nodes=False)
    assert {j.node.idx for j in cl.fill_jobs.values() if j.state == "stopping"} != {0}
    _run(f, 100, 110)
    assert sum(1 for n in cl.nodes if n.inference) > 1


def test_node_aware_adapter_places_fill_where_the_policy_says():
    from ttsfleet.sim.adapter import Controllers, policy_step

    f = _fleet()
    cl, pool = f.classes["h200"], f.pools[0]
    f.bind_ready(pool, 6)  # node 0: 6 inference, 2 free; node 1: empty
    pool.traffic.in_flight = pool.traffic.in_flight_obs = 5 * pool.traffic.target  # 6 with head-room
    policy_step(0.0, f, Controllers(), fill=True)
    on = [sum(1 for j in cl.fill_jobs.values() if j.node is n) for n in cl.nodes]
    # the empty node fills first; inference's own free GPUs are the last to take fill
    assert on[1] == 8 and on[0] <= 2


def test_burst_headroom_and_node_knobs_through_the_cli(tmp_path):
    """--burst-headroom / --forecast / --node-blind reach the scenario; bad values are exit 2."""
    cli = [sys.executable, "-P", "-m", "ttsfleet.cli", "simulate", "--days", "0.05", "--fleet",
           "h200=16", "--peak-rps", "150", "--runs", "inference-only", "--no-training", "--json",
           "--no-plot", "--quiet"]

    def inference_allocated(*extra: str) -> float:
        p = subprocess.run([*cli, *extra], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        run = json.loads(p.stdout)["runs"]["inference-only"]
        return run["utilization"]["overall"]["allocated"]["inference"]

    none = inference_allocated("--burst-headroom", "0", "--no-forecast")
    assert inference_allocated("--burst-headroom", "0.5", "--forecast", "--node-blind") > none * 1.2
    for bad in (["--burst-headroom", "-1"], ["--forecast-horizon", "0"]):
        p = subprocess.run([*cli, *bad], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert p.returncode == 2 and "Traceback" not in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_a_bursts_requests_take_free_slots_before_the_queue_bound_refuses_any():
    """The server refuses a request only when the requests waiting beyond its free decode slots
    reach its queue bound (inference/engine.py); the fluid applied the bound to the whole
    second's arrivals before the slots took theirs, so a one-second burst that free slots would
    have taken was refused (most of azure-code-1h's 2.80% 429s on 2026-12-04c)."""
    sc = Scenario(fleet={"h200": 8})
    (pool,) = build_pools(sc)
    pool.ready = 1
    slots = pool.max_running
    assert slots == sc.catalog.get("h200").serving.max_running_requests
    burst = slots + 2 * pool.queue_cap  # what one replica holds: its slots, then its queue bound
    pool.second(float(burst), 20.0)
    assert pool.rejected == 0
    assert pool.in_flight + pool.queue + pool.frames / 20.0 == pytest.approx(burst)
    pool.second(float(slots + 3 * pool.queue_cap), 20.0)  # past slots and bound: refused
    assert pool.rejected > 0


def test_the_queue_bound_is_the_servers_default_unless_set():
    """4 x max_running_requests per replica (inference/serve_config.py), per class."""
    sc = Scenario()
    for c in sc.fleet:
        assert sc.queue_for(c) == 4 * sc.catalog.get(c).serving.max_running_requests
    assert Scenario(queue_per_replica=64).queue_for("h200") == 64
