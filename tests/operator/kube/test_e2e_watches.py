"""The controllers observe pods and nodes through watches: after start-up, no pod or node LIST.

Issue 17: every controller re-LISTed every pod and node every 10-15 s (one 5,000-pod LIST is
~31 MiB of JSON). Now each collection is listed once and then watched (operator/informer.py).
Over a window in which the fill controller has real work to do (a shard finishes, the next one
is admitted, the status records it), the API server's audit log shows the operator's
ServiceAccount sending no LIST of pods or nodes, and its WATCHes of both.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from ttsfleet.devtools.localkube import LocalKube

from . import audit
from .conftest import Api, bound_claim, empty, exactly, running_operator, wait_for
from .test_e2e_fill import fill_job, pods

# A hang costs this test, not the run (see test_e2e_fill.py): ~5x its duration (21 s),
# at least 120 s (the session's first test also starts the control plane).
pytestmark = pytest.mark.timeout(120, method="signal")

NS = "tts-watch"
OPERATOR = audit.sa_user("ttsfleet", "ttsfleet")
FJ = f"/apis/ttsfleet.io/v1alpha1/namespaces/{NS}/filljobs"
EXIT = "fake-kubelet.ttsfleet.io/exit-code"


def pod_node_calls(events: list[dict[str, Any]], verb: str) -> list[str]:
    return [f"{e['verb']} {e.get('requestURI')}" for e in events
            if e["verb"] == verb and (e.get("objectRef") or {}).get("resource") in ("pods", "nodes")
            and (e.get("objectRef") or {}).get("apiGroup", "") == ""]


async def test_steady_state_sends_no_pod_or_node_list(
        releases: Any, api: Api, kube: LocalKube, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    await api.namespace(NS)
    await bound_claim(api, NS)
    start = audit.mark(kube)
    async with running_operator(kube, "ttsfleet", tmp_path, monkeypatch, fill_interval_s=1.0) as rt:
        await api.create(FJ, fill_job("w", ["rtx5090"], shards=3, parallelism=2))
        first = await wait_for(lambda: exactly(pods(api, NS, "ttsfleet.io/filljob=w"), 2), 60,
                               "2 fill pods Running on the 2 rtx5090 GPUs")
        await asyncio.sleep(3 * rt.fill_interval_s)  # start-up is over
        since = audit.mark(kube)
        done = first[0]["metadata"]["name"]
        await api.patch(f"/api/v1/namespaces/{NS}/pods/{done}",
                        {"metadata": {"annotations": {EXIT: "0"}}})

        async def next_shard_admitted() -> bool:
            body = await api.get(f"{FJ}/w") or {}
            running = await pods(api, NS, "ttsfleet.io/filljob=w")
            return (body.get("status") or {}).get("shardsDone") == 1 and len(running) == 2 \
                and done not in {p["metadata"]["name"] for p in running}
        await wait_for(next_shard_admitted, 60, "the finished shard counted and the third admitted")
        await asyncio.sleep(3 * rt.fill_interval_s)
        window = audit.requests(kube, OPERATOR, since)
        assert [w for w in audit.writes(window) if w.startswith("create /pods")], \
            "the fill controller did not act in the window"
        assert pod_node_calls(window, "list") == [], "a pod or node LIST after start-up"
        lived = audit.requests(kube, OPERATOR, start)
        watched = {(e.get("objectRef") or {}).get("resource") for e in lived if e["verb"] == "watch"}
        assert {"pods", "nodes"} <= watched, f"no pod/node WATCH recorded: {watched}"
        assert rt.view.requests()["pods_lists"] == 1 and rt.view.requests()["nodes_lists"] == 1
        assert await api.delete(f"{FJ}/w") == 200
        await wait_for(lambda: empty(pods(api, NS, "ttsfleet.io/workload", phase=None)), 60, "pods gone")
