"""spec.replicas (the scale subresource's field) on kmock, the fast layer of kube/test_scale.py.

The total is split by the policy (weights 3:1 within each pool's bounds), the pools' Deployments
follow a change of the total, and the status carries what the subresource reports.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.operator.conftest import running_operator
from tests.operator.helpers import DEPLOY, TTSD, live, ttsd, wait_for

pytestmark = pytest.mark.looptime


def split(cluster: Any) -> dict[str, int]:
    return {pool: (live(cluster, DEPLOY, "ns1", f"voice-{pool}") or {}).get("spec", {}).get("replicas", -1)
            for pool in ("h200", "rtx5090")}


async def scale(cluster: Any, replicas: int) -> None:
    await cluster.patch("/apis/ttsfleet.io/v1alpha1/namespaces/ns1/ttsdeployments/voice",
                        json={"spec": {"replicas": replicas}},
                        headers={"Content-Type": "application/merge-patch+json"})


async def test_spec_replicas_is_split_across_the_pools(cluster, make_runtime) -> None:
    rt = make_runtime(autoscale_interval_s=5.0)
    async with running_operator(rt):
        # TTSD_SPEC's pools: h200 1..6 weight 3, rtx5090 0..4 weight 1.
        await cluster.post("/apis/ttsfleet.io/v1alpha1/namespaces/ns1/ttsdeployments", json=ttsd(replicas=5))
        await wait_for(lambda: split(cluster) == {"h200": 4, "rtx5090": 1})
        selector = await wait_for(lambda: (live(cluster, TTSD, "ns1", "voice") or {}).get("status", {})
                                  .get("selector"))
        assert selector == "app.kubernetes.io/instance=voice,ttsfleet.io/workload=inference"
        await scale(cluster, 9)
        await wait_for(lambda: split(cluster) == {"h200": 6, "rtx5090": 3})
        await scale(cluster, 50)
        await wait_for(lambda: split(cluster) == {"h200": 6, "rtx5090": 4})  # both at their max
        body = live(cluster, TTSD, "ns1", "voice")
        assert not body["status"].get("lastDecisions")  # the traffic autoscaler stayed off
