"""A GPU class added by one catalog file, on a real control plane: its server pod can start.

The documented path for a new class, end to end: one catalog file (``tests/catalogs.py``: a
B200), the operator run with it (``operator run --catalog FILE`` loads it with
``GpuCatalog.load``), CRDs that name the class (``ttsfleet operator crds --catalog FILE``, applied
over the chart's). The operator's pod for the b200 pool is scheduled on the b200 node and Running;
its environment and the catalog ConfigMap it mounts, read back from the API server, are laid out
as the container would see them and handed to the server's own reader and the ``serve`` parser.
Before the catalog hand-off that reader exited 2 on this pod: ``unknown GPU class 'b200'``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ttsfleet.devtools.localkube import LocalKube
from ttsfleet.operator.crds import crd_documents

from tests.catalogs import B200_YAML
from tests.doors.cli import parse
from tests.doors.pods import materialize
from ttsfleet.catalog import GpuCatalog

from .conftest import Api, bound_claim, gone, running_operator, wait_for

# A hang costs this test, not the run (see test_e2e_fill.py): ~5x its duration (13 s),
# at least 120 s (the session's first test also starts the control plane).
pytestmark = pytest.mark.timeout(120, method="signal")

NS = "tts-b200"
TTSD = f"/apis/ttsfleet.io/v1alpha1/namespaces/{NS}/ttsdeployments"
CRD = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/ttsdeployments.ttsfleet.io"
CATALOG_MAP = f"/api/v1/namespaces/{NS}/configmaps/voice-catalog"


async def replace_crd(api: Api, spec: dict[str, Any]) -> None:
    """PUT the TTSDeployment CRD with ``spec`` (what `kubectl replace -f` of the regenerated file does)."""
    live = await api.get(CRD)
    assert live is not None
    body = {"apiVersion": live["apiVersion"], "kind": live["kind"],
            "metadata": {k: live["metadata"][k] for k in ("name", "resourceVersion", "labels", "annotations")
                         if k in live["metadata"]},
            "spec": spec}
    r = await api.call("PUT", CRD, body)
    assert r.status_code == 200, r.text[:500]


async def b200_pod(api: Api) -> dict[str, Any] | None:
    pods = await api.items(f"/api/v1/namespaces/{NS}/pods", labelSelector="ttsfleet.io/pool=b200")
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"
               and not p["metadata"].get("deletionTimestamp")]
    return running[0] if running else None


async def test_a_b200_catalog_file_makes_a_server_pod_that_starts(
        releases: Any, api: Api, kube: LocalKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ttsfleet.inference.serve_config import ServeConfig

    (tmp_path / "b200.yaml").write_text(B200_YAML)
    catalog = GpuCatalog.load(tmp_path / "b200.yaml")
    shipped = await api.get(CRD)
    assert shipped is not None
    await replace_crd(api, crd_documents(catalog)["ttsdeployments.ttsfleet.io.yaml"]["spec"])
    try:
        await api.namespace(NS)
        await bound_claim(api, NS, "models")
        async with running_operator(kube, "ttsfleet", tmp_path, monkeypatch, catalog=catalog):
            await api.create(TTSD, {
                "apiVersion": "ttsfleet.io/v1alpha1", "kind": "TTSDeployment", "metadata": {"name": "voice"},
                "spec": {"model": {"checkpoint": "pvc://models/narrator/v3"},
                         "image": "ghcr.io/ttsfleet/inference:test",
                         "resources": {"cpu": "0.5", "memory": "1Gi", "gpus": 1},
                         "pools": [{"gpuClass": "b200", "minReplicas": 1, "maxReplicas": 2}]}})
            pod = await wait_for(lambda: b200_pod(api), 90, "the b200 pod Running")
            assert pod["spec"]["nodeName"] == "b200-a"
            catalog_map = await api.get(CATALOG_MAP)
            assert catalog_map is not None
            assert catalog_map["metadata"]["ownerReferences"][0]["name"] == "voice"  # owned: collected

            env = materialize(pod["spec"], [catalog_map], tmp_path / "pod")
            Path(env["TTSFLEET_CHECKPOINT"]).mkdir(parents=True)  # the model PVC holds it
            cfg = ServeConfig.from_env(env)
            assert (cfg.gpu_class, cfg.quantization) == ("b200", "mxfp8")
            assert cfg.gpu_catalog == catalog
            (c,) = pod["spec"]["containers"]
            parse(["serve"], [*c["command"][2:], *c.get("args", [])], env, monkeypatch)

            # The catalog edited by hand comes back (reconcile by diff, like every child).
            await api.patch(CATALOG_MAP, {"data": {"catalog.yaml": "classes: {}\n"}})

            async def restored() -> bool:
                live = await api.get(CATALOG_MAP) or {}
                return live.get("data", {}).get("catalog.yaml") == catalog.to_yaml()
            await wait_for(restored, 30, "the catalog ConfigMap restored")

            assert await api.delete(f"{TTSD}/voice") == 200
            await wait_for(lambda: gone(api, f"{TTSD}/voice"), 60, "the TTSDeployment gone")
            await wait_for(lambda: gone(api, CATALOG_MAP), 60, "the catalog ConfigMap collected with it")
    finally:
        await replace_crd(api, shipped["spec"])
