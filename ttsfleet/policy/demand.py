"""Inference demand per GPU class, and the forecast fill admission keeps head-room for.

Fill must hand GPUs back *before* inference needs them, so :func:`ttsfleet.policy.plan_fill` gets
``inference_forecast_gpus``: the inference GPUs a class is expected to hold one eviction deadline
from now. It is the larger of two things:

* the trend: a least-squares line through the class's demand (inference GPUs held plus wanted)
  over ``forecast_window_s``, extrapolated by ``eviction_deadline_s``; only growth is
  extrapolated, so the forecast never releases capacity early;
* what the autoscalers already know: :attr:`PoolDecision.needed` (replicas the load needs before
  the scale-up rate limit), carried from the autoscaler to the fill plan as an
  :class:`InferenceNeed`, so fill is evicted ahead of the next scale-up steps, not at them.

Admission looks further than eviction (:func:`admission_forecast`): a fill job pays its start-up
on every admission, so it is admitted only onto GPUs the forecast expects to stay free past its
start-up and first checkpoint (``admission_horizon_s``) and that inference has not needed within
``admission_lookback_s`` (on bursty traffic a GPU a burst just used is needed again soon). The
gap between the two forecasts is a hysteresis band: a GPU inside it is neither filled nor
evicted, so fill does not churn at the scale-up/down boundary.

Every adapter (operator fill controller, simulator, Slurm agent) keeps one :class:`DemandTracker`
(an immutable value it replaces each pass, over :func:`tracker_window_s`) and calls
:func:`fill_forecasts` and :func:`admission_forecasts`; none of them writes the formula. Pure:
time comes in as arguments.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from ttsfleet.config import FillPolicyConfig
from ttsfleet.policy.autoscale import ScaleDecision
from ttsfleet.policy.fill import ClassObservation
from ttsfleet.policy.trend import fit_trend

Samples = tuple[tuple[float, float], ...]


def demand_trend(history: Sequence[tuple[float, float]], now: float, horizon_s: float,
                 window_s: float) -> float | None:
    """Demand expected at ``now + horizon_s``: the newest sample plus the growth of the
    least-squares trend over ``window_s`` (:func:`~ttsfleet.policy.trend.fit_trend`).

    Only growth is extrapolated (a falling trend forecasts the current value), so the forecast
    reserves room for scale-ups and never releases capacity early. Returns None with no history.
    """
    trend = fit_trend(history, now, window_s)
    if trend is None:
        return None
    return trend.last + max(trend.slope, 0.0) * horizon_s


#: The old name (adapters switch to :func:`fill_forecasts`).
forecast_demand = demand_trend


def _frozen(mapping: Mapping[str, int]) -> Mapping[str, int]:
    return MappingProxyType({k: v for k, v in sorted(mapping.items()) if v})


@dataclass(frozen=True)
class InferenceNeed:
    """GPUs per class that inference load needs beyond the autoscalers' rate-limited steps.

    The typed value the autoscaler hands the fill plan (instead of a shared dict): build one per
    decision with :meth:`from_decision`, add the ones of several deployments with :meth:`total`.
    """

    gpus: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if any(v < 0 for v in self.gpus.values()):
            raise ValueError(f"needed GPUs must be >= 0, got {dict(self.gpus)}")
        object.__setattr__(self, "gpus", _frozen(self.gpus))

    @classmethod
    def from_decision(cls, decision: ScaleDecision, gpus_per_replica: int = 1) -> InferenceNeed:
        """The GPUs a decision's pools need (``PoolDecision.needed`` x GPUs per replica)."""
        return cls(needed_by_class(decision, gpus_per_replica))

    @classmethod
    def total(cls, needs: Iterable[InferenceNeed]) -> InferenceNeed:
        """The sum over several deployments (each holds its own GPUs)."""
        out: dict[str, int] = {}
        for need in needs:
            for cls_name, n in need.gpus.items():
                out[cls_name] = out.get(cls_name, 0) + n
        return cls(out)

    def for_class(self, gpu_class: str) -> int:
        return self.gpus.get(gpu_class, 0)


def needed_by_class(decision: ScaleDecision, gpus_per_replica: int = 1) -> Mapping[str, int]:
    """GPUs per class the decision's load needs: sum of ``PoolDecision.needed`` x GPUs/replica."""
    if gpus_per_replica < 1:
        raise ValueError("gpus_per_replica must be >= 1")
    out: dict[str, int] = {}
    for pd in decision.pools:
        out[pd.gpu_class] = out.get(pd.gpu_class, 0) + pd.needed * gpus_per_replica
    return _frozen(out)


@dataclass(frozen=True)
class DemandTracker:
    """Inference demand samples per GPU class over the forecast window (an immutable value).

    :meth:`observe` returns the next tracker; samples older than the window are dropped and a
    second sample at the same (or an earlier) time is ignored, so several fill passes at one
    instant record the demand once.
    """

    history: Mapping[str, Samples] = field(default_factory=lambda: MappingProxyType({}))
    #: The eviction forecasts (:func:`fill_forecast`) the fill passes kept GPUs free for, per
    #: class (:meth:`remember`): admission does not take back a GPU eviction just wanted free.
    forecasts: Mapping[str, Samples] = field(default_factory=lambda: MappingProxyType({}))

    @staticmethod
    def _add(history: Mapping[str, Samples], t: float, values: Mapping[str, float],
             window_s: float) -> Mapping[str, Samples]:
        out = dict(history)
        for cls_name, value in values.items():
            hist = tuple(s for s in out.get(cls_name, ()) if s[0] >= t - window_s)
            if not hist or hist[-1][0] < t:
                hist += ((float(t), float(value)),)
            out[cls_name] = hist
        return MappingProxyType(out)

    def observe(self, t: float, demand: Mapping[str, float], window_s: float) -> DemandTracker:
        """Record ``demand`` (inference GPUs held plus wanted, per class) at time ``t``."""
        return DemandTracker(self._add(self.history, t, demand, window_s), self.forecasts)

    def remember(self, t: float, forecasts: Mapping[str, float], window_s: float) -> DemandTracker:
        """Record the eviction forecasts of the pass at ``t`` (what fill kept free)."""
        return DemandTracker(self.history, self._add(self.forecasts, t, forecasts, window_s))

    def observe_classes(self, t: float, observations: Mapping[str, ClassObservation],
                        window_s: float) -> DemandTracker:
        """:meth:`observe` with each class's :func:`inference_demand`."""
        return self.observe(t, {c: inference_demand(o) for c, o in observations.items()}, window_s)

    def samples(self, gpu_class: str) -> Samples:
        return self.history.get(gpu_class, ())


def inference_demand(obs: ClassObservation) -> float:
    """What the demand forecast tracks: inference GPUs held plus wanted."""
    return float(obs.inference_gpus + obs.pending_inference_gpus)


def fill_forecast(tracker: DemandTracker, gpu_class: str, now: float, config: FillPolicyConfig,
                  need: InferenceNeed | None = None) -> float:
    """Inference GPUs ``gpu_class`` is expected to hold at ``now + eviction_deadline_s``: the
    larger of the demand trend and the autoscalers' known need (0.0 with neither)."""
    trend = demand_trend(tracker.samples(gpu_class), now, config.eviction_deadline_s,
                         config.forecast_window_s)
    needed = need.for_class(gpu_class) if need is not None else 0
    return max(trend or 0.0, float(needed))


def fill_forecasts(tracker: DemandTracker, now: float, config: FillPolicyConfig,
                   need: InferenceNeed | None = None,
                   classes: Iterable[str] | None = None) -> dict[str, float]:
    """:func:`fill_forecast` for ``classes`` (default: every class the tracker has seen)."""
    names = sorted(tracker.history) if classes is None else list(classes)
    return {c: fill_forecast(tracker, c, now, config, need) for c in names}


def tracker_window_s(config: FillPolicyConfig) -> float:
    """How much history the adapters' :class:`DemandTracker` keeps: the trend's window and the
    admission look-back, whichever is longer."""
    return max(config.forecast_window_s, config.admission_lookback_s)


def recent_peak(history: Sequence[tuple[float, float]], now: float, window_s: float) -> float | None:
    """The highest sample of ``(now - window_s, now]`` (None: no sample in it, or no window)."""
    if window_s <= 0:
        return None
    vals = [v for (t, v) in history if now - window_s < t <= now]
    return max(vals) if vals else None


def admission_forecast(tracker: DemandTracker, gpu_class: str, now: float, config: FillPolicyConfig,
                       need: InferenceNeed | None = None, evict_forecast: float | None = None) -> float:
    """Inference GPUs ``gpu_class`` may need while a fill job admitted now pays back its start-up:
    the largest of :func:`fill_forecast` (what eviction keeps free), the demand trend's growth
    over ``eviction_deadline_s + admission_horizon_s``, and the peak over ``admission_lookback_s``
    of the demand and of the eviction forecasts remembered (:meth:`DemandTracker.remember`).
    Never below :func:`fill_forecast` (pass it as ``evict_forecast`` when already computed), so
    admission never takes a GPU that eviction would free again at once."""
    samples = tracker.samples(gpu_class)
    out = (fill_forecast(tracker, gpu_class, now, config, need) if evict_forecast is None
           else evict_forecast)
    if config.admission_horizon_s > 0:
        trend = demand_trend(samples, now, config.eviction_deadline_s + config.admission_horizon_s,
                             config.forecast_window_s)
        out = max(out, trend or 0.0)
    for hist in (samples, tracker.forecasts.get(gpu_class, ())):
        peak = recent_peak(hist, now, config.admission_lookback_s)
        out = max(out, peak or 0.0)
    return out


def admission_forecasts(tracker: DemandTracker, now: float, config: FillPolicyConfig,
                        need: InferenceNeed | None = None,
                        classes: Iterable[str] | None = None) -> dict[str, float]:
    """:func:`admission_forecast` for ``classes`` (default: every class the tracker has seen)."""
    names = sorted(tracker.history) if classes is None else list(classes)
    return {c: admission_forecast(tracker, c, now, config, need) for c in names}
