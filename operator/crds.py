"""CustomResourceDefinitions generated from the pydantic models in :mod:`ttsfleet.operator.models`.

apiextensions/v1 wants *structural* OpenAPI v3.0 schemas: no ``$ref``, a ``type`` on every node,
``nullable`` instead of ``anyOf [.., null]``, boolean ``exclusiveMinimum``, and never
``properties`` together with ``additionalProperties``. :func:`structural` converts pydantic's JSON
Schema into that form; :func:`crd_documents` wraps it into the two CRDs. The chart ships the files
``ttsfleet operator crds --out charts/ttsfleet/crds`` writes, and a test regenerates and compares.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from ttsfleet.operator.models import (
    DNS1035,
    GROUP,
    VERSION,
    FillJobSpec,
    FillJobStatus,
    TTSDeploymentSpec,
    TTSDeploymentStatus,
)

from ttsfleet.catalog import GpuCatalog

_DROP = {"title", "examples", "$defs", "definitions"}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(x, defs) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(merged, defs)
    return {k: _resolve(v, defs) for k, v in node.items()}


def _without_none(value: Any) -> Any:
    """A default as the API server may store it: unset (None) optional fields left out."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


def _structural(node: dict[str, Any]) -> dict[str, Any]:
    node = dict(node)
    for key in _DROP:
        node.pop(key, None)
    any_of = node.pop("anyOf", None)
    if any_of is not None:
        non_null = [s for s in any_of if s.get("type") != "null"]
        if len(non_null) != 1:
            raise ValueError(f"cannot express anyOf {any_of!r} structurally")
        inner = _structural(non_null[0])
        outer = {k: v for k, v in node.items() if k != "default" or v is not None}
        node = {**inner, **outer}
        if len(non_null) != len(any_of):
            node["nullable"] = True
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), int | float) and not isinstance(node.get(bound), bool):
            node[plain] = node.pop(bound)
            node[bound] = True
    if node.get("default", 0) is None:
        node.pop("default")
    if isinstance(node.get("default"), dict):
        # The model's own default object, as it is: a field default (FillJob resources 16Gi) may
        # differ from the nested class's defaults (32Gi), and `{}` would silently take the latter.
        node["default"] = _without_none(node["default"])
    if "properties" in node:
        node["type"] = "object"
        node["properties"] = {k: _structural(v) for k, v in node["properties"].items()}
        if node.get("additionalProperties") is False:
            node.pop("additionalProperties")
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _structural(node["additionalProperties"])
    if isinstance(node.get("items"), dict):
        node["items"] = _structural(node["items"])
    if "enum" in node and "type" not in node:
        node["type"] = "string"
    return node


def _factory_defaults(model: type[BaseModel], schema: dict[str, Any]) -> dict[str, Any]:
    """pydantic writes no default for ``default_factory`` fields; a non-empty one (FillJob's
    ``command``) must still be what the API server stores, so it is added here."""
    for name, info in model.model_fields.items():
        prop = schema.get("properties", {}).get(info.alias or name)
        if prop is None:
            continue
        if info.default_factory is not None and (value := info.default_factory()):  # type: ignore[call-arg]
            prop["default"] = value
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            _factory_defaults(info.annotation, prop)
    return schema


def structural(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a wire model (camelCase, input mode)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    return _factory_defaults(model, _structural(_resolve(raw, defs)))


#: Rules on the object's own name (CEL may read metadata.name at the root): a name the CRD accepts
#: must make children the API server accepts.
NAME_RULES: dict[str, list[dict[str, str]]] = {
    "TTSDeployment": [
        {"rule": f"self.metadata.name.matches(r'{DNS1035}')",
         "message": "metadata.name must be a DNS-1035 label (a-z, 0-9, '-', starting with a letter): "
                    "it names the pools' Services"},
        {"rule": "self.spec.pools.all(p, size(self.metadata.name) + 1 + "
                 "size(has(p.name) && p.name != '' ? p.name : p.gpuClass) <= 63)",
         "message": "metadata.name + '-' + pool name must be at most 63 characters (Service names)"}],
    "FillJob": [
        {"rule": "size(self.metadata.name) <= 63",
         "message": "metadata.name must be at most 63 characters: it is a label value on fill pods"}],
}


#: Where a GPU class name sits in each spec schema: the enum there is the run's catalog.
CLASS_FIELDS = {"TTSDeployment": ("pools", "items", "gpuClass"), "FillJob": ("gpuClasses", "items")}


def _class_enum(kind: str, schema: dict[str, Any], catalog: GpuCatalog) -> None:
    node = schema
    for key in CLASS_FIELDS[kind]:
        node = node["items"] if key == "items" else node["properties"][key]
    node["enum"] = catalog.names()
    node["description"] = f"a GPU class of the catalog: {catalog.names_text()}"


#: The scale subresource (``kubectl scale``, HorizontalPodAutoscaler): ``spec.replicas`` is the total
#: over all pools, ``status.replicas`` what the pools' Deployments have, ``status.selector`` their pods.
SCALE = {"TTSDeployment": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                           "labelSelectorPath": ".status.selector"}}


def _crd(kind: str, plural: str, short: list[str], spec: type[BaseModel], status: type[BaseModel],
         columns: list[dict[str, Any]], catalog: GpuCatalog) -> dict[str, Any]:
    spec_schema = structural(spec)
    _class_enum(kind, spec_schema, catalog)
    spec_schema["description"] = (spec.__doc__ or "").strip().splitlines()[0]
    status_schema = structural(status)
    status_schema.pop("description", None)
    status_schema.pop("required", None)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}",
                     "labels": {"app.kubernetes.io/part-of": "ttsfleet"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural,
                      "singular": kind.lower(), "shortNames": short, "categories": ["ttsfleet"]},
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}, **({"scale": SCALE[kind]} if kind in SCALE else {})},
                "additionalPrinterColumns": columns,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "required": ["spec"],
                    "x-kubernetes-validations": NAME_RULES[kind],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": spec_schema,
                        "status": status_schema,
                    },
                }},
            }],
        },
    }


def _col(name: str, path: str, type_: str = "string", priority: int = 0) -> dict[str, Any]:
    col: dict[str, Any] = {"name": name, "type": type_, "jsonPath": path}
    if priority:
        col["priority"] = priority
    return col


def crd_documents(catalog: GpuCatalog) -> dict[str, dict[str, Any]]:
    """File name → CRD document, for both custom resources (class enums from the run's ``catalog``)."""
    ready = '.status.conditions[?(@.type=="Ready")].status'
    ttsd = _crd("TTSDeployment", "ttsdeployments", ["ttsd"], TTSDeploymentSpec, TTSDeploymentStatus, [
        _col("Ready", ready),
        _col("Desired", ".status.desiredReplicas", "integer"),
        _col("Available", ".status.readyReplicas", "integer"),
        _col("Pools", ".status.summary"),
        _col("Model", ".spec.model.checkpoint", priority=1),
        _col("Age", ".metadata.creationTimestamp", "date"),
    ], catalog)
    fill = _crd("FillJob", "filljobs", ["fj"], FillJobSpec, FillJobStatus, [
        _col("Done", ".status.shardsDone", "integer"),
        _col("Shards", ".spec.shards", "integer"),
        _col("Running", ".status.runningPods", "integer"),
        _col("Preempted", ".status.preemptionsSurvived", "integer"),
        _col("Complete", '.status.conditions[?(@.type=="Complete")].status'),
        _col("Age", ".metadata.creationTimestamp", "date"),
    ], catalog)
    return {"ttsdeployments.ttsfleet.io.yaml": ttsd, "filljobs.ttsfleet.io.yaml": fill}


HEADER = "# Generated by `ttsfleet operator crds` from ttsfleet/operator/models.py. Do not edit.\n"


def render(doc: dict[str, Any]) -> str:
    return HEADER + yaml.safe_dump(doc, sort_keys=False, width=100)


def write_crds(out: Path, catalog: GpuCatalog) -> list[Path]:
    """Write every CRD into ``out``; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, doc in crd_documents(catalog).items():
        path = out / name
        path.write_text(render(doc))
        written.append(path)
    return written
