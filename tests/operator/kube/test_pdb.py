"""PodDisruptionBudgets on a real control plane (the disruption controller of kube-controller-manager).

Inference: the operator's PDB per pool (``maxUnavailable: 1``) makes the Eviction API (policy/v1,
what ``kubectl drain`` and cluster autoscalers use) refuse a second eviction while one replica is
already gone (HTTP 429) and allow one within the budget (201).

Fill: the operator's own fill evictions are deliberately *not* Eviction API calls but deletes with
the pod's grace period. Fill pods are preemptible by contract (PriorityClass ``ttsfleet-fill``,
below every other workload; the scheduler preempts them too), and the operator evicts them to give
their GPUs to inference or to keep the fill policy's head-room: a PDB someone put on fill pods
must not stall that. Such a PDB still protects them from drains (429), which is tested too.
"""

from __future__ import annotations

from typing import Any

import pytest
from ttsfleet.devtools.localkube import LocalKube

from . import audit
from .conftest import Api, bound_claim, empty, exactly, running_operator, wait_for
from .test_e2e_fill import fill_job, pods

NS = "tts-pdb"
OPERATOR = audit.sa_user("ttsfleet", "ttsfleet")
TTSD = f"/apis/ttsfleet.io/v1alpha1/namespaces/{NS}/ttsdeployments"
FJ = f"/apis/ttsfleet.io/v1alpha1/namespaces/{NS}/filljobs"
PDBS = f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets"


async def evict(api: Api, name: str) -> int:
    """POST pods/NAME/eviction, as kubectl drain does; returns the HTTP status."""
    r = await api.call("POST", f"/api/v1/namespaces/{NS}/pods/{name}/eviction", {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": NS}})
    return r.status_code


async def cordon(api: Api, unschedulable: bool) -> None:
    for node in ("h200-a", "h200-b"):
        await api.patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": unschedulable or None}})


async def budget(api: Api, name: str, healthy: int, allowed: int) -> dict[str, Any] | None:
    pdb = await api.get(f"{PDBS}/{name}") or {}
    st = pdb.get("status") or {}
    ok = st.get("currentHealthy") == healthy and st.get("disruptionsAllowed") == allowed \
        and st.get("observedGeneration") == pdb.get("metadata", {}).get("generation")
    return pdb if ok else None


async def test_the_pool_pdb_refuses_an_eviction_beyond_its_budget(
        releases: Any, api: Api, kube: LocalKube, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    await api.namespace(NS)
    async with running_operator(kube, "ttsfleet", tmp_path, monkeypatch):
        await api.create(TTSD, {
            "apiVersion": "ttsfleet.io/v1alpha1", "kind": "TTSDeployment", "metadata": {"name": "guarded"},
            "spec": {"model": {"checkpoint": "s3://m/v1"}, "image": "ghcr.io/ttsfleet/inference:test",
                     "pools": [{"gpuClass": "h200", "minReplicas": 3, "maxReplicas": 3}],
                     "resources": {"cpu": "0.5", "memory": "1Gi"}}})
        sel = "app.kubernetes.io/instance=guarded"
        await wait_for(lambda: exactly(pods(api, NS, sel), 3), 60, "3 inference pods Running")
        pdb = await wait_for(lambda: budget(api, "guarded-h200", 3, 1), 60,
                             "the pool PDB: 3 healthy, 1 allowed")
        assert pdb["spec"]["maxUnavailable"] == 1
        first, second, _ = sorted(p["metadata"]["name"] for p in await pods(api, NS, sel))

        # As kubectl drain does: cordon, then evict. The replacement of an evicted pod stays
        # Pending (no schedulable h200 node), so the budget cannot refill behind the test's back.
        try:
            await cordon(api, True)
            assert await evict(api, first) == 201  # within the budget
            r = await api.call("POST", f"/api/v1/namespaces/{NS}/pods/{second}/eviction", {
                "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": second, "namespace": NS}})
            assert r.status_code == 429, r.text  # one is already gone: beyond the budget
            assert "disruption budget" in r.json()["message"]
            pod = await api.get(f"/api/v1/namespaces/{NS}/pods/{second}")
            assert pod is not None and not pod["metadata"].get("deletionTimestamp")
        finally:
            await cordon(api, False)
        # The replacement is scheduled and Ready: the budget allows one eviction again.
        await wait_for(lambda: budget(api, "guarded-h200", 3, 1), 60, "the budget restored")
        assert await evict(api, second) == 201
        assert await api.delete(f"{TTSD}/guarded") == 200
        await wait_for(lambda: empty(pods(api, NS, sel, phase=None)), 60, "the pool's pods gone")


async def test_operator_fill_evictions_are_deletes_that_a_fill_pdb_does_not_stall(
        releases: Any, api: Api, kube: LocalKube, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    await api.namespace(NS)
    await bound_claim(api, NS)
    sel = "ttsfleet.io/filljob=clean-pdb"
    async with running_operator(kube, "ttsfleet", tmp_path, monkeypatch, fill_interval_s=1.0):
        await api.create(FJ, fill_job("clean-pdb", ["rtx5090"], shards=4, parallelism=2))
        await wait_for(lambda: exactly(pods(api, NS, sel), 2), 60, "2 fill pods on the 2 rtx5090 GPUs")
        await api.create(PDBS, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                                "metadata": {"name": "fill-guard"},
                                "spec": {"minAvailable": 2, "selector": {"matchLabels": {
                                    "ttsfleet.io/filljob": "clean-pdb"}}}})
        await wait_for(lambda: budget(api, "fill-guard", 2, 0), 60, "the fill PDB: 2 healthy, 0 allowed")
        victim = (await pods(api, NS, sel))[0]["metadata"]["name"]
        assert await evict(api, victim) == 429  # a drain honours it

        since = audit.mark(kube)
        await api.patch(f"{FJ}/clean-pdb", {"spec": {"policy": {"minFreeGpus": 1}}})  # head-room 1 GPU
        await wait_for(lambda: exactly(pods(api, NS, sel), 1), 60, "the operator evicting one fill pod")
        calls = audit.requests(kube, OPERATOR, since)
        assert not any(audit.call(e)[1] == "pods/eviction" for e in calls)
        assert any(w.startswith(f"delete /pods {NS}/") for w in audit.writes(calls))
        body = await wait_for(lambda: _evicted(api), 30, "the eviction in the FillJob's status")
        assert body["status"]["evictions"] >= 1
        assert await api.delete(f"{FJ}/clean-pdb") == 200
        await wait_for(lambda: empty(pods(api, NS, "ttsfleet.io/workload", phase=None)), 60, "fill pods gone")
        assert await api.delete(f"{PDBS}/fill-guard") == 200


async def _evicted(api: Api) -> dict[str, Any] | None:
    body = await api.get(f"{FJ}/clean-pdb") or {}
    return body if (body.get("status") or {}).get("evictions") else None
