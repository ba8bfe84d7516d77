"""Namespaced mode (``operator.watchNamespaces: [tts-a]``) with the chart's Roles: fill pods and the
GPU inventory work, nothing is forbidden, and every write stays inside the watched namespace.

Defect 1 of issue 17: the fill controller and the inventory need the whole cluster's GPU picture
(every pod on every labelled node, whatever its namespace), and the chart's namespaced RBAC did
not allow listing pods cluster-wide: 403 on every pass, no fill pods, empty GPU dashboards.
"""

from __future__ import annotations

from typing import Any

import pytest
from ttsfleet.devtools.localkube import LocalKube

from . import audit
from .conftest import Api, bound_claim, empty, exactly, running_operator, wait_for
from .test_e2e_fill import fill_job, pods

NS = "tts-a"
OPERATOR = audit.sa_user("tts-ops", "tts-ns-ttsfleet")
FJ = f"/apis/ttsfleet.io/v1alpha1/namespaces/{NS}/filljobs"
TTSD = f"/apis/ttsfleet.io/v1alpha1/namespaces/{NS}/ttsdeployments"


async def test_namespaced_operator_fills_inventories_and_reconciles(
        releases: Any, api: Api, kube: LocalKube, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    await api.namespace(NS)
    await bound_claim(api, NS)
    since = audit.mark(kube)
    async with running_operator(kube, "tts-ns", tmp_path, monkeypatch) as rt:
        await api.create(FJ, fill_job("clean-a", ["rtx5090"], shards=4, parallelism=4))
        filled = await wait_for(lambda: exactly(pods(api, NS, "ttsfleet.io/filljob=clean-a"), 2), 60,
                                "2 fill pods Running on the rtx5090 node")
        assert {p["spec"]["nodeName"] for p in filled} == {"rtx5090-a"}

        def inventory(cls: str) -> float | None:
            return rt.metrics.registry.get_sample_value("ttsfleet_gpus_total", {"gpu_class": cls})
        await wait_for(lambda: inventory("rtx5090") == 2 and inventory("h200") == 8, 30,
                       "the GPU inventory of every class")

        await api.create(TTSD, {
            "apiVersion": "ttsfleet.io/v1alpha1", "kind": "TTSDeployment", "metadata": {"name": "narrow"},
            "spec": {"model": {"checkpoint": "s3://m/v1"}, "image": "ghcr.io/ttsfleet/inference:test",
                     "pools": [{"gpuClass": "h200", "minReplicas": 1, "maxReplicas": 1}],
                     "resources": {"cpu": "0.5", "memory": "1Gi"}}})
        await wait_for(lambda: exactly(pods(api, NS, "app.kubernetes.io/instance=narrow"), 1), 60,
                       "the inference pod Running")
        assert await api.delete(f"{TTSD}/narrow") == 200
        assert await api.delete(f"{FJ}/clean-a") == 200
        await wait_for(lambda: empty(pods(api, NS, "ttsfleet.io/workload", phase=None)), 60, "pods gone")
        await wait_for(lambda: empty(api.items(TTSD)), 30, "the TTSDeployment gone")
    sent = audit.requests(kube, OPERATOR, since)
    assert sent, "the namespaced operator made no request"
    assert audit.forbidden(sent) == []
    outside = [w for w in audit.writes(sent) if f" {NS}/" not in w]
    assert outside == [], "writes outside the watched namespace"
