"""CRDs: generated from the models, valid apiextensions/v1, structural, and enforcing the spec rules."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError
from ttsfleet.operator.crds import crd_documents, render
from ttsfleet.operator.models import FillJobSpec, TTSDeploymentSpec

from tests.operator.helpers import filljob, ttsd
from ttsfleet.catalog import GpuCatalog

CAT = GpuCatalog.default()

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "charts" / "ttsfleet" / "crds"
EXAMPLES = ROOT / "charts" / "ttsfleet" / "examples"
DOCS = crd_documents(CAT)


def schema(kind: str) -> dict[str, Any]:
    doc = DOCS["ttsdeployments.ttsfleet.io.yaml" if kind == "TTSDeployment" else "filljobs.ttsfleet.io.yaml"]
    return doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _draft4(node: Any) -> Any:
    """OpenAPI v3.0 → JSON Schema draft 4 (boolean exclusive bounds): ``nullable`` becomes a null type."""
    if isinstance(node, list):
        return [_draft4(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _draft4(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def validate(doc: dict[str, Any], kind: str) -> None:
    jsonschema.Draft4Validator(_draft4(schema(kind))).validate(doc)


def test_files_on_disk_equal_freshly_generated() -> None:
    for name, doc in DOCS.items():
        path = CRD_DIR / name
        assert path.exists(), f"missing {path}: run ttsfleet operator crds --out {CRD_DIR}"
        assert path.read_text() == render(doc), f"{path} is stale: run ttsfleet operator crds"


@pytest.mark.parametrize("name", sorted(DOCS))
def test_crd_is_valid_apiextensions_v1(name: str) -> None:
    kubernetes_validate.validate(DOCS[name], "1.31", strict=True)
    names = DOCS[name]["spec"]["names"]
    assert DOCS[name]["spec"]["group"] == "ttsfleet.io"
    assert DOCS[name]["spec"]["versions"][0]["name"] == "v1alpha1"
    if names["kind"] == "TTSDeployment":
        assert names["plural"] == "ttsdeployments" and names["shortNames"] == ["ttsd"]
    else:
        assert names["plural"] == "filljobs"


def _walk(node: Any, where: str = "") -> list[str]:
    """Structural-schema violations: missing types, refs, anyOf, properties + additionalProperties."""
    bad = []
    if isinstance(node, dict):
        if "$ref" in node or "anyOf" in node or "oneOf" in node or "allOf" in node:
            bad.append(f"{where}: composition or $ref")
        if "properties" in node and "additionalProperties" in node:
            bad.append(f"{where}: properties with additionalProperties")
        if "type" not in node and not node.get("x-kubernetes-int-or-string"):
            bad.append(f"{where}: no type")
        for key, sub in (node.get("properties") or {}).items():
            bad += _walk(sub, f"{where}.{key}")
        if isinstance(node.get("items"), dict):
            bad += _walk(node["items"], f"{where}[]")
        if isinstance(node.get("additionalProperties"), dict):
            bad += _walk(node["additionalProperties"], f"{where}{{}}")
    return bad


@pytest.mark.parametrize("kind", ["TTSDeployment", "FillJob"])
def test_schemas_are_structural(kind: str) -> None:
    assert _walk(schema(kind)) == []


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")) if EXAMPLES.exists() else [])
def test_chart_examples_validate(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc.get("apiVersion") == "ttsfleet.io/v1alpha1":
            validate(doc, doc["kind"])
            model = TTSDeploymentSpec if doc["kind"] == "TTSDeployment" else FillJobSpec
            model.model_validate(doc["spec"], context={"catalog": CAT})


def test_test_fixtures_validate() -> None:
    validate(ttsd(), "TTSDeployment")
    validate(filljob(), "FillJob")


def _mutate(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    node = doc
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if k.isdigit() else node.setdefault(k, {})
    node[int(keys[-1]) if keys[-1].isdigit() else keys[-1]] = value
    return doc


@pytest.mark.parametrize(("path", "value"), [
    ("spec.pools.0.gpuClass", "a100"),
    ("spec.pools.0.minReplicas", -1),
    ("spec.pools.0.weight", 0),
    ("spec.pools", []),
    ("spec.quantization", "int4"),
    ("spec.autoscale.targetInFlightPerReplica", -3),
    ("spec.serving.maxRunningRequests", 0),
    ("spec.model.checkpoint", "relative/path"),
    ("spec.resources.memory", "lots"),
    ("spec.serving.kernelCache", {"hostPath": "relative/dir"}),
    ("spec.serving.kernelCache", {"claimName": "Not_A_Name"}),
])
def test_invalid_ttsdeployment_rejected_by_schema_and_model(path: str, value: Any) -> None:
    bad = _mutate(ttsd(), path, value)
    with pytest.raises(jsonschema.ValidationError):
        validate(bad, "TTSDeployment")
    with pytest.raises(ValidationError):
        TTSDeploymentSpec.model_validate(bad["spec"], context={"catalog": CAT})


@pytest.mark.parametrize(("path", "value"), [
    ("spec.gpuClasses", ["tpu"]),
    ("spec.shards", 0),
    ("spec.maxParallelism", -1),
    ("spec.policy.gracePeriodS", 0),
    ("spec.checkpointVolume", None),
    ("spec.stages", ["decode", "bogus"]),  # not in the fill stage registry
])
def test_invalid_filljob_rejected_by_schema_and_model(path: str, value: Any) -> None:
    bad = _mutate(filljob(), path, value)
    with pytest.raises(jsonschema.ValidationError):
        validate(bad, "FillJob")
    with pytest.raises(ValidationError):
        FillJobSpec.model_validate(bad["spec"], context={"catalog": CAT})


def test_min_above_max_is_a_cel_rule_and_a_model_error() -> None:
    """jsonschema cannot evaluate CEL: the rule is in the CRD for the API server, and the model
    (what the operator validates with) rejects it too."""
    pool_schema = schema("TTSDeployment")["properties"]["spec"]["properties"]["pools"]["items"]
    rules = [r["rule"] for r in pool_schema["x-kubernetes-validations"]]
    assert rules == ["self.minReplicas <= self.maxReplicas"]
    bad = _mutate(ttsd(), "spec.pools.0.minReplicas", 9)
    with pytest.raises(ValidationError, match="minReplicas"):
        TTSDeploymentSpec.model_validate(bad["spec"], context={"catalog": CAT})


def test_a_kernel_cache_names_one_volume_in_a_cel_rule_and_the_model() -> None:
    serving = schema("TTSDeployment")["properties"]["spec"]["properties"]["serving"]
    rules = [r["rule"] for r in serving["properties"]["kernelCache"]["x-kubernetes-validations"]]
    assert rules == ["has(self.claimName) != has(self.hostPath)"]
    for both_or_none in ({"claimName": "kernels", "hostPath": "/var/cache/k"}, {}):
        bad = _mutate(ttsd(), "spec.serving.kernelCache", both_or_none)
        with pytest.raises(ValidationError, match="exactly one"):
            TTSDeploymentSpec.model_validate(bad["spec"], context={"catalog": CAT})


def test_printer_columns() -> None:
    cols = {c["name"]: c["jsonPath"] for c in
            DOCS["ttsdeployments.ttsfleet.io.yaml"]["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert cols["Desired"] == ".status.desiredReplicas" and cols["Available"] == ".status.readyReplicas"
    status_props = schema("TTSDeployment")["properties"]["status"]["properties"]
    for path in cols.values():
        if path.startswith(".status.") and "[" not in path:
            assert path.split(".")[2] in status_props


def test_readme_examples_validate() -> None:
    text = (ROOT / "operator" / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```yaml")[1:]]
    docs = [yaml.safe_load(b) for b in blocks]
    assert sorted(d["kind"] for d in docs) == ["FillJob", "TTSDeployment"]
    for doc in docs:
        validate(doc, doc["kind"])
        model = TTSDeploymentSpec if doc["kind"] == "TTSDeployment" else FillJobSpec
        model.model_validate(doc["spec"], context={"catalog": CAT})
