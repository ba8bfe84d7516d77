"""The simulation loop: a fluid model of the fleet at 1 s resolution, the policy at its cadence.

Only the policy decides. Every ``policy_interval_s`` the loop builds the same observations the
operator builds (per-pool traffic signals, per-class GPU state), calls
:func:`ttsfleet.policy.decide_replicas` and :func:`ttsfleet.policy.plan_fill`, and carries out
the decisions with the delays real clusters have: an inference pod holds its GPU for
``model_load_s`` before it serves, a fill job needs ``start_s`` before it works and ``stop_s`` to
checkpoint and free its GPU after SIGTERM. Between decisions, the "scheduler" part of the loop
only places pods that are already wanted onto GPUs that are free (inference first, then
training), like kube-scheduler and slurmctld would.

Traffic is modelled as a fluid per pool: arrivals join a queue, are admitted into free decode
slots (``max_running_requests`` per replica), and complete at the per-request frame rate the
class's capacity curve gives for the current concurrency. Time to first audio is the curve's
value at that concurrency plus the queueing delay.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ttsfleet.catalog import GpuCatalog
from ttsfleet.policy import (
    AutoscaleState,
    ClassObservation,
    DeploymentSignals,
    FillJobView,
    PoolSignals,
    decide_replicas,
    forecast_demand,
    plan_fill,
    pool_targets,
    split_load,
)
from ttsfleet.sim.scenario import Scenario
from ttsfleet.sim.trace import Trace

WORKLOADS = ("inference", "training", "fill", "idle")
LUT_STEPS = 4  # concurrency lookup table resolution: 1/4 request


@dataclass
class _Pool:
    key: str
    gpu_class: str
    target: float
    max_running: int
    fps_lut: list[float]
    ttfa_lut: list[float]
    peak_fps: float
    load_s: float
    ready: int = 0
    starting: list[float] = field(default_factory=list)  # ready_at times
    pending: int = 0
    desired: int = 0
    in_flight: float = 0.0
    in_flight_obs: float = 0.0  # in flight during the last second (before its completions)
    queue: float = 0.0
    window_ttfa: float = 0.0  # worst time to first audio since the last decision
    frames: float = 0.0
    busy_s: float = 0.0  # replica-seconds with at least one request in flight

    @property
    def held(self) -> int:
        return self.ready + len(self.starting)


@dataclass
class _FillJob:
    id: str
    gpu_class: str
    state: str  # starting | running | terminating
    run_start: float = 0.0


@dataclass
class _Class:
    name: str
    total: int
    fill_jobs: dict[str, _FillJob] = field(default_factory=dict)
    fill_starting: int = 0
    fill_running: int = 0
    fill_terminating: int = 0
    train_running: int = 0
    train_pending: list = field(default_factory=list)  # [(submit_s, gpus, duration, idx)]
    demand_history: list[tuple[float, float]] = field(default_factory=list)

    @property
    def fill_held(self) -> int:
        return self.fill_starting + self.fill_running + self.fill_terminating

    def idle(self, inference_gpus: int) -> int:
        """GPUs nothing holds, given the GPUs inference holds in this class."""
        return self.total - inference_gpus - self.train_running - self.fill_held


@dataclass
class SimResult:
    """Totals and per-minute series of one run."""

    scenario: Scenario
    fill_enabled: bool
    seconds: int
    gpu_seconds: dict[str, dict[str, float]]  # class -> workload -> allocated GPU-seconds
    active_seconds: dict[str, dict[str, float]]  # class -> workload -> active GPU-seconds
    work_seconds: dict[str, float]  # class -> load-weighted GPU-seconds of work
    ttfa_s: np.ndarray  # per (pool, second) time to first audio
    ttfa_w: np.ndarray  # weights (arrivals)
    slo_violation_minutes: int
    requests: float
    rejected: float
    frames: float
    scale_events: dict[str, int]
    fill_done_s: float
    fill_lost_s: float
    fill_evictions: int
    fill_admissions: int
    training_gpu_s: float
    training_wait_s: list[float]
    minute_series: dict[str, np.ndarray]
    decisions_sample: list[str]


def _luts(catalog: GpuCatalog, gpu_class: str, max_running: int) -> tuple[list[float], list[float]]:
    curve = catalog.get(gpu_class).capacity
    n = max_running * LUT_STEPS + 1
    fps = [curve.frames_per_s(i / LUT_STEPS) for i in range(n)]
    ttfa = [curve.ttfa_s(max(i / LUT_STEPS, 1.0)) for i in range(n)]
    return fps, ttfa


def _weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    mask = weights > 0
    if not mask.any():
        return float("nan")
    v, w = values[mask], weights[mask]
    order = np.argsort(v, kind="stable")
    cw = np.cumsum(w[order])
    i = int(np.searchsorted(cw, q * cw[-1], side="left"))
    return float(v[order][min(i, len(v) - 1)])


def simulate(scenario: Scenario, trace: Trace, *, fill: bool = True, catalog: GpuCatalog | None = None,
             progress: Callable[[int], None] | None = None) -> SimResult:
    """Run the fleet over ``trace``; ``fill=False`` is the inference-only baseline.

    Written for speed (a week of a 512-GPU fleet at 1 s resolution in well under a minute):
    per-second work is only the traffic fluid per pool; GPU holdings change at events and
    decisions, so their GPU-time is accumulated piecewise between changes.
    """
    catalog = catalog or GpuCatalog.default()
    scenario.check_catalog(catalog)
    cfg = scenario.autoscale
    fcfg = scenario.fill_policy
    fw = scenario.fill
    targets = pool_targets(scenario.pools, catalog, cfg)

    pools: list[_Pool] = []
    for spec in scenario.pools:
        cls = catalog.get(spec.gpu_class)
        mr = cls.serving.max_running_requests
        fps, ttfa = _luts(catalog, spec.gpu_class, mr)
        pools.append(_Pool(spec.key, spec.gpu_class, targets[spec.key], mr, fps, ttfa,
                           cls.capacity.peak_frames_per_s, cls.model_load_s))
    classes = {name: _Class(name, n) for name, n in scenario.fleet.items()}
    pools_by_class: dict[str, list[_Pool]] = {c: [p for p in pools if p.gpu_class == c] for c in classes}

    # Warm start: the deployment existed before the trace begins, sized by the policy's own
    # load split for the first minute's traffic (Little's law at the target concurrency).
    first_rate = float(trace.rate[:60].mean())
    ref = pools[0]
    per_req_fps = ref.fps_lut[min(int(ref.target * LUT_STEPS), len(ref.fps_lut) - 1)] / ref.target
    warm = split_load(first_rate * float(trace.mean_frames[0]) / per_req_fps, scenario.pools, targets)
    for p in pools:
        room = classes[p.gpu_class].total - sum(q.held for q in pools_by_class[p.gpu_class])
        p.ready = max(min(warm[p.key], room), 0)
        p.desired = p.ready
        p.in_flight = p.in_flight_obs = p.ready * p.target * 0.5

    events: list[tuple[float, int, str, object]] = []  # (time, seq, kind, payload)
    seq = 0

    def push(t: float, kind: str, payload: object) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, payload))

    training = sorted(scenario.training, key=lambda j: j.submit_s)
    for i, j in enumerate(training):
        push(j.submit_s, "train_submit", i)

    n = trace.seconds
    arrivals = trace.arrivals(scenario.seed).tolist()
    mean_frames = trace.mean_frames.tolist()
    interval = max(int(round(scenario.policy_interval_s)), 1)
    state = AutoscaleState()
    fill_seq = 0
    gpu_s = {c: dict.fromkeys(WORKLOADS, 0.0) for c in classes}
    act_s = {c: dict.fromkeys(WORKLOADS, 0.0) for c in classes}
    work_s = dict.fromkeys(classes, 0.0)
    n_pools = len(pools)
    ttfa_vals = np.zeros((n_pools, n), dtype=np.float32)
    ttfa_wts = np.zeros((n_pools, n), dtype=np.float32)
    slo = cfg.ttfa_p99_slo_s
    minutes = (n + 59) // 60
    snap = {k: np.zeros(minutes) for k in ("alloc_inference", "alloc_training", "alloc_fill",
                                           "alloc_idle", "fill_running", "training_running")}
    for p in pools:
        snap[f"replicas_{p.key}"] = np.zeros(minutes)
    rate_min = np.zeros(minutes)
    busy_min = np.zeros(minutes)
    total_gpus = sum(c.total for c in classes.values())
    requests = 0.0
    rejected = 0.0
    queue_cap = scenario.queue_per_replica
    fill_lost = 0.0
    evictions = admissions = 0
    scale_events = {"up": 0, "down": 0}
    train_wait: list[float] = []
    decisions_sample: list[str] = []
    pending_work = False
    history_len = int(fcfg.forecast_window_s // interval) + 2
    ckpt = fcfg.checkpoint_interval_s
    last_acc = 0

    def inference_held(c: str) -> int:
        return sum(p.held for p in pools_by_class[c])

    def accumulate(t: int) -> None:
        """Add GPU-time of the holdings in force since the last change."""
        nonlocal last_acc
        dt = t - last_acc
        if dt <= 0:
            return
        for c, cl in classes.items():
            inf = inference_held(c)
            g = gpu_s[c]
            g["inference"] += inf * dt
            g["training"] += cl.train_running * dt
            g["fill"] += cl.fill_held * dt
            g["idle"] += cl.idle(inf) * dt
            a = act_s[c]
            a["fill"] += cl.fill_running * dt
            a["training"] += cl.train_running * dt
            work_s[c] += (cl.fill_running * fw.load_factor
                          + cl.train_running * scenario.training_load_factor) * dt
        last_acc = t

    def place(t: float) -> bool:
        """Put wanted pods on free GPUs: inference first, then training (FIFO)."""
        still_pending = False
        for c, cl in classes.items():
            free = cl.idle(inference_held(c))
            for p in pools_by_class[c]:
                while p.pending > 0 and free > 0:
                    p.pending -= 1
                    free -= 1
                    p.starting.append(t + p.load_s)
                    push(t + p.load_s, "ready", p)
                if p.pending:
                    still_pending = True
            while cl.train_pending and cl.train_pending[0][1] <= free:
                submit, gpus, dur, _ = cl.train_pending.pop(0)
                free -= gpus
                cl.train_running += gpus
                train_wait.append(t - submit)
                push(t + dur, "train_end", (c, gpus))
            if cl.train_pending:
                still_pending = True
        return still_pending

    for t in range(n):
        # 1. events due now (holdings change: account for the time before)
        if events and events[0][0] <= t:
            accumulate(t)
            while events and events[0][0] <= t:
                _, _, kind, payload = heapq.heappop(events)
                if kind == "ready":
                    p = payload  # type: ignore[assignment]
                    if p.starting:
                        p.starting.sort()
                        if p.starting[0] <= t:
                            p.starting.pop(0)
                            p.ready += 1
                elif kind == "fill_running":
                    job = payload  # type: ignore[assignment]
                    if job.state == "starting" and job.id in classes[job.gpu_class].fill_jobs:
                        cl = classes[job.gpu_class]
                        job.state = "running"
                        job.run_start = float(t)
                        cl.fill_starting -= 1
                        cl.fill_running += 1
                elif kind == "fill_gone":
                    job = payload  # type: ignore[assignment]
                    cl = classes[job.gpu_class]
                    cl.fill_terminating -= 1
                    del cl.fill_jobs[job.id]
                    pending_work = True
                elif kind == "train_submit":
                    j = training[payload]  # type: ignore[index]
                    classes[j.gpu_class].train_pending.append((j.submit_s, j.gpus, j.duration_s, payload))
                    pending_work = True
                elif kind == "train_end":
                    c, gpus = payload  # type: ignore[misc]
                    classes[c].train_running -= gpus
                    pending_work = True
        # 2. scheduler: place wanted pods on free GPUs
        if pending_work:
            accumulate(t)
            pending_work = place(float(t))

        # 3. traffic (the fluid, per pool)
        a_total = arrivals[t]
        mf = mean_frames[t]
        requests += a_total
        cap_sum = 0.0
        for p in pools:
            cap_sum += p.ready * p.target
        minute = t // 60
        rate_min[minute] += a_total
        busy_total = 0.0
        for i, p in enumerate(pools):
            a = a_total * (p.ready * p.target / cap_sum if cap_sum > 0 else 1.0 / n_pools)
            p.queue += a
            if p.queue > p.ready * queue_cap + queue_cap:
                # the server's bounded queue: beyond it requests get 429 + Retry-After
                rejected += p.queue - (p.ready * queue_cap + queue_cap)
                p.queue = p.ready * queue_cap + queue_cap
            slots = p.ready * p.max_running - p.in_flight
            if slots > 0 and p.queue > 0:
                adm = p.queue if p.queue < slots else slots
                p.queue -= adm
                p.in_flight += adm
            p.in_flight_obs = p.in_flight
            if p.ready > 0 and p.in_flight > 0:
                k = int(p.in_flight / p.ready * LUT_STEPS)
                if k >= len(p.fps_lut):
                    k = len(p.fps_lut) - 1
                produced = p.fps_lut[k] * p.ready
                done = produced / mf
                if done > p.in_flight:
                    done = p.in_flight
                busy = p.in_flight if p.in_flight < p.ready else p.ready
                p.in_flight -= done
                p.frames += produced
                p.busy_s += busy
                busy_total += busy
                ttfa = p.ttfa_lut[k] + (p.queue / done if (p.queue > 0 and done > 0) else 0.0)
            else:
                ttfa = p.ttfa_lut[LUT_STEPS] + (60.0 if p.queue > 0 else 0.0)
            ttfa_vals[i, t] = ttfa
            ttfa_wts[i, t] = a
            if a > 0 and ttfa > p.window_ttfa:
                p.window_ttfa = ttfa
        busy_min[minute] += busy_total

        # 4. the policy, at the operator's cadence
        if t % interval == 0:
            accumulate(t)
            sig = {}
            for p in pools:
                sig[p.key] = PoolSignals(in_flight=p.in_flight_obs, queue_depth=p.queue,
                                         ready_replicas=p.ready, current_replicas=p.desired,
                                         ttfa_p99_s=p.window_ttfa if p.window_ttfa > 0 else None)
                p.window_ttfa = 0.0
            decision, state = decide_replicas(cfg, scenario.pools, catalog, state,
                                              DeploymentSignals(float(t), sig))
            for p, d in zip(pools, decision.pools, strict=True):
                if d.direction != "none":
                    scale_events[d.direction] += 1
                    if len(decisions_sample) < 40:
                        decisions_sample.append(f"t={t}s {p.key}: {d.current}->{d.desired} ({d.reason}) "
                                                f"{d.message}")
                p.desired = d.desired
                have = p.held + p.pending
                if d.desired > have:
                    p.pending += d.desired - have
                    pending_work = True
                elif d.desired < have:
                    drop = have - d.desired
                    k = min(drop, p.pending)
                    p.pending -= k
                    drop -= k
                    while drop and p.starting:
                        p.starting.sort()
                        p.starting.pop()  # the one furthest from ready
                        drop -= 1
                    k = min(drop, p.ready)
                    p.ready -= k
                    pending_work = True
            if fill:
                for c, cl in classes.items():
                    held_inf = inference_held(c)
                    pend_inf = sum(p.pending for p in pools_by_class[c])
                    cl.demand_history.append((float(t), float(held_inf + pend_inf)))
                    if len(cl.demand_history) > history_len:
                        del cl.demand_history[0]
                    fc = forecast_demand(cl.demand_history, float(t), fcfg.eviction_deadline_s,
                                         fcfg.forecast_window_s)
                    # what the load already needs beyond the rate-limited step counts as demand
                    # within the deadline: evict ahead of the autoscaler's next steps
                    needed = sum(d.needed for d in decision.pools if d.gpu_class == c)
                    fc = max(fc or 0.0, float(needed))
                    views = tuple([
                        FillJobView(j.id, 1,
                                    ((t - j.run_start) % ckpt) if j.state == "running" else 0.0,
                                    j.state == "terminating")
                        for j in cl.fill_jobs.values()])
                    obs = ClassObservation(
                        gpu_class=c, t=float(t), total_gpus=cl.total,
                        inference_gpus=held_inf, training_gpus=cl.train_running,
                        pending_inference_gpus=pend_inf,
                        pending_training_gpus=sum(x[1] for x in cl.train_pending),
                        fill_jobs=views, inference_forecast_gpus=fc)
                    plan = plan_fill(fcfg, obs)
                    for jid in plan.evict:
                        job = cl.fill_jobs[jid]
                        evictions += 1
                        if job.state == "running":
                            cl.fill_running -= 1
                            if fw.stop_s <= fcfg.grace_period_s:
                                fill_lost += (t - job.run_start) % fw.item_s
                            else:
                                fill_lost += (t - job.run_start) % ckpt
                        else:
                            cl.fill_starting -= 1
                        job.state = "terminating"
                        cl.fill_terminating += 1
                        push(t + min(fw.stop_s, fcfg.grace_period_s), "fill_gone", job)
                    for _ in range(plan.admit):
                        fill_seq += 1
                        job = _FillJob(f"{c}-fill-{fill_seq:07d}", c, "starting")
                        cl.fill_jobs[job.id] = job
                        cl.fill_starting += 1
                        admissions += 1
                        push(t + fw.start_s, "fill_running", job)
        # 5. per-minute snapshot of holdings for the plot
        if t % 60 == 59 or t == n - 1:
            for c, cl in classes.items():
                inf = inference_held(c)
                snap["alloc_inference"][minute] += inf
                snap["alloc_training"][minute] += cl.train_running
                snap["alloc_fill"][minute] += cl.fill_held
                snap["alloc_idle"][minute] += cl.idle(inf)
                snap["fill_running"][minute] += cl.fill_running
                snap["training_running"][minute] += cl.train_running
            for p in pools:
                snap[f"replicas_{p.key}"][minute] = p.ready
            if progress is not None and minute % 60 == 59:
                progress(t + 1)

    accumulate(n)
    if progress is not None:
        progress(n)
    fill_done = 0.0
    for c in classes:
        fill_done += act_s[c]["fill"]
    for p in pools:
        act_s[p.gpu_class]["inference"] += p.busy_s
        work_s[p.gpu_class] += p.frames / p.peak_fps
    secs = np.full(minutes, 60.0)
    secs[-1] = n - 60 * (minutes - 1)
    series = dict(snap)
    series["rate"] = rate_min / secs
    # Plot series: inference busy is a per-minute mean, holdings are end-of-minute snapshots, so
    # their sum is capped at the fleet size (totals above are exact, not taken from these).
    series["active"] = np.minimum(busy_min / secs + snap["fill_running"] + snap["training_running"],
                                  total_gpus)
    series["active_frac"] = series["active"] / total_gpus
    pad = minutes * 60 - n
    series["ttfa_max"] = np.pad(ttfa_vals.max(axis=0), (0, pad)).reshape(minutes, 60).max(axis=1)
    # SLO violation minutes: more than 1% of a minute's requests above the SLO
    per_sec_viol = ((ttfa_vals > slo) * ttfa_wts).sum(axis=0)
    per_sec_w = ttfa_wts.sum(axis=0)
    vm = np.pad(per_sec_viol, (0, pad)).reshape(minutes, 60).sum(axis=1)
    wm = np.pad(per_sec_w, (0, pad)).reshape(minutes, 60).sum(axis=1)
    slo_minutes = int(np.sum((wm > 0) & (vm > 0.01 * wm)))
    train_gpu_s = sum(act_s[c]["training"] for c in classes)
    return SimResult(
        scenario=scenario, fill_enabled=fill, seconds=n, gpu_seconds=gpu_s, active_seconds=act_s,
        work_seconds=work_s, ttfa_s=ttfa_vals.ravel(), ttfa_w=ttfa_wts.ravel(),
        slo_violation_minutes=slo_minutes, requests=requests, rejected=rejected,
        frames=sum(p.frames for p in pools),
        scale_events=scale_events, fill_done_s=max(fill_done - fill_lost, 0.0), fill_lost_s=fill_lost,
        fill_evictions=evictions, fill_admissions=admissions, training_gpu_s=train_gpu_s,
        training_wait_s=train_wait, minute_series=series, decisions_sample=decisions_sample)


def summarize(r: SimResult) -> dict:
    """The report as plain data (what ``--json`` prints)."""
    total = {w: sum(r.gpu_seconds[c][w] for c in r.gpu_seconds) for w in WORKLOADS}
    gpu_total = sum(total.values()) or 1.0
    act = {w: sum(r.active_seconds[c][w] for c in r.active_seconds) for w in WORKLOADS}

    def util(gs: dict[str, float], acts: dict[str, float], work: float) -> dict:
        tot = sum(gs.values()) or 1.0
        return {
            "allocated": {w: round(gs[w] / tot, 4) for w in WORKLOADS},
            "allocated_busy": round(1 - gs["idle"] / tot, 4),
            "active": {w: round(acts[w] / tot, 4) for w in WORKLOADS if w != "idle"},
            "active_total": round(sum(acts[w] for w in WORKLOADS if w != "idle") / tot, 4),
            "load_weighted": round(work / tot, 4),
        }

    per_class = {c: util(r.gpu_seconds[c], r.active_seconds[c], r.work_seconds[c]) for c in r.gpu_seconds}
    overall = util(total, act, sum(r.work_seconds.values()))
    p50 = _weighted_quantile(r.ttfa_s, r.ttfa_w, 0.50)
    p99 = _weighted_quantile(r.ttfa_s, r.ttfa_w, 0.99)
    fill_h = r.fill_done_s / 3600
    lost_h = r.fill_lost_s / 3600
    return {
        "mode": "policy" if r.fill_enabled else "inference-only",
        "duration_h": round(r.seconds / 3600, 2),
        "fleet": dict(r.scenario.fleet),
        "gpu_hours": round(gpu_total / 3600, 1),
        "utilization": {"overall": overall, "per_class": per_class},
        "inference": {
            "requests": int(r.requests),
            "rejected_429": int(r.rejected),
            "rejected_pct": round(100 * r.rejected / r.requests, 3) if r.requests else 0.0,
            "frames": int(r.frames),
            "ttfa_p50_ms": round(p50 * 1000, 1),
            "ttfa_p99_ms": round(p99 * 1000, 1),
            "slo_ms": round(r.scenario.autoscale.ttfa_p99_slo_s * 1000, 1),
            "slo_violation_minutes": r.slo_violation_minutes,
            "scale_events": dict(r.scale_events),
        },
        "fill": {
            "gpu_hours_done": round(fill_h, 1),
            "gpu_hours_lost": round(lost_h, 3),
            "lost_pct": round(100 * lost_h / (fill_h + lost_h), 3) if fill_h + lost_h > 0 else 0.0,
            "evictions": r.fill_evictions,
            "admissions": r.fill_admissions,
        },
        "training": {
            "gpu_hours": round(r.training_gpu_s / 3600, 1),
            "jobs_started": len(r.training_wait_s),
            "mean_wait_s": round(float(np.mean(r.training_wait_s)), 1) if r.training_wait_s else 0.0,
        },
    }


def check_targets(policy: dict, baseline: dict | None) -> dict[str, bool | None]:
    """The issue's targets, evaluated on a pair of runs (None where it cannot be judged)."""
    out: dict[str, bool | None] = {
        "active_with_fill_ge_92pct": policy["utilization"]["overall"]["active_total"] >= 0.92,
        "lost_fill_le_1pct": policy["fill"]["lost_pct"] <= 1.0,
    }
    if baseline is not None:
        b = baseline["inference"]["ttfa_p99_ms"]
        out["p99_ttfa_within_5pct_of_baseline"] = (
            not math.isnan(b) and policy["inference"]["ttfa_p99_ms"] <= 1.05 * b)
        ba = baseline["utilization"]["overall"]["active_total"]
        out["baseline_active_near_50pct"] = 0.40 <= ba <= 0.60
    return out
