"""Autoscaling end to end: real HTTP /metrics endpoints (prometheus-client) behind kmock pods."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from ttsfleet.devtools.ports import free_port

from tests.operator.conftest import running_operator
from tests.operator.helpers import DEPLOY, EVENTS, PODS, TTSD, live, objects, ttsd, wait_for

pytestmark = pytest.mark.looptime

POOL = [{"gpuClass": "h200", "minReplicas": 1, "maxReplicas": 6}]


async def add_pod(cluster: Any, name: str, port: int, pool: str = "h200", deployment: str = "voice") -> None:
    """What the ReplicaSet controller and kubelet would do: a running pod serving /metrics."""
    await cluster.post("/api/v1/namespaces/ns1/pods", json={
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns1",
                     "labels": {"app.kubernetes.io/instance": deployment, "ttsfleet.io/pool": pool,
                                "ttsfleet.io/workload": "inference", "ttsfleet.io/gpu-class": "h200"}},
        "spec": {"containers": [{"name": "server", "image": "x",
                                 "ports": [{"name": "http", "containerPort": port}]}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1"},
    })


def replicas(cluster: Any) -> int:
    return live(cluster, DEPLOY, "ns1", "voice-h200")["spec"]["replicas"]


async def set_ready(cluster: Any, name: str, ready: int) -> None:
    await cluster.patch(f"/apis/apps/v1/namespaces/ns1/deployments/{name}/status",
                        json={"status": {"replicas": ready, "readyReplicas": ready}},
                        headers={"Content-Type": "application/merge-patch+json"})


async def test_scales_up_on_load_and_down_with_deletion_cost(cluster, make_runtime, metrics_servers):
    rt = make_runtime(autoscale_interval_s=5.0)
    spec = {"pools": POOL, "autoscale": {"targetInFlightPerReplica": 10, "stableWindowS": 20,
                                         "panicWindowS": 10, "scaleDownStabilizationS": 30}}
    async with running_operator(rt):
        await cluster.post("/apis/ttsfleet.io/v1alpha1/namespaces/ns1/ttsdeployments", json=ttsd(**spec))
        await wait_for(lambda: live(cluster, DEPLOY, "ns1", "voice-h200"))
        first = await metrics_servers()
        first.set(in_flight=35, queue=0, ttfa=[0.08] * 20)
        await add_pod(cluster, "voice-h200-5d9f-aaaaa", first.port)
        await set_ready(cluster, "voice-h200", 1)

        # 35 requests in flight at 10 per replica: 4 replicas.
        await wait_for(lambda: replicas(cluster) == 4, timeout=60)
        status = await wait_for(lambda: live(cluster, TTSD, "ns1", "voice")["status"]["lastDecisions"])
        assert status[-1]["direction"] == "up" and status[-1]["toReplicas"] == 4
        assert status[-1]["reason"] in ("load", "panic")
        events = objects(cluster, EVENTS)
        assert any(e["reason"] == "ScaledUp" and "1 -> 4" in e["message"] for e in events.values())

        # Four ready pods, load drops to 3 in flight: after the stabilization window, scale down
        # (at most halving per step) and mark the least busy pods for removal.
        servers = [first] + [await metrics_servers() for _ in range(3)]
        for i, s in enumerate(servers[1:], start=1):
            await add_pod(cluster, f"voice-h200-5d9f-pod{i}", s.port)
        for s, load in zip(servers, (2, 0, 1, 0), strict=True):
            s.set(in_flight=load)
        await set_ready(cluster, "voice-h200", 4)
        await wait_for(lambda: replicas(cluster) == 2, timeout=120)
        pods = objects(cluster, PODS)
        marked = sorted(n for n, p in pods.items()
                        if (p["metadata"].get("annotations") or {}).get(
                            "controller.kubernetes.io/pod-deletion-cost") == "-1000")
        assert marked == ["voice-h200-5d9f-pod1", "voice-h200-5d9f-pod3"]  # the two idle ones
        history = live(cluster, TTSD, "ns1", "voice")["status"]["lastDecisions"]
        assert history[-1]["direction"] == "down" and history[-1]["fromReplicas"] == 4
        st = live(cluster, TTSD, "ns1", "voice")["status"]
        assert st["pools"][0]["desired"] == 2


async def test_ttfa_slo_breach_adds_replicas(cluster, make_runtime, metrics_servers):
    """Load is within target but time to first audio p99 breaks the SLO: the policy adds a replica."""
    rt = make_runtime(autoscale_interval_s=5.0)
    spec = {"pools": [{"gpuClass": "h200", "minReplicas": 2, "maxReplicas": 6}],
            "autoscale": {"targetInFlightPerReplica": 40, "ttfaP99SloS": 0.5, "stableWindowS": 20,
                          "panicWindowS": 10}}
    async with running_operator(rt):
        await cluster.post("/apis/ttsfleet.io/v1alpha1/namespaces/ns1/ttsdeployments", json=ttsd(**spec))
        await wait_for(lambda: live(cluster, DEPLOY, "ns1", "voice-h200"))
        servers = [await metrics_servers() for _ in range(2)]
        for i, s in enumerate(servers):
            s.set(in_flight=5)
            await add_pod(cluster, f"voice-h200-77-p{i}", s.port)
        await set_ready(cluster, "voice-h200", 2)
        # Let a baseline scrape happen, then slow requests arrive.
        await wait_for(lambda: rt.metrics["operator_replicas_desired"].labels(
            "ns1", "voice", "h200", "h200")._value.get() == 2)
        for s in servers:
            s.set(in_flight=5, ttfa=[1.5] * 50)
        await wait_for(lambda: replicas(cluster) == 3, timeout=60)
        last = live(cluster, TTSD, "ns1", "voice")["status"]["lastDecisions"][-1]
        assert last["reason"] == "slo" and "ttfa p99" in last["message"]


async def test_blind_pool_is_not_scaled_down_and_prometheus_outage_falls_back(cluster, make_runtime,
                                                                              metrics_servers):
    """Prometheus is down and no pod answers /metrics: no decision (zero load would be invented).
    Once a pod answers, scraping replaces Prometheus and the pool scales on real load."""
    rt = make_runtime(autoscale_interval_s=5.0, prometheus_url=f"http://127.0.0.1:{free_port()}")
    spec = {"pools": POOL, "autoscale": {"targetInFlightPerReplica": 10, "stableWindowS": 20,
                                         "panicWindowS": 10, "scaleDownStabilizationS": 10}}
    async with running_operator(rt):
        await cluster.post("/apis/ttsfleet.io/v1alpha1/namespaces/ns1/ttsdeployments", json=ttsd(**spec))
        await wait_for(lambda: live(cluster, DEPLOY, "ns1", "voice-h200"))
        await cluster.patch("/apis/apps/v1/namespaces/ns1/deployments/voice-h200",
                            json={"spec": {"replicas": 3}},
                            headers={"Content-Type": "application/merge-patch+json"})
        for i in range(3):
            await add_pod(cluster, f"voice-h200-5d9f-dead{i}", free_port())
        await set_ready(cluster, "voice-h200", 3)
        await asyncio.sleep(120)  # many autoscaling periods, well past the stabilization window
        assert replicas(cluster) == 3
        assert not live(cluster, TTSD, "ns1", "voice")["status"].get("lastDecisions")

        busy = await metrics_servers()
        busy.set(in_flight=100)
        await add_pod(cluster, "voice-h200-5d9f-alive", busy.port)
        await wait_for(lambda: replicas(cluster) > 3, timeout=60)
        assert live(cluster, TTSD, "ns1", "voice")["status"]["lastDecisions"][-1]["direction"] == "up"
