"""FillJob controller: fill idle GPUs with shard pods, hand them back before inference needs them.

One pass per FillJob timer, under a process-wide lock so two jobs never admit onto the same idle
GPU, in three steps that read like the simulator's ``policy_step``:

* :func:`observe` — nodes and pods (the cluster-wide GPU picture), this job's shard accounting,
  checkpoint ages, and one :class:`~ttsfleet.policy.ClassObservation` per class whose inference
  forecast comes from :mod:`ttsfleet.policy.demand` (the demand trend and the autoscalers'
  :class:`~ttsfleet.policy.demand.InferenceNeed`);
* :func:`decide` — pure: :func:`ttsfleet.policy.plan_fill` per class, with the shards each
  admission takes;
* :func:`act` — evict the victims with their grace period (they checkpoint and exit 99), create
  the shard pods, record decisions and Events; :func:`job_status` builds the status.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import kopf
from pydantic import ValidationError
from ttsfleet.operator import fillview as fv
from ttsfleet.operator import status as st
from ttsfleet.operator.kube import KubeError, path
from ttsfleet.operator.models import FillJobSpec
from ttsfleet.operator.runtime import Runtime
from ttsfleet.operator.signals import pod_url, scrape_gauges

from ttsfleet.catalog import GpuCatalog
from ttsfleet.errors import validation_text
from ttsfleet.metrics import spec as metric_spec
from ttsfleet.policy import ClassObservation, FillPlan, plan_fill
from ttsfleet.policy.demand import InferenceNeed, fill_forecasts

log = logging.getLogger(__name__)


def validate(spec_raw: Any, name: str, catalog: GpuCatalog) -> tuple[FillJobSpec | None, str]:
    try:
        spec = FillJobSpec.model_validate(dict(spec_raw or {}), context={"catalog": catalog})
    except ValidationError as exc:
        return None, validation_text(exc)
    if len(name) > 63:  # the CRD rejects these; one created before that rule is reported, not run
        return None, f"name {name!r} is longer than 63 characters (it is a label value on fill pods)"
    return spec, ""


@dataclass
class FillView:
    """What one pass saw: the cluster, this job's progress, the policy's observations."""

    pods: list[dict[str, Any]]
    pods_by_id: dict[str, dict[str, Any]]
    acc: fv.Accounting
    observations: dict[str, ClassObservation]
    wall: float
    existing: set[str]  # pod names in the job's namespace (for deterministic new names)


@dataclass
class ClassStep:
    """The policy's answer for one GPU class, and the shards its admissions take."""

    gpu_class: str
    plan: FillPlan
    shards: list[int] = field(default_factory=list)


async def observe(rt: Runtime, spec: FillJobSpec, namespace: str, job: str,
                  status: Mapping[str, Any]) -> FillView:
    """Read the cluster, fold finished pods into the accounting, build the observations."""
    nodes = await rt.view.gpu_nodes()  # watch-fed caches: no LIST per pass
    pods = await rt.view.gpu_pods()  # every GPU holder
    own = await rt.view.fill_pods(namespace, job)  # finished too
    wall, t = rt.wall(), rt.now()
    own = await release_stuck(rt, own, nodes, wall)
    acc = fv.account(status, fv.own_pods(own, namespace, job), spec, wall)
    for name in acc.to_delete:  # finished pods counted in an earlier pass
        await rt.kube.delete(path("v1", "pods", namespace, name))
    policy = spec.policy
    base = fv.observe(nodes, pods, t, wall, policy.checkpoint_interval_s, rt.catalog)
    rt.demand = rt.demand.observe_classes(t, base, policy.forecast_window_s)
    need = InferenceNeed.total(rt.inference_need.values())
    forecasts = fill_forecasts(rt.demand, t, policy, need, classes=base)
    observations = fv.observe(nodes, pods, t, wall, policy.checkpoint_interval_s, rt.catalog, forecasts,
                              await checkpoint_ages(rt, pods))
    # Names taken in the namespace, finished pods of this job included (a new pod never reuses one).
    mine = {p["metadata"]["name"] for p in [*pods, *own] if p["metadata"].get("namespace") == namespace}
    return FillView(pods=pods, pods_by_id={fv.pod_id(p): p for p in pods}, acc=acc,
                    observations=observations, wall=wall, existing=mine)


async def release_stuck(rt: Runtime, own: list[dict[str, Any]], nodes: list[dict[str, Any]],
                        wall: float) -> list[dict[str, Any]]:
    """Force-delete this job's pods stuck Terminating on a lost node (their kubelet is gone): the
    shard then counts as preempted and is run again from its checkpoint elsewhere."""
    kept = []
    for pod in own:
        if fv.stuck_on_lost_node(pod, nodes, wall):
            m = pod["metadata"]
            log.warning("%s/%s: Terminating on lost node %s past its grace; force-deleting",
                        m["namespace"], m["name"], pod["spec"].get("nodeName"))
            await rt.kube.delete(path("v1", "pods", m["namespace"], m["name"]), grace_seconds=0)
            continue
        kept.append(pod)
    return kept


def decide(spec: FillJobSpec, view: FillView) -> list[ClassStep]:
    """Pure: what to admit and evict per class. Classes are served in name order; each admission
    takes the next free shards and shrinks the room (``maxParallelism``) left for the next class."""
    acc = view.acc
    remaining = [s for s in range(spec.shards) if s not in acc.done | acc.failed]
    room = max(spec.max_parallelism - len(acc.active), 0)
    taken: set[int] = set()
    steps = []
    for cls in sorted(view.observations):
        busy = dataclasses.replace(acc, running_shards=acc.running_shards | taken)
        allowed = cls in spec.gpu_classes and not (set(remaining) <= busy.running_shards)
        work = min(room, len(fv.next_shards(spec, busy, room))) if allowed else 0
        obs = dataclasses.replace(view.observations[cls], fill_gpus_per_job=spec.gpus_per_pod,
                                  fill_work_available=work)
        plan = plan_fill(spec.policy, obs)
        shards = fv.next_shards(spec, busy, plan.admit) if plan.admit else []
        taken |= set(shards)
        room = max(room - len(shards), 0)
        steps.append(ClassStep(cls, plan, shards))
    return steps


async def act(rt: Runtime, body: Any, spec: FillJobSpec, view: FillView, steps: Sequence[ClassStep],
              status: Mapping[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """Evict, admit, record. Returns (decision records, evictions of this job's own pods)."""
    meta = body["metadata"]
    job, namespace = meta["name"], meta["namespace"]
    now, decisions, evicted_mine = st.now_iso(), [], 0
    for step in steps:
        cls, plan = step.gpu_class, step.plan
        obs = view.observations[cls]
        rt.metrics["operator_fill_pods_running"].labels(gpu_class=cls).set(
            sum(1 for j in obs.fill_jobs if not j.terminating))
        rt.metrics["operator_eviction_stuck"].labels(gpu_class=cls).set(sum(
            1 for j in obs.fill_jobs if j.terminating and past_grace(view.pods_by_id.get(j.id), view.wall)))
        reasons = "; ".join(plan.reasons)
        for victim in plan.evict:
            if await evict(rt, view.pods_by_id.get(victim), spec):
                rt.metrics["operator_fill_evictions"].labels(gpu_class=cls, reason="inference").inc()
                vns, vname = victim.split("/", 1)
                evicted_mine += int(vns == namespace and vname in view.acc.active)
        if plan.evict:
            decisions.append(_record(now, cls, "evict", len(plan.evict), reasons))
            await rt.kube.event(dict(body), "Normal", "FillEvicted", f"{cls}: {reasons}")
        if step.shards:
            for shard in step.shards:
                await create_shard_pod(rt, body, spec, shard, cls, view)
                rt.metrics["operator_fill_admissions"].labels(gpu_class=cls).inc()
            decisions.append(_record(now, cls, "admit", len(step.shards), reasons))
            await rt.kube.event(dict(body), "Normal", "FillAdmitted",
                                f"{cls}: shards {fv.format_ranges(step.shards)} ({reasons})")
        elif plan.reasons and not plan.evict and not plan.admit:
            last = [d for d in status.get("lastDecisions") or [] if d.get("gpuClass") == cls][-1:]
            if not (last and last[0].get("action") == "hold" and last[0].get("message") == reasons[:300]):
                decisions.append(_record(now, cls, "hold", 0, reasons))
    if decisions:
        log.info("%s/%s: %s", namespace, job, "; ".join(f"{d['gpuClass']} {d['action']} {d['count']}"
                                                        for d in decisions))
    return decisions, evicted_mine


def _record(now: str, cls: str, action: str, count: int, message: str) -> dict[str, Any]:
    return {"time": now, "gpuClass": cls, "action": action, "count": count, "message": message[:300]}


async def evict(rt: Runtime, pod: Mapping[str, Any] | None, spec: FillJobSpec) -> bool:
    """Delete a fill pod with its grace period (never below 1 s: 0 would be a force delete while
    the GPU is still held and the checkpoint unwritten)."""
    if pod is None:
        return False
    meta = pod["metadata"]
    grace = int((pod.get("spec") or {}).get("terminationGracePeriodSeconds") or spec.policy.grace_period_s)
    return await rt.kube.delete(path("v1", "pods", meta["namespace"], meta["name"]),
                                grace_seconds=max(grace, 1))


async def create_shard_pod(rt: Runtime, body: Any, spec: FillJobSpec, shard: int, cls: str,
                           view: FillView) -> str:
    meta = body["metadata"]
    name = fv.pod_name(meta["name"], shard, view.existing)
    pod = fv.fill_pod(meta["name"], meta["namespace"], spec, shard, cls, name, catalog=rt.catalog)
    kopf.adopt(pod, owner=body)
    try:
        rt.view.created(await rt.kube.create(path("v1", "pods", meta["namespace"]), pod))
    except KubeError as exc:
        if exc.status != 409:  # 409: created by an earlier, interrupted pass
            raise
    view.existing.add(name)
    view.acc.running_shards.add(shard)
    view.acc.active.append(name)
    return name


def job_status(spec: FillJobSpec, acc: fv.Accounting, status: Mapping[str, Any], gen: int,
               decisions: list[dict[str, Any]], evicted_mine: int) -> dict[str, Any]:
    """The status fields of one pass (the handler sends only those that changed)."""
    complete = len(acc.done | acc.failed) >= spec.shards
    conds = st.set_conditions(status.get("conditions"), {
        "Complete": ("True", "AllShardsFinished", f"{len(acc.done)} done, {len(acc.failed)} failed")
        if complete else ("False", "ShardsRemaining", f"{spec.shards - len(acc.done | acc.failed)} left"),
        "Progressing": ("True", "Running", f"{len(acc.active)} pod(s)") if acc.active
        else ("False", "Idle", "no fill pods (no idle GPUs or no work)"),
        "Degraded": ("True", "ShardsFailed", f"shards {fv.format_ranges(acc.failed)} failed")
        if acc.failed else ("False", "Healthy", "no failed shards"),
    }, gen)
    out: dict[str, Any] = {
        "observedGeneration": gen, "shardsTotal": spec.shards, "shardsDone": len(acc.done),
        "completedShards": fv.format_ranges(acc.done), "failedShards": fv.format_ranges(acc.failed),
        "shardFailures": acc.failures, "runningPods": len(acc.active), "activePods": sorted(acc.active),
        "accountedPods": acc.accounted, "preemptionsSurvived": acc.preemptions,
        "evictions": int(status.get("evictions", 0)) + evicted_mine,
        "lostWorkSeconds": round(acc.lost_work_s, 1),
        "conditions": conds,
    }
    if decisions:
        out["lastDecisions"] = st.append_history(status.get("lastDecisions"), decisions)
    return out


async def fill_pass(rt: Runtime, body: Any, status: Any) -> dict[str, Any]:
    """One pass for one FillJob: observe → policy → act. Returns the status fields."""
    meta = body["metadata"]
    job, namespace, gen = meta["name"], meta["namespace"], int(meta.get("generation", 0))
    spec, problem = validate(body.get("spec"), job, rt.catalog)
    if spec is None:
        if not st.already(status.get("conditions"), "Degraded", "True", "InvalidSpec", problem):
            await rt.kube.event(dict(body), "Warning", "InvalidSpec", problem)
            rt.metrics["operator_reconcile_errors"].labels(kind="FillJob").inc()
        return {"observedGeneration": gen, "conditions": st.set_conditions(
            status.get("conditions"), {"Degraded": ("True", "InvalidSpec", problem)}, gen)}
    async with rt.fill_lock:
        view = await observe(rt, spec, namespace, job, status)
        steps = decide(spec, view)
        decisions, evicted_mine = await act(rt, body, spec, view, steps, status)
    return job_status(spec, view.acc, status, gen, decisions, evicted_mine)


def past_grace(pod: dict[str, Any] | None, wall: float) -> bool:
    """A deleted pod's deletionTimestamp is when the kubelet may SIGKILL it; past that it is stuck."""
    when = fv.parse_time(((pod or {}).get("metadata") or {}).get("deletionTimestamp"))
    return when is not None and wall > when + 30


async def checkpoint_ages(rt: Runtime, pods: list[dict[str, Any]]) -> dict[str, float]:
    """Work at risk as each running fill pod reports it on its metrics port (the job computes it
    with :func:`ttsfleet.contracts.fill.work_at_risk`, on its own clock)."""
    urls = {}
    for p in pods:
        if (p["metadata"].get("labels") or {}).get(fv.L_WORKLOAD) != "fill" or fv.finished(p):
            continue
        url = pod_url(p, default_port=None, port_name="metrics")
        if url:
            urls[fv.pod_id(p)] = url
    if not urls:
        return {}
    return await scrape_gauges(rt.http, urls, metric_spec("fill_seconds_since_checkpoint").name)
