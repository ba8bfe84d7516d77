"""Fill work and inference sharing real GPU nodes: the operator and the real scheduler together.

One scenario on the two h200 nodes (8 GPUs): a FillJob fills every idle GPU; a TTSDeployment's
first replica arrives while fill holds them all, so the real scheduler preempts a fill pod (the
PriorityClasses: inference > fill, fill never preempts); then the load rises beyond what one
rate-limited scale-up step allows (1 ready -> at most 5), and the operator evicts fill pods for
the whole need (7) *ahead* of the next step (the autoscaler's InferenceNeed). The inference
pods' metrics are served by real HTTP servers on their pod IPs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from ttsfleet.devtools.localkube import LocalKube
from ttsfleet.operator import fillview

from tests.operator import stopping
from tests.operator.conftest import MetricsServer

from . import audit
from .conftest import Api, bound_claim, empty, exactly, gone, running_operator, wait_for

# A hang must cost this test, not the run: pytest-timeout's alarm (signal: it fails the test where
# it waits; tests/operator/conftest.py then names that wait and bounds the teardown, which the one
# alarm no longer covers) at ~5x the tests' duration (the longest seen: 43 s and 46 s, 2026-12-04),
# setup included.
pytestmark = pytest.mark.timeout(240, method="signal")

NS = "tts-fill"
OPERATOR = audit.sa_user("ttsfleet", "ttsfleet")
FJ = f"/apis/ttsfleet.io/v1alpha1/namespaces/{NS}/filljobs"
TTSD = f"/apis/ttsfleet.io/v1alpha1/namespaces/{NS}/ttsdeployments"


def fill_job(name: str, classes: list[str], shards: int, parallelism: int) -> dict[str, Any]:
    return {"apiVersion": "ttsfleet.io/v1alpha1", "kind": "FillJob", "metadata": {"name": name},
            "spec": {"image": "ghcr.io/ttsfleet/fill:test", "manifest": "/data/m.jsonl",
                     "output": "/data/out",
                     "checkpointVolume": {"claimName": "ckpt", "mountPath": "/checkpoints"},
                     "shards": shards, "gpuClasses": classes, "maxParallelism": parallelism,
                     "resources": {"cpu": "0.5", "memory": "1Gi"},
                     "policy": {"gracePeriodS": 5, "checkpointIntervalS": 60, "evictionDeadlineS": 60,
                                "forecastWindowS": 1}}}


async def pods(api: Api, ns: str, selector: str, phase: str | None = "Running") -> list[dict[str, Any]]:
    out = [p for p in await api.items(f"/api/v1/namespaces/{ns}/pods", labelSelector=selector)
           if not p["metadata"].get("deletionTimestamp")]
    return [p for p in out if phase is None or (p.get("status") or {}).get("phase") == phase]


class PodMetrics:
    """A real /metrics server on each Running inference pod's IP (port 8000), load set per pod."""

    def __init__(self, api: Api, selector: str, namespace: str = NS) -> None:
        self.api, self.selector, self.namespace, self.in_flight = api, selector, namespace, 0.0
        self.servers: dict[str, MetricsServer] = {}

    async def sync(self) -> None:
        for p in await pods(self.api, self.namespace, self.selector):
            ip = p["status"]["podIP"]
            if ip not in self.servers:
                self.servers[ip] = await MetricsServer().start(host=ip, port=8000)
        for s in self.servers.values():
            s.set(in_flight=self.in_flight, ttfa=[0.08])

    async def run(self) -> None:
        while True:
            await self.sync()
            await asyncio.sleep(0.5)

    async def stop(self) -> None:
        for s in self.servers.values():
            await s.stop()

    @contextlib.asynccontextmanager
    async def feeding(self) -> AsyncIterator[PodMetrics]:
        """Serve the pods' metrics (new pods picked up every 0.5 s) while the block runs; stop
        every server after it, however the block ends, in bounded time (a stop that does not
        end raises StuckTask, or notes it on the block's own error)."""
        feeder = asyncio.create_task(self.run(), name=f"PodMetrics feeder ({self.selector})")
        failing: BaseException | None = None
        try:
            yield self
        except BaseException as exc:
            failing = exc
            raise
        finally:
            problems: list[Exception] = []
            try:
                # cancelled at once (no grace): the feeder only loops; what it failed with, if
                # it died before, is raised here
                await stopping.stop_task(feeder, "the PodMetrics feeder", grace_s=0, cancel_s=10.0)
            except Exception as problem:
                problems.append(problem)
            try:
                await stopping.run_bounded(self.stop, "stopping the pod metrics servers", timeout_s=20.0)
            except Exception as problem:
                problems.append(problem)
            for problem in problems:
                stopping.note(failing, problem)


async def test_fill_yields_to_inference_by_preemption_and_ahead_of_need(
        releases: Any, api: Api, kube: LocalKube, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    await api.namespace(NS)
    await bound_claim(api, NS)
    # Fill passes far more often than autoscaling steps: what the operator evicts between two
    # steps is evicted ahead of need, not raced against the scheduler's preemption.
    async with running_operator(kube, "ttsfleet", tmp_path, monkeypatch, autoscale_interval_s=5.0,
                                fill_interval_s=1.0):
        await api.create(FJ, fill_job("clean", ["h200"], shards=12, parallelism=8))
        filled = await wait_for(lambda: exactly(pods(api, NS, "ttsfleet.io/filljob=clean"), 8), 60,
                                "8 fill pods Running on the 8 idle h200 GPUs")
        assert {p["spec"]["nodeName"] for p in filled} == {"h200-a", "h200-b"}
        assert {p["spec"]["priorityClassName"] for p in filled} == {"ttsfleet-fill"}
        assert {p["spec"]["preemptionPolicy"] for p in filled} == {"Never"}

        # The first inference replica finds no free GPU: the scheduler preempts a fill pod.
        metrics = PodMetrics(api, "app.kubernetes.io/instance=burst")
        async with metrics.feeding():
            await api.create(TTSD, {
                "apiVersion": "ttsfleet.io/v1alpha1", "kind": "TTSDeployment", "metadata": {"name": "burst"},
                "spec": {"model": {"checkpoint": "s3://m/v1"}, "image": "ghcr.io/ttsfleet/inference:test",
                         "pools": [{"gpuClass": "h200", "minReplicas": 1, "maxReplicas": 7}],
                         "resources": {"cpu": "0.5", "memory": "1Gi"},
                         "autoscale": {"targetInFlightPerReplica": 10, "stableWindowS": 4, "panicWindowS": 2,
                                       "maxScaleUpRate": 2, "scaleDownStabilizationS": 4}}})
            await wait_for(lambda: exactly(pods(api, NS, "app.kubernetes.io/instance=burst"), 1), 60,
                           "the first inference pod Running (after preemption)")
            events = await api.items(f"/api/v1/namespaces/{NS}/events")
            assert any(e["reason"] == "Preempted" for e in events), "the scheduler preempted no fill pod"

            # Load for 7 replicas; one step may go to 5 (ready + 4): the operator evicts fill
            # pods for the whole need, so the next step finds free GPUs.
            since = audit.mark(kube)
            metrics.in_flight = 70.0
            await wait_for(lambda: exactly(pods(api, NS, "app.kubernetes.io/instance=burst"), 7), 90,
                           "7 inference pods Running")
            sent = audit.requests(kube, OPERATOR, since)
            evictions = [e for e in sent if e["verb"] == "delete" and e["objectRef"]["resource"] == "pods"]
            scale_ups = [e for e in sent
                         if e["verb"] == "patch" and e["objectRef"]["resource"] == "deployments"]
            assert evictions, "the operator evicted no fill pod ahead of the scale-up"
            assert len(scale_ups) >= 2, "expected rate-limited steps (1 -> 5 -> 7)"
            assert evictions[0]["requestReceivedTimestamp"] < scale_ups[-1]["requestReceivedTimestamp"], \
                "fill was evicted only when the last step asked for the GPUs"
            job = await api.get(f"{FJ}/clean")
            decisions = job["status"]["lastDecisions"]
            assert any(d["action"] == "evict" for d in decisions), decisions
            assert job["status"]["preemptionsSurvived"] >= 1
            assert len(await pods(api, NS, "ttsfleet.io/filljob=clean", phase=None)) <= 1
            dep = await api.get(f"/apis/apps/v1/namespaces/{NS}/deployments/burst-h200")
            assert dep["spec"]["replicas"] == 7

            # Load gone: after the stabilization window at most half go per step, the least busy
            # pods marked with the lowest deletion cost first.
            metrics.in_flight = 0.0
            await wait_for(lambda: exactly(pods(api, NS, "app.kubernetes.io/instance=burst"), 4), 60,
                           "a scale-down step to 4 (7 halved, rounded up)")
        assert await api.delete(f"{TTSD}/burst") == 200
        assert await api.delete(f"{FJ}/clean") == 200
        await wait_for(lambda: empty(pods(api, NS, "ttsfleet.io/workload", phase=None)), 60,
                       "every pod of the scenario gone")
    assert audit.forbidden(audit.requests(kube, OPERATOR)) == []


async def test_a_fill_pod_stuck_on_a_lost_node_is_released_and_its_shard_rerun(
        releases: Any, api: Api, kube: LocalKube, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ns, node = "tts-lost", "/api/v1/nodes/h200-b"
    await api.namespace(ns)
    await bound_claim(api, ns)
    job = fill_job("lost", ["h200"], shards=1, parallelism=1)
    job["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "h200-b"}
    path = f"/apis/ttsfleet.io/v1alpha1/namespaces/{ns}/filljobs"
    # The operator gives a pod on a lost node up 30 s past its deletion deadline; 3 s here (the
    # operator runs in this process). That grace is checked in test_observe.py without waiting.
    monkeypatch.setattr(fillview, "STUCK_AFTER_S", 3.0)

    async def ready(status: str) -> None:
        await api.call("PATCH", f"{node}/status", {"status": {"conditions": [
            {"type": "Ready", "status": status, "reason": "Test", "message": "test",
             "lastHeartbeatTime": "2026-12-01T00:00:00Z", "lastTransitionTime": "2026-12-01T00:00:00Z"}]}})
    try:
        async with running_operator(kube, "ttsfleet", tmp_path, monkeypatch, fill_interval_s=1.0):
            await api.create(path, job)
            (pod,) = await wait_for(lambda: exactly(pods(api, ns, "ttsfleet.io/filljob=lost"), 1), 60,
                                    "the fill pod Running on h200-b")
            # The node is lost: its kubelet stops, it goes NotReady, and the pod is deleted (a drain)
            # but nobody is left to finish the deletion.
            await api.patch(node, {"metadata": {"labels": {"fake-kubelet.ttsfleet.io/stopped": "true"}}})
            await ready("False")
            await api.delete(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}", gracePeriodSeconds=1)
            await wait_for(lambda: gone(api, f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}"), 90,
                           "the stuck pod force-deleted by the operator")
            async def requeued() -> bool:
                status = (await api.get(f"{path}/lost"))["status"]
                return status["preemptionsSurvived"] >= 1 and status["shardsDone"] == 0
            await wait_for(requeued, 30, "the shard counted as preempted (requeued, not done)")
            # The node comes back: the shard runs again (a new pod, from its checkpoint).
            await api.patch(node, {"metadata": {"labels": {"fake-kubelet.ttsfleet.io/stopped": None}}})
            await ready("True")
            (again,) = await wait_for(lambda: exactly(pods(api, ns, "ttsfleet.io/filljob=lost"), 1), 60,
                                      "shard 0 running again")
            assert again["metadata"]["name"] != pod["metadata"]["name"]
            assert await api.delete(f"{path}/lost") == 200
            await wait_for(lambda: empty(pods(api, ns, "ttsfleet.io/workload", phase=None)), 60, "pods gone")
    finally:
        await api.patch(node, {"metadata": {"labels": {"fake-kubelet.ttsfleet.io/stopped": None}}})
        await ready("True")
