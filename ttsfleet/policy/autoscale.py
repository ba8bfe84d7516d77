"""Replica decisions for one TTSDeployment from live traffic signals.

Pure and deterministic: ``decide_replicas(config, pools, state, signals)`` returns the desired
replicas per pool, a reason for each, and the next state. No clocks are read — time comes in with
the signals — so the operator, the simulator and the tests replay identical decisions.

The algorithm, in the order it applies:

1. Load is requests in flight plus requests queued, summed over the deployment.
2. Stable load is the mean over ``stable_window_s``; panic load is the mean over
   ``panic_window_s``. Panic mode starts when the panic load needs ``panic_threshold`` times the
   ready capacity and lasts a stable window; in panic the deployment never scales down.
3. The load is split across pools by weight, water-filling around pool bounds; each pool's
   target in-flight per replica is the deployment target scaled by its GPU class's throughput
   relative to the fastest class.
4. SLO pressure: time to first audio p99 above the SLO, or queued requests beyond
   ``queue_depth_per_replica``, adds replicas even if the load target is met.
5. Scale-up is immediate but bounded by ``max_scale_up_rate``; scale-down takes the highest
   recommendation of the last ``scale_down_stabilization_s`` seconds and at most halves the pool
   per step (``max_scale_down_rate``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ttsfleet.catalog import GpuCatalog
from ttsfleet.config import AutoscaleConfig, PoolSpec


@dataclass(frozen=True)
class PoolSignals:
    """What one pool reports at time ``t`` (from Prometheus or the pods' /metrics)."""

    in_flight: float = 0.0
    queue_depth: float = 0.0
    ready_replicas: int = 0
    current_replicas: int = 0
    ttfa_p99_s: float | None = None
    frames_per_s: float = 0.0


@dataclass(frozen=True)
class DeploymentSignals:
    t: float
    pools: Mapping[str, PoolSignals]


@dataclass(frozen=True)
class AutoscaleState:
    """What the autoscaler remembers between decisions (kept in the CR status or in memory)."""

    samples: tuple[tuple[float, float], ...] = ()
    recommendations: Mapping[str, tuple[tuple[float, int], ...]] = field(default_factory=dict)
    panic_until: float | None = None


@dataclass(frozen=True)
class PoolDecision:
    pool: str
    gpu_class: str
    current: int
    desired: int
    direction: str  # up | down | none
    reason: str  # short label: load | panic | slo | queue | stabilized | min | max | steady
    message: str
    #: Replicas the load needs before the scale-up rate limit and scale-down stabilization
    #: (within min/max). Fill eviction plans for it, so GPUs are free before later steps need them.
    needed: int = 0


@dataclass(frozen=True)
class ScaleDecision:
    t: float
    pools: tuple[PoolDecision, ...]
    stable_load: float
    panic_load: float
    panic: bool

    def desired(self) -> dict[str, int]:
        return {p.pool: p.desired for p in self.pools}

    def by_pool(self) -> dict[str, PoolDecision]:
        return {p.pool: p for p in self.pools}


def pool_targets(pools: Sequence[PoolSpec], catalog: GpuCatalog,
                 config: AutoscaleConfig) -> dict[str, float]:
    """In-flight target per replica for each pool, scaled by class throughput."""
    peak = max(c.capacity.peak_frames_per_s for c in catalog.classes.values())
    out = {}
    for p in pools:
        if p.target_in_flight_per_replica is not None:
            out[p.key] = p.target_in_flight_per_replica
        else:
            rel = catalog.get(p.gpu_class).capacity.peak_frames_per_s / peak
            out[p.key] = config.target_in_flight_per_replica * rel
    return out


def split_load(load: float, pools: Sequence[PoolSpec], targets: Mapping[str, float]) -> dict[str, int]:
    """Replicas per pool that carry ``load`` split by weight, respecting min/max (water-filling).

    A pool pinned at its max passes its excess to the others in proportion to their weights;
    pools pinned at their min keep that many replicas and take their weighted share of the load.
    """
    remaining = {p.key: p for p in pools}
    result: dict[str, int] = {}
    load_left = max(load, 0.0)
    while remaining:
        wsum = sum(p.weight for p in remaining.values())
        pinned = False
        for key in sorted(remaining):
            p = remaining[key]
            share = load_left * p.weight / wsum
            want = math.ceil(share / targets[key] - 1e-9)
            if want > p.max_replicas:
                result[key] = p.max_replicas
                load_left -= p.max_replicas * targets[key]
                load_left = max(load_left, 0.0)
                del remaining[key]
                pinned = True
                break
        if pinned:
            continue
        for key in sorted(remaining):
            p = remaining[key]
            share = load_left * p.weight / wsum
            result[key] = max(p.min_replicas, math.ceil(share / targets[key] - 1e-9))
        remaining = {}
    return result


def _window_mean(samples: Sequence[tuple[float, float]], now: float, window: float) -> float:
    vals = [v for (t, v) in samples if t > now - window]
    return sum(vals) / len(vals) if vals else 0.0


def decide_replicas(config: AutoscaleConfig, pools: Sequence[PoolSpec], catalog: GpuCatalog,
                    state: AutoscaleState, signals: DeploymentSignals) -> tuple[ScaleDecision,
                                                                               AutoscaleState]:
    """Decide desired replicas for every pool of one deployment; return the next state."""
    if not pools:
        raise ValueError("a deployment needs at least one pool")
    keys = [p.key for p in pools]
    if len(set(keys)) != len(keys):
        raise ValueError(f"pool names must be unique, got {keys}")
    now = signals.t
    sig = {p.key: signals.pools.get(p.key, PoolSignals()) for p in pools}
    load_now = sum(s.in_flight + s.queue_depth for s in sig.values())
    keep_from = now - config.stable_window_s
    samples = tuple((t, v) for (t, v) in state.samples if t > keep_from) + ((now, load_now),)
    stable = _window_mean(samples, now, config.stable_window_s)
    panic_load = _window_mean(samples, now, config.panic_window_s)

    targets = pool_targets(pools, catalog, config)
    ready_capacity = sum(sig[p.key].ready_replicas * targets[p.key] for p in pools)
    panic_until = state.panic_until
    if panic_until is not None and now >= panic_until:
        panic_until = None
    if panic_load >= config.panic_threshold * max(ready_capacity, 1e-9) and panic_load > 0:
        panic_until = now + config.stable_window_s
    panic = panic_until is not None

    basis = max(stable, panic_load) if panic else stable
    wanted = split_load(basis, pools, targets)

    recs = dict(state.recommendations)
    decisions = []
    for p in pools:
        s = sig[p.key]
        current = s.current_replicas
        ready = s.ready_replicas
        want = wanted[p.key]
        reason, msg = "load", (f"load {basis:.1f} req split by weight; target "
                               f"{targets[p.key]:.1f}/replica")
        if panic:
            reason = "panic"
            msg = f"panic: {panic_load:.1f} req in {config.panic_window_s:.0f}s window vs " \
                  f"ready capacity {ready_capacity:.1f}"
        # SLO pressure adds replicas even when the load target is met.
        slo_bad = s.ttfa_p99_s is not None and s.ttfa_p99_s > config.ttfa_p99_slo_s and ready > 0
        queue_bad = ready > 0 and s.queue_depth > config.queue_depth_per_replica * ready
        if (slo_bad or queue_bad) and want <= current:
            want = current + max(1, math.ceil(0.1 * current))
            if slo_bad:
                reason, msg = "slo", f"ttfa p99 {s.ttfa_p99_s:.3f}s > SLO {config.ttfa_p99_slo_s}s"
            else:
                reason, msg = "queue", (f"queue depth {s.queue_depth:.0f} > "
                                        f"{config.queue_depth_per_replica:g}/replica")
        # Scale-up rate limit.
        needed = min(max(want, p.min_replicas), p.max_replicas)
        up_cap = max(math.ceil(max(ready, 1) * config.max_scale_up_rate), ready + 4)
        if want > up_cap:
            want = up_cap
            msg += f"; capped by scale-up rate at {up_cap}"
        # Scale-down stabilization: the highest recommendation in the window wins.
        hist = tuple((t, v) for (t, v) in recs.get(p.key, ())
                     if t > now - config.scale_down_stabilization_s) + ((now, want),)
        recs[p.key] = hist
        if want < current:
            if panic:
                want = current
                reason, msg = "panic", "panic mode: no scale-down"
            else:
                stabilized = max(v for (_, v) in hist)
                floor = math.ceil(current / config.max_scale_down_rate)
                target = max(stabilized, floor, want)
                if target > want:
                    reason = "stabilized"
                    msg = (f"load wants {want}; holding {min(target, current)} (max recommendation "
                           f"in {config.scale_down_stabilization_s:.0f}s window, at most "
                           f"1/{config.max_scale_down_rate:g} removed per step)")
                want = min(target, current)
        clamped = min(max(want, p.min_replicas), p.max_replicas)
        if clamped != want:
            reason = "min" if clamped > want else "max"
            msg = f"{msg}; clamped to [{p.min_replicas}, {p.max_replicas}]"
            want = clamped
        direction = "up" if want > current else "down" if want < current else "none"
        if direction == "none" and reason == "load":
            reason = "steady"
        decisions.append(PoolDecision(p.key, p.gpu_class, current, want, direction, reason, msg,
                                      needed=max(needed, want)))

    decision = ScaleDecision(now, tuple(decisions), stable, panic_load, panic)
    new_state = replace(state, samples=samples, recommendations=recs, panic_until=panic_until)
    return decision, new_state


def scale_down_victims(in_flight_by_pod: Mapping[str, float], count: int) -> tuple[str, ...]:
    """Which replicas to remove first on scale-down: the ``count`` least busy (ties by name).

    The operator marks them with a low ``controller.kubernetes.io/pod-deletion-cost`` so the
    ReplicaSet removes them and the fewest in-flight requests have to drain.
    """
    ranked = sorted(in_flight_by_pod, key=lambda name: (in_flight_by_pod[name], name))
    return tuple(ranked[:max(count, 0)])
