"""The chart on a real API server: CRDs accepted, defaults equal the models, bad specs rejected.

Defects 3 and 4 of issue 17 live here: a FillJob without ``resources`` must be stored with the
model's 16Gi (not the nested class's 32Gi), and names/tolerations that would make children the
API server rejects must be rejected by the CRD itself, at ``kubectl apply`` time.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from ttsfleet.operator.models import FillJobSpec, TTSDeploymentSpec

from tests.operator.helpers import FILL_SPEC, TTSD_SPEC
from ttsfleet.catalog import GpuCatalog

from .conftest import Api

CAT = GpuCatalog.default()

NS = "tts-install"
TTSD_PATH = f"/apis/ttsfleet.io/v1alpha1/namespaces/{NS}/ttsdeployments"
FJ_PATH = f"/apis/ttsfleet.io/v1alpha1/namespaces/{NS}/filljobs"


def _obj(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "ttsfleet.io/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": spec}


async def test_crds_are_established_and_priority_classes_exist(releases: Any, api: Api) -> None:
    for name in ("ttsdeployments.ttsfleet.io", "filljobs.ttsfleet.io"):
        crd = await api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        assert crd is not None, name
        conds = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conds.get("Established") == "True" and conds.get("NamesAccepted") == "True", conds
    for pc in ("ttsfleet-inference", "ttsfleet-training", "ttsfleet-fill"):
        assert await api.get(f"/apis/scheduling.k8s.io/v1/priorityclasses/{pc}") is not None, pc


@pytest.mark.parametrize(("kind", "model", "spec"), [
    ("TTSDeployment", TTSDeploymentSpec, TTSD_SPEC),
    ("FillJob", FillJobSpec, FILL_SPEC),
])
async def test_server_side_defaults_equal_the_models(releases: Any, api: Api, kind: str, model: Any,
                                                     spec: dict[str, Any]) -> None:
    await api.namespace(NS)
    path = TTSD_PATH if kind == "TTSDeployment" else FJ_PATH
    name = f"defaults-{kind.lower()}"
    created = await api.create(path, _obj(kind, name, copy.deepcopy(spec)))
    try:
        stored = created["spec"]
        ctx = {"catalog": CAT}
        want = model.model_validate(spec, context=ctx).model_dump(mode="json", by_alias=True,
                                                                exclude_none=True)
        # Every default the server filled in is the model's; what it left out (empty lists and
        # maps, which the schema does not default) the model fills with the same empties.
        assert {k: v for k, v in want.items() if k in stored} == stored
        assert all(not want[k] for k in set(want) - set(stored)), set(want) - set(stored)
        assert model.model_validate(stored, context=ctx) == model.model_validate(spec, context=ctx)
        if kind == "FillJob":
            assert stored["resources"] == {"cpu": "4", "memory": "16Gi", "gpus": 1}
    finally:
        await api.delete(f"{path}/{name}")


BAD_TTSD = [
    ("narrator.en", {}, "DNS-1035"),
    ("1narrator", {}, "DNS-1035"),
    ("n" * 58, {}, "at most 63"),
    ("tol", {"tolerations": [{"effect": "NoSchedule"}]}, "operator: Exists"),
    ("tolval", {"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]}, "takes no value"),
    ("tolsec", {"tolerations": [{"key": "a", "operator": "Exists", "tolerationSeconds": 5}]}, "NoExecute"),
    ("sel", {"nodeSelector": {"bad key!": "x"}}, "label keys"),
    ("minmax", {"pools": [{"gpuClass": "h200", "minReplicas": 5, "maxReplicas": 2}]}, "minReplicas"),
    ("cls", {"pools": [{"gpuClass": "a100"}]}, "Unsupported value"),
    ("kcboth", {"serving": {"kernelCache": {"claimName": "k", "hostPath": "/var/k"}}}, "exactly one"),
    ("kcnone", {"serving": {"kernelCache": {}}}, "exactly one"),
]


@pytest.mark.parametrize(("name", "override", "message"), BAD_TTSD, ids=[b[0][:12] for b in BAD_TTSD])
async def test_invalid_ttsdeployments_are_rejected_by_the_server(
        releases: Any, api: Api, name: str, override: dict[str, Any], message: str) -> None:
    await api.namespace(NS)
    spec = {**copy.deepcopy(TTSD_SPEC), **override}
    r = await api.call("POST", TTSD_PATH, _obj("TTSDeployment", name, spec))
    assert r.status_code == 422, f"accepted: {r.text[:300]}"
    assert message in r.json()["message"], r.json()["message"]


async def test_long_filljob_names_bad_tolerations_and_unknown_stages_are_rejected(
        releases: Any, api: Api) -> None:
    await api.namespace(NS)
    r = await api.call("POST", FJ_PATH, _obj("FillJob", "f" * 64, copy.deepcopy(FILL_SPEC)))
    assert r.status_code == 422 and "at most 63" in r.json()["message"], r.text[:300]
    spec = {**copy.deepcopy(FILL_SPEC), "tolerations": [{"effect": "NoSchedule"}]}
    r = await api.call("POST", FJ_PATH, _obj("FillJob", "tol", spec))
    assert r.status_code == 422 and "operator: Exists" in r.json()["message"], r.text[:300]
    spec = {**copy.deepcopy(FILL_SPEC), "stages": ["decode", "bogus"]}
    r = await api.call("POST", FJ_PATH, _obj("FillJob", "stages", spec))
    assert r.status_code == 422 and "bogus" in r.json()["message"], r.text[:300]  # the stage registry
    ok = await api.create(FJ_PATH, _obj("FillJob", "f" * 63, copy.deepcopy(FILL_SPEC)))
    await api.delete(f"{FJ_PATH}/{ok['metadata']['name']}")
