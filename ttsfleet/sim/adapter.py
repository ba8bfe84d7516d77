"""The simulator as an adapter: observe the simulated fleet, call the policy, act on the fleet.

:func:`policy_step` is the simulator's counterpart of the operator's autoscale timer
(``operator/inference.py``) and fill pass (``operator/fill.py``), in the same order: pool
signals → :func:`~ttsfleet.policy.decide_replicas` → scale the pools; per GPU class the demand
tracker and an observation → :func:`~ttsfleet.policy.plan_fill` → evict and admit. Only the
policy decides; this module only translates between the fleet model and the policy's types.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ttsfleet.contracts.fill import work_at_risk
from ttsfleet.policy import (
    AutoscaleState,
    ClassObservation,
    DeploymentSignals,
    FillJobView,
    NodeView,
    PoolSignals,
    ScaleDecision,
    decide_replicas,
    plan_fill,
)
from ttsfleet.policy.demand import DemandTracker, InferenceNeed, fill_forecast
from ttsfleet.sim.fleet import ClassState, Fleet

DECISIONS_KEPT = 40


@dataclass
class Controllers:
    """What the operator's controllers remember between passes (their state, not decisions)."""

    autoscale: AutoscaleState = field(default_factory=AutoscaleState)
    demand: DemandTracker = field(default_factory=DemandTracker)
    scale_events: dict[str, int] = field(default_factory=lambda: {"up": 0, "down": 0})
    decisions_sample: list[str] = field(default_factory=list)


def to_pool_signals(fleet: Fleet, t: float) -> DeploymentSignals:
    """Per-pool traffic signals, as the operator scrapes them from the pods' /metrics: in flight
    and queued now, and the p99 time to first audio of the requests since the last pass."""
    sig = {}
    for h in fleet.pools:
        p = h.traffic
        sig[p.key] = PoolSignals(in_flight=p.in_flight_obs, queue_depth=p.queue,
                                 ready_replicas=p.ready, current_replicas=h.desired,
                                 ttfa_p99_s=p.take_window_p99())
    return DeploymentSignals(t, sig)


def to_class_observation(cl: ClassState, t: float, checkpoint_interval_s: float, gpus_per_node: int,
                         forecast_gpus: float | None = None, *, fill_jobs: bool = True,
                         nodes: bool = False) -> ClassObservation:
    """One GPU class as the fill controller sees it: nodes' allocations, (``fill_jobs``) the
    fill pods with their seconds since the last checkpoint and (``nodes``) the node topology."""
    views = tuple(FillJobView(j.id, 1, work_at_risk(t, j.run_start, None, checkpoint_interval_s)
                              if j.state == "running" else 0.0, j.state == "stopping",
                              j.node.name if nodes else "")
                  for j in cl.fill_jobs.values()) if fill_jobs else ()
    node_views = tuple(NodeView(n.name, n.size, n.inference, n.training)
                       for n in cl.nodes) if nodes else ()
    return ClassObservation(
        gpu_class=cl.name, t=t, total_gpus=cl.total, inference_gpus=cl.inference_gpus,
        training_gpus=cl.train_gpus, pending_inference_gpus=sum(h.pending for h in cl.pools),
        pending_training_gpus=gpus_per_node * sum(j.nodes for _, j in cl.train_pending),
        fill_jobs=views, inference_forecast_gpus=forecast_gpus, nodes=node_views)


def policy_step(t: float, fleet: Fleet, ctl: Controllers, *, fill: bool) -> ScaleDecision:
    """One pass of the operator's timers over the simulated fleet."""
    scenario = fleet.scenario
    # autoscale: observe -> decide -> act
    signals = to_pool_signals(fleet, t)
    decision, ctl.autoscale = decide_replicas(scenario.autoscale, scenario.pools, scenario.catalog,
                                              ctl.autoscale, signals)
    for h, d in zip(fleet.pools, decision.pools, strict=True):
        if d.direction != "none":
            ctl.scale_events[d.direction] += 1
            if len(ctl.decisions_sample) < DECISIONS_KEPT:
                ctl.decisions_sample.append(f"t={t:.0f}s {d.pool}: {d.current}->{d.desired} "
                                            f"({d.reason}) {d.message}")
        fleet.set_replicas(t, h, d.desired)
    if not fill:
        return decision
    # fill: observe -> demand tracker and forecast -> plan -> act
    cfg = scenario.fill_policy
    need = InferenceNeed.from_decision(decision)
    held = {c: to_class_observation(cl, t, cfg.checkpoint_interval_s, scenario.gpus_per_node,
                                    fill_jobs=False) for c, cl in fleet.classes.items()}
    ctl.demand = ctl.demand.observe_classes(t, held, cfg.forecast_window_s)
    for c, cl in fleet.classes.items():
        obs = to_class_observation(cl, t, cfg.checkpoint_interval_s, scenario.gpus_per_node,
                                   fill_forecast(ctl.demand, c, t, cfg, need),
                                   nodes=scenario.observe_nodes)
        plan = plan_fill(cfg, obs)
        # the operator's counterpart: preferred node affinity on the pods it creates
        cl.inference_order = [cl.by_name[n] for n in plan.inference_nodes]
        fleet.evict_fill(t, c, plan.evict)
        fleet.admit_fill(t, c, plan.admit, [cl.by_name[n] for n in plan.placements])
    return decision
