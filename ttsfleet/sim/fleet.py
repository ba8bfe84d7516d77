"""The simulated fleet: nodes, the pods on them, a scheduler, and the GPU-time ledger.

This is the world the simulator's adapter observes and acts on; nothing here decides what the
fleet should run (that is :mod:`ttsfleet.policy`). It only carries decisions out with the delays
a real cluster has:

* GPUs sit on nodes of ``gpus_per_node``. Inference and fill pods take one GPU and are packed
  onto the fullest node that has room (kube-scheduler's MostAllocated scoring); training jobs
  take whole nodes.
* An inference pod holds its GPU for the class's ``model_load_s`` before it serves. A removed
  replica frees its GPU ``release_s`` later.
* A fill job needs ``start_s`` before it works (restart cost), answers SIGTERM by checkpointing
  and exiting after ``stop_s`` (SIGKILL at the grace period), and its GPU can be bound again
  ``release_s`` after the exit.
* A pending training job that finds no whole free node preempts the fill pods of the nodes
  that hold nothing else (the PriorityClasses: training above fill), like kube-scheduler and
  Slurm's ``partition_prio`` do; it never preempts inference.
* Co-location (when the policy allows it, :attr:`FillPlan.share`): a pending inference pod is
  bound beside a running fill job instead of evicting it; the job goes on as the replica's
  co-tenant (no restart) and gets the GPU back when the replica leaves. While its replica serves
  it yields above the policy's concurrency limit and slows the replica below it
  (:mod:`ttsfleet.sim.traffic`). Co-tenant process-seconds have their own ledger (``COTENANT``).

GPU-time is accounted piecewise between holding changes, so the per-second work is only the
traffic fluid (:mod:`ttsfleet.sim.traffic`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ttsfleet.sim.scenario import Scenario, TrainingJob
from ttsfleet.sim.traffic import PoolTraffic

#: Ledger keys: GPU-seconds per class in each holding state.
HOLDINGS = ("inference", "training", "fill_starting", "fill_running", "fill_stopping", "idle")
#: Co-tenant ledger keys: process-seconds of fill beside serving replicas, per state.
COTENANT = ("starting", "running", "stopping")


@dataclass
class Node:
    idx: int
    size: int
    inference: int = 0  # inference pods bound here (loading, serving or releasing)
    fill: int = 0  # fill pods bound here (starting, running, stopping or releasing)
    training: int = 0
    nominated: bool = False  # a pending training job waits for this node to empty
    name: str = ""  # what the policy calls it (NodeView.name)

    @property
    def free(self) -> int:
        return self.size - self.inference - self.fill - self.training


@dataclass(eq=False)  # identity: two co-tenants admitted together are still two
class CoTenant:
    """A fill process beside an inference replica on its GPU (a fill job inference was bound beside)."""

    admitted: float
    state: str = "starting"  # starting | running | stopping
    run_start: float = 0.0


@dataclass(eq=False)  # identity: list.remove must take this replica, not an equal one
class Replica:
    node: Node
    state: str = "starting"  # starting | ready | gone
    cotenant: CoTenant | None = None


@dataclass
class FillJob:
    id: str
    gpu_class: str
    node: Node
    state: str = "starting"  # starting | running | stopping
    run_start: float = 0.0
    admitted: float = 0.0


@dataclass
class PoolHoldings:
    """A pool's replicas as the cluster holds them, beside its traffic."""

    traffic: PoolTraffic
    load_s: float
    desired: int = 0
    pending: int = 0
    starting: list[Replica] = field(default_factory=list)
    ready: list[Replica] = field(default_factory=list)

    @property
    def held(self) -> int:
        return len(self.starting) + len(self.ready)

    @property
    def colocated(self) -> int:
        """Co-tenants not yet told to stop (what the co-location policy counts)."""
        return sum(1 for r in self.ready if r.cotenant is not None and r.cotenant.state != "stopping")


@dataclass
class ClassState:
    name: str
    nodes: list[Node]
    pools: list[PoolHoldings]
    inference_gpus: int = 0  # bound inference pods, including releasing ones
    train_gpus: int = 0
    fill_starting: int = 0
    fill_running: int = 0
    fill_stopping: int = 0  # SIGTERM sent until the GPU is free again
    co: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COTENANT, 0))
    fill_jobs: dict[str, FillJob] = field(default_factory=dict)
    train_pending: list[tuple[float, TrainingJob]] = field(default_factory=list)
    total: int = 0
    #: The policy's preferred nodes for new inference pods, best first (empty: pack)
    inference_order: list[Node] = field(default_factory=list)
    by_name: dict[str, Node] = field(default_factory=dict)  # Node.name -> node
    #: Bumped whenever a node's inference or training count changes (the adapter's node views
    #: are rebuilt only then).
    node_epoch: int = 0
    node_view_cache: tuple[int, tuple] | None = None  # (epoch, the adapter's node views)

    def __post_init__(self) -> None:
        self.total = sum(n.size for n in self.nodes)
        self.by_name = {n.name: n for n in self.nodes}

    @property
    def fill_gpus(self) -> int:
        return self.fill_starting + self.fill_running + self.fill_stopping

    @property
    def idle(self) -> int:
        return self.total - self.inference_gpus - self.train_gpus - self.fill_gpus

    def for_inference(self) -> Node | None:
        """The policy's first preferred node with a free GPU (not nominated), else :meth:`pack`
        — kube-scheduler honouring a preferred node affinity."""
        for n in self.inference_order:
            if n.free > 0 and not n.nominated:
                return n
        return self.pack(allow_nominated=True)

    def pack(self, *, allow_nominated: bool) -> Node | None:
        """The fullest node with a free GPU (MostAllocated), nominated nodes last."""
        best = None
        for n in self.nodes:
            if n.free > 0 and (allow_nominated or not n.nominated) and (
                    best is None or (n.nominated, n.free) < (best.nominated, best.free)):
                best = n
        return best


@dataclass
class FillLedger:
    """Fill work lost, by cause (GPU-seconds), beside the ledger's holding states."""

    abandoned_s: float = 0.0  # work since the last durable point, lost at eviction
    evictions_policy: int = 0
    evictions_scheduler: int = 0
    evictions_starting: int = 0  # evicted before they did any work
    admissions: int = 0
    first_checkpoints: int = 0  # early first checkpoints written (each costs a checkpoint write)
    shared: int = 0  # fill jobs inference was bound beside (instead of an eviction)
    unshared: int = 0  # co-tenants that got their GPU back when their replica left


class Fleet:
    """Nodes, pods and events of one run; the adapter reads it and calls its actions."""

    def __init__(self, scenario: Scenario, pools: Sequence[PoolTraffic]) -> None:
        self.scenario = scenario
        cat = scenario.catalog
        self.classes: dict[str, ClassState] = {}
        for name in scenario.fleet:
            nodes = [Node(i, s, name=f"{name}-node{i:03d}")
                     for i, s in enumerate(scenario.node_sizes(name))]
            mine = [PoolHoldings(p, cat.get(name).model_load_s) for p in pools if p.gpu_class == name]
            self.classes[name] = ClassState(name, nodes, mine)
        self.pools = [h for c in self.classes.values() for h in c.pools]
        order = {p.key: i for i, p in enumerate(pools)}
        self.pools.sort(key=lambda h: order[h.traffic.key])
        self.events: list[tuple[float, int, Callable[[Any, float], None], object]] = []
        self._seq = 0
        self._fill_seq = 0
        self.pending_work = False
        self.ledger = {c: dict.fromkeys(HOLDINGS, 0.0) for c in self.classes}
        self.co_ledger = {c: dict.fromkeys(COTENANT, 0.0) for c in self.classes}
        self.fill = FillLedger()
        self.train_wait: list[float] = []
        self._last = 0.0

    # -- events -------------------------------------------------------------------------------
    def push(self, t: float, handler: Callable[[Any, float], None], payload: object) -> None:
        """Call ``handler(payload, t)`` at time ``t`` (ties in push order)."""
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, handler, payload))

    def run_events(self, t: float) -> None:
        """Apply every event due by ``t``."""
        if not self.events or self.events[0][0] > t:
            return
        self.account(t)
        while self.events and self.events[0][0] <= t:
            _, _, handler, payload = heapq.heappop(self.events)
            handler(payload, t)

    def on_ready(self, r: tuple[PoolHoldings, Replica], t: float) -> None:
        pool, rep = r
        if rep.state == "starting":
            pool.starting.remove(rep)
            rep.state = "ready"
            pool.ready.append(rep)
            pool.traffic.ready += 1
            if rep.cotenant is not None:
                self._sync_colocated(pool)

    def on_released(self, r: tuple[str, Node], t: float) -> None:
        c, node = r
        node.inference -= 1
        self.classes[c].node_epoch += 1
        self.classes[c].inference_gpus -= 1
        self.pending_work = True

    def on_fill_running(self, job: FillJob, t: float) -> None:
        if job.state == "starting":
            cl = self.classes[job.gpu_class]
            job.state, job.run_start = "running", t
            cl.fill_starting -= 1
            cl.fill_running += 1

    def on_fill_gone(self, job: FillJob, t: float) -> None:
        cl = self.classes[job.gpu_class]
        cl.fill_stopping -= 1
        job.node.fill -= 1
        del cl.fill_jobs[job.id]
        self.pending_work = True

    def on_train_submit(self, job: TrainingJob, t: float) -> None:
        self.classes[job.gpu_class].train_pending.append((t, job))
        self.pending_work = True

    def on_train_end(self, r: tuple[str, list[Node]], t: float) -> None:
        c, nodes = r
        for n in nodes:
            self.classes[c].train_gpus -= n.training
            n.training = 0
            self.classes[c].node_epoch += 1
        self.pending_work = True

    # -- the ledger ---------------------------------------------------------------------------
    def account(self, t: float) -> None:
        """Add the GPU-time of the holdings in force since the last change."""
        dt = t - self._last
        if dt <= 0:
            return
        for c, cl in self.classes.items():
            g = self.ledger[c]
            g["inference"] += cl.inference_gpus * dt
            g["training"] += cl.train_gpus * dt
            g["fill_starting"] += cl.fill_starting * dt
            g["fill_running"] += cl.fill_running * dt
            g["fill_stopping"] += cl.fill_stopping * dt
            g["idle"] += cl.idle * dt
            if cl.co["starting"] or cl.co["running"] or cl.co["stopping"]:
                co = self.co_ledger[c]
                for k, n in cl.co.items():
                    co[k] += n * dt
        self._last = t

    # -- actions (what the adapter carries out) -----------------------------------------------
    def bind_ready(self, pool: PoolHoldings, count: int) -> None:
        """Replicas that were already serving when the run starts (the warm start)."""
        cl = self.classes[pool.traffic.gpu_class]
        for _ in range(count):
            node = cl.pack(allow_nominated=True)
            if node is None:
                break
            node.inference += 1
            cl.node_epoch += 1
            cl.inference_gpus += 1
            pool.ready.append(Replica(node, "ready"))
            pool.traffic.ready += 1
        pool.desired = pool.held

    def set_replicas(self, t: float, pool: PoolHoldings, desired: int) -> None:  # noqa: C901
        """Scale a pool: create pending pods, or remove pending, then loading, then serving ones."""
        self.account(t)
        pool.desired = desired
        have = pool.held + pool.pending
        if desired > have:
            pool.pending += desired - have
            self.pending_work = True
            return
        drop = have - desired
        k = min(drop, pool.pending)
        pool.pending -= k
        drop -= k
        while drop and pool.starting:
            rep = pool.starting.pop()  # the one furthest from ready
            if rep.cotenant is not None:
                self._unshare(t, pool, rep)
                rep.state = "gone"
            else:
                self._remove(t, pool, rep)
            drop -= 1
        while drop and pool.ready:
            # In the fluid every replica carries the same load, so the operator's least-busy
            # ranking (policy.scale_down_victims) ties; the tie goes to the replica on the node
            # with the fewest inference pods, so nodes drain whole (the packing counterpart).
            rep = min(reversed(pool.ready), key=lambda r: r.node.inference)
            pool.ready.remove(rep)
            pool.traffic.ready -= 1
            if rep.cotenant is not None:  # the co-tenant keeps the GPU
                self._unshare(t, pool, rep)
                rep.state = "gone"
                self._sync_colocated(pool)
            else:
                self._remove(t, pool, rep)
            drop -= 1

    def _remove(self, t: float, pool: PoolHoldings, rep: Replica) -> None:
        rep.state = "gone"
        self.push(t + self.scenario.release_s, self.on_released, (pool.traffic.gpu_class, rep.node))

    def admit_fill(self, t: float, c: str, count: int, nodes: Sequence[Node] = ()) -> int:
        """Start up to ``count`` fill jobs on free GPUs of class ``c``, on ``nodes`` (one per job,
        as placed by the policy) where they are free, else packed; return how many started."""
        self.account(t)
        cl = self.classes[c]
        started = 0
        for i in range(count):
            node = nodes[i] if i < len(nodes) else None
            if node is None or node.free <= 0 or node.nominated:
                node = cl.pack(allow_nominated=False)
            if node is None:
                break
            self._fill_seq += 1
            job = FillJob(f"{c}-fill-{self._fill_seq:07d}", c, node, admitted=t)
            node.fill += 1
            cl.fill_jobs[job.id] = job
            cl.fill_starting += 1
            self.fill.admissions += 1
            started += 1
            self.push(t + self.scenario.fill.start_s, self.on_fill_running, job)
        return started

    def evict_fill(self, t: float, c: str, ids: Sequence[str], *, by_scheduler: bool = False) -> None:
        """SIGTERM these fill jobs: they checkpoint and exit, their GPUs free after release."""
        self.account(t)
        cl = self.classes[c]
        fw, grace = self.scenario.fill, self.scenario.fill_policy.grace_period_s
        for jid in ids:
            job = cl.fill_jobs[jid]
            if job.state == "stopping":
                continue
            if by_scheduler:
                self.fill.evictions_scheduler += 1
            else:
                self.fill.evictions_policy += 1
            if job.state == "running":
                cl.fill_running -= 1
                ran = t - job.run_start
                self.fill.abandoned_s += self._abandoned(ran)
                self.fill.first_checkpoints += self._first_checkpoint(ran)
            else:
                cl.fill_starting -= 1
                self.fill.evictions_starting += 1
            job.state = "stopping"
            cl.fill_stopping += 1
            self.push(t + min(fw.stop_s, grace) + self.scenario.release_s, self.on_fill_gone, job)

    def _abandoned(self, ran: float) -> float:
        """Work an evicted job loses after running ``ran`` s: within the grace period it commits
        what it finished and loses its current item; killed at the grace period, all since its
        last checkpoint."""
        fw = self.scenario.fill
        if fw.stop_s <= self.scenario.fill_policy.grace_period_s:
            return ran % fw.item_s
        return self.scenario.since_checkpoint(ran)

    def _first_checkpoint(self, ran: float) -> int:
        first = self.scenario.fill.first_checkpoint_s
        return int(first is not None and ran >= first)

    def end_of_run(self, t: float) -> None:
        """Count the early first checkpoints of the jobs still running when the trace ends (a
        co-tenant's is counted when it gets its GPU back, or not at all: a rounding)."""
        for cl in self.classes.values():
            for job in cl.fill_jobs.values():
                if job.state == "running":
                    self.fill.first_checkpoints += self._first_checkpoint(t - job.run_start)

    # -- co-location: inference beside fill on one GPU ---------------------------------------
    def share_fill(self, t: float, c: str, ids: Sequence[str]) -> int:
        """Bind pending inference pods of class ``c`` beside these fill jobs, one each, instead of
        evicting them (the policy's :attr:`FillPlan.share`): the job keeps working as the new
        replica's co-tenant, with no restart. Returns how many were bound."""
        self.account(t)
        cl = self.classes[c]
        bound = 0
        for jid in ids:
            pool = next((h for h in cl.pools if h.pending > 0), None)
            job = cl.fill_jobs.get(jid)
            if pool is None or job is None or job.state == "stopping":
                continue
            del cl.fill_jobs[jid]
            node = job.node
            node.fill -= 1
            node.inference += 1
            cl.node_epoch += 1
            cl.inference_gpus += 1
            if job.state == "running":
                cl.fill_running -= 1
            else:
                cl.fill_starting -= 1
                self.push(job.admitted + self.scenario.fill.start_s, self.on_cotenant_running, None)
            co = CoTenant(job.admitted, job.state, job.run_start)
            job.state = "shared"  # its pending start event is the co-tenant's now
            cl.co[co.state] += 1
            rep = Replica(node, cotenant=co)
            pool.pending -= 1
            pool.starting.append(rep)
            self.fill.shared += 1
            self.push(t + pool.load_s, self.on_ready, (pool, rep))
            bound += 1
        return bound

    def _unshare(self, t: float, pool: PoolHoldings, rep: Replica) -> None:
        """A replica leaving a GPU it shares hands the GPU to its co-tenant: the co-tenant goes on
        as an exclusive fill job (no restart, no release delay: the GPU stays in use)."""
        co, cl = rep.cotenant, self.classes[pool.traffic.gpu_class]
        rep.cotenant = None
        rep.node.inference -= 1
        cl.node_epoch += 1
        rep.node.fill += 1
        cl.inference_gpus -= 1
        cl.co[co.state] -= 1
        self._fill_seq += 1
        job = FillJob(f"{cl.name}-fill-{self._fill_seq:07d}", cl.name, rep.node, co.state,
                      co.run_start, co.admitted)
        cl.fill_jobs[job.id] = job
        if co.state == "running":
            cl.fill_running += 1
        else:
            cl.fill_starting += 1
            self.push(max(t, co.admitted + self.scenario.fill.start_s), self.on_fill_running, job)
        self.fill.unshared += 1

    def on_cotenant_running(self, _: object, t: float) -> None:
        """A shared job that was still starting when it was shared has started."""
        for cl in self.classes.values():
            for pool in cl.pools:
                for rep in (*pool.starting, *pool.ready):
                    co = rep.cotenant
                    started = co is not None and co.admitted + self.scenario.fill.start_s <= t
                    if started and co.state == "starting":
                        self.account(t)
                        cl.co["starting"] -= 1
                        cl.co["running"] += 1
                        co.state, co.run_start = "running", t
                self._sync_colocated(pool)

    @staticmethod
    def _sync_colocated(pool: PoolHoldings) -> None:
        """Tell the traffic fluid how many serving replicas decode beside a running co-tenant."""
        pool.traffic.colocated = sum(1 for r in pool.ready
                                     if r.cotenant is not None and r.cotenant.state == "running")

    # -- the scheduler ------------------------------------------------------------------------
    def schedule(self, t: float) -> None:
        """Bind wanted pods to free GPUs: inference first, then training (FIFO, whole nodes)."""
        if not self.pending_work:
            return
        self.account(t)
        waiting = False
        for cl in self.classes.values():
            for pool in cl.pools:
                while pool.pending > 0:
                    node = cl.for_inference()
                    if node is None:
                        waiting = True
                        break
                    node.inference += 1
                    cl.node_epoch += 1
                    node.nominated = False  # inference outranks the training job that waited
                    cl.inference_gpus += 1
                    pool.pending -= 1
                    rep = Replica(node)
                    pool.starting.append(rep)
                    self.push(t + pool.load_s, self.on_ready, (pool, rep))
            waiting |= self._schedule_training(t, cl)
        self.pending_work = waiting

    def _schedule_training(self, t: float, cl: ClassState) -> bool:
        """Start the head training job on whole free nodes, or preempt fill to empty some."""
        while cl.train_pending:
            submit, job = cl.train_pending[0]
            full = self.scenario.gpus_per_node
            empty = sorted((n for n in cl.nodes if n.free == n.size == full),
                           key=lambda n: (not n.nominated, n.idx))
            if len(empty) >= job.nodes:
                nodes = empty[:job.nodes]
                for n in nodes:
                    n.training, n.nominated = n.size, False
                    cl.node_epoch += 1
                    cl.train_gpus += n.size
                cl.train_pending.pop(0)
                self.train_wait.append(t - submit)
                self.push(t + job.duration_s, self.on_train_end, (cl.name, nodes))
                continue
            nominated = sum(1 for n in cl.nodes if n.nominated)
            need = job.nodes - len([n for n in empty if not n.nominated]) - nominated
            if need > 0:
                # nodes holding only fill (or nothing): fewest running fill jobs first
                cands = sorted((n for n in cl.nodes if not n.nominated and n.inference == 0
                                and n.training == 0 and n.size == full and n.free < n.size),
                               key=lambda n: (n.fill, n.idx))[:need]
                for n in cands:
                    n.nominated = True
                    victims = [j.id for j in cl.fill_jobs.values() if j.node is n]
                    self.evict_fill(t, cl.name, victims, by_scheduler=True)
            return True
        return False
