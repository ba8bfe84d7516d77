"""Fill that expects to stay (admission forecast, work at risk) and co-location (issue 24)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ttsfleet.catalog import GpuCatalog
from ttsfleet.config import AutoscaleConfig, ColocationConfig, FillPolicyConfig
from ttsfleet.policy import (
    ClassObservation,
    DemandTracker,
    FillJobView,
    admission_forecast,
    choose_victims,
    colocation_limit,
    fill_forecast,
    plan_fill,
    recent_peak,
    tracker_window_s,
)

CFG = FillPolicyConfig(eviction_deadline_s=120, forecast_window_s=300, admission_lookback_s=600)


def jobs(*ages: float) -> tuple[FillJobView, ...]:
    return tuple(FillJobView(f"j{i}", 1, a) for i, a in enumerate(ages))


def tracker(samples: list[tuple[float, float]], window: float = 600) -> DemandTracker:
    tr = DemandTracker()
    for t, v in samples:
        tr = tr.observe(t, {"h200": v}, window)
    return tr


def test_recent_peak_and_tracker_window():
    hist = ((0.0, 5.0), (100.0, 9.0), (200.0, 3.0))
    assert recent_peak(hist, 200, 90) == 3.0  # (110, 200]
    assert recent_peak(hist, 200, 250) == 9.0
    assert recent_peak(hist, 200, 0) is None and recent_peak((), 200, 60) is None
    assert tracker_window_s(CFG) == 600
    assert tracker_window_s(FillPolicyConfig(forecast_window_s=300)) == 300


def test_admission_forecast_remembers_recent_demand_and_eviction_forecasts():
    # demand peaked at 12 GPUs 400 s ago and is 4 now, flat for the last 300 s
    tr = tracker([(0, 4), (200, 12), (300, 4), (450, 4), (600, 4)])
    evict = fill_forecast(tr, "h200", 600, CFG)
    assert evict == 4.0  # the eviction forecast looks at the trend only
    assert admission_forecast(tr, "h200", 600, CFG) == 12.0
    off = CFG.model_copy(update={"admission_lookback_s": 0.0})
    assert admission_forecast(tr, "h200", 600, off) == evict  # lookback 0: as before
    # a forecast eviction kept free a moment ago is remembered too
    tr = tr.remember(590, {"h200": 15.0}, 600)
    assert admission_forecast(tr, "h200", 600, CFG) == 15.0
    # a longer horizon extrapolates a rising trend further
    rising = tracker([(t, t / 60) for t in range(0, 601, 60)])
    long = CFG.model_copy(update={"admission_horizon_s": 600.0})
    assert admission_forecast(rising, "h200", 600, long) > admission_forecast(rising, "h200", 600, CFG)


def obs(**kw) -> ClassObservation:
    base = {"gpu_class": "h200", "t": 0.0, "total_gpus": 16, "inference_gpus": 4}
    return ClassObservation(**{**base, **kw})


def test_gpus_between_the_two_forecasts_are_neither_filled_nor_evicted():
    cfg = FillPolicyConfig()
    # 8 idle GPUs, 4 fill jobs; eviction expects 4 inference GPUs, admission 10
    o = obs(fill_jobs=jobs(10, 20, 30, 40), inference_forecast_gpus=4.0, inference_admission_gpus=10.0)
    plan = plan_fill(cfg, o)
    assert plan.evict == () and plan.admit == 2  # 8 idle, 6 held back for the admission forecast
    assert any("hold 6 idle GPU(s) back" in r for r in plan.reasons)
    # without the admission forecast every idle GPU is filled, as before
    assert plan_fill(cfg, obs(fill_jobs=jobs(10, 20, 30, 40), inference_forecast_gpus=4.0)).admit == 8
    # the admission forecast never evicts
    crowded = obs(fill_jobs=jobs(*range(12)), inference_forecast_gpus=4.0, inference_admission_gpus=16.0)
    assert plan_fill(cfg, crowded).evict == () and plan_fill(cfg, crowded).admit == 0


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 8), st.integers(0, 8), st.floats(0, 16), st.floats(0, 16))
def test_admission_forecast_only_ever_admits_less(n_fill, inf, f_evict, f_extra):
    cfg = FillPolicyConfig()
    o = obs(inference_gpus=inf, fill_jobs=jobs(*range(n_fill)), inference_forecast_gpus=f_evict)
    with_admission = obs(inference_gpus=inf, fill_jobs=jobs(*range(n_fill)),
                         inference_forecast_gpus=f_evict, inference_admission_gpus=f_evict + f_extra)
    a, b = plan_fill(cfg, o), plan_fill(cfg, with_admission)
    assert b.evict == a.evict  # eviction is the eviction forecast's alone
    assert b.admit <= a.admit


def test_work_at_risk_counts_a_young_jobs_start_up():
    # a job 15 s into its 20 s start-up has 15 s at risk; one 5 s after its checkpoint, 5 s
    starting = FillJobView("starting", 1, 15.0)
    checkpointed = FillJobView("ran-long", 1, 5.0)
    assert choose_victims((starting, checkpointed), 1) == ("ran-long",)


CURVES = GpuCatalog.default()
#: The in-flight target the limit is judged at: the default sizing (AutoscaleConfig, the scenario's).
TARGET = AutoscaleConfig().target_in_flight_per_replica


def test_colocation_limit_from_the_measured_cost():
    served = CURVES.get("h200").capacity
    on = ColocationConfig(enabled=True)
    limit = colocation_limit(on, served, TARGET)
    assert 1 <= limit.concurrency < TARGET and limit.allowed
    assert "RTF" in limit.reason or "TTFA" in limit.reason
    # a looser RTF limit allows more; off never allows
    looser = on.model_copy(update={"max_rtf": 0.8})
    assert colocation_limit(looser, served, TARGET).concurrency > limit.concurrency
    assert not colocation_limit(ColocationConfig(), served, TARGET).allowed
    # the write-up's flat TTFA curve: 1.67x at one request is already slower than at the target
    flat = CURVES.with_named_curve("h200", "writeup").get("h200").capacity
    never = colocation_limit(on, flat, TARGET)
    assert not never.allowed and never.reason.startswith("never pays")
    # a free interference cost makes co-location pay up to the curve's end
    free = on.model_copy(update={"inference_latency": 1.0, "max_rtf": 10.0})
    assert colocation_limit(free, served, served.max_concurrency).concurrency == served.max_concurrency


def test_colocated_plan_shares_instead_of_evicting_and_keeps_no_headroom():
    cfg = FillPolicyConfig()
    o = obs(inference_gpus=4, pending_inference_gpus=5, fill_jobs=jobs(9, 1, 5, 7, 3, 8, 2, 6, 4, 0),
            inference_forecast_gpus=12.0, colocate=True)
    plan = plan_fill(cfg, o)
    # 2 GPUs idle: 3 pending replicas share the fill jobs with the least work at risk
    assert plan.evict == () and plan.share == ("j9", "j1", "j6") and plan.admit == 0
    idle = plan_fill(cfg, obs(inference_gpus=4, fill_jobs=jobs(1, 2), inference_forecast_gpus=12.0,
                              colocate=True))
    assert idle.admit == 10 and idle.headroom_gpus == 0  # scale-ups bind beside fill
    # training still gets whole GPUs: evicted, never shared
    train = plan_fill(cfg, obs(inference_gpus=4, pending_training_gpus=8, fill_jobs=jobs(*range(10)),
                               colocate=True))
    assert len(train.evict) == 6 and train.share == () and train.admit == 0


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 6), st.integers(0, 10), st.integers(0, 10), st.integers(0, 8))
def test_colocated_plan_invariants(inf, n_fill, pending, training):
    cfg = FillPolicyConfig()
    o = obs(total_gpus=24, inference_gpus=inf, pending_inference_gpus=pending,
            pending_training_gpus=training, fill_jobs=jobs(*range(n_fill)), colocate=True)
    plan = plan_fill(cfg, o)
    free = 24 - inf - n_fill
    assert len(plan.share) == min(max(pending - free, 0), n_fill)  # exactly what is missing
    assert not set(plan.share) & set(plan.evict)
    assert inf + n_fill + plan.admit <= 24  # never more pods than GPUs
