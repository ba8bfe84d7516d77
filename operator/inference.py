"""TTSDeployment controller: reconcile the pools' objects and run one autoscaling step.

``reconcile`` brings Deployments, Services and PDBs to the spec (create-or-patch by diff, orphaned
pools removed); ``autoscale`` reads live signals, calls :func:`ttsfleet.policy.decide_replicas`,
marks the least busy pods for removal on scale-down and patches ``spec.replicas``. Both return the
status fields to write; the kopf handlers pass them to kopf's ``patch``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import kopf
from pydantic import ValidationError
from ttsfleet.operator import desired as d
from ttsfleet.operator import status as st
from ttsfleet.operator.autoscalestate import WallClock, from_status, to_status
from ttsfleet.operator.kube import KINDS, path
from ttsfleet.operator.models import TTSDeploymentSpec
from ttsfleet.operator.reconcile import NotOwned, apply, delete_if_owned
from ttsfleet.operator.runtime import Runtime
from ttsfleet.operator.signals import PoolMeasure, PrometheusSource, ScrapeSource

from ttsfleet.catalog import GpuCatalog
from ttsfleet.errors import validation_text
from ttsfleet.policy import (
    AutoscaleState,
    DeploymentSignals,
    PoolSignals,
    clamp_replicas,
    decide_replicas,
    scale_down_victims,
    split_replicas,
)
from ttsfleet.policy.demand import InferenceNeed

log = logging.getLogger(__name__)
REPLICAS = ("spec", "replicas")


@dataclass
class Memory:
    """Per-TTSDeployment memory (kopf memo): the autoscaler state and the scrape baselines."""

    state: AutoscaleState = field(default_factory=AutoscaleState)
    #: One scraper per pool: each keeps its pool's pods' last TTFA histograms (the deltas' base).
    scrapers: dict[str, ScrapeSource] = field(default_factory=dict)
    restored: bool = False  # the state was read back from status.autoscaler (or seeded)
    clock: WallClock = field(default_factory=WallClock)


def forget(mem: Memory) -> None:
    """Every field of ``mem`` back to its default (a fresh memory, seeded again on next use)."""
    fresh = Memory()
    for f in dataclasses.fields(mem):
        setattr(mem, f.name, getattr(fresh, f.name))


def validate(spec_raw: Any, name: str, catalog: GpuCatalog) -> tuple[TTSDeploymentSpec | None, str]:
    """Validate with the CRD's own model and the run's catalog; an invalid spec is reported,
    never acted on."""
    try:
        spec = TTSDeploymentSpec.model_validate(dict(spec_raw or {}), context={"catalog": catalog})
    except ValidationError as exc:
        return None, validation_text(exc)
    problems = d.name_problems(name, spec)
    return (None if problems else spec), "; ".join(problems)


def degraded(body: Any, status: Any, reason: str, message: str) -> list[dict[str, Any]]:
    gen = int(body["metadata"].get("generation", 0))
    return st.set_conditions(status.get("conditions"), {"Degraded": ("True", reason, message)}, gen)


async def report_invalid(rt: Runtime, body: Any, message: str, status: Any) -> dict[str, Any]:
    if not st.already(status.get("conditions"), "Degraded", "True", "InvalidSpec", message):
        await rt.kube.event(dict(body), "Warning", "InvalidSpec", message)
        rt.metrics["operator_reconcile_errors"].labels(kind="TTSDeployment").inc()
    gen = int(body["metadata"].get("generation", 0))
    return {"conditions": degraded(body, status, "InvalidSpec", message), "observedGeneration": gen}


def _deployment_url(namespace: str, name: str) -> str:
    return path(KINDS["Deployment"][0], "deployments", namespace, name)


async def live_deployments(rt: Runtime, namespace: str, name: str,
                           spec: TTSDeploymentSpec) -> dict[str, dict[str, Any] | None]:
    return {p.key: await rt.kube.get(_deployment_url(namespace, d.child_name(name, p))) for p in spec.pools}


def pools_status(rt: Runtime, name: str, spec: TTSDeploymentSpec,
                 live: dict[str, dict[str, Any] | None],
                 desired: dict[str, int] | None = None) -> list[dict[str, Any]]:
    return [st.pool_status(p.key, p.gpu_class, live[p.key], (desired or {}).get(p.key),
                           d.quantization(spec, p, rt.catalog),
                           spec.cuda_graph_max_bs(p.gpu_class, rt.catalog))
            for p in spec.pools]


async def reconcile(rt: Runtime, body: Any, status: Any) -> dict[str, Any]:
    """Spec → objects. Returns the status fields to patch."""
    meta = body["metadata"]
    name, namespace, gen = meta["name"], meta["namespace"], int(meta.get("generation", 0))
    spec, problem = validate(body.get("spec"), name, rt.catalog)
    if spec is None:
        return await report_invalid(rt, body, problem, status)
    objs = d.desired_objects(name, spec, rt.catalog)
    for obj in objs:
        obj["metadata"]["namespace"] = namespace
    kopf.adopt(objs, owner=body)
    changed, conflicts = [], []
    for obj in objs:
        try:
            outcome = await apply(rt.kube, obj, [REPLICAS] if obj["kind"] == "Deployment" else [])
        except NotOwned as exc:
            conflicts.append(str(exc))
            continue
        if outcome != "unchanged":
            changed.append(f"{obj['kind']}/{obj['metadata']['name']} {outcome}")
    # spec.replicas > 0 (scale subresource): the policy's split of the total; else the bounds may
    # have changed: clamp now (the policy's clamp) rather than wait for the autoscaler.
    live = await live_deployments(rt, namespace, name, spec)
    split = split_replicas(spec.replicas, spec.pools) if spec.replicas else None
    for pool in spec.pools:
        obj = live[pool.key]
        cur = int(((obj or {}).get("spec") or {}).get("replicas", 0) or 0)
        want = split.pools[pool.key] if split else clamp_replicas(pool, cur)
        if obj is not None and want != cur:
            await rt.kube.patch(_deployment_url(namespace, d.child_name(name, pool)),
                                {"spec": {"replicas": want}})
            obj.setdefault("spec", {})["replicas"] = want
            why = f"spec.replicas {spec.replicas}" + (f" placed as {split.total}" if split.clamped else "") \
                if split else "clamped"
            changed.append(f"{pool.key} replicas {cur}->{want} ({why})")
    await delete_orphans(rt, body, spec)
    policies = sorted(o["metadata"]["name"] for o in objs if o["kind"] == "NetworkPolicy")
    changed += await delete_stale_policies(rt, body, status, policies)
    if changed:
        await rt.kube.event(dict(body), "Normal", "Reconciled", "; ".join(changed))
    pools = pools_status(rt, name, spec, live)
    degraded_ = ("False", "Reconciled", "spec applied")
    if conflicts:
        degraded_ = ("True", "NotOwned", "; ".join(conflicts))
        if not st.already(status.get("conditions"), "Degraded", *degraded_):
            await rt.kube.event(dict(body), "Warning", "NotOwned", "; ".join(conflicts))
    conds = st.set_conditions(status.get("conditions"), {**st.replica_conditions(pools),
                                                         "Degraded": degraded_}, gen)
    out = {"pools": pools, **st.summary(pools), "selector": scale_selector(name), "conditions": conds,
           "observedGeneration": gen}
    if policies or status.get("networkPolicies"):
        out["networkPolicies"] = policies
    return out


async def delete_stale_policies(rt: Runtime, body: Any, status: Any, keep: list[str]) -> list[str]:
    """NetworkPolicies this TTSDeployment made (``status.networkPolicies``) that the spec no longer
    wants (the policy switched off, a pool removed): deleted when still ours."""
    meta = body["metadata"]
    api, plural = KINDS["NetworkPolicy"]
    gone = []
    for stale in sorted(set(status.get("networkPolicies") or []) - set(keep)):
        if await delete_if_owned(rt.kube, path(api, plural, meta["namespace"], stale), meta["uid"]):
            gone.append(f"NetworkPolicy/{stale} deleted")
    return gone


def scale_selector(name: str) -> str:
    """``status.selector`` for the scale subresource: every inference pod of this TTSDeployment
    (an HPA reads their metrics through it)."""
    return f"{d.L_INSTANCE}={name},{d.L_WORKLOAD}=inference"


async def delete_orphans(rt: Runtime, body: Any, spec: TTSDeploymentSpec) -> list[str]:
    """Children of pools that left the spec (selected by instance label, checked by owner uid)."""
    meta = body["metadata"]
    keep = {p.key for p in spec.pools}
    removed = []
    for item in await rt.kube.list(path("apps/v1", "deployments", meta["namespace"]),
                                   labels=f"{d.L_INSTANCE}={meta['name']}"):
        m = item["metadata"]
        owners = {o.get("uid") for o in m.get("ownerReferences") or []}
        pool = (m.get("labels") or {}).get(d.L_POOL)
        if meta.get("uid") not in owners or pool is None or pool in keep:
            continue
        for kind in ("Deployment", "Service", "PodDisruptionBudget"):
            api, plural = KINDS[kind]
            await delete_if_owned(rt.kube, path(api, plural, meta["namespace"], m["name"]), meta["uid"])
        removed.append(m["name"])
    return removed


async def delete_children(rt: Runtime, body: Any, spec_raw: Any) -> None:
    """Explicit cleanup on deletion (the API server's GC does the same through owner references)."""
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    spec, _ = validate(spec_raw, name, rt.catalog)
    if spec is not None:
        for obj in d.desired_objects(name, spec, rt.catalog):
            api, plural = KINDS[obj["kind"]]
            await delete_if_owned(rt.kube, path(api, plural, namespace, obj["metadata"]["name"]),
                                  meta["uid"])
        for pool in spec.pools:
            for metric in ("operator_replicas_desired", "operator_replicas_ready"):
                with contextlib.suppress(KeyError):
                    rt.metrics[metric].remove(namespace, name, pool.key, pool.gpu_class)


def pool_pods(pods: list[dict[str, Any]], name: str, pool_key: str) -> list[dict[str, Any]]:
    """Running, not terminating pods of one pool (the deployment's pods, filtered by pool here)."""
    out = []
    for p in pods:
        labels = p["metadata"].get("labels") or {}
        if labels.get(d.L_INSTANCE) != name or labels.get(d.L_POOL) != pool_key:
            continue
        if p["metadata"].get("deletionTimestamp") or (p.get("status") or {}).get("phase") != "Running":
            continue
        out.append(p)
    return out


def least_busy(pods: list[dict[str, Any]], in_flight: dict[str, float], count: int) -> list[str]:
    """The ``count`` pods with the fewest requests in flight, as the policy ranks them."""
    names = [p["metadata"]["name"] for p in pods]
    return list(scale_down_victims({n: in_flight.get(n, 0.0) for n in names}, count))


async def mark_for_removal(rt: Runtime, namespace: str, pods: list[dict[str, Any]],
                           victims: list[str]) -> None:
    """pod-deletion-cost: victims get the lowest cost, earlier marks on other pods are cleared."""
    for p in pods:
        pname = p["metadata"]["name"]
        has = d.DELETION_COST in (p["metadata"].get("annotations") or {})
        if pname in victims:
            value: str | None = "-1000"
        elif has:
            value = None
        else:
            continue
        await rt.kube.patch(path("v1", "pods", namespace, pname),
                            {"metadata": {"annotations": {d.DELETION_COST: value}}})


async def measure(rt: Runtime, mem: Memory, namespace: str, name: str, spec: TTSDeploymentSpec,
                  pods: list[dict[str, Any]]) -> dict[str, PoolMeasure]:
    out = {}
    if rt.prometheus_url:
        prom = PrometheusSource(rt.http, rt.prometheus_url)
        try:
            for pool in spec.pools:
                m = await prom.measure(namespace, d.child_name(name, pool), spec.autoscale.panic_window_s)
                running = len(pool_pods(pods, name, pool.key))
                if running and not m.scraped:  # no series for running pods: Prometheus cannot see them
                    m = dataclasses.replace(m, errors=running)
                out[pool.key] = m
            return out
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            log.warning("%s/%s: Prometheus unavailable (%s); scraping the pods directly",
                        namespace, name, exc)
            out = {}
    for pool in spec.pools:
        scraper = mem.scrapers.setdefault(pool.key, ScrapeSource(rt.http))
        out[pool.key] = await scraper.measure(pool_pods(pods, name, pool.key))
    return out


def seeded_state(state: AutoscaleState, signals: DeploymentSignals) -> AutoscaleState:
    """A memory with nothing to resume from (no ``status.autoscaler``) counts the live replicas as just
    recommended, so the scale-down stabilization window restarts from them: a restarted operator
    holds 16 replicas for the window instead of dropping to what one quiet sample suggests."""
    recs = {k: ((signals.t, s.current_replicas),) for k, s in signals.pools.items() if s.current_replicas}
    return dataclasses.replace(state, recommendations=recs)


def resume(mem: Memory, stored: Mapping[str, Any] | None, signals: DeploymentSignals, wall: float) -> None:
    """First step of this process: continue the state the last one wrote to status (the same
    stabilization window and panic); an object without one (written before it was kept) is
    seeded from its live replicas."""
    if stored is not None:
        mem.state, mem.clock = from_status(stored, signals.t, wall)
    elif not mem.state.recommendations:
        mem.state = seeded_state(mem.state, signals)
    mem.restored = True


def to_pool_signals(measure: PoolMeasure, deployment: Mapping[str, Any] | None) -> PoolSignals:
    """The operator's one conversion into the policy's type: a pool's measured load (Prometheus
    or the pods' /metrics) and its Deployment's replica counts."""
    dep = deployment or {}
    return PoolSignals(in_flight=measure.in_flight, queue_depth=measure.queue_depth,
                       ready_replicas=int((dep.get("status") or {}).get("readyReplicas", 0) or 0),
                       current_replicas=int((dep.get("spec") or {}).get("replicas", 0) or 0),
                       ttfa_p99_s=measure.ttfa_p99_s)


async def autoscale(rt: Runtime, body: Any, status: Any, mem: Memory) -> dict[str, Any] | None:
    """One autoscaling step. Returns the status fields to patch (None: nothing to do yet)."""
    meta = body["metadata"]
    name, namespace, gen = meta["name"], meta["namespace"], int(meta.get("generation", 0))
    spec, _ = validate(body.get("spec"), name, rt.catalog)
    if spec is None:
        return None
    if spec.replicas:
        # The scale subresource's writer (kubectl scale, an HPA) owns the count; reconcile applies
        # the split. The traffic autoscaler restarts from the live replicas when it is back at 0:
        # its memory is forgotten, and any autoscaler state kept in status dropped.
        forget(mem)
        rt.inference_need.pop(f"{namespace}/{name}", None)
        return {"autoscaler": None}
    live = await live_deployments(rt, namespace, name, spec)
    if any(v is None for v in live.values()):
        return None  # the reconcile handler has not created them yet
    pods = await rt.view.instance_pods(namespace, name)
    measures = await measure(rt, mem, namespace, name, spec, pods)
    blind = [k for k, m in measures.items() if m.errors and not m.scraped]
    if blind:
        # No pod of a pool answered: zero load would be a lie that scales the pool down.
        log.warning("%s/%s: no metrics from pool(s) %s; skipping this autoscaling step",
                    namespace, name, ", ".join(blind))
        return None
    for m in measures.values():
        for pod_name, in_flight in m.per_pod_in_flight.items():
            rt.inference_busy[f"{namespace}/{pod_name}"] = in_flight > 0
    signals = DeploymentSignals(t=rt.now(), pools={
        p.key: to_pool_signals(measures[p.key], live[p.key]) for p in spec.pools})
    if not mem.restored:
        resume(mem, status.get("autoscaler"), signals, rt.wall())
    decision, mem.state = decide_replicas(spec.autoscale, spec.pools, rt.catalog, mem.state, signals)
    rt.inference_need[f"{namespace}/{name}"] = InferenceNeed.from_decision(decision, spec.resources.gpus)
    records = []
    now = st.now_iso()
    for pd in decision.pools:
        labels = (namespace, name, pd.pool, pd.gpu_class)
        rt.metrics["operator_replicas_desired"].labels(*labels).set(pd.desired)
        rt.metrics["operator_replicas_ready"].labels(*labels).set(signals.pools[pd.pool].ready_replicas)
        rt.metrics["operator_scaling_decisions"].labels(namespace, name, pd.pool, pd.direction,
                                                        pd.reason).inc()
        if pd.desired == pd.current:
            continue
        pool = next(p for p in spec.pools if p.key == pd.pool)
        if pd.direction == "down":
            candidates = pool_pods(pods, name, pd.pool)
            victims = least_busy(candidates, dict(measures[pd.pool].per_pod_in_flight),
                                 pd.current - pd.desired)
            await mark_for_removal(rt, namespace, candidates, victims)
        await rt.kube.patch(_deployment_url(namespace, d.child_name(name, pool)),
                            {"spec": {"replicas": pd.desired}})
        live[pd.pool]["spec"]["replicas"] = pd.desired  # type: ignore[index]
        msg = f"pool {pd.pool}: {pd.current} -> {pd.desired} ({pd.reason}: {pd.message})"
        await rt.kube.event(dict(body), "Normal", "ScaledUp" if pd.direction == "up" else "ScaledDown", msg)
        log.info("%s/%s %s", namespace, name, msg)
        records.append({"time": now, "pool": pd.pool, "fromReplicas": pd.current, "toReplicas": pd.desired,
                        "direction": pd.direction, "reason": pd.reason, "message": pd.message[:300]})
    pools = pools_status(rt, name, spec, live, decision.desired())
    conds = st.set_conditions(status.get("conditions"), st.replica_conditions(pools), gen)
    out: dict[str, Any] = {"pools": pools, **st.summary(pools), "conditions": conds,
                           "autoscaler": to_status(mem.state, mem.clock, signals.t, rt.wall())}
    if records:
        out["lastDecisions"] = st.append_history(status.get("lastDecisions"), records)
    return out
