"""The example manifests are valid custom resources: checked against the openAPIV3Schema of the
CRDs the chart ships (and of the CRDs the operator's models generate), with unknown fields
rejected as `kubectl apply` (strict field validation) would, and through the operator's own
pydantic models, which also carry the cross-field rules (CEL in the CRDs)."""

from __future__ import annotations

import copy

import jsonschema
import kubernetes_validate
import pytest
import yaml

from ttsfleet.catalog import GpuCatalog

CAT = GpuCatalog.default()

EXAMPLES = {
    "ttsdeployment-h200-rtx5090.yaml": "TTSDeployment",
    "filljob.yaml": "FillJob",
}


def crd_schemas_from_chart(lib) -> dict[str, dict]:
    out = {}
    for path in sorted((lib.CHART_DIR / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                out[doc["spec"]["names"]["kind"]] = doc
    return out


def crd_schemas_from_models() -> dict[str, dict]:
    from ttsfleet.operator.crds import crd_documents

    return {d["spec"]["names"]["kind"]: d for d in crd_documents(CAT).values()}


def schema_of(crd: dict, version: str) -> dict:
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return v["schema"]["openAPIV3Schema"]


def unknown_fields(obj, schema, path="") -> list[str]:
    """Paths of fields the structural schema does not declare (the API server would prune them,
    kubectl's strict field validation rejects them)."""
    found = []
    if isinstance(obj, dict):
        props = schema.get("properties")
        if props is None:
            if isinstance(schema.get("additionalProperties"), dict):
                for k, v in obj.items():
                    found += unknown_fields(v, schema["additionalProperties"], f"{path}.{k}")
            return found
        for k, v in obj.items():
            if path == "" and k == "metadata":
                continue
            if k not in props:
                found.append(f"{path}.{k}")
            else:
                found += unknown_fields(v, props[k], f"{path}.{k}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(obj):
            found += unknown_fields(v, schema["items"], f"{path}[{i}]")
    return found


def check_against_crd(doc: dict, crd: dict) -> None:
    group, version = doc["apiVersion"].split("/")
    assert group == crd["spec"]["group"] == "ttsfleet.io"
    assert doc["kind"] == crd["spec"]["names"]["kind"]
    schema = schema_of(crd, version)
    # OpenAPI v3.0 schema objects follow draft 4 semantics (boolean exclusiveMinimum).
    jsonschema.Draft4Validator(schema).validate(doc)
    assert unknown_fields(doc, schema) == []


def load(lib, name: str) -> dict:
    return yaml.safe_load((lib.EXAMPLES_DIR / name).read_text())


def test_every_example_is_covered(lib):
    assert sorted(p.name for p in lib.EXAMPLES_DIR.glob("*.yaml")) == sorted(EXAMPLES)


@pytest.mark.parametrize("name, kind", EXAMPLES.items())
def test_example_matches_the_generated_crd_schema(lib, name, kind):
    check_against_crd(load(lib, name), crd_schemas_from_models()[kind])


@pytest.mark.parametrize("name, kind", EXAMPLES.items())
def test_example_matches_the_shipped_crd(lib, name, kind):
    crds = crd_schemas_from_chart(lib)
    assert crds, "charts/ttsfleet/crds/ is empty: run `ttsfleet operator crds`"
    check_against_crd(load(lib, name), crds[kind])


def test_shipped_crds_are_valid_v1_crds(chart, lib):
    """The CRDs the chart installs: valid apiextensions/v1 for 1.31, names per the contract."""
    crds = chart.crds
    assert crds, "charts/ttsfleet/crds/ is empty: run `ttsfleet operator crds`"
    names = set()
    for entry in crds:
        for doc in yaml.safe_load_all(entry["data"]):
            if doc:
                kubernetes_validate.validate(doc, lib.KUBE_VERSION, strict=True)
                names.add(doc["metadata"]["name"])
    assert names == {"ttsdeployments.ttsfleet.io", "filljobs.ttsfleet.io"}


@pytest.mark.parametrize("name, kind", EXAMPLES.items())
def test_example_passes_the_operator_models(lib, name, kind):
    from ttsfleet.operator.models import FillJobSpec, TTSDeploymentSpec

    model = {"TTSDeployment": TTSDeploymentSpec, "FillJob": FillJobSpec}[kind]
    model.model_validate(load(lib, name)["spec"], context={"catalog": CAT})


def test_examples_describe_the_mixed_fleet_and_use_the_chart_images(lib):
    values = yaml.safe_load((lib.CHART_DIR / "values.yaml").read_text())["images"]
    tts = load(lib, "ttsdeployment-h200-rtx5090.yaml")["spec"]
    assert {p["gpuClass"] for p in tts["pools"]} == {"h200", "rtx5090"}
    assert tts["image"] == f"{values['inference']['repository']}:{values['inference']['tag']}"
    fill = load(lib, "filljob.yaml")["spec"]
    assert fill["image"] == f"{values['fill']['repository']}:{values['fill']['tag']}"
    assert fill["command"] == ["ttsfleet", "fill", "run"]


@pytest.mark.parametrize("mutate", [
    lambda d: d["spec"]["pools"][0].update(gpuClass="a100"),
    lambda d: d["spec"]["pools"][0].update(minReplicas=-1),
    lambda d: d["spec"].update(quantization="int4"),
    lambda d: d["spec"]["pools"][0].update(minReplica=1),  # typo: unknown field
    lambda d: d["spec"].pop("model"),
], ids=["unknown-gpu-class", "negative-replicas", "bad-quantization", "typo", "no-model"])
def test_the_check_catches_broken_resources(lib, mutate):
    doc = copy.deepcopy(load(lib, "ttsdeployment-h200-rtx5090.yaml"))
    mutate(doc)
    with pytest.raises((jsonschema.ValidationError, AssertionError)):
        check_against_crd(doc, crd_schemas_from_models()["TTSDeployment"])
