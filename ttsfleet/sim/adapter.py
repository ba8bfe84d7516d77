"""The simulator as an adapter: observe the simulated fleet, call the policy, act on the fleet.

:func:`policy_step` is the simulator's counterpart of the operator's autoscale timer
(``operator/inference.py``) and fill pass (``operator/fill.py``), in the same order: pool
signals → :func:`~ttsfleet.policy.decide_replicas` → scale the pools; per GPU class the demand
tracker, the eviction and admission forecasts and an observation →
:func:`~ttsfleet.policy.plan_fill` → evict, share (co-location: bind pending inference beside
fill) and admit. Only the policy decides; this module only translates between the fleet model
and the policy's types.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

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
from ttsfleet.policy.demand import (
    DemandTracker,
    InferenceNeed,
    admission_forecast,
    fill_forecast,
    tracker_window_s,
)
from ttsfleet.sim.fleet import ClassState, Fleet
from ttsfleet.sim.scenario import Scenario
from ttsfleet.sim.traffic import LUT_STEPS

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


class FillJobViews(Sequence[FillJobView]):
    """A class's fill jobs as the policy sees them, built when the plan first reads them (it reads
    them only to pick victims or place admissions): hundreds of views per pass would otherwise
    be most of the simulator's time on a large fleet. Ids are unique (the fleet's counter)."""

    def __init__(self, cl: ClassState, t: float, scenario: Scenario, nodes: bool) -> None:
        self._args = (cl, t, scenario, nodes)
        self._views: tuple[FillJobView, ...] | None = None

    def _build(self) -> tuple[FillJobView, ...]:
        if self._views is None:
            cl, t, scenario, nodes = self._args
            at_risk = scenario.at_risk
            self._views = tuple(
                FillJobView(j.id, 1, at_risk(j.state, j.admitted, j.run_start, t),
                            j.state == "stopping", j.node.name if nodes else "")
                for j in cl.fill_jobs.values())
        return self._views

    def __getitem__(self, i):  # noqa: ANN001, ANN204 - Sequence protocol
        return self._build()[i]

    def __len__(self) -> int:
        return len(self._args[0].fill_jobs)

    def __iter__(self) -> Iterator[FillJobView]:
        return iter(self._build())


def _node_views(cl: ClassState) -> tuple[NodeView, ...]:
    """The class's nodes as the policy sees them, rebuilt only when a node's inference or
    training count changed (:attr:`ClassState.node_epoch`)."""
    cached = cl.node_view_cache
    if cached is None or cached[0] != cl.node_epoch:
        cached = (cl.node_epoch, tuple(NodeView(n.name, n.size, n.inference, n.training)
                                       for n in cl.nodes))
        cl.node_view_cache = cached
    return cached[1]


def to_class_observation(cl: ClassState, t: float, scenario: Scenario,
                         forecast_gpus: float | None = None, admission_gpus: float | None = None, *,
                         fill_jobs: bool = True, nodes: bool = False) -> ClassObservation:
    """One GPU class as the fill controller sees it: nodes' allocations, (``fill_jobs``) the
    fill pods with their work at risk (:meth:`Scenario.at_risk`, built when the plan reads them)
    and (``nodes``) the node topology."""
    gpus_per_node = scenario.gpus_per_node
    views = FillJobViews(cl, t, scenario, nodes) if fill_jobs else ()
    node_views = _node_views(cl) if nodes else ()
    return ClassObservation(
        gpu_class=cl.name, t=t, total_gpus=cl.total, inference_gpus=cl.inference_gpus,
        training_gpus=cl.train_gpus, pending_inference_gpus=sum(h.pending for h in cl.pools),
        pending_training_gpus=gpus_per_node * sum(j.nodes for _, j in cl.train_pending),
        fill_jobs=views, inference_forecast_gpus=forecast_gpus,
        inference_admission_gpus=admission_gpus, nodes=node_views,
        colocate=bool(cl.pools) and all(h.traffic.co_max_k >= LUT_STEPS for h in cl.pools),
        fill_running_gpus=cl.fill_starting + cl.fill_running if fill_jobs else 0,
        fill_terminating_gpus=cl.fill_stopping if fill_jobs else 0)


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
    held = {c: to_class_observation(cl, t, scenario, fill_jobs=False)
            for c, cl in fleet.classes.items()}
    ctl.demand = ctl.demand.observe_classes(t, held, tracker_window_s(cfg))
    evict_for = {c: fill_forecast(ctl.demand, c, t, cfg, need) for c in fleet.classes}
    ctl.demand = ctl.demand.remember(t, evict_for, tracker_window_s(cfg))
    for c, cl in fleet.classes.items():
        obs = to_class_observation(cl, t, scenario, evict_for[c],
                                   admission_forecast(ctl.demand, c, t, cfg, need, evict_for[c]),
                                   nodes=scenario.observe_nodes)
        plan = plan_fill(cfg, obs)
        # the operator's counterpart: preferred node affinity on the pods it creates
        cl.inference_order = [cl.by_name[n] for n in plan.inference_nodes]
        fleet.evict_fill(t, c, plan.evict)
        fleet.share_fill(t, c, plan.share)
        fleet.admit_fill(t, c, plan.admit, [cl.by_name[n] for n in plan.placements])
    return decision
