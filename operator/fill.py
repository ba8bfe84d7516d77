"""FillJob controller: fill idle GPUs with shard pods, hand them back before inference needs them.

One pass (run by each FillJob's timer under a process-wide lock, so two jobs never admit onto the
same idle GPU): list nodes and pods, fold this job's finished pods into its status, build one
observation per GPU class, ask :func:`ttsfleet.policy.plan_fill` what to admit and evict, then
delete the victims with their grace period (they checkpoint and exit 99) and create shard pods.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import kopf
from pydantic import ValidationError
from ttsfleet.operator import fillview as fv
from ttsfleet.operator import status as st
from ttsfleet.operator.kube import KubeError, path
from ttsfleet.operator.models import FillJobSpec
from ttsfleet.operator.runtime import Runtime
from ttsfleet.operator.signals import pod_url, scrape_gauges

from ttsfleet.metrics import spec as metric_spec
from ttsfleet.policy import forecast_demand, plan_fill

log = logging.getLogger(__name__)


def validate(spec_raw: Any) -> tuple[FillJobSpec | None, str]:
    try:
        return FillJobSpec.model_validate(dict(spec_raw or {})), ""
    except ValidationError as exc:
        return None, "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors())


def _record_demand(rt: Runtime, t: float, cls: str, value: float, window_s: float) -> None:
    hist = [(ts, v) for ts, v in rt.demand_history.get(cls, []) if ts >= t - window_s]
    if not hist or hist[-1][0] < t:
        hist.append((t, value))
    rt.demand_history[cls] = hist


async def fill_pass(rt: Runtime, body: Any, status: Any) -> dict[str, Any]:
    """One pass for one FillJob. Returns the status fields to patch."""
    meta = body["metadata"]
    job, namespace, gen = meta["name"], meta["namespace"], int(meta.get("generation", 0))
    spec, problem = validate(body.get("spec"))
    if spec is None:
        if not st.already(status.get("conditions"), "Degraded", "True", "InvalidSpec", problem):
            await rt.kube.event(dict(body), "Warning", "InvalidSpec", problem)
            rt.metrics["operator_reconcile_errors"].labels(kind="FillJob").inc()
        return {"observedGeneration": gen, "conditions": st.set_conditions(
            status.get("conditions"), {"Degraded": ("True", "InvalidSpec", problem)}, gen)}
    policy = spec.policy
    async with rt.fill_lock:
        nodes = await rt.kube.list(path("v1", "nodes"))
        pods = await rt.kube.list(path("v1", "pods"))
        wall, t = rt.wall(), rt.now()
        mine = fv.own_pods(pods, namespace, job)
        acc = fv.account(status, mine, spec, wall)
        for name in acc.to_delete:  # finished pods counted in an earlier pass
            await rt.kube.delete(path("v1", "pods", namespace, name))
        ages = await checkpoint_ages(rt, pods)
        # Demand forecast per class from the inference GPUs held or wanted over the window.
        base = fv.observe(nodes, pods, t, wall, policy.checkpoint_interval_s)
        forecasts = {}
        for cls, obs in base.items():
            _record_demand(rt, t, cls, fv.inference_demand(obs), policy.forecast_window_s)
            trend = forecast_demand(rt.demand_history[cls], t, policy.eviction_deadline_s,
                                    policy.forecast_window_s)
            # What the autoscalers already know the load needs beyond their rate-limited steps
            # (as the simulator does): evict ahead of the next scale-up steps, not at them.
            needed = sum(n.get(cls, 0) for n in rt.inference_needed.values())
            forecasts[cls] = max(trend or 0.0, float(needed)) if trend is not None or needed else None
        observations = fv.observe(nodes, pods, t, wall, policy.checkpoint_interval_s, forecasts, ages)
        pods_by_id = {f"{p['metadata'].get('namespace', '')}/{p['metadata']['name']}": p for p in pods}
        decisions: list[dict[str, Any]] = []
        evicted_mine = 0
        now = st.now_iso()
        remaining = [s for s in range(spec.shards) if s not in acc.done | acc.failed]
        room = max(spec.max_parallelism - len(acc.active), 0)
        created: list[str] = []
        existing = {p["metadata"]["name"] for p in pods if p["metadata"].get("namespace") == namespace}
        for cls in sorted(observations):
            obs = observations[cls]
            allowed = cls in spec.gpu_classes and not (set(remaining) <= acc.running_shards)
            work = min(room, len(fv.next_shards(spec, acc, room))) if allowed else 0
            obs = dataclasses.replace(obs, fill_gpus_per_job=spec.gpus_per_pod, fill_work_available=work)
            plan = plan_fill(policy, obs)
            running = sum(1 for j in obs.fill_jobs if not j.terminating)
            rt.metrics["operator_fill_pods_running"].labels(gpu_class=cls).set(running)
            stuck = sum(1 for j in obs.fill_jobs if j.terminating and past_grace(pods_by_id.get(j.id), wall))
            rt.metrics["operator_eviction_stuck"].labels(gpu_class=cls).set(stuck)
            for victim in plan.evict:
                pod = pods_by_id.get(victim)
                if pod is None:
                    continue
                vns, vname = victim.split("/", 1)
                grace = int((pod.get("spec") or {}).get("terminationGracePeriodSeconds")
                            or policy.grace_period_s)
                if await rt.kube.delete(path("v1", "pods", vns, vname), grace_seconds=grace):
                    rt.metrics["operator_fill_evictions"].labels(gpu_class=cls, reason="inference").inc()
                    evicted_mine += int(vns == namespace and vname in acc.active)
            if plan.evict:
                msg = "; ".join(plan.reasons)
                decisions.append({"time": now, "gpuClass": cls, "action": "evict", "count": len(plan.evict),
                                  "message": msg[:300]})
                await rt.kube.event(dict(body), "Normal", "FillEvicted", f"{cls}: {msg}")
            if plan.admit:
                shards = fv.next_shards(spec, acc, plan.admit)
                for shard in shards:
                    name = fv.pod_name(job, shard, existing)
                    pod = fv.fill_pod(job, namespace, spec, shard, cls, name)
                    kopf.adopt(pod, owner=body)
                    try:
                        await rt.kube.create(path("v1", "pods", namespace), pod)
                    except KubeError as exc:
                        if exc.status != 409:
                            raise
                    existing.add(name)
                    created.append(name)
                    acc.running_shards.add(shard)
                    acc.active.append(name)
                    rt.metrics["operator_fill_admissions"].labels(gpu_class=cls).inc()
                room = max(room - len(shards), 0)
                if shards:
                    msg = "; ".join(plan.reasons)
                    decisions.append({"time": now, "gpuClass": cls, "action": "admit", "count": len(shards),
                                      "message": msg[:300]})
                    await rt.kube.event(dict(body), "Normal", "FillAdmitted",
                                        f"{cls}: shards {fv.format_ranges(shards)} ({msg})")
            elif plan.reasons and not plan.evict:
                hold = "; ".join(plan.reasons)[:300]
                last = [d for d in status.get("lastDecisions") or [] if d.get("gpuClass") == cls][-1:]
                if not (last and last[0].get("action") == "hold" and last[0].get("message") == hold):
                    decisions.append({"time": now, "gpuClass": cls, "action": "hold", "count": 0,
                                      "message": hold})
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
    if created:
        log.info("%s/%s: created %s", namespace, job, ", ".join(created))
    return out


def past_grace(pod: dict[str, Any] | None, wall: float) -> bool:
    """A deleted pod's deletionTimestamp is when the kubelet may SIGKILL it; past that it is stuck."""
    when = fv.parse_time(((pod or {}).get("metadata") or {}).get("deletionTimestamp"))
    return when is not None and wall > when + 30


async def checkpoint_ages(rt: Runtime, pods: list[dict[str, Any]]) -> dict[str, float]:
    """Un-checkpointed seconds as each running fill pod reports it on its metrics port."""
    urls = {}
    for p in pods:
        meta = p["metadata"]
        if (meta.get("labels") or {}).get(fv.L_WORKLOAD) != "fill" or fv.finished(p):
            continue
        url = pod_url(p, default_port=None, port_name="metrics")
        if url:
            urls[f"{meta.get('namespace', '')}/{meta['name']}"] = url
    if not urls:
        return {}
    return await scrape_gauges(rt.http, urls, metric_spec("fill_seconds_since_checkpoint").name)
