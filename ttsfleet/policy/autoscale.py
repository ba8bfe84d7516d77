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
4. Forecast: replicas take a class's ``model_load_s`` to become ready, so each pool is also sized
   for the load the least-squares trend over ``forecast_window_s`` expects that far ahead
   (with ``forecast``; ``forecast_horizon_s`` overrides the horizon); growth only, and only when
   it is ``forecast_min_growth`` above the load; reason ``forecast``. ``burst_headroom`` sizes
   every step for that share more load than it carries (spare capacity for what outruns a load).
5. Pressures (:data:`PRESSURES`, a rule table: signal, threshold knob, reason): time to first
   audio p99 above the SLO, or queued requests beyond ``queue_depth_per_replica``, add replicas
   even if the load target is met. A new signal is one :class:`Pressure` row.
6. Scale-up is immediate but bounded by ``max_scale_up_rate``; scale-down takes the highest
   recommendation of the last ``scale_down_stabilization_s`` seconds (``burst_hold_s`` while a
   panic is that recent: :func:`stabilization_window`) and at most halves the pool per step
   (``max_scale_down_rate``).
7. Every result is clamped to the pool's bounds by :func:`clamp_replicas`, the only clamp.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import NamedTuple

from ttsfleet.catalog import GpuCatalog
from ttsfleet.config import AutoscaleConfig, PoolSpec
from ttsfleet.policy.trend import Trend, fit_trend


@dataclass(frozen=True)
class PoolSignals:
    """What one pool reports at time ``t``: the type every adapter converts its world into.

    Each adapter writes its own ``to_pool_signals`` (operator: Prometheus or the pods' /metrics;
    simulator: its fluid model; tests: literals). ``extra`` carries signals the built-in fields do
    not name (e.g. a real-time factor), read by :class:`Pressure` rows by key.
    """

    in_flight: float = 0.0
    queue_depth: float = 0.0
    ready_replicas: int = 0
    current_replicas: int = 0
    ttfa_p99_s: float | None = None
    extra: Mapping[str, float] = field(default_factory=dict)

    def value(self, signal: str) -> float | None:
        """A signal by name: a field of this class, else a key of ``extra`` (None: not reported)."""
        if signal != "extra" and signal in _SIGNAL_FIELDS:
            v = getattr(self, signal)
            return None if v is None else float(v)
        v = self.extra.get(signal)
        return None if v is None else float(v)


_SIGNAL_FIELDS = frozenset(f.name for f in fields(PoolSignals))


@dataclass(frozen=True)
class DeploymentSignals:
    t: float
    pools: Mapping[str, PoolSignals]


@dataclass(frozen=True)
class Pressure:
    """One rule of the pressure table: a signal that adds replicas while it is above its threshold,
    even when the load target is met.

    ``signal`` names a :class:`PoolSignals` value (:meth:`PoolSignals.value`); ``threshold`` is the
    name of the :class:`AutoscaleConfig` knob that bounds it, or a fixed number; with
    ``per_replica`` the bound is multiplied by the ready replicas. ``reason`` labels the decision
    (and the ``reason`` label of ``operator_scaling_decisions``); ``message`` is formatted with
    ``value`` and ``threshold``. A pool with no ready replica feels no pressure (its signals
    describe nothing yet); the first row that fires wins.
    """

    reason: str
    signal: str
    threshold: str | float
    message: str
    per_replica: bool = False

    def limit(self, config: AutoscaleConfig) -> float:
        if isinstance(self.threshold, str):
            return float(getattr(config, self.threshold))
        return float(self.threshold)

    def fires(self, config: AutoscaleConfig, s: PoolSignals) -> str | None:
        """The message when the rule fires for ``s``, else None."""
        value = s.value(self.signal)
        if value is None or s.ready_replicas <= 0:
            return None
        limit = self.limit(config)
        bound = limit * s.ready_replicas if self.per_replica else limit
        if value <= bound:
            return None
        return self.message.format(value=value, threshold=limit)


#: The pressure table. A new signal is one row here (and a value in the adapters' PoolSignals).
PRESSURES: tuple[Pressure, ...] = (
    Pressure("slo", "ttfa_p99_s", "ttfa_p99_slo_s", "ttfa p99 {value:.3f}s > SLO {threshold:g}s"),
    Pressure("queue", "queue_depth", "queue_depth_per_replica",
             "queue depth {value:.0f} > {threshold:g}/replica", per_replica=True),
)


def pressure_step(current: int) -> int:
    """Replicas a firing pressure asks for: 10% more, at least one."""
    return current + max(1, math.ceil(0.1 * current))


@dataclass(frozen=True)
class AutoscaleState:
    """What the autoscaler remembers between decisions (kept in the CR status or in memory)."""

    samples: tuple[tuple[float, float], ...] = ()
    recommendations: Mapping[str, tuple[tuple[float, int], ...]] = field(default_factory=dict)
    panic_until: float | None = None
    #: The last decision taken in panic (what ``burst_hold_s`` counts from); None: none yet.
    last_panic: float | None = None


@dataclass(frozen=True)
class PoolDecision:
    pool: str
    gpu_class: str
    current: int
    desired: int
    direction: str  # up | down | none
    reason: str  # load | panic | forecast | stabilized | min | max | steady | a Pressure's reason
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


def clamp_replicas(pool: PoolSpec, replicas: int) -> int:
    """``replicas`` within the pool's ``[min_replicas, max_replicas]``: the only replica clamp.

    The autoscaler applies it to every decision; an adapter applies it when the bounds change
    between decisions (``clamp_replicas(pool, live)``), or to size a new pool
    (``clamp_replicas(pool, 0)`` = ``min_replicas``).
    """
    return min(max(replicas, pool.min_replicas), pool.max_replicas)


def pool_targets(pools: Sequence[PoolSpec], catalog: GpuCatalog,
                 config: AutoscaleConfig) -> dict[str, float]:
    """In-flight target per replica for each pool, scaled by class throughput."""
    out = {}
    for p in pools:
        if p.target_in_flight_per_replica is not None:
            out[p.key] = p.target_in_flight_per_replica
        else:
            out[p.key] = config.target_in_flight_per_replica * catalog.relative_throughput(p.gpu_class)
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


@dataclass(frozen=True)
class _Step:
    """What every pool's decision of one step shares."""

    config: AutoscaleConfig
    now: float
    panic: bool
    basis: float  # the load the replicas are sized for
    panic_load: float
    ready_capacity: float
    targets: Mapping[str, float]
    pressures: Sequence[Pressure]
    forecasts: Mapping[str, LoadForecast]
    window: float  # the scale-down stabilization window in force (stabilization_window)


class LoadForecast(NamedTuple):
    """The replicas a pool needs for the load expected when a replica ordered now is ready."""

    replicas: int
    load: float  # requests (in flight + queued) the trend expects at now + horizon_s
    horizon_s: float
    slope: float  # requests per second


def forecast_horizon(config: AutoscaleConfig, pool: PoolSpec, catalog: GpuCatalog) -> float:
    """How far ahead a pool is sized: ``forecast_horizon_s``, else its class's ``model_load_s``."""
    if config.forecast_horizon_s is not None:
        return config.forecast_horizon_s
    return float(catalog.get(pool.gpu_class).model_load_s)


def load_forecasts(config: AutoscaleConfig, pools: Sequence[PoolSpec], catalog: GpuCatalog,
                   samples: Sequence[tuple[float, float]], now: float, basis: float,
                   targets: Mapping[str, float]) -> dict[str, LoadForecast]:
    """Per pool, the replicas for the deployment load the rising trend expects one horizon ahead
    (the line fitted over ``forecast_window_s``, split like the load); only pools whose forecast
    exceeds ``basis``, the load the step already sizes for. Empty when the load is not rising."""
    if not config.forecast:
        return {}
    trend = fit_trend(samples, now, config.forecast_window_s)
    if trend is None or trend.slope <= 0:
        return {}
    out: dict[str, LoadForecast] = {}
    by_horizon: dict[float, dict[str, int]] = {}
    for p in pools:
        h = forecast_horizon(config, p, catalog)
        load = _expected(trend, now, h)
        if load <= basis * (1 + config.forecast_min_growth):
            continue
        if h not in by_horizon:
            by_horizon[h] = split_load(load * (1.0 + config.burst_headroom), pools, targets)
        out[p.key] = LoadForecast(by_horizon[h][p.key], load, h, trend.slope)
    return out


def _expected(trend: Trend, now: float, horizon_s: float) -> float:
    return trend.at(now - trend.t + horizon_s)


def _check_pools(pools: Sequence[PoolSpec]) -> None:
    if not pools:
        raise ValueError("a deployment needs at least one pool")
    keys = [p.key for p in pools]
    if len(set(keys)) != len(keys):
        raise ValueError(f"pool names must be unique, got {keys}")


def stabilization_window(config: AutoscaleConfig, last_panic: float | None, now: float) -> float:
    """Seconds of recommendations a scale-down takes the highest of: ``burst_hold_s`` while the
    last panic is younger than that, else ``scale_down_stabilization_s``.

    Why: a burst that ends within seconds is over before a replica ordered for it has loaded, so
    the replicas it brought only help if they are still warm at the next one; where bursts recur
    faster than ``burst_hold_s``, letting them go after the usual window makes every burst meet
    loading replicas and every scale-up evict the fill admitted between bursts.
    """
    hold = config.burst_hold_s
    if hold > config.scale_down_stabilization_s and last_panic is not None and now - last_panic < hold:
        return hold
    return config.scale_down_stabilization_s


def _history_kept_s(config: AutoscaleConfig) -> float:
    """How far back the recommendations are kept: the longest window a scale-down may take."""
    return max(config.scale_down_stabilization_s, config.burst_hold_s)


def _panic_until(config: AutoscaleConfig, state: AutoscaleState, now: float, panic_load: float,
                 ready_capacity: float) -> float | None:
    """Panic starts when the short-window load needs ``panic_threshold`` x the ready capacity and
    lasts one stable window."""
    until = state.panic_until
    if until is not None and now >= until:
        until = None
    if panic_load >= config.panic_threshold * max(ready_capacity, 1e-9) and panic_load > 0:
        until = now + config.stable_window_s
    return until


def decide_replicas(config: AutoscaleConfig, pools: Sequence[PoolSpec], catalog: GpuCatalog,
                    state: AutoscaleState, signals: DeploymentSignals,
                    pressures: Sequence[Pressure] = PRESSURES) -> tuple[ScaleDecision,
                                                                        AutoscaleState]:
    """Decide desired replicas for every pool of one deployment; return the next state."""
    _check_pools(pools)
    now = signals.t
    sig = {p.key: signals.pools.get(p.key, PoolSignals()) for p in pools}
    load_now = sum(s.in_flight + s.queue_depth for s in sig.values())
    keep_from = now - max(config.stable_window_s,
                          config.forecast_window_s if config.forecast else 0.0)
    samples = tuple((t, v) for (t, v) in state.samples if t > keep_from) + ((now, load_now),)
    stable = _window_mean(samples, now, config.stable_window_s)
    panic_load = _window_mean(samples, now, config.panic_window_s)

    targets = pool_targets(pools, catalog, config)
    # the load the ready replicas are sized to carry (their targets less the burst head-room)
    ready_capacity = sum(sig[p.key].ready_replicas * targets[p.key] for p in pools) / (
        1.0 + config.burst_headroom)
    panic_until = _panic_until(config, state, now, panic_load, ready_capacity)
    panic = panic_until is not None
    basis = max(stable, panic_load) if panic else stable
    spare = 1.0 + config.burst_headroom
    wanted = split_load(basis * spare, pools, targets)
    forecasts = load_forecasts(config, pools, catalog, samples, now, basis, targets)
    last_panic = now if panic else state.last_panic

    step = _Step(config, now, panic, basis, panic_load, ready_capacity, targets, tuple(pressures),
                 forecasts, stabilization_window(config, last_panic, now))
    recs = dict(state.recommendations)
    decisions = []
    for p in pools:
        decision, recs[p.key] = _decide_pool(step, p, sig[p.key], wanted[p.key],
                                             recs.get(p.key, ()))
        decisions.append(decision)
    decision = ScaleDecision(now, tuple(decisions), stable, panic_load, panic)
    new_state = replace(state, samples=samples, recommendations=recs, panic_until=panic_until,
                        last_panic=last_panic)
    return decision, new_state


def _decide_pool(step: _Step, p: PoolSpec, s: PoolSignals, want: int,
                 history: tuple[tuple[float, int], ...]) -> tuple[PoolDecision,
                                                                 tuple[tuple[float, int], ...]]:
    """One pool: load (or panic) -> forecast -> pressures -> scale-up cap -> scale-down
    stabilization -> clamp."""
    cfg, current, ready = step.config, s.current_replicas, s.ready_replicas
    if step.panic:
        reason, msg = "panic", (f"panic: {step.panic_load:.1f} req in {cfg.panic_window_s:.0f}s "
                                f"window vs ready capacity {step.ready_capacity:.1f}")
    else:
        reason, msg = "load", (f"load {step.basis:.1f} req split by weight; target "
                               f"{step.targets[p.key]:.1f}/replica")
    ahead = step.forecasts.get(p.key)
    if ahead is not None and ahead.replicas > want:
        want, reason = ahead.replicas, "forecast"
        msg = (f"load rising {ahead.slope:.2f} req/s: {ahead.load:.1f} req expected in "
               f"{ahead.horizon_s:.0f}s, when a replica ordered now is ready; target "
               f"{step.targets[p.key]:.1f}/replica")
    if want <= current:
        for rule in step.pressures:
            fired = rule.fires(cfg, s)
            if fired is not None:
                want, reason, msg = pressure_step(current), rule.reason, fired
                break
    needed = clamp_replicas(p, want)
    up_cap = max(math.ceil(max(ready, 1) * cfg.max_scale_up_rate), ready + 4)
    if want > up_cap:
        want = up_cap
        msg += f"; capped by scale-up rate at {up_cap}"
    # Scale-down stabilization: the highest recommendation in the window wins.
    history = tuple((t, v) for (t, v) in history
                    if t > step.now - _history_kept_s(cfg)) + ((step.now, want),)
    if want < current:
        if step.panic:
            want, reason, msg = current, "panic", "panic mode: no scale-down"
        else:
            stabilized = max(v for (t, v) in history if t > step.now - step.window)
            # at most 1/rate of the replicas go per step; the last one of a pool whose minimum is
            # 0 may go too (ceil(1/rate) = 1 would hold it for ever: found by the loop test)
            floor = math.ceil(current / cfg.max_scale_down_rate) if current > 1 else 0
            target = max(stabilized, floor, want)
            if target > want:
                reason = "stabilized"
                msg = (f"load wants {want}; holding {min(target, current)} (max recommendation "
                       f"in {step.window:.0f}s window, at most "
                       f"1/{cfg.max_scale_down_rate:g} removed per step)")
            want = min(target, current)
    clamped = clamp_replicas(p, want)
    if clamped != want:
        reason = "min" if clamped > want else "max"
        msg = f"{msg}; clamped to [{p.min_replicas}, {p.max_replicas}]"
        want = clamped
    direction = "up" if want > current else "down" if want < current else "none"
    if direction == "none" and reason == "load":
        reason = "steady"
    return PoolDecision(p.key, p.gpu_class, current, want, direction, reason, msg,
                        needed=max(needed, want)), history


def scale_down_victims(in_flight_by_pod: Mapping[str, float], count: int) -> tuple[str, ...]:
    """Which replicas to remove first on scale-down: the ``count`` least busy (ties by name).

    The operator marks them with a low ``controller.kubernetes.io/pod-deletion-cost`` so the
    ReplicaSet removes them and the fewest in-flight requests have to drain.
    """
    ranked = sorted(in_flight_by_pod, key=lambda name: (in_flight_by_pod[name], name))
    return tuple(ranked[:max(count, 0)])
