"""The fleet policy: pure, deterministic functions that decide replicas, fill admission and eviction.

Everything that decides lives here; the operator, the Slurm agent and the simulator only observe
their world, call these functions and carry out the result. Nothing in this package does I/O,
reads a clock or imports an adapter; it imports only the core (:mod:`ttsfleet.catalog`,
:mod:`ttsfleet.config`).

* :mod:`~ttsfleet.policy.autoscale` — replicas per pool from traffic signals;
* :mod:`~ttsfleet.policy.fill` — fill admission and eviction for one GPU class;
* :mod:`~ttsfleet.policy.demand` — the inference demand forecasts fill keeps head-room for (eviction)
  and admits against (admission that expects to stay), and the typed :class:`InferenceNeed` the
  autoscaler hands the fill plan;
* :mod:`~ttsfleet.policy.colocate` — when inference may share a fill job's GPU (the fill job a
  low-priority co-tenant) instead of evicting it, against a measured interference cost;
* :mod:`~ttsfleet.policy.scale` — an explicit replica total (the scale subresource) split across
  pools by weight within their bounds;
* :mod:`~ttsfleet.policy.trend` — the least-squares trend both forecasts read.
"""

from ttsfleet.policy.autoscale import (
    PRESSURES,
    AutoscaleState,
    DeploymentSignals,
    LoadForecast,
    PoolDecision,
    PoolSignals,
    Pressure,
    ScaleDecision,
    clamp_replicas,
    decide_replicas,
    forecast_horizon,
    load_forecasts,
    pool_targets,
    pressure_step,
    scale_down_victims,
    split_load,
)
from ttsfleet.policy.colocate import ColocationLimit, colocated_rtf, colocation_limit
from ttsfleet.policy.demand import (
    DemandTracker,
    InferenceNeed,
    admission_forecast,
    admission_forecasts,
    demand_trend,
    fill_forecast,
    fill_forecasts,
    forecast_demand,
    inference_demand,
    needed_by_class,
    recent_peak,
    tracker_window_s,
)
from ttsfleet.policy.fill import (
    ClassObservation,
    FillJobView,
    FillPlan,
    NodeView,
    choose_victims,
    fill_placements,
    headroom_gpus,
    inference_node_order,
    plan_colocated,
    plan_fill,
)
from ttsfleet.policy.scale import ReplicaSplit, split_replicas, total_bounds
from ttsfleet.policy.trend import Trend, fit_trend

__all__ = [
    "AutoscaleState", "ClassObservation", "ColocationLimit", "DemandTracker", "DeploymentSignals",
    "FillJobView", "FillPlan", "InferenceNeed", "LoadForecast", "NodeView", "PRESSURES",
    "PoolDecision", "PoolSignals", "Pressure", "ReplicaSplit", "ScaleDecision", "Trend",
    "admission_forecast", "admission_forecasts", "choose_victims", "clamp_replicas",
    "colocated_rtf", "colocation_limit", "decide_replicas", "demand_trend", "fill_forecast",
    "fill_forecasts", "fill_placements", "fit_trend", "forecast_demand", "forecast_horizon",
    "headroom_gpus", "inference_demand", "inference_node_order", "load_forecasts",
    "needed_by_class", "plan_colocated", "plan_fill", "pool_targets", "pressure_step",
    "recent_peak", "scale_down_victims", "split_load", "split_replicas", "total_bounds",
    "tracker_window_s"
]
