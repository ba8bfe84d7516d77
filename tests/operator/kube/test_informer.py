"""The watch cache against a real API server: paged LIST, projections, WATCH events.

kmock ignores ``limit``/``continue`` and label and field selectors, so these run on the local
control plane (operator/informer.py). 410 Gone is tested on kmock (tests/operator/test_informer.py):
a real API server's watch cache keeps at least 75 s of history, too long for a test to outlive.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from ttsfleet.devtools.localkube import LocalKube
from ttsfleet.operator import fillview as fv
from ttsfleet.operator.informer import Informer, project_node, project_pod
from ttsfleet.operator.kube import Kube

from .conftest import Api, wait_for

NS = "tts-informer"
SELECT = "informer-test=yes"


@pytest.fixture
async def admin(kube: LocalKube) -> AsyncIterator[Kube]:
    client = httpx.AsyncClient(base_url=kube.url, timeout=30,
                               verify=ssl.create_default_context(cafile=str(kube.ca_file)),
                               headers={"Authorization": f"Bearer {kube.admin_token}"})
    yield Kube(client)
    await client.aclose()


def pending_pod(name: str) -> dict[str, Any]:
    """A pod no node can take (it stays Pending: nothing but its labels changes)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"informer-test": "yes"},
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "x" * 2000,
                                         "ttsfleet.io/note": "1"}},
            "spec": {"nodeSelector": {"no-such-node": "x"},
                     "containers": [{"name": "c", "image": "busybox", "env": [{"name": "A", "value": "b"}],
                                     "resources": {"requests": {"cpu": "10m"}}}]}}


async def test_nodes_are_listed_in_pages_and_projected(admin: Kube, kube: LocalKube) -> None:
    pages = [p async for p in admin.list_pages("/api/v1/nodes", labels=fv.NODE_SELECTOR, limit=1)]
    assert len(pages) >= 3 and all(len(p["items"]) <= 1 for p in pages), "the server did not page"
    inf = Informer(admin, "/api/v1/nodes", labels=fv.NODE_SELECTOR, project=project_node, page_size=1)
    await inf.relist()
    assert sorted(k.strip("/") for k in inf.items) == ["b200-a", "h200-a", "h200-b", "rtx5090-a"]
    node = inf.items["/h200-a"]
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert "managedFields" not in node["metadata"] and "nodeInfo" not in node["status"]
    assert inf.lists == 1 and inf.resource_version


async def test_watch_follows_the_server(releases: Any, admin: Kube, api: Api) -> None:
    await api.namespace(NS)
    pods = f"/api/v1/namespaces/{NS}/pods"
    inf = Informer(admin, "/api/v1/pods", labels=SELECT, project=project_pod, watch_timeout_s=1, retry_s=0.2)
    task = asyncio.create_task(inf.run())
    try:
        await inf.ready(30)
        assert inf.items == {}
        await api.create(pods, pending_pod("w1"))
        got = await wait_for(lambda: inf.items.get(f"{NS}/w1"), 30, "the ADDED pod in the cache")
        assert got["metadata"]["annotations"] == {"ttsfleet.io/note": "1"}  # projected
        assert "env" not in got["spec"]["containers"][0]
        await api.patch(f"{pods}/w1", {"metadata": {"labels": {"step": "2"}}})
        await wait_for(lambda: inf.items[f"{NS}/w1"]["metadata"]["labels"].get("step") == "2", 30,
                       "the MODIFIED pod")
        # The server ends each watch after timeoutSeconds: watched again from where it was.
        await wait_for(lambda: inf.watches >= 3, 30, "watches renewed after the server's timeout")
        assert inf.lists == 1, "a renewed watch must not list again"
        assert await api.delete(f"{pods}/w1", gracePeriodSeconds=0) == 200
        await wait_for(lambda: f"{NS}/w1" not in inf.items, 30, "the DELETED pod gone from the cache")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
