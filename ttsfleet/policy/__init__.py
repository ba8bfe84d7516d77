"""The fleet policy: pure, deterministic functions that decide replicas, fill admission and eviction.

Everything that decides lives here; the operator, the Slurm agent and the simulator only observe
their world, call these functions and carry out the result. Nothing in this package does I/O,
reads a clock or imports an adapter.
"""

from ttsfleet.policy.autoscale import (
    AutoscaleState,
    DeploymentSignals,
    PoolDecision,
    PoolSignals,
    ScaleDecision,
    decide_replicas,
    pool_targets,
    scale_down_victims,
    split_load,
)
from ttsfleet.policy.fill import (
    ClassObservation,
    FillJobView,
    FillPlan,
    choose_victims,
    forecast_demand,
    headroom_gpus,
    plan_fill,
)

__all__ = [
    "AutoscaleState", "ClassObservation", "DeploymentSignals", "FillJobView", "FillPlan",
    "PoolDecision", "PoolSignals", "ScaleDecision", "choose_victims", "decide_replicas",
    "forecast_demand", "headroom_gpus", "plan_fill", "pool_targets", "scale_down_victims", "split_load",
]
