"""The fill head-room forecast: demand tracker, trend, and the autoscaler's typed need."""

from __future__ import annotations

import pytest

from ttsfleet.catalog import GpuCatalog
from ttsfleet.config import AutoscaleConfig, FillPolicyConfig, PoolSpec
from ttsfleet.policy import (
    AutoscaleState,
    ClassObservation,
    DemandTracker,
    DeploymentSignals,
    FillJobView,
    InferenceNeed,
    PoolSignals,
    decide_replicas,
    fill_forecast,
    fill_forecasts,
    needed_by_class,
    plan_fill,
)

CFG = FillPolicyConfig(eviction_deadline_s=120, forecast_window_s=300)


def test_tracker_keeps_the_window_and_one_sample_per_instant():
    tr = DemandTracker()
    for t in range(0, 400, 50):
        tr = tr.observe(t, {"h200": t / 50}, window_s=300)
    assert [s[0] for s in tr.samples("h200")] == [50, 100, 150, 200, 250, 300, 350]
    again = tr.observe(350, {"h200": 99}, window_s=300)  # a second pass at the same instant
    assert again.samples("h200") == tr.samples("h200")
    assert tr.samples("rtx5090") == ()
    with pytest.raises(TypeError):
        tr.history["h200"] = ()  # type: ignore[index]  # immutable: no dict passed between timers


def test_forecast_is_the_larger_of_trend_and_need():
    tr = DemandTracker()
    for t in range(0, 301, 30):
        tr = tr.observe(t, {"h200": 5 + t / 60}, window_s=300)  # rising 1 GPU/min
    trend = fill_forecast(tr, "h200", 300, CFG)
    assert trend == pytest.approx(10 + 2)  # 10 now, +2 over the 120 s deadline
    assert fill_forecast(tr, "h200", 300, CFG, InferenceNeed({"h200": 20})) == 20
    assert fill_forecast(tr, "h200", 300, CFG, InferenceNeed({"h200": 3})) == pytest.approx(12)
    # a falling trend forecasts the current value, never less
    fall = DemandTracker().observe(0, {"h200": 9}, 300).observe(60, {"h200": 4}, 300)
    assert fill_forecast(fall, "h200", 60, CFG) == 4
    # no history and no need: nothing to reserve (0.0 and None mean the same to the fill plan)
    assert fill_forecast(DemandTracker(), "h200", 0, CFG) == 0.0
    assert fill_forecasts(tr, 300, CFG, InferenceNeed({"rtx5090": 2}), classes=["h200", "rtx5090"]) \
        == {"h200": pytest.approx(12), "rtx5090": 2.0}


def test_need_from_a_decision_reaches_the_fill_plan():
    cat = GpuCatalog.default()
    pools = [PoolSpec(gpu_class="h200", min_replicas=1, max_replicas=16)]
    cfg = AutoscaleConfig(target_in_flight_per_replica=10, max_scale_up_rate=2)
    sig = DeploymentSignals(0.0, {"h200": PoolSignals(in_flight=200, ready_replicas=1,
                                                      current_replicas=1)})
    decision, _ = decide_replicas(cfg, pools, cat, AutoscaleState(), sig)
    (pd,) = decision.pools
    assert pd.desired < pd.needed == 16  # the step is rate limited, the need is not
    assert dict(needed_by_class(decision, gpus_per_replica=2)) == {"h200": 32}
    need = InferenceNeed.total([InferenceNeed.from_decision(decision),
                                InferenceNeed({"h200": 2, "rtx5090": 1})])
    assert need.for_class("h200") == 18 and need.for_class("rtx5090") == 1
    # the fill plan evicts for the need before the autoscaler's later steps ask for the GPUs
    tr = DemandTracker().observe(0, {"h200": 1}, 300)
    fc = fill_forecast(tr, "h200", 0, CFG, InferenceNeed.from_decision(decision))
    obs = ClassObservation("h200", 0, total_gpus=20, inference_gpus=1,
                           fill_jobs=tuple(FillJobView(f"j{i}") for i in range(19)),
                           inference_forecast_gpus=fc)
    plan = plan_fill(FillPolicyConfig(), obs)
    assert len(plan.evict) == 15 and plan.headroom_gpus == 15


def test_need_rejects_bad_values():
    with pytest.raises(ValueError):
        InferenceNeed({"h200": -1})
    assert InferenceNeed({"h200": 0}).gpus == {}
