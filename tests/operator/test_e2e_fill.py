"""Fill controller end to end: fill pods on idle GPUs, evicted for inference, shards accounted."""

from __future__ import annotations

import time
from typing import Any

import kubernetes_validate
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.operator.conftest import running_operator
from tests.operator.helpers import EVENTS, FILLJOB, PODS, filljob, live, names, node, objects, wait_for
from ttsfleet.policy.demand import InferenceNeed

pytestmark = pytest.mark.looptime

MERGE = {"Content-Type": "application/merge-patch+json"}


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


async def run_pod(cluster: Any, name: str, checkpoint_age_s: float, metrics_port: int | None = None) -> None:
    """The scheduler and kubelet: bind and start the pod ``checkpoint_age_s`` ago (under the
    checkpoint interval, the operator's estimate of its work at risk), or, with ``metrics_port``,
    let the fill job report its own on its metrics endpoint."""
    now = time.time()
    patch: dict[str, Any] = {
        "spec": {"nodeName": "gpu-a"},
        "status": {"phase": "Running", "startTime": iso(now - checkpoint_age_s)}}
    if metrics_port:
        pod = live(cluster, PODS, "ns1", name)
        container = dict(pod["spec"]["containers"][0], ports=[{"name": "metrics",
                                                              "containerPort": metrics_port}])
        patch["spec"]["containers"] = [container]
        patch["status"]["podIP"] = "127.0.0.1"
    await cluster.patch(f"/api/v1/namespaces/ns1/pods/{name}", headers=MERGE, json=patch)


async def finish_pod(cluster: Any, name: str, code: int) -> None:
    await cluster.patch(f"/api/v1/namespaces/ns1/pods/{name}", headers=MERGE, json={"status": {
        "phase": "Succeeded" if code == 0 else "Failed",
        "containerStatuses": [{"name": "fill", "state": {"terminated": {"exitCode": code}}}]}})


def gauge(rt: Any, name: str, **labels: str) -> float | None:
    """A sample as the operator's /metrics endpoint would expose it."""
    for fam in text_string_to_metric_families(generate_latest(rt.metrics.registry).decode()):
        for s in fam.samples:
            if s.name == name and s.labels.get("gpu_class") == "h200" and labels.items() <= s.labels.items():
                return s.value
    return None


def fill_pods(cluster: Any) -> list[str]:
    return [n for n, p in objects(cluster, PODS).items()
            if p["metadata"]["labels"].get("ttsfleet.io/workload") == "fill"]


async def test_fill_admits_evicts_and_accounts(cluster, make_runtime, metrics_servers):
    await cluster.post("/api/v1/nodes", json=node("gpu-a", "h200", gpus=4))
    await cluster.post("/api/v1/nodes", json=node("cpu-a", ""))  # unlabelled: ignored
    rt = make_runtime(fill_interval_s=5.0)
    async with running_operator(rt):
        # A forecast window shorter than a pass: headroom follows current demand only (the
        # forecast-ahead eviction has its own test below).
        job = filljob()
        job["spec"]["policy"]["forecastWindowS"] = 1
        await cluster.post("/apis/ttsfleet.io/v1alpha1/namespaces/ns1/filljobs", json=job)
        # Four idle H200 GPUs, six shards: four shard pods, lowest shards first.
        await wait_for(lambda: len(fill_pods(cluster)) == 4)
        assert sorted(fill_pods(cluster)) == ["clean-0-0", "clean-1-0", "clean-2-0", "clean-3-0"]
        pod = live(cluster, PODS, "ns1", "clean-1-0")
        assert pod["spec"]["priorityClassName"] == "ttsfleet-fill"
        assert pod["spec"]["preemptionPolicy"] == "Never"
        assert pod["spec"]["nodeSelector"]["ttsfleet.io/gpu-class"] == "h200"
        assert "--shard" in pod["spec"]["containers"][0]["args"]
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "FillJob"
        written = [live(cluster, PODS, "ns1", n) for n in fill_pods(cluster)]
        for obj in [*written, *objects(cluster, EVENTS).values()]:
            kubernetes_validate.validate(obj, "1.31", strict=True)
        for name, age in (("clean-0-0", 50), ("clean-1-0", 40), ("clean-2-0", 5), ("clean-3-0", 30)):
            await run_pod(cluster, name, age)
        # The fleet GPU metrics (exported whether or not a FillJob exists) see 4 fill GPUs, 0 idle.
        await wait_for(lambda: gauge(rt, "ttsfleet_gpus_active", workload="fill") == 4)
        assert gauge(rt, "ttsfleet_gpus", workload="fill") == 4
        assert gauge(rt, "ttsfleet_gpus", workload="idle") == 0
        assert gauge(rt, "ttsfleet_gpus_total") == 4
        # clean-3-0 reports its own work at risk on its metrics port (what the fill job exports):
        # 2 s, less than every start-time estimate, so it is the cheapest to evict.
        fill_metrics = await metrics_servers("fill")
        fill_metrics.collectors["fill_seconds_since_checkpoint"].labels(fill_job="clean-3").set(2)
        await run_pod(cluster, "clean-3-0", 30, metrics_port=fill_metrics.port)

        # Inference wants a GPU (a pending pod pinned to h200): the fill pod with the least
        # un-checkpointed work is deleted with its grace period; nothing new is admitted.
        await cluster.post("/api/v1/namespaces/ns1/pods", json={
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "voice-h200-x-1", "namespace": "ns1",
                         "labels": {"ttsfleet.io/workload": "inference"}},
            "spec": {"priorityClassName": "ttsfleet-inference",
                     "nodeSelector": {"ttsfleet.io/gpu-class": "h200"},
                     "containers": [{"name": "s", "image": "x",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Pending"}})
        await wait_for(lambda: "clean-3-0" not in fill_pods(cluster))
        assert sorted(fill_pods(cluster)) == ["clean-0-0", "clean-1-0", "clean-2-0"]
        events = objects(cluster, EVENTS)
        assert any(e["reason"] == "FillEvicted" for e in events.values())
        st = await wait_for(lambda: live(cluster, FILLJOB, "ns1", "clean")["status"]
                            if live(cluster, FILLJOB, "ns1", "clean")["status"].get("preemptionsSurvived")
                            else None)
        assert st["preemptionsSurvived"] == 1 and st["runningPods"] == 3
        assert [d["action"] for d in st["lastDecisions"]][-1] == "evict"

        # The inference pod lands on the freed GPU; shard 0 finishes, shard 1 is preempted (exit 99),
        # shard 2 crashes (exit 1). Freed GPUs go to the next shards.
        await cluster.patch("/api/v1/namespaces/ns1/pods/voice-h200-x-1", headers=MERGE,
                            json={"spec": {"nodeName": "gpu-a"}, "status": {"phase": "Running"}})
        await finish_pod(cluster, "clean-0-0", 0)
        await finish_pod(cluster, "clean-1-0", 99)
        await finish_pod(cluster, "clean-2-0", 1)
        st = await wait_for(lambda: live(cluster, FILLJOB, "ns1", "clean")["status"]
                            if live(cluster, FILLJOB, "ns1", "clean")["status"]["shardsDone"] == 1 else None)
        assert st["completedShards"] == "0"
        assert st["preemptionsSurvived"] == 2
        assert st["shardFailures"] == {"2": 1}
        # Counted pods are deleted on the next pass; three GPUs are idle again: shards 1, 2, 3 rerun.
        await wait_for(lambda: "clean-0-0" not in names(cluster, PODS))

        def active_shards() -> list[str]:
            return sorted(p["metadata"]["labels"]["ttsfleet.io/shard"]
                          for p in objects(cluster, PODS).values()
                          if p["metadata"]["labels"].get("ttsfleet.io/workload") == "fill"
                          and p.get("status", {}).get("phase") not in ("Succeeded", "Failed"))

        await wait_for(lambda: len(active_shards()) == 3)
        assert active_shards() == ["1", "2", "3"]
        # Shard 1 resumes under a new pod name (its preempted pod still exists until deleted).
        assert "clean-1-1" in fill_pods(cluster) or "clean-1-0" not in names(cluster, PODS)


async def test_rising_inference_demand_evicts_ahead_of_need(cluster, make_runtime):
    """With a demand trend, headroom for the forecast growth is freed before pods wait for it."""
    await cluster.post("/api/v1/nodes", json=node("gpu-a", "h200", gpus=8))
    rt = make_runtime(fill_interval_s=5.0)
    async with running_operator(rt):
        job = filljob(shards=20)
        job["spec"]["policy"].update(forecastWindowS=120, evictionDeadlineS=60)
        await cluster.post("/apis/ttsfleet.io/v1alpha1/namespaces/ns1/filljobs", json=job)
        await wait_for(lambda: len(fill_pods(cluster)) == 8)
        await cluster.post("/api/v1/namespaces/ns1/pods", json={
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "voice-h200-x-1", "namespace": "ns1",
                         "labels": {"ttsfleet.io/workload": "inference"}},
            "spec": {"nodeSelector": {"ttsfleet.io/gpu-class": "h200"},
                     "containers": [{"name": "s", "image": "x",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Pending"}})
        # One GPU is wanted now, but demand rose from 0 to 1 within a pass: the forecast over the
        # eviction deadline asks for more, and more than one fill pod makes way.
        await wait_for(lambda: len(fill_pods(cluster)) < 7)
        decisions = live(cluster, FILLJOB, "ns1", "clean")["status"]["lastDecisions"]
        assert any("forecast" in d["message"] for d in decisions if d["action"] == "evict")


async def test_autoscaler_need_beyond_its_step_evicts_ahead(cluster, make_runtime):
    """What a TTSDeployment's load needs beyond the rate-limited step (PoolDecision.needed) is
    evicted for before the next step asks for it, as in the simulator."""
    await cluster.post("/api/v1/nodes", json=node("gpu-a", "h200", gpus=8))
    rt = make_runtime(fill_interval_s=5.0)
    async with running_operator(rt):
        job = filljob(shards=20)
        job["spec"]["policy"]["forecastWindowS"] = 1  # no trend: only the autoscaler's need counts
        await cluster.post("/apis/ttsfleet.io/v1alpha1/namespaces/ns1/filljobs", json=job)
        await wait_for(lambda: len(fill_pods(cluster)) == 8)
        rt.inference_need["ns1/voice"] = InferenceNeed({"h200": 3})  # as the autoscale timer records it
        await wait_for(lambda: len(fill_pods(cluster)) == 5)
        decisions = live(cluster, FILLJOB, "ns1", "clean")["status"]["lastDecisions"]
        assert any(d["action"] == "evict" for d in decisions)
        rt.inference_need.pop("ns1/voice")
        await wait_for(lambda: len(fill_pods(cluster)) == 8)  # the need went away: refilled
