"""The simulation loop: the fleet model at 1 s resolution, the policy at the operator's cadence.

Each second: events due now (pods ready, jobs gone, training submitted or done), the scheduler
binds wanted pods, the traffic fluid advances every pool, and every ``policy_interval_s`` the
adapter's :func:`~ttsfleet.sim.adapter.policy_step` observes, calls the policy and acts. Three
modes replay the same trace:

* ``policy`` — autoscaled inference plus fill work on the GPUs it leaves;
* ``inference-only`` — the same autoscaler, no fill (the baseline the policy must not hurt);
* ``static-warm`` — an always-on fleet sized for the trace's peak: no autoscaling, no fill.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ttsfleet.policy import AutoscaleState, colocation_limit, pool_targets, split_load
from ttsfleet.policy.demand import DemandTracker, tracker_window_s
from ttsfleet.sim.adapter import Controllers, policy_step
from ttsfleet.sim.fleet import FillLedger, Fleet
from ttsfleet.sim.scenario import Scenario
from ttsfleet.sim.trace import Trace
from ttsfleet.sim.traffic import LUT_STEPS, PoolTraffic

MODES = ("policy", "inference-only", "static-warm")


@dataclass
class SimResult:
    """Totals and per-minute series of one run."""

    scenario: Scenario
    mode: str
    seconds: int
    holdings_s: dict[str, dict[str, float]]  # class -> holding state -> GPU-seconds
    busy_s: dict[str, dict[str, float]]  # class -> workload -> GPU-busy seconds (NVML)
    work_s: dict[str, float]  # class -> load-weighted GPU-seconds of work
    ttfa_lo: np.ndarray  # per (second, pool): TTFA of the second's first and last arrival
    ttfa_hi: np.ndarray
    ttfa_w: np.ndarray  # arrivals
    #: Requests served beside a fill co-tenant, kept apart: (second, pool index) and TTFA range.
    co_ttfa: dict[str, np.ndarray]
    requests: float
    rejected: float
    frames: float
    scale_events: dict[str, int]
    fill: FillLedger
    co_holdings_s: dict[str, dict[str, float]]  # class -> co-tenant state -> process-seconds
    #: class -> co-tenant running time beside a serving replica ("active"), yielded ("paused"),
    #: and beside a replica still loading its model ("loading"), seconds
    co_time_s: dict[str, dict[str, float]]
    checkpoint_overhead: float  # share of fill running time spent writing checkpoints
    training_wait_s: list[float]
    minute_series: dict[str, np.ndarray]
    decisions_sample: list[str]

    @property
    def fill_enabled(self) -> bool:
        return self.mode == "policy"

    def ttfa_all(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every request's TTFA range and weight: plain and co-located replicas together."""
        co = self.co_ttfa
        if not len(co["w"]):
            return self.ttfa_lo, self.ttfa_hi, self.ttfa_w
        return (np.concatenate([self.ttfa_lo, co["lo"]]), np.concatenate([self.ttfa_hi, co["hi"]]),
                np.concatenate([self.ttfa_w, co["w"]]))


def build_pools(scenario: Scenario) -> list[PoolTraffic]:
    co_yield_s = int(round(scenario.colocation.yield_s))
    targets = pool_targets(scenario.pools, scenario.catalog, scenario.autoscale)
    out = []
    co = scenario.colocation
    for spec in scenario.pools:
        cls = scenario.catalog.get(spec.gpu_class)
        p = PoolTraffic.build(spec.key, spec.gpu_class, cls.capacity, targets[spec.key],
                              cls.serving.max_running_requests,
                              scenario.queue_for(spec.gpu_class))
        p.co_throughput, p.co_latency = co.inference_throughput, co.inference_latency
        # the policy's co-location limit for the pool (constant for a run: curve and target are)
        limit = colocation_limit(co, cls.capacity, targets[spec.key])
        p.co_max_k = int(limit.concurrency * LUT_STEPS + 1e-9) if limit.allowed else -1
        p.co_yield_s = co_yield_s
        out.append(p)
    return out


def _little(fleet: Fleet, rate: float, mean_frames: float) -> float:
    """Requests in flight at steady state (Little's law) when pools run at their targets."""
    w = sum(s.weight for s in fleet.scenario.pools)
    fps = sum(s.weight * h.traffic.per_request_fps(h.traffic.target)
              for s, h in zip(fleet.scenario.pools, fleet.pools, strict=True)) / w
    return rate * mean_frames / fps


def _peak_load(fleet: Fleet, trace: Trace) -> float:
    n = trace.seconds // 60 * 60 or trace.seconds
    step = 60 if n >= 60 else n
    rate = trace.rate[:n].reshape(-1, step).mean(axis=1)
    frames = trace.mean_frames[:n].reshape(-1, step).mean(axis=1)
    return max(_little(fleet, float(r), float(f)) for r, f in zip(rate, frames, strict=True))


def warm_start(fleet: Fleet, trace: Trace, mode: str) -> Controllers:
    """The deployment as it stood before the trace: replicas and in-flight requests at steady
    state for the first minute (Little's law), and controllers with the history that state
    leaves (load samples, scale-down recommendations, demand), so t = 0 is not a cold start."""
    sc = fleet.scenario
    rate = float(trace.rate[:60].mean())
    in_flight = _little(fleet, rate, float(trace.mean_frames[:60].mean()))
    spare = 1.0 + sc.autoscale.burst_headroom
    sized_for = _peak_load(fleet, trace) if mode == "static-warm" else in_flight * spare
    want = split_load(sized_for, sc.pools, {h.traffic.key: h.traffic.target for h in fleet.pools})
    for h in fleet.pools:
        fleet.bind_ready(h, want[h.traffic.key])
    cap = sum(h.traffic.ready * h.traffic.target for h in fleet.pools) or 1.0
    for h in fleet.pools:
        share = h.traffic.ready * h.traffic.target / cap
        # the observed in-flight (arrivals of the second admitted, completions not yet) is the
        # Little's-law figure; the fluid holds one second's arrivals less before it
        h.traffic.in_flight_obs = in_flight * share
        h.traffic.in_flight = max(in_flight - rate, 0.0) * share
    step = sc.policy_interval_s
    ago = lambda window: [-step * k for k in range(int(window // step), 0, -1)]  # noqa: E731
    samples = tuple((t, in_flight) for t in ago(sc.autoscale.stable_window_s))
    recs = {h.traffic.key: tuple((t, h.desired) for t in ago(sc.autoscale.scale_down_stabilization_s))
            for h in fleet.pools}
    window = tracker_window_s(sc.fill_policy)
    demand = DemandTracker()
    for t in ago(window):
        demand = demand.observe(t, {c: float(cl.inference_gpus) for c, cl in fleet.classes.items()},
                                window)
    return Controllers(autoscale=AutoscaleState(samples=samples, recommendations=recs), demand=demand)


class _Recorder:
    """Per-second TTFA ranges and per-minute series for the plot."""

    def __init__(self, fleet: Fleet, seconds: int) -> None:
        self.fleet = fleet
        self.lo: list[float] = []
        self.hi: list[float] = []
        self.w: list[float] = []
        self.co: list[tuple[int, int, float, float, float]] = []  # second, pool, lo, hi, w
        minutes = (seconds + 59) // 60
        keys = ("alloc_inference", "alloc_training", "alloc_fill", "alloc_idle", "busy", "rate",
                "colocated")
        self.series = {k: np.zeros(minutes) for k in keys}
        for h in fleet.pools:
            self.series[f"replicas_{h.traffic.key}"] = np.zeros(minutes)
        self._busy_at = 0.0
        self._co_at = 0.0

    def minute(self, t: int, rate: float, seconds: float) -> None:
        m, s, sc = t // 60, self.series, self.fleet.scenario
        inf_busy = sum(h.traffic.busy_s for h in self.fleet.pools)
        s["busy"][m] = (inf_busy - self._busy_at) / seconds
        self._busy_at = inf_busy
        s["rate"][m] = rate / seconds
        for c, cl in self.fleet.classes.items():
            s["alloc_inference"][m] += cl.inference_gpus
            s["alloc_training"][m] += cl.train_gpus
            s["alloc_fill"][m] += cl.fill_gpus
            s["alloc_idle"][m] += cl.idle
            s["busy"][m] += cl.fill_running * sc.fill_busy(c) + cl.train_gpus * sc.training_busy_fraction
        co_idle = sum(h.traffic.co_idle_s * sc.fill_busy(h.traffic.gpu_class) for h in self.fleet.pools)
        s["busy"][m] += (co_idle - self._co_at) / seconds
        self._co_at = co_idle
        for h in self.fleet.pools:
            s[f"replicas_{h.traffic.key}"][m] = h.traffic.ready
            s["colocated"][m] += h.traffic.colocated


def _traffic_second(fleet: Fleet, rec: _Recorder, t: int, arrivals: float, mean_frames: float) -> None:
    """Split the second's arrivals over the pools by ready capacity and advance each."""
    pools = fleet.pools
    cap = 0.0
    for h in pools:
        cap += h.traffic.ready * h.traffic.target
    for i, h in enumerate(pools):
        p = h.traffic
        a = arrivals * (p.ready * p.target / cap if cap > 0 else 1.0 / len(pools))
        lo, hi = p.second(a, mean_frames)
        rec.lo.append(lo)
        rec.hi.append(hi)
        if p.co_last is not None:  # part of the second's requests went to co-located replicas
            co_lo, co_hi, co_w = p.co_last
            p.co_last = None
            rec.co.append((t, i, co_lo, co_hi, co_w))
            a -= co_w
        rec.w.append(a)


def simulate(scenario: Scenario, trace: Trace, *, mode: str = "policy",
             progress: Callable[[int], None] | None = None, warmup_s: int = 0) -> SimResult:
    """Replay ``trace`` through the fleet in one of :data:`MODES`.

    Written for speed (a week of a 512-GPU fleet at 1 s resolution in seconds): per-second work
    is only the traffic fluid per pool; holdings change at events and decisions.

    ``warmup_s``: first replay the trace's last ``warmup_s`` seconds, uncounted, so a short trace
    (one hour) is measured with the controllers' history its own traffic leaves (the trace taken
    as periodic) rather than from the steady state of its first minute.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    n = trace.seconds
    warm = max(0, min(int(warmup_s), n))
    full = trace.window(n - warm).concat(trace) if warm else trace
    fleet = Fleet(scenario, build_pools(scenario))
    ctl = warm_start(fleet, full, mode)
    for job in scenario.training:
        fleet.push(job.submit_s + warm, fleet.on_train_submit, job)
    arrivals = full.arrivals(scenario.seed).tolist()
    if warm:  # the counted part replays the trace's own draw
        arrivals[warm:] = trace.arrivals(scenario.seed).tolist()
    mean_frames = full.mean_frames.tolist()
    interval = max(int(round(scenario.policy_interval_s)), 1)
    autoscaled, with_fill = mode != "static-warm", mode == "policy"
    rec = _Recorder(fleet, n)
    requests = minute_rate = 0.0
    for t in range(warm + n):
        if t == warm and warm:
            fleet.account(float(t))
            _reset_counters(fleet, ctl)
            rec, requests, minute_rate = _Recorder(fleet, n), 0.0, 0.0
        fleet.run_events(t)
        fleet.schedule(t)
        _traffic_second(fleet, rec, t - warm, arrivals[t], mean_frames[t])
        requests += arrivals[t]
        minute_rate += arrivals[t]
        if autoscaled and t % interval == 0:
            policy_step(float(t), fleet, ctl, fill=with_fill)
        u = t - warm
        if u >= 0 and (u % 60 == 59 or u == n - 1):
            rec.minute(u, minute_rate, float(u % 60 + 1))
            minute_rate = 0.0
            if progress is not None and u % 3600 == 3599:
                progress(u + 1)
    fleet.account(float(warm + n))
    fleet.end_of_run(float(warm + n))
    if progress is not None:
        progress(n)
    return _result(scenario, mode, n, fleet, ctl, rec, requests)


def _reset_counters(fleet: Fleet, ctl: Controllers) -> None:
    """Zero what a run counts (the warm-up is not counted); the fleet's state carries on."""
    for g in (*fleet.ledger.values(), *fleet.co_ledger.values()):
        for k in g:
            g[k] = 0.0
    fleet.fill = FillLedger()
    fleet.train_wait = []
    ctl.scale_events = dict.fromkeys(ctl.scale_events, 0)
    for h in fleet.pools:
        p = h.traffic
        p.frames = p.busy_s = p.rejected = p.co_idle_s = p.co_active_s = p.co_paused_s = 0.0


def _result(scenario: Scenario, mode: str, n: int, fleet: Fleet, ctl: Controllers, rec: _Recorder,
            requests: float) -> SimResult:
    busy: dict[str, dict[str, float]] = {}
    work: dict[str, float] = {}
    co_time: dict[str, dict[str, float]] = {}
    for c, g in fleet.ledger.items():
        pools = [h.traffic for h in fleet.classes[c].pools]
        fill_busy = g["fill_running"] * scenario.fill_busy(c)
        # co-tenants: on NVML in the time their serving replica leaves idle (all of it while the
        # replica still loads); work at fill_throughput of an exclusive job while the replica serves
        active = sum(p.co_active_s for p in pools)
        loading = max(fleet.co_ledger[c]["running"] - active - sum(p.co_paused_s for p in pools), 0.0)
        co_time[c] = {"active": active, "loading": loading,
                      "paused": sum(p.co_paused_s for p in pools)}
        co_busy = (sum(p.co_idle_s for p in pools) + loading) * scenario.fill_busy(c)
        co_work = (active * scenario.colocation.fill_throughput + loading) * scenario.fill_busy(c)
        train_busy = g["training"] * scenario.training_busy_fraction
        busy[c] = {"inference": sum(p.busy_s for p in pools), "training": train_busy,
                   "fill": fill_busy + co_busy}
        work[c] = sum(p.frames / p.peak_fps for p in pools) + fill_busy + co_work + train_busy
    co = np.asarray(rec.co, dtype=np.float64).reshape(-1, 5)
    co_ttfa = {"t": co[:, 0].astype(np.int64), "pool": co[:, 1].astype(np.int64), "lo": co[:, 2],
               "hi": co[:, 3], "w": co[:, 4]}
    return SimResult(
        scenario=scenario, mode=mode, seconds=n, holdings_s=fleet.ledger, busy_s=busy, work_s=work,
        ttfa_lo=np.asarray(rec.lo, dtype=np.float64), ttfa_hi=np.asarray(rec.hi, dtype=np.float64),
        ttfa_w=np.asarray(rec.w, dtype=np.float64), co_ttfa=co_ttfa, requests=requests,
        rejected=sum(h.traffic.rejected for h in fleet.pools),
        frames=sum(h.traffic.frames for h in fleet.pools), scale_events=ctl.scale_events,
        fill=fleet.fill, co_holdings_s=fleet.co_ledger, co_time_s=co_time,
        checkpoint_overhead=scenario.checkpoint_overhead,
        training_wait_s=fleet.train_wait,
        minute_series=rec.series, decisions_sample=ctl.decisions_sample)
