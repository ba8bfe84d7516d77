"""Fixtures for the Helm chart tests: the real Helm SDK, real Kubernetes schemas.

`render_docs(values)` renders charts/ttsfleet with helm-python-sdk and returns the parsed
manifests; `chart_copy` gives a private copy of the chart so a test can empty or fill the
dashboards/ and rules/ folders (owned by the observability engineer) without touching the tree.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
# TTSFLEET_CHART_DIR points the tests at another copy of the chart (mutation checks of the tests).
CHART_DIR = Path(os.environ.get("TTSFLEET_CHART_DIR") or REPO / "charts" / "ttsfleet")
DOCKER_DIR = REPO / "docker"
EXAMPLES_DIR = CHART_DIR / "examples"
KUBE_VERSION = "1.31"
RELEASE = "ttsfleet"
NAMESPACE = "ttsfleet"

Docs = list[dict[str, Any]]


def load_docs(rendered: dict[str, str]) -> Docs:
    """Every non-empty YAML document of a render, NOTES.txt excluded, tagged with its template."""
    docs: Docs = []
    for template, text in sorted(rendered.items()):
        if template.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                docs.append({**doc, "_template": template})
    return docs


def strip(doc: dict[str, Any]) -> dict[str, Any]:
    """The manifest without the test's bookkeeping key."""
    return {k: v for k, v in doc.items() if k != "_template"}


def by_kind(docs: Docs, kind: str) -> Docs:
    return [d for d in docs if d["kind"] == kind]


def one(docs: Docs, kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


@pytest.fixture(scope="session")
def chart() -> Iterator[helm.Chart]:
    c = helm.Chart.load(CHART_DIR)
    try:
        yield c
    finally:
        c.close()


def _render(c: helm.Chart, values: dict[str, Any] | None) -> dict[str, str]:
    return c.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)


@pytest.fixture(scope="session")
def render_docs(chart: helm.Chart) -> Callable[[dict[str, Any] | None], Docs]:
    def _do(values: dict[str, Any] | None = None) -> Docs:
        return load_docs(_render(chart, values))

    return _do


@pytest.fixture(scope="session")
def render_raw(chart: helm.Chart) -> Callable[[dict[str, Any] | None], dict[str, str]]:
    return lambda values=None: _render(chart, values)


@pytest.fixture()
def chart_copy(tmp_path: Path) -> Path:
    """A copy of the chart without its dashboards/ and rules/ folders (tests add their own)."""
    dst = tmp_path / "ttsfleet"
    shutil.copytree(CHART_DIR, dst, ignore=shutil.ignore_patterns("dashboards", "rules", "__pycache__"))
    return dst


def render_dir(path: Path, values: dict[str, Any] | None = None) -> Docs:
    with helm.Chart.load(path) as c:
        return load_docs(_render(c, values))


# --- monitoring kinds: not built into Kubernetes, so checked against their structure ----------

_DURATION = {"type": "string", "pattern": r"^(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?$",
             "minLength": 2}
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_META = {"type": "object", "required": ["name", "namespace", "labels"],
         "properties": {"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
                        "namespace": {"type": "string"}, "labels": _LABELS}}
_SELECTOR = {"type": "object", "additionalProperties": False, "minProperties": 1,
             "properties": {"matchLabels": _LABELS, "matchExpressions": {"type": "array"}}}
_NS_SELECTOR = {"type": "object", "additionalProperties": False, "maxProperties": 1,
                "properties": {"any": {"type": "boolean"},
                               "matchNames": {"type": "array", "minItems": 1,
                                              "items": {"type": "string"}}}}


_RELABEL = {"type": "object", "additionalProperties": False,
            "properties": {"sourceLabels": {"type": "array", "items": {
                               "type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
                           "targetLabel": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"},
                           "regex": {"type": "string"}, "replacement": {"type": "string"},
                           "separator": {"type": "string"},
                           "action": {"enum": ["replace", "keep", "drop", "labelmap", "labeldrop",
                                               "labelkeep", "hashmod", "lowercase", "uppercase"]}}}


def _endpoint(port_type: str) -> dict:
    return {"type": "object", "additionalProperties": False, "required": ["port"],
            "properties": {"port": {"type": port_type}, "path": {"type": "string", "pattern": "^/"},
                           "interval": _DURATION, "scrapeTimeout": _DURATION,
                           "honorLabels": {"type": "boolean"},
                           "relabelings": {"type": "array", "items": _RELABEL}}}


def _resource(kind: str, spec: dict) -> dict:
    return {"type": "object", "additionalProperties": False,
            "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {"apiVersion": {"const": "monitoring.coreos.com/v1"},
                           "kind": {"const": kind}, "metadata": _META, "spec": spec}}


MONITORING_SCHEMAS = {
    # Field names and shapes of prometheus-operator's monitoring.coreos.com/v1 CRDs (the subset
    # the chart uses; additionalProperties false so a misspelt field fails).
    "ServiceMonitor": _resource("ServiceMonitor", {
        "type": "object", "additionalProperties": False, "required": ["selector", "endpoints"],
        "properties": {"selector": _SELECTOR, "namespaceSelector": _NS_SELECTOR,
                       "endpoints": {"type": "array", "minItems": 1, "items": _endpoint("string")}}}),
    "PodMonitor": _resource("PodMonitor", {
        "type": "object", "additionalProperties": False,
        "required": ["selector", "podMetricsEndpoints"],
        "properties": {"selector": _SELECTOR, "namespaceSelector": _NS_SELECTOR,
                       "podMetricsEndpoints": {"type": "array", "minItems": 1,
                                               "items": _endpoint("string")}}}),
    "PrometheusRule": _resource("PrometheusRule", {
        "type": "object", "additionalProperties": False, "required": ["groups"],
        "properties": {"groups": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["name", "rules"],
            "properties": {"name": {"type": "string", "minLength": 1},
                           "interval": _DURATION,
                           "rules": {"type": "array", "items": {
                               "type": "object", "required": ["expr"],
                               "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
                               "properties": {
                                   "record": {"type": "string"}, "alert": {"type": "string"},
                                   "expr": {"type": ["string", "integer"]}, "for": _DURATION,
                                   "keep_firing_for": _DURATION,
                                   "labels": _LABELS, "annotations": _LABELS},
                               "additionalProperties": False}}}}}}}),
}


def check_monitoring(doc: dict) -> None:
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)  # really not a built-in kind
    jsonschema.validate(doc, MONITORING_SCHEMAS[doc["kind"]])



# Representative values, used by the render, lint and validation tests.
FULL_VALUES: dict[str, Any] = {
    "fullnameOverride": "tts",
    "images": {
        "operator": {"repository": "registry.example.com/ttsfleet/operator", "tag": "0.1.0",
                     "digest": "sha256:" + "a" * 64, "pullPolicy": "Always"},
    },
    "imagePullSecrets": ["regcred"],
    "operator": {
        "prometheusUrl": "http://prometheus-operated.monitoring.svc:9090",
        "watchNamespaces": ["tts-prod", "tts-staging"],
        "extraArgs": ["--verbose"],
        "extraEnv": [{"name": "TTSFLEET_LOG_FORMAT", "value": "json"}],
        "priorityClassName": "system-cluster-critical",
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "ttsfleet.io/gpu-class", "operator": "DoesNotExist"}]}]}}},
        "podAnnotations": {"example.com/team": "speech"},
        "podLabels": {"team": "speech"},
    },
    "serviceAccount": {"annotations": {"example.com/role": "ttsfleet"}},
    "priorityClasses": {
        "inference": {"value": 1000000000},
        "training": {"value": 500000},
        "fill": {"value": -2000000},
    },
    "metrics": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "podMonitor": {"enabled": True, "namespaces": ["tts-prod"],
                       "labels": {"release": "kube-prometheus-stack"}},
    },
    "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "dashboards": {"namespace": "monitoring", "folder": "TTS fleet"},
}

MINIMAL_VALUES: dict[str, Any] = {
    "operator": {"replicas": 0},
    "serviceAccount": {"create": False, "name": "ttsfleet-preexisting"},
    "rbac": {"create": False},
    "priorityClasses": {"create": False},
    "metrics": {"service": {"enabled": False}},
    "dashboards": {"enabled": False},
}

VALUE_SETS = {"default": {}, "full": FULL_VALUES, "minimal": MINIMAL_VALUES}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`value_set` parametrizes a test over the representative values (ids: their names)."""
    if "value_set" in metafunc.fixturenames:
        metafunc.parametrize("value_set", list(VALUE_SETS.items()), ids=list(VALUE_SETS))


@pytest.fixture(scope="session")
def lib() -> SimpleNamespace:
    """Helpers and constants for the test modules (importlib mode: no imports from conftest)."""
    return SimpleNamespace(
        REPO=REPO, CHART_DIR=CHART_DIR, DOCKER_DIR=DOCKER_DIR, EXAMPLES_DIR=EXAMPLES_DIR,
        KUBE_VERSION=KUBE_VERSION, RELEASE=RELEASE, NAMESPACE=NAMESPACE,
        FULL_VALUES=FULL_VALUES, MINIMAL_VALUES=MINIMAL_VALUES, VALUE_SETS=VALUE_SETS,
        load_docs=load_docs, strip=strip, by_kind=by_kind, one=one, render_dir=render_dir,
        deep_merge=deep_merge, MONITORING_SCHEMAS=MONITORING_SCHEMAS,
        check_monitoring=check_monitoring,
    )


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` merged into a copy of `base` (dicts recursively, everything else replaced)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
