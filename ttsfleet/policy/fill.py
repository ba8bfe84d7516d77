"""Fill admission and eviction for one GPU class: inference > training > cleaning.

Pure and deterministic. ``plan_fill(config, observation)`` says how many fill jobs to start on
idle GPUs and which running fill jobs to evict, with reasons. The Kubernetes fill controller,
the Slurm fill agent and the simulator each build an :class:`ClassObservation` from their own
world and carry out the :class:`FillPlan`; none of them decides anything itself.

Rules:

* Higher-priority work waiting for GPUs (pending inference or training) must find them free: fill
  is evicted for it at once.
* Headroom: GPUs kept empty for inference growth that the demand forecast
  (:mod:`ttsfleet.policy.demand`) expects within the eviction deadline (grace period plus pod
  start), plus a configured minimum, so scale-up never waits for a fill job's grace period.
* Fill jobs already terminating count as freeing capacity, so the same need is never evicted
  twice across consecutive decisions.
* Victims: least un-checkpointed work first (seconds since their last checkpoint), ties broken by
  job id. Exactly enough GPUs are freed: never more than needed.
* Nodes (optional: :attr:`ClassObservation.nodes` and :attr:`FillJobView.node`), because training
  takes whole nodes and inference pods that scatter leave none whole: victims freed for inference
  come from the nodes that already hold the most inference, so inference packs onto few nodes;
  victims freed for training come from the nodes with the least fill and no inference, so a
  whole node frees with the fewest evictions; admitted fill is placed on the nodes that already
  hold fill (:attr:`FillPlan.placements`) and inference on the nodes that already hold
  inference (:attr:`FillPlan.inference_nodes`). Within a node the least un-checkpointed work
  still goes first; the count is still exactly what is needed.
* Admission: only onto GPUs that are free now and not reserved for demand or headroom, never
  while training waits (when ``hold_while_training_pending``), never beyond ``max_fill_gpus`` or the
  work available. With :attr:`ClassObservation.inference_admission_gpus` (the admission forecast,
  :func:`ttsfleet.policy.demand.admission_forecast`) admission also keeps free the GPUs inference
  is expected to need before a new job pays back its start-up: GPUs between the two forecasts are
  neither filled nor evicted (a hysteresis band), so fill does not churn on bursty traffic.
* Work at risk: :attr:`FillJobView.seconds_since_checkpoint` counts from the job's start while it
  has not checkpointed yet, so a job still starting (or young) is not a free victim: evicting it
  throws its start-up away. Jobs checkpoint early in their life to make that start-up durable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ttsfleet.config import FillPolicyConfig


class FillJobView(NamedTuple):
    """A running fill job (pod or Slurm job) as the policy sees it.

    A NamedTuple rather than a dataclass: immutable like the rest of the observation, and cheap
    enough that the simulator can build hundreds per decision at the operator's cadence.
    """

    id: str
    gpus: int = 1
    #: Work at risk: seconds since the last checkpoint, or since the job started (start-up
    #: included) while it has none yet. Victims are chosen by it, least first.
    seconds_since_checkpoint: float = 0.0
    terminating: bool = False
    node: str = ""  # the node it runs on ("": unknown; node rules skip the job's node)


class NodeView(NamedTuple):
    """One node of the class as the policy sees it: its GPUs and what non-fill work holds them.

    Fill on the node is read from the :class:`FillJobView` entries naming it.
    """

    name: str
    gpus: int
    inference_gpus: int = 0  # bound inference pods (loading, serving or releasing)
    training_gpus: int = 0
    unavailable_gpus: int = 0


@dataclass(frozen=True)
class ClassObservation:
    """The state of one GPU class at time ``t``."""

    gpu_class: str
    t: float
    total_gpus: int
    inference_gpus: int = 0
    training_gpus: int = 0
    pending_inference_gpus: int = 0
    pending_training_gpus: int = 0
    unavailable_gpus: int = 0
    #: The running and terminating fill jobs. A tuple, or (an adapter that builds hundreds per
    #: pass) any sequence that builds them when first read, with the counts below given: the plan
    #: reads the jobs only when it evicts, shares or places.
    fill_jobs: Sequence[FillJobView] = ()
    fill_gpus_per_job: int = 1
    fill_work_available: int | None = None  # jobs that could still start; None = unbounded
    #: Fill jobs already waiting in the scheduler's queue (e.g. requeued after preemption): they
    #: start on their own as GPUs free up, so admission counts them as already admitted.
    queued_fill_jobs: int = 0
    inference_forecast_gpus: float | None = None  # inference GPUs expected at t + deadline
    #: Inference GPUs expected before a job admitted now pays back its start-up (the admission
    #: forecast: at least ``inference_forecast_gpus``). None: admission uses the eviction forecast.
    inference_admission_gpus: float | None = None
    #: The class's nodes (optional): with them victims, fill placement and inference placement
    #: keep nodes whole for training. Without them every rule is node-blind, as before.
    nodes: tuple[NodeView, ...] = ()
    #: Inference may be bound beside fill on this class (co-location pays on its pools:
    #: :func:`ttsfleet.policy.colocation_limit`): no head-room is kept and pending inference
    #: shares fill jobs' GPUs (:attr:`FillPlan.share`) instead of evicting them.
    colocate: bool = False
    #: GPUs held by running and by terminating fill jobs, when the adapter counts them itself
    #: (None: summed from ``fill_jobs``).
    fill_running_gpus: int | None = None
    fill_terminating_gpus: int | None = None

    def __post_init__(self) -> None:
        for name in ("total_gpus", "inference_gpus", "training_gpus", "pending_inference_gpus",
                     "pending_training_gpus", "unavailable_gpus", "queued_fill_jobs"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.fill_gpus_per_job < 1:
            raise ValueError("fill_gpus_per_job must be >= 1")
        if isinstance(self.fill_jobs, tuple):  # a lazy sequence's adapter vouches for its ids
            ids = [j.id for j in self.fill_jobs]
            if len(set(ids)) != len(ids):
                raise ValueError("fill job ids must be unique")
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")


@dataclass(frozen=True)
class FillPlan:
    gpu_class: str
    admit: int  # fill jobs to start
    evict: tuple[str, ...]  # fill job ids to stop (gracefully)
    free_gpus: int
    reserved_gpus: int  # demand now + headroom
    headroom_gpus: int
    reasons: tuple[str, ...]
    #: With nodes observed: a node for each admitted job (where fill already packs), and the
    #: nodes pending inference should bind to, best first (where inference already runs).
    #: Empty without nodes; adapters that cannot steer placement ignore them.
    placements: tuple[str, ...] = ()
    inference_nodes: tuple[str, ...] = ()
    #: With co-location (:attr:`ClassObservation.colocate`): fill jobs pending inference is bound
    #: beside instead of evicting them; each goes on as the replica's co-tenant.
    share: tuple[str, ...] = ()


def fill_gpus(jobs: Sequence[FillJobView], *, terminating: bool) -> int:
    return sum(j.gpus for j in jobs if j.terminating == terminating)


def headroom_gpus(config: FillPolicyConfig, obs: ClassObservation, *,
                  admission: bool = False) -> int:
    """GPUs to keep empty for inference growth expected within the eviction deadline (with
    ``admission``: expected before a job admitted now pays back its start-up)."""
    base = config.min_free_gpus + math.ceil(config.headroom_fraction * obs.inference_gpus - 1e-9)
    forecast = obs.inference_forecast_gpus
    if admission and obs.inference_admission_gpus is not None:
        forecast = max(forecast or 0.0, obs.inference_admission_gpus)
    growth = 0
    if forecast is not None:
        placed_or_pending = obs.inference_gpus + obs.pending_inference_gpus
        growth = max(0, math.ceil(forecast - placed_or_pending - 1e-9))
    return base + growth


def choose_victims(jobs: Sequence[FillJobView], gpus_needed: int,
                   nodes: Sequence[NodeView] = (), *, for_training: bool = False) -> tuple[str, ...]:
    """Running fill jobs to evict: just enough GPUs, least un-checkpointed work first.

    With ``nodes``, whole nodes come first: for inference (the default) the nodes that already
    hold the most non-fill work, so inference packs onto them; ``for_training`` the nodes with no
    inference or training and the least fill, so a whole node frees with the fewest evictions.
    Within a node (and among jobs whose node is not observed, ranked last) the least
    un-checkpointed work goes first.
    """
    if gpus_needed <= 0:
        return ()
    candidates = [j for j in jobs if not j.terminating]
    if nodes:
        rank = _victim_node_rank(nodes, candidates, for_training=for_training)
        last = (len(rank),)
        candidates.sort(key=lambda j: (rank.get(j.node, last), j.seconds_since_checkpoint, j.id))
    else:
        candidates.sort(key=lambda j: (j.seconds_since_checkpoint, j.id))
    victims: list[str] = []
    freed = 0
    for j in candidates:
        if freed >= gpus_needed:
            break
        victims.append(j.id)
        freed += j.gpus
    return tuple(victims)


def _victim_node_rank(nodes: Sequence[NodeView], running: Sequence[FillJobView], *,
                      for_training: bool) -> dict[str, tuple]:
    """Order of the nodes victims are taken from (lower first)."""
    fill = _fill_by_node(running)
    youngest: dict[str, float] = {}
    for j in running:
        youngest[j.node] = min(youngest.get(j.node, math.inf), j.seconds_since_checkpoint)
    out = {}
    for n in nodes:
        busy = n.inference_gpus + n.training_gpus
        if for_training:
            key = (busy > 0, fill.get(n.name, 0), youngest.get(n.name, math.inf), n.name)
        else:
            key = (-busy, n.gpus, youngest.get(n.name, math.inf), n.name)
        out[n.name] = key
    return {name: (i,) for i, (name, _) in enumerate(sorted(out.items(), key=lambda kv: kv[1]))}


def _fill_by_node(jobs: Sequence[FillJobView]) -> dict[str, int]:
    out: dict[str, int] = {}
    for j in jobs:
        out[j.node] = out.get(j.node, 0) + j.gpus
    return out


def inference_node_order(nodes: Sequence[NodeView]) -> tuple[str, ...]:
    """Nodes for new inference pods, best first: those already holding the most inference (or
    training), then the smaller ones, so the nodes left whole stay free for training."""
    return tuple(n.name for n in sorted(
        nodes, key=lambda n: (-(n.inference_gpus + n.training_gpus), n.gpus, n.name)))


def fill_placements(nodes: Sequence[NodeView], jobs: Sequence[FillJobView], count: int,
                    gpus_per_job: int = 1) -> tuple[str, ...]:
    """A node for each of ``count`` new fill jobs: nodes without inference first, then those
    holding the most fill, then the fullest, so fill packs and free GPUs gather where inference
    runs. At most as many as the nodes' free GPUs hold."""
    fill = _fill_by_node(jobs)
    free = {n.name: n.gpus - n.unavailable_gpus - n.inference_gpus - n.training_gpus
            - fill.get(n.name, 0) for n in nodes}
    order = sorted(nodes, key=lambda n: (n.inference_gpus > 0, -fill.get(n.name, 0),
                                         free[n.name], n.name))
    out: list[str] = []
    for n in order:
        while len(out) < count and free[n.name] >= gpus_per_job:
            out.append(n.name)
            free[n.name] -= gpus_per_job
    return tuple(out)


def fill_counts(obs: ClassObservation) -> tuple[int, int]:
    """GPUs held by running and by terminating fill jobs."""
    running = (obs.fill_running_gpus if obs.fill_running_gpus is not None
               else fill_gpus(obs.fill_jobs, terminating=False))
    terminating = (obs.fill_terminating_gpus if obs.fill_terminating_gpus is not None
                   else fill_gpus(obs.fill_jobs, terminating=True))
    return running, terminating


def plan_fill(config: FillPolicyConfig, obs: ClassObservation) -> FillPlan:
    """Decide fill admissions and evictions for one GPU class."""
    if obs.colocate:
        return plan_colocated(config, obs)
    running, terminating = fill_counts(obs)
    usable = max(obs.total_gpus - obs.unavailable_gpus, 0)
    held = obs.inference_gpus + obs.training_gpus + running + terminating
    free = max(usable - held, 0)
    # Where the scheduler itself preempts fill for pending training (Slurm's partition_prio), the
    # policy must not evict for it too, or both evict and one job too many is lost.
    evict_for_training = 0 if config.scheduler_preempts_training else obs.pending_training_gpus
    demand = obs.pending_inference_gpus + obs.pending_training_gpus
    evict_demand = obs.pending_inference_gpus + evict_for_training
    headroom = headroom_gpus(config, obs)
    # Headroom can never exceed what fill could give back.
    reserved = demand + min(headroom, max(usable - obs.inference_gpus - obs.training_gpus
                                          - demand, 0))
    reasons: list[str] = []
    becoming_free = free + terminating
    shortfall = reserved - (demand - evict_demand) - becoming_free
    inference_nodes = inference_node_order(obs.nodes)
    if shortfall > 0:
        # pending inference outranks training: its victims decide the order when both wait
        for_training = evict_for_training > 0 and not obs.pending_inference_gpus
        victims = choose_victims(obs.fill_jobs, shortfall, obs.nodes, for_training=for_training)
        if victims:
            why = []
            if demand:
                why.append(f"{demand} GPU(s) wanted by pending "
                           + ("inference" if obs.pending_inference_gpus else "")
                           + (" and " if obs.pending_inference_gpus and obs.pending_training_gpus
                              else "")
                           + ("training" if obs.pending_training_gpus else ""))
            if headroom:
                why.append(f"headroom {headroom} GPU(s) for forecast inference growth")
            reasons.append(f"evict {len(victims)} fill job(s): need {reserved} free, "
                           f"{becoming_free} free or freeing; " + "; ".join(why))
        return FillPlan(obs.gpu_class, 0, victims, free, reserved, headroom, tuple(reasons),
                        inference_nodes=inference_nodes)

    admit_headroom = headroom_gpus(config, obs, admission=True)
    admit_reserved = demand + min(admit_headroom, max(usable - obs.inference_gpus
                                                      - obs.training_gpus - demand, 0))
    admit_gpus = max(free - admit_reserved, 0)
    if admit_reserved > reserved and free > reserved:
        reasons.append(f"hold {min(free, admit_reserved) - reserved} idle GPU(s) back: inference "
                       f"is expected to need them before a new fill job pays back its start-up")
    if obs.pending_training_gpus and config.hold_while_training_pending:
        admit_gpus = 0
        reasons.append("training pending: holding fill back")
    if config.max_fill_gpus is not None:
        admit_gpus = min(admit_gpus, max(config.max_fill_gpus - running - terminating, 0))
    admit = admit_gpus // obs.fill_gpus_per_job
    if obs.queued_fill_jobs:
        admit = max(admit - obs.queued_fill_jobs, 0)
    if obs.fill_work_available is not None:
        admit = min(admit, obs.fill_work_available)
    if admit:
        reasons.append(f"admit {admit} fill job(s): {free} GPU(s) idle, {reserved} reserved")
    placements = (fill_placements(obs.nodes, obs.fill_jobs, admit, obs.fill_gpus_per_job)
                  if obs.nodes and admit else ())
    return FillPlan(obs.gpu_class, admit, (), free, reserved, headroom, tuple(reasons),
                    placements, inference_nodes)


def plan_colocated(config: FillPolicyConfig, obs: ClassObservation) -> FillPlan:
    """:func:`plan_fill` where inference may be bound beside fill: pending inference takes the free
    (or freeing) GPUs first and shares fill jobs' GPUs for the rest (never evicts for it); no
    head-room is kept, since a scale-up binds beside fill; training still gets whole GPUs (its
    victims are evicted, as without co-location)."""
    running, terminating = fill_counts(obs)
    usable = max(obs.total_gpus - obs.unavailable_gpus, 0)
    free = max(usable - obs.inference_gpus - obs.training_gpus - running - terminating, 0)
    inference_nodes = inference_node_order(obs.nodes)
    reasons: list[str] = []
    inference_short = max(obs.pending_inference_gpus - free - terminating, 0)
    share = choose_victims(obs.fill_jobs, inference_short, obs.nodes)
    if share:
        reasons.append(f"share {len(share)} fill job(s)' GPUs with pending inference "
                       f"({obs.pending_inference_gpus} GPU(s) wanted, {free + terminating} free "
                       f"or freeing)")
    evict: tuple[str, ...] = ()
    evict_for_training = 0 if config.scheduler_preempts_training else obs.pending_training_gpus
    left = max(free + terminating - obs.pending_inference_gpus, 0)
    if evict_for_training > left:
        others = [j for j in obs.fill_jobs if j.id not in set(share)]
        evict = choose_victims(others, evict_for_training - left, obs.nodes, for_training=True)
        if evict:
            reasons.append(f"evict {len(evict)} fill job(s): {obs.pending_training_gpus} GPU(s) "
                           "wanted by pending training")
    demand = obs.pending_inference_gpus + obs.pending_training_gpus
    admit_gpus = 0 if share or evict else max(free - demand, 0)
    if obs.pending_training_gpus and config.hold_while_training_pending:
        admit_gpus = 0
    if config.max_fill_gpus is not None:
        admit_gpus = min(admit_gpus, max(config.max_fill_gpus - running - terminating, 0))
    admit = max(admit_gpus // obs.fill_gpus_per_job - obs.queued_fill_jobs, 0)
    if obs.fill_work_available is not None:
        admit = min(admit, obs.fill_work_available)
    if admit:
        reasons.append(f"admit {admit} fill job(s): {free} GPU(s) idle, {demand} wanted; "
                       "inference shares fill's GPUs")
    placements = (fill_placements(obs.nodes, obs.fill_jobs, admit, obs.fill_gpus_per_job)
                  if obs.nodes and admit else ())
    return FillPlan(obs.gpu_class, admit, evict, free, demand, 0, tuple(reasons), placements,
                    inference_nodes, share)
