"""The scale subresource on a real API server: ``kubectl scale`` and a HorizontalPodAutoscaler.

``spec.replicas`` is the total over the pools; the operator splits it by weight within each pool's
bounds (:func:`ttsfleet.policy.split_replicas`) and patches the pools' Deployments; the traffic
autoscaler is off while it is above 0 and resumes from the live replicas at 0 (the default: the
API server cannot serve /scale while the field is missing). GET /scale
reports the total and the inference pods' selector; PATCH /scale is what ``kubectl scale`` sends;
the real HPA controller (kube-controller-manager) drives the same endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from ttsfleet.devtools.localkube import LocalKube

from .conftest import Api, gone, running_operator, wait_for
from .test_e2e_fill import PodMetrics

NS = "tts-scale"
TTSD = f"/apis/ttsfleet.io/v1alpha1/namespaces/{NS}/ttsdeployments"
SCALE = f"{TTSD}/sc/scale"
SELECTOR = "app.kubernetes.io/instance=sc,ttsfleet.io/workload=inference"


def scalable() -> dict[str, Any]:
    return {"apiVersion": "ttsfleet.io/v1alpha1", "kind": "TTSDeployment", "metadata": {"name": "sc"},
            "spec": {"model": {"checkpoint": "s3://m/v1"}, "image": "ghcr.io/ttsfleet/inference:test",
                     "pools": [{"gpuClass": "h200", "minReplicas": 1, "maxReplicas": 4, "weight": 3},
                               {"gpuClass": "rtx5090", "minReplicas": 0, "maxReplicas": 2, "weight": 1}],
                     "resources": {"cpu": "0.5", "memory": "1Gi"},
                     # Quick to scale down on zero load: would undo a manual total at once if the
                     # traffic autoscaler were not off while spec.replicas is set.
                     "autoscale": {"targetInFlightPerReplica": 10, "stableWindowS": 2, "panicWindowS": 1,
                                   "scaleDownStabilizationS": 1}}}


@contextlib.asynccontextmanager
async def deleted_after(api: Api) -> AsyncIterator[None]:
    """Delete the TTSDeployment and wait until it is gone, also when the test fails (a left-over
    one would fail the next test's create with 409)."""
    try:
        yield
    finally:
        if await api.get(f"{TTSD}/sc"):
            assert await api.delete(f"{TTSD}/sc") == 200
            await wait_for(lambda: gone(api, f"{TTSD}/sc"), 60, "the TTSDeployment gone")


async def pool_replicas(api: Api) -> dict[str, int]:
    out = {}
    for pool in ("h200", "rtx5090"):
        dep = await api.get(f"/apis/apps/v1/namespaces/{NS}/deployments/sc-{pool}") or {}
        out[pool] = int((dep.get("spec") or {}).get("replicas") or 0)
    return out


async def reaches(api: Api, want: dict[str, int]) -> bool:
    return await pool_replicas(api) == want


async def scale_of(api: Api) -> dict[str, Any]:
    r = await api.call("GET", SCALE)
    assert r.status_code == 200, r.text
    return r.json()


async def kubectl_scale(api: Api, replicas: int) -> dict[str, Any]:
    """What ``kubectl scale ttsd/sc --replicas=N`` sends: a merge patch of the scale subresource."""
    r = await api.call("PATCH", SCALE, {"spec": {"replicas": replicas}})
    assert r.status_code == 200, r.text
    return r.json()


async def test_kubectl_scale_splits_the_total_and_pauses_the_autoscaler(
        releases: Any, api: Api, kube: LocalKube, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    await api.namespace(NS)
    metrics = PodMetrics(api, "app.kubernetes.io/instance=sc", namespace=NS)  # zero load on every pod
    async with metrics.feeding(), running_operator(kube, "ttsfleet", tmp_path, monkeypatch) as rt, \
            deleted_after(api):
        await api.create(TTSD, scalable())
        await wait_for(lambda: reaches(api, {"h200": 1, "rtx5090": 0}), 60, "the pools at their minimum")

        async def reported(replicas: int) -> dict[str, Any] | None:
            s = await scale_of(api)
            return s if s["status"].get("replicas") == replicas and s["status"].get("selector") else None
        scale = await wait_for(lambda: reported(1), 60, "GET /scale reporting 1 replica")
        assert scale["kind"] == "Scale" and scale["apiVersion"] == "autoscaling/v1"
        assert scale["status"]["selector"] == SELECTOR
        # The CRD's default 0 (the traffic autoscaler decides); Scale omits a 0 (omitempty).
        assert scale["spec"].get("replicas", 0) == 0
        assert (await api.get(f"{TTSD}/sc"))["spec"]["replicas"] == 0

        # kubectl scale --replicas=5: weights 3:1 within the bounds -> 4 + 1.
        patched = await kubectl_scale(api, 5)
        assert patched["spec"]["replicas"] == 5
        await wait_for(lambda: reaches(api, {"h200": 4, "rtx5090": 1}), 60, "the split 4 + 1")
        body = await api.get(f"{TTSD}/sc")
        assert body["spec"]["replicas"] == 5
        await wait_for(lambda: reported(5), 60, "GET /scale reporting 5 replicas")
        # Zero load, 1 s stabilization: the traffic autoscaler would scale down; it is off.
        await wait_for(lambda: _running(api, 5), 60, "5 inference pods Running")
        await asyncio.sleep(3 * rt.autoscale_interval_s + 1)
        assert await pool_replicas(api) == {"h200": 4, "rtx5090": 1}
        assert not ((await api.get(f"{TTSD}/sc"))["status"].get("lastDecisions"))

        # More than the pools hold: placed at their maximum (4 + 2), the request kept as asked.
        await kubectl_scale(api, 100)
        await wait_for(lambda: reaches(api, {"h200": 4, "rtx5090": 2}), 60, "both pools at their max")
        events = await api.items(f"/api/v1/namespaces/{NS}/events",
                                 fieldSelector="involvedObject.name=sc")
        assert any("spec.replicas 100 placed as 6" in e["message"] for e in events)

        # kubectl scale --replicas=0: the traffic autoscaler takes over again and scales down.
        await kubectl_scale(api, 0)
        # down to the pools' minimum, at most half a pool per step (rtx5090: 2 -> 1 -> 0)
        await wait_for(lambda: reaches(api, {"h200": 1, "rtx5090": 0}), 90,
                       "the autoscaler scaling down to the minimum on zero load")
        last = (await api.get(f"{TTSD}/sc"))["status"]["lastDecisions"]
        assert last and last[-1]["direction"] == "down"


async def test_a_horizontal_pod_autoscaler_drives_the_scale_subresource(
        releases: Any, api: Api, kube: LocalKube, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real HPA controller reads /scale and writes it: below its minReplicas it scales the
    target up to them (that step needs no metrics API, which this control plane does not run)."""
    await api.namespace(NS)
    async with running_operator(kube, "ttsfleet", tmp_path, monkeypatch), deleted_after(api):
        await api.create(TTSD, {**scalable(), "spec": {**scalable()["spec"], "replicas": 2}})
        await wait_for(lambda: reaches(api, {"h200": 2, "rtx5090": 0}), 60, "the split of 2: 2 + 0")
        await api.create(f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers", {
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "sc"},
            "spec": {"scaleTargetRef": {"apiVersion": "ttsfleet.io/v1alpha1", "kind": "TTSDeployment",
                                        "name": "sc"},
                     "minReplicas": 5, "maxReplicas": 6,
                     "metrics": [{"type": "Resource", "resource": {
                         "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]}})
        await wait_for(lambda: reaches(api, {"h200": 4, "rtx5090": 1}), 90, "the HPA's 5 split as 4 + 1")
        body = await api.get(f"{TTSD}/sc")
        assert body["spec"]["replicas"] == 5
        hpa = await api.get(f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers/sc")
        assert hpa["status"]["desiredReplicas"] == 5
        assert await api.delete(f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers/sc") == 200


async def _running(api: Api, n: int) -> bool:
    items = await api.items(f"/api/v1/namespaces/{NS}/pods", labelSelector=SELECTOR)
    return sum(1 for p in items if (p.get("status") or {}).get("phase") == "Running"
               and not p["metadata"].get("deletionTimestamp")) == n
