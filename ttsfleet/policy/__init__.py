"""The fleet policy: pure, deterministic functions that decide replicas, fill admission and eviction.

Everything that decides lives here; the operator, the Slurm agent and the simulator only observe
their world, call these functions and carry out the result. Nothing in this package does I/O,
reads a clock or imports an adapter; it imports only the core (:mod:`ttsfleet.catalog`,
:mod:`ttsfleet.config`).

* :mod:`~ttsfleet.policy.autoscale` — replicas per pool from traffic signals;
* :mod:`~ttsfleet.policy.fill` — fill admission and eviction for one GPU class;
* :mod:`~ttsfleet.policy.demand` — the inference demand forecast fill keeps head-room for, and
  the typed :class:`InferenceNeed` the autoscaler hands the fill plan.
"""

from ttsfleet.policy.autoscale import (
    PRESSURES,
    AutoscaleState,
    DeploymentSignals,
    PoolDecision,
    PoolSignals,
    Pressure,
    ScaleDecision,
    clamp_replicas,
    decide_replicas,
    pool_targets,
    pressure_step,
    scale_down_victims,
    split_load,
)
from ttsfleet.policy.demand import (
    DemandTracker,
    InferenceNeed,
    demand_trend,
    fill_forecast,
    fill_forecasts,
    forecast_demand,
    inference_demand,
    needed_by_class,
)
from ttsfleet.policy.fill import (
    ClassObservation,
    FillJobView,
    FillPlan,
    choose_victims,
    headroom_gpus,
    plan_fill,
)

__all__ = [
    "PRESSURES", "AutoscaleState", "ClassObservation", "DemandTracker", "DeploymentSignals",
    "FillJobView", "FillPlan", "InferenceNeed", "PoolDecision", "PoolSignals", "Pressure",
    "ScaleDecision", "choose_victims", "clamp_replicas", "decide_replicas", "demand_trend",
    "fill_forecast", "fill_forecasts", "forecast_demand", "headroom_gpus", "inference_demand",
    "needed_by_class", "plan_fill", "pool_targets", "pressure_step", "scale_down_victims",
    "split_load",
]
