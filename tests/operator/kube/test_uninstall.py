"""The chart README's uninstall steps, in their order, complete on a real cluster.

kopf keeps a finalizer on every TTSDeployment and FillJob it runs timers for, so the custom
resources must go while the operator still runs; then ``helm uninstall``; then the CRDs. Each
step must finish (nothing left Terminating). Runs last (file order): it removes both releases.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from ttsfleet.devtools.localkube import LocalKube

from .conftest import (
    CHART,
    RELEASES,
    Api,
    bound_claim,
    empty,
    exactly,
    gone,
    running_operator,
    uninstall,
    wait_for,
)
from .test_e2e_fill import fill_job, pods

NS = "tts-un"
#: What ``kubectl delete -f charts/ttsfleet/crds/`` deletes: every CRD file the chart ships.
CRDS = tuple(sorted(yaml.safe_load(p.read_text())["metadata"]["name"]
                    for p in (CHART / "crds").glob("*.yaml")))
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
GROUP = "/apis/ttsfleet.io/v1alpha1"


async def test_readme_uninstall_order_completes(releases: Any, api: Api, kube: LocalKube, tmp_path: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    await api.namespace(NS)
    await bound_claim(api, NS)
    async with running_operator(kube, "ttsfleet", tmp_path, monkeypatch):
        await api.create(f"/apis/ttsfleet.io/v1alpha1/namespaces/{NS}/filljobs",
                         fill_job("bye", ["rtx5090"], shards=2, parallelism=2))
        await api.create(f"/apis/ttsfleet.io/v1alpha1/namespaces/{NS}/ttsdeployments", {
            "apiVersion": "ttsfleet.io/v1alpha1", "kind": "TTSDeployment", "metadata": {"name": "bye"},
            "spec": {"model": {"checkpoint": "s3://m/v1"}, "image": "ghcr.io/ttsfleet/inference:test",
                     "pools": [{"gpuClass": "h200", "minReplicas": 1, "maxReplicas": 1}]}})
        await wait_for(lambda: exactly(pods(api, NS, "ttsfleet.io/workload"), 3), 60,
                       "fill and inference pods")

        # 1. kubectl delete ttsdeployments,filljobs --all -A --wait (the operator still runs)
        for plural in ("ttsdeployments", "filljobs"):
            for obj in await api.items(f"{GROUP}/{plural}"):
                m = obj["metadata"]
                await api.delete(f"{GROUP}/namespaces/{m['namespace']}/{plural}/{m['name']}")
        for plural in ("ttsdeployments", "filljobs"):
            await wait_for(lambda plural=plural: empty(api.items(f"{GROUP}/{plural}")), 60,
                           f"every {plural} gone (the operator released its finalizer)")
    await wait_for(lambda: empty(pods(api, NS, "ttsfleet.io/workload", phase=None)), 60, "their pods gone")

    # 2. helm uninstall (both releases): the operator's objects go, nothing hangs.
    for release in RELEASES:
        uninstall(kube, release)
        name = "ttsfleet-operator" if release == "ttsfleet" else f"{release}-ttsfleet-operator"
        assert await api.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}") is None
    assert await api.get("/apis/scheduling.k8s.io/v1/priorityclasses/ttsfleet-fill") is None

    # 3. kubectl delete -f charts/ttsfleet/crds/
    assert CRDS == ("filljobs.ttsfleet.io", "ttsdeployments.ttsfleet.io")
    for crd in CRDS:
        assert await api.delete(f"{CRD_PATH}/{crd}") == 200
    for crd in CRDS:
        await wait_for(lambda crd=crd: gone(api, f"{CRD_PATH}/{crd}"), 60, f"CRD {crd} gone")
