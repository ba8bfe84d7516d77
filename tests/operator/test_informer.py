"""The watch cache on kmock: list, watch events, and a relist after the server's 410 Expired.

(Paging and server-side selectors need a real API server: tests/operator/kube/test_informer.py.)
"""

from __future__ import annotations

from typing import Any

from ttsfleet.operator import fillview as fv
from ttsfleet.operator.informer import ClusterCache, Informer, project_node
from ttsfleet.operator.kube import Kube

from tests.operator.helpers import node, wait_for


async def test_informer_watches_and_relists_after_410(cluster: Any) -> None:
    await cluster.post("/api/v1/nodes", json=node("gpu-a", "h200", gpus=4))
    await cluster.post("/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node",  # no class label:
                                              "metadata": {"name": "cpu-a"}})  # kept out client-side
    kube = Kube.from_environment()
    cache = ClusterCache(kube)
    inf: Informer = cache.informers["nodes"]
    try:
        assert [n["metadata"]["name"] for n in await cache.gpu_nodes()] == ["gpu-a"]
        await cluster.post("/api/v1/nodes", json=node("gpu-b", "h200", gpus=8))
        await wait_for(lambda: "/gpu-b" in inf.items, 10)
        assert inf.items["/gpu-b"] == project_node(node("gpu-b", "h200", gpus=8)) | {
            "metadata": inf.items["/gpu-b"]["metadata"]}
        assert inf.lists == 1
        assert await cluster.expire_watches("nodes") >= 1
        await wait_for(lambda: inf.lists == 2, 10)  # listed again, then watching again
        await cluster.delete("/api/v1/nodes/gpu-a")
        await wait_for(lambda: "/gpu-a" not in inf.items, 10)
        assert sorted(inf.items) == ["/gpu-b"]
        assert "410" in inf.last_error
    finally:
        await cache.aclose()
        await kube.aclose()


async def test_a_created_pod_is_seen_before_its_watch_event(cluster: Any) -> None:
    kube = Kube.from_environment()
    cache = ClusterCache(kube)
    try:
        assert await cache.fill_pods("ns1", "clean") == []
        pod = {"metadata": {"name": "clean-0", "namespace": "ns1",
                            "labels": {fv.L_FILLJOB: "clean", fv.L_SHARD: "0"}}, "spec": {}, "status": {}}
        cache.created(pod)  # what fill.create_shard_pod does with the server's answer
        assert [p["metadata"]["name"] for p in await cache.fill_pods("ns1", "clean")] == ["clean-0"]
        assert [p["metadata"]["name"] for p in await cache.gpu_pods()] == ["clean-0"]
    finally:
        await cache.aclose()
        await kube.aclose()


async def test_aclose_lets_its_callers_cancellation_through() -> None:
    """Closing waits for the informers, but a cancellation of the closer itself propagates: with a
    suppress around each await, a runner cancelling the closer would wait on it forever (the CI
    hang of 2026-12-04 had such a wait in its stack)."""
    import asyncio

    release = asyncio.Event()

    async def slow_informer() -> None:  # ends only once released, whatever cancels it
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue

    cache = ClusterCache(None)  # type: ignore[arg-type]  # no API server: nothing is started
    cache.tasks = [asyncio.create_task(slow_informer())]
    closer = asyncio.create_task(cache.aclose())
    await asyncio.sleep(0)
    closer.cancel()
    done, _ = await asyncio.wait({closer}, timeout=2)
    release.set()
    await asyncio.gather(*cache.tasks, return_exceptions=True)
    assert closer in done and closer.cancelled(), "aclose swallowed its caller's cancellation"
