"""A TTSDeployment on a real control plane, run by the operator with the chart's ServiceAccount.

The operator's objects go through the real admission chain (RBAC, OwnerReferencesPermission-
Enforcement, defaulting), the controller-manager turns Deployments into ReplicaSets and pods, the
scheduler places them by node affinity and taints, and deletion is finished by the real garbage
collector. The audit log counts what the operator sends once it has converged: nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import yaml
from ttsfleet.devtools.localkube import LocalKube

from . import audit
from .conftest import REPO, Api, gone, running_operator, wait_for

# A hang costs this test, not the run (see test_e2e_fill.py): ~5x its duration (14 s the longest),
# at least 120 s (the session's first test also starts the control plane).
pytestmark = pytest.mark.timeout(120, method="signal")

NS = "tts-inf"
OPERATOR = audit.sa_user("ttsfleet", "ttsfleet")
TTSD = f"/apis/ttsfleet.io/v1alpha1/namespaces/{NS}/ttsdeployments"


def voice(name: str = "voice", **spec: Any) -> dict[str, Any]:
    base = {
        "model": {"checkpoint": "s3://models/narrator/v3"},
        "image": "ghcr.io/ttsfleet/inference:test",
        "pools": [{"gpuClass": "h200", "minReplicas": 2, "maxReplicas": 4},
                  {"gpuClass": "rtx5090", "minReplicas": 1, "maxReplicas": 2}],
        # Spelled as users do; the server stores 500m and 1536Mi (defect 5: must not be drift).
        "resources": {"cpu": "0.5", "memory": "1.5Gi", "gpus": 1},
        "nodeSelector": {},
        "env": [{"name": "EXTRA", "value": ""}],
        "autoscale": {"scaleDownStabilizationS": 30},
    }
    return {"apiVersion": "ttsfleet.io/v1alpha1", "kind": "TTSDeployment",
            "metadata": {"name": name}, "spec": {**base, **spec}}


async def pool_pods(api: Api, name: str, pool: str) -> list[dict[str, Any]]:
    sel = f"app.kubernetes.io/instance={name},ttsfleet.io/pool={pool}"
    return [p for p in await api.items(f"/api/v1/namespaces/{NS}/pods", labelSelector=sel)
            if not p["metadata"].get("deletionTimestamp")]


async def running_on(api: Api, name: str, pool: str, count: int) -> list[str] | None:
    pods = await pool_pods(api, name, pool)
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    return sorted(p["spec"]["nodeName"] for p in running) if len(running) == count == len(pods) else None


async def test_pools_run_on_their_gpu_class_settle_and_are_collected(
        releases: Any, api: Api, kube: LocalKube, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    await api.namespace(NS)
    async with running_operator(kube, "ttsfleet", tmp_path, monkeypatch) as rt:
        await api.create(TTSD, voice())
        h200 = await wait_for(lambda: running_on(api, "voice", "h200", 2), 60, "2 h200 pods Running")
        rtx = await wait_for(lambda: running_on(api, "voice", "rtx5090", 1), 60, "1 rtx5090 pod Running")
        assert set(h200) <= {"h200-a", "h200-b"} and rtx == ["rtx5090-a"]
        rs = await api.items(f"/apis/apps/v1/namespaces/{NS}/replicasets",
                             labelSelector="app.kubernetes.io/instance=voice")
        owners = sorted(r["metadata"]["ownerReferences"][0]["name"] for r in rs)
        assert owners == ["voice-h200", "voice-rtx5090"]
        dep = await api.get(f"/apis/apps/v1/namespaces/{NS}/deployments/voice-h200")
        assert dep is not None
        res = dep["spec"]["template"]["spec"]["containers"][0]["resources"]
        assert res["requests"] == {"cpu": "500m", "memory": "1536Mi", "nvidia.com/gpu": "1"}

        async def ready() -> bool:
            body = await api.get(f"{TTSD}/voice") or {}
            conds = {c["type"]: c["status"] for c in (body.get("status") or {}).get("conditions") or []}
            return conds.get("Ready") == "True" and conds.get("Progressing") == "False"
        await wait_for(ready, 60, "the TTSDeployment Ready and not Progressing")

        # Steady state: three autoscaling passes send no PATCH and write no Event.
        await asyncio.sleep(2 * rt.autoscale_interval_s)
        since = audit.mark(kube)
        await asyncio.sleep(3 * rt.autoscale_interval_s + 1)
        sent = audit.requests(kube, OPERATOR, since)
        assert [e for e in sent if e["verb"] == "get"], "the operator did not run in the window"
        assert audit.writes(sent) == [], "steady state must not write"

        # Drift by hand comes back (reconcile by diff against what the server stores).
        svc = f"/api/v1/namespaces/{NS}/services/voice-h200"
        pdb = f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/voice-h200"
        await api.patch(svc, {"spec": {"selector": {"stray": "x"}}})
        await api.patch(pdb, {"spec": {"maxUnavailable": 3}})

        async def restored() -> bool:
            s, b = await api.get(svc), await api.get(pdb)
            return "stray" not in s["spec"]["selector"] and b["spec"]["maxUnavailable"] == 1
        await wait_for(restored, 30, "the Service selector and the PDB restored")

        # GC on delete: the operator lets go (finalizer), the garbage collector removes the rest.
        assert await api.delete(f"{TTSD}/voice") == 200
        await wait_for(lambda: gone(api, f"{TTSD}/voice"), 60,
                       "the TTSDeployment gone (finalizer released)")
        for kind in ("apis/apps/v1/namespaces/{ns}/deployments", "api/v1/namespaces/{ns}/services",
                     "apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", "api/v1/namespaces/{ns}/pods"):
            path = "/" + kind.format(ns=NS)
            await wait_for(lambda path=path: _empty(api, path), 60, f"{path} emptied")
        assert audit.forbidden(audit.requests(kube, OPERATOR)) == []


async def _empty(api: Api, path: str) -> bool:
    return not await api.items(path, labelSelector="app.kubernetes.io/instance=voice")


async def test_a_same_named_object_of_someone_else_is_never_adopted(
        releases: Any, api: Api, kube: LocalKube, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    await api.namespace(NS)
    svc_path = f"/api/v1/namespaces/{NS}/services/taken-h200"
    await api.create(f"/api/v1/namespaces/{NS}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "taken-h200"},
        "spec": {"selector": {"app": "theirs"}, "ports": [{"port": 80}]}})
    async with running_operator(kube, "ttsfleet", tmp_path, monkeypatch):
        pools = [{"gpuClass": "h200", "minReplicas": 1, "maxReplicas": 1}]
        await api.create(TTSD, voice("taken", pools=pools))

        async def not_owned() -> bool:
            body = await api.get(f"{TTSD}/taken") or {}
            return any(c["type"] == "Degraded" and c["status"] == "True" and c["reason"] == "NotOwned"
                       for c in (body.get("status") or {}).get("conditions") or [])
        await wait_for(not_owned, 60, "Degraded NotOwned")
        assert await api.get(f"/apis/apps/v1/namespaces/{NS}/deployments/taken-h200") is not None
        svc = await api.get(svc_path)
        assert svc["spec"]["selector"] == {"app": "theirs"} and not svc["metadata"].get("ownerReferences")
        assert await api.delete(f"{TTSD}/taken") == 200
        await wait_for(lambda: gone(api, f"{TTSD}/taken"), 60, "the TTSDeployment gone")
    assert await api.get(svc_path) is not None, "someone else's Service was deleted"
    await api.delete(svc_path)


async def test_the_shipped_example_settles(releases: Any, api: Api, kube: LocalKube, tmp_path: Any,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """kubectl apply -f charts/ttsfleet/examples/ttsdeployment-h200-rtx5090.yaml: once reconciled,
    the operator sends nothing (it used to re-PATCH it with a Reconciled Event every 15 s)."""
    example = yaml.safe_load((REPO / "charts/ttsfleet/examples/ttsdeployment-h200-rtx5090.yaml")
                             .read_text())
    ns = example["metadata"]["namespace"]
    await api.namespace(ns)
    async with running_operator(kube, "ttsfleet", tmp_path, monkeypatch) as rt:
        await api.create(f"/apis/ttsfleet.io/v1alpha1/namespaces/{ns}/ttsdeployments", example)
        name = example["metadata"]["name"]
        for pool in ("h200", "rtx5090"):
            dep = f"/apis/apps/v1/namespaces/{ns}/deployments/{name}-{pool}"
            await wait_for(lambda dep=dep: api.get(dep), 60, f"the {pool} Deployment")
        await asyncio.sleep(3 * rt.autoscale_interval_s)
        since = audit.mark(kube)
        await asyncio.sleep(3 * rt.autoscale_interval_s + 1)
        assert audit.writes(audit.requests(kube, OPERATOR, since)) == []
        path = f"/apis/ttsfleet.io/v1alpha1/namespaces/{ns}/ttsdeployments/{name}"
        assert await api.delete(path) == 200
        await wait_for(lambda: gone(api, path), 60, "the example gone")
