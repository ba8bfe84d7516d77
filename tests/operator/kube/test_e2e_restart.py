"""An operator restart inside the scale-down stabilization window keeps the replicas.

Issue 17: the autoscaler's memory lived in the process, so after a restart one quiet sample
dropped 4 replicas to 2 although the 300 s window had not passed. The state now lives in
``status.autoscaler`` (operator/autoscalestate.py): a restart inside the window keeps the
replicas, and with a short window the pool scales down when the persisted history says, not a
fresh window after the restart.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from ttsfleet.devtools.localkube import LocalKube
from ttsfleet.operator.fillview import parse_time

from . import audit
from .conftest import Api, bound_claim, empty, exactly, gone, running_operator, wait_for
from .test_e2e_fill import PodMetrics, fill_job, pods

# A hang costs this test, not the run (see test_e2e_fill.py): ~5x its duration (44 s the longest),
# at least 120 s (the session's first test also starts the control plane).
pytestmark = pytest.mark.timeout(210, method="signal")

NS = "tts-restart"
#: Autoscaler passes every 1 s (running_operator's default too, pinned here): the waits below are
#: counted in passes, and the scale-down lands closer to the window's end the assertions bound.
FAST = {"autoscale_interval_s": 1.0}
TTSD = f"/apis/ttsfleet.io/v1alpha1/namespaces/{NS}/ttsdeployments"
DEPLOY = f"/apis/apps/v1/namespaces/{NS}/deployments/steady-h200"


async def replicas(api: Api, path: str = DEPLOY) -> int:
    """The Deployment's spec.replicas (0 while it does not exist)."""
    dep = await api.get(path) or {}
    return int((dep.get("spec") or {}).get("replicas") or 0)


async def test_restart_inside_the_stabilization_window_keeps_replicas(
        releases: Any, api: Api, kube: LocalKube, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    await api.namespace(NS)
    metrics = PodMetrics(api, "app.kubernetes.io/instance=steady", namespace=NS)
    async with metrics.feeding():
        async with running_operator(kube, "ttsfleet", tmp_path, monkeypatch, **FAST):
            await api.create(TTSD, {
                "apiVersion": "ttsfleet.io/v1alpha1", "kind": "TTSDeployment", "metadata": {"name": "steady"},
                "spec": {"model": {"checkpoint": "s3://m/v1"}, "image": "ghcr.io/ttsfleet/inference:test",
                         "pools": [{"gpuClass": "h200", "minReplicas": 1, "maxReplicas": 4}],
                         "resources": {"cpu": "0.5", "memory": "1Gi"},
                         "autoscale": {"targetInFlightPerReplica": 10, "stableWindowS": 2, "panicWindowS": 1,
                                       "scaleDownStabilizationS": 300}}})
            metrics.in_flight = 40.0
            await wait_for(lambda: _at(replicas(api), 4), 60, "4 replicas under load")
            await wait_for(lambda: exactly(pods(api, NS, "app.kubernetes.io/instance=steady"), 4), 60,
                           "4 Running")
        metrics.in_flight = 0.0  # the load goes while the operator is down
        async with running_operator(kube, "ttsfleet", tmp_path, monkeypatch, **FAST) as rt:
            await asyncio.sleep(4 * rt.autoscale_interval_s + 1)
            assert await replicas(api) == 4, "a restart inside the 300 s window dropped replicas"
            body = await api.get(f"{TTSD}/steady")
            last = body["status"]["lastDecisions"][-1]
            assert last["direction"] == "up"  # no scale-down was recorded after the restart
            held = body["status"]["autoscaler"]["recommendations"]
            assert [r["replicas"] for r in held] == [4], held  # the window continues from status
            assert await api.delete(f"{TTSD}/steady") == 200
            await wait_for(lambda: gone(api, f"{TTSD}/steady"), 60, "the TTSDeployment gone")


WINDOW_S = 8.0  # the restart lands 4 s in: the persisted window ends 4 s after it, a fresh one 8 s after


async def test_a_restart_continues_the_persisted_window(
        releases: Any, api: Api, kube: LocalKube, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Load goes, the operator writes the held recommendation and stops; restarted a few seconds
    later, it holds the replicas until the persisted time + the window, then scales down: before
    a fresh window from the restart would have let it."""
    await api.namespace(NS)
    metrics = PodMetrics(api, "app.kubernetes.io/instance=short", namespace=NS)
    deploy = f"/apis/apps/v1/namespaces/{NS}/deployments/short-h200"
    async with metrics.feeding():
        async with running_operator(kube, "ttsfleet", tmp_path, monkeypatch, **FAST):
            await api.create(TTSD, {
                "apiVersion": "ttsfleet.io/v1alpha1", "kind": "TTSDeployment", "metadata": {"name": "short"},
                "spec": {"model": {"checkpoint": "s3://m/v1"}, "image": "ghcr.io/ttsfleet/inference:test",
                         "pools": [{"gpuClass": "h200", "minReplicas": 1, "maxReplicas": 4}],
                         "resources": {"cpu": "0.5", "memory": "1Gi"},
                         "autoscale": {"targetInFlightPerReplica": 10, "stableWindowS": 1, "panicWindowS": 1,
                                       "scaleDownStabilizationS": WINDOW_S}}})
            metrics.in_flight = 40.0
            await wait_for(lambda: _count(deploy, api, 4), 60, "4 replicas under load")
            await wait_for(lambda: exactly(pods(api, NS, "app.kubernetes.io/instance=short"), 4), 60,
                           "4 Running")
            metrics.in_flight = 0.0
            held = await wait_for(lambda: _held(api, "short", 4), 30, "the held recommendation in status")
        await asyncio.sleep(max(held + 4.0 - time.time(), 0))  # restarted 4+ s into the window
        async with running_operator(kube, "ttsfleet", tmp_path, monkeypatch, **FAST) as rt:
            restarted = time.time()
            assert await replicas(api, deploy) == 4
            await wait_for(lambda: _below(deploy, api, 4), 60, "the scale-down after the window")
            down = time.time()
            assert down >= held + WINDOW_S - 1, f"scaled down {held + WINDOW_S - down:.1f} s early"
            assert down < restarted + WINDOW_S, \
                f"held {down - restarted:.1f} s after the restart: a fresh window, not the persisted one"
            # Settled at the minimum: the persisted state no longer moves, so nothing is written.
            await wait_for(lambda: _count(deploy, api, 1), 60, "the pool at minReplicas")
            await asyncio.sleep(3 * rt.autoscale_interval_s)
            since = audit.mark(kube)
            await asyncio.sleep(3 * rt.autoscale_interval_s + 1)
            sent = audit.requests(kube, audit.sa_user("ttsfleet", "ttsfleet"), since)
            assert [e for e in sent if e["verb"] == "get"], "the operator did not run in the window"
            assert audit.writes(sent) == [], "a steady state with persisted autoscaler state wrote"
            assert await api.delete(f"{TTSD}/short") == 200
            await wait_for(lambda: gone(api, f"{TTSD}/short"), 60, "the TTSDeployment gone")


async def _count(path: str, api: Api, n: int) -> bool:
    return await replicas(api, path) == n


async def _below(path: str, api: Api, n: int) -> bool:
    return 0 < await replicas(api, path) < n


async def _held(api: Api, name: str, replicas: int) -> float | None:
    """Wall time of the persisted recommendation of ``replicas`` (the load has fallen below it)."""
    body = await api.get(f"{TTSD}/{name}") or {}
    for r in ((body.get("status") or {}).get("autoscaler") or {}).get("recommendations") or []:
        if r["replicas"] == replicas:
            return parse_time(r["time"])
    return None


async def _at(value: Any, n: int) -> bool:
    return await value == n


async def test_killed_mid_admission_converges_without_duplicates(
        releases: Any, api: Api, kube: LocalKube, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator task is cancelled right after its first fill pod create (mid-pass); a new one
    finishes the admission: every shard once, no second pod for a shard."""
    ns = "tts-kill"
    await api.namespace(ns)
    await bound_claim(api, ns)
    path = f"/apis/ttsfleet.io/v1alpha1/namespaces/{ns}/filljobs"
    since = audit.mark(kube)
    user = audit.sa_user("ttsfleet", "ttsfleet")

    def first_create() -> bool:
        return any(e["verb"] == "create" and (e.get("objectRef") or {}).get("resource") == "pods"
                   for e in audit.requests(kube, user, since))
    async with running_operator(kube, "ttsfleet", tmp_path, monkeypatch, fill_interval_s=1.0) as rt:
        await api.create(path, fill_job("kill", ["h200"], shards=8, parallelism=8))
        await wait_for(first_create, 60, "the first fill pod create")
        rt.kopf_task.cancel()  # killed mid-pass: no cleanup, no status write
    made = await pods(api, ns, "ttsfleet.io/filljob=kill", phase=None)
    assert made, "the first pass created nothing before it was killed"
    async with running_operator(kube, "ttsfleet", tmp_path, monkeypatch, fill_interval_s=1.0):
        running = await wait_for(lambda: exactly(pods(api, ns, "ttsfleet.io/filljob=kill"), 8), 60,
                                 "8 fill pods Running after the restart")
        await asyncio.sleep(3)
        every = await pods(api, ns, "ttsfleet.io/filljob=kill", phase=None)
        shards = sorted(int(p["metadata"]["labels"]["ttsfleet.io/shard"]) for p in every)
        assert shards == list(range(8)), f"duplicate or missing shards: {shards}"
        assert {p["metadata"]["name"] for p in made} <= {p["metadata"]["name"] for p in running}
        assert await api.delete(f"{path}/kill") == 200
        await wait_for(lambda: empty(pods(api, ns, "ttsfleet.io/workload", phase=None)), 60, "pods gone")
