"""Operator restarts: a reconcile cut short converges to the same objects, never duplicates;
an invalid spec that slipped past the schema is reported as Degraded with an Event."""

from __future__ import annotations

import asyncio

import pytest
from ttsfleet.operator import fillview as fv
from ttsfleet.operator.desired import desired_objects
from ttsfleet.operator.models import FillJobSpec, TTSDeploymentSpec

from tests.operator.conftest import running_operator
from tests.operator.helpers import (
    DEPLOY,
    EVENTS,
    FILLJOB,
    PDB,
    PODS,
    SVC,
    TTSD,
    filljob,
    live,
    names,
    node,
    objects,
    ttsd,
    wait_for,
)
from ttsfleet.catalog import GpuCatalog

CAT = GpuCatalog.default()

pytestmark = pytest.mark.looptime
MERGE = {"Content-Type": "application/merge-patch+json"}


def history_len(cluster, resource: str, name: str) -> int:
    for (res, ns, n), obj in cluster.objects.items():
        if n == name and ns == "ns1" and res.plural == resource.rsplit("/", 1)[-1]:
            return len(obj.history)
    return 0


async def test_restart_mid_reconcile_converges_without_duplicates(cluster, make_runtime):
    # A first operator created the CR's Deployment (autoscaled to 3 since) and a Service, then died.
    resp = await cluster.post("/apis/ttsfleet.io/v1alpha1/namespaces/ns1/ttsdeployments", json=ttsd())
    cr = await resp.json()
    owner = [{"apiVersion": "ttsfleet.io/v1alpha1", "kind": "TTSDeployment", "name": "voice",
              "uid": cr["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
    spec = TTSDeploymentSpec.model_validate(cr["spec"], context={"catalog": CAT})
    objs = desired_objects("voice", spec, CAT)
    dep = next(o for o in objs if o["metadata"]["name"] == "voice-h200" and o["kind"] == "Deployment")
    dep["metadata"].update(namespace="ns1", ownerReferences=owner)
    dep["spec"]["replicas"] = 3
    await cluster.post("/apis/apps/v1/namespaces/ns1/deployments", json=dep)
    await cluster.post("/api/v1/namespaces/ns1/services", json={
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "voice-h200", "namespace": "ns1", "ownerReferences": owner},
        "spec": {"selector": {"stale": "selector"}, "ports": [{"port": 8000}]}})

    async with running_operator(make_runtime()):
        await wait_for(lambda: live(cluster, TTSD, "ns1", "voice").get("status", {}).get("pools"))
    assert names(cluster, DEPLOY) == ["voice-h200", "voice-rtx5090"]
    assert names(cluster, SVC) == ["voice", "voice-h200", "voice-rtx5090"]
    assert names(cluster, PDB) == ["voice-h200", "voice-rtx5090"]
    assert live(cluster, DEPLOY, "ns1", "voice-h200")["spec"]["replicas"] == 3  # the autoscaler's
    assert live(cluster, SVC, "ns1", "voice-h200")["spec"]["selector"] == {
        "app.kubernetes.io/instance": "voice", "ttsfleet.io/pool": "h200"}

    # Another restart: everything already matches, nothing is written to the children.
    before = {n: history_len(cluster, DEPLOY, n) for n in names(cluster, DEPLOY)}
    before.update({f"svc/{n}": history_len(cluster, SVC, n) for n in names(cluster, SVC)})
    async with running_operator(make_runtime(autoscale_interval_s=3600)):
        await wait_for(lambda: live(cluster, TTSD, "ns1", "voice")["metadata"].get("finalizers"))
        await asyncio.sleep(10)
    after = {n: history_len(cluster, DEPLOY, n) for n in names(cluster, DEPLOY)}
    after.update({f"svc/{n}": history_len(cluster, SVC, n) for n in names(cluster, SVC)})
    assert after == before


async def test_fill_restart_adopts_existing_shard_pods(cluster, make_runtime):
    await cluster.post("/api/v1/nodes", json=node("gpu-a", "h200", gpus=2))
    resp = await cluster.post("/apis/ttsfleet.io/v1alpha1/namespaces/ns1/filljobs", json=filljob())
    job = await resp.json()
    # The previous operator created shard 0's pod but died before writing status.
    fill_spec = FillJobSpec.model_validate(job["spec"], context={"catalog": CAT})
    pod = fv.fill_pod("clean", "ns1", fill_spec, 0, "h200", "clean-0-0", CAT)
    await cluster.post("/api/v1/namespaces/ns1/pods", json=pod)
    async with running_operator(make_runtime(fill_interval_s=5)):
        await wait_for(lambda: len(names(cluster, PODS)) == 2)
        await asyncio.sleep(20)  # more passes: still no duplicates
    shards = sorted(p["metadata"]["labels"]["ttsfleet.io/shard"] for p in objects(cluster, PODS).values())
    assert shards == ["0", "1"]


async def test_invalid_spec_reported_as_degraded_with_event(cluster, make_runtime):
    bad = ttsd()
    bad["spec"]["pools"][0]["minReplicas"] = 9  # past maxReplicas 6; the CEL rule would stop it
    async with running_operator(make_runtime()):
        await cluster.post("/apis/ttsfleet.io/v1alpha1/namespaces/ns1/ttsdeployments", json=bad)
        conds = await wait_for(lambda: live(cluster, TTSD, "ns1", "voice")["status"]["conditions"])
        degraded = next(c for c in conds if c["type"] == "Degraded")
        assert degraded["status"] == "True" and degraded["reason"] == "InvalidSpec"
        assert "minReplicas" in degraded["message"]
        assert names(cluster, DEPLOY) == []
        assert any(e["reason"] == "InvalidSpec" and e["type"] == "Warning"
                   for e in objects(cluster, EVENTS).values())
        # Fixing the spec recovers.
        fixed = ttsd()["spec"]
        await cluster.patch("/apis/ttsfleet.io/v1alpha1/namespaces/ns1/ttsdeployments/voice",
                            json={"spec": fixed}, headers=MERGE)
        await wait_for(lambda: names(cluster, DEPLOY) == ["voice-h200", "voice-rtx5090"])
        await wait_for(lambda: next(c for c in live(cluster, TTSD, "ns1", "voice")["status"]["conditions"]
                                    if c["type"] == "Degraded")["status"] == "False")


@pytest.mark.looptime(False)  # kopf measures retry delays on the wall clock: run in real time
async def test_api_errors_surface_as_degraded_and_retry(cluster, make_runtime):
    """The API refuses Deployments (a quota, an admission webhook): Degraded=ReconcileError while
    kopf retries, and the condition clears once the API accepts them."""
    refusing = [True]
    cluster[lambda req: refusing[0] and req.method == "POST" and req.url.path.endswith("/deployments")] \
        << 403 << {"kind": "Status", "apiVersion": "v1", "code": 403, "message": "quota exceeded"}
    async with running_operator(make_runtime(retry_delay_s=1.0, autoscale_interval_s=3600)):
        await cluster.post("/apis/ttsfleet.io/v1alpha1/namespaces/ns1/ttsdeployments", json=ttsd())

        def degraded() -> dict:
            conds = live(cluster, TTSD, "ns1", "voice")["status"]["conditions"]
            return next(c for c in conds if c["type"] == "Degraded")

        cond = await wait_for(degraded, timeout=20, step=0.1)
        assert cond["status"] == "True" and cond["reason"] == "ReconcileError" and "403" in cond["message"]
        refusing[0] = False
        await wait_for(lambda: degraded()["status"] == "False", timeout=20, step=0.1)
        assert names(cluster, DEPLOY) == ["voice-h200", "voice-rtx5090"]


async def test_children_deleted_or_edited_by_hand_come_back(cluster, make_runtime):
    async with running_operator(make_runtime(autoscale_interval_s=5.0)):
        await cluster.post("/apis/ttsfleet.io/v1alpha1/namespaces/ns1/ttsdeployments", json=ttsd())
        await wait_for(lambda: names(cluster, PDB) == ["voice-h200", "voice-rtx5090"])
        await cluster.delete("/api/v1/namespaces/ns1/services/voice-h200")
        await cluster.patch("/apis/apps/v1/namespaces/ns1/deployments/voice-rtx5090", headers=MERGE,
                            json={"spec": {"template": {"spec": {"priorityClassName": "hijacked"}}}})
        await wait_for(lambda: "voice-h200" in names(cluster, SVC))
        await wait_for(lambda: live(cluster, DEPLOY, "ns1", "voice-rtx5090")["spec"]["template"]["spec"][
            "priorityClassName"] == "ttsfleet-inference")


async def test_invalid_filljob_is_degraded_with_one_event(cluster, make_runtime):
    bad = filljob()
    bad["spec"]["gpuClasses"] = ["tpu-v5"]
    async with running_operator(make_runtime(fill_interval_s=5.0)):
        await cluster.post("/apis/ttsfleet.io/v1alpha1/namespaces/ns1/filljobs", json=bad)
        conds = await wait_for(lambda: live(cluster, FILLJOB, "ns1", "clean")["status"]["conditions"])
        assert conds[0]["type"] == "Degraded" and conds[0]["reason"] == "InvalidSpec"
        await asyncio.sleep(30)  # several passes
        warnings = [e for e in objects(cluster, EVENTS).values() if e["reason"] == "InvalidSpec"]
        assert len(warnings) == 1 and "gpuClasses" in warnings[0]["message"]
        assert names(cluster, PODS) == []
