"""values.schema.json rejects bad values before anything renders, and accepts the good ones."""

from __future__ import annotations

import json

import helm_python as helm
import jsonschema
import pytest
import yaml

BAD = {
    "unknown top-level key": {"replicaCount": 2},
    "unknown nested key (typo)": {"operator": {"metricPort": 9000}},
    "two operator replicas without leader election": {"operator": {"replicas": 2}},
    "three operator replicas": {"operator": {"replicas": 3, "leaderElection": {"enabled": True}}},
    "lease duration as a string": {"operator": {"leaderElection": {"leaseDurationSeconds": "15"}}},
    "port out of range": {"operator": {"metricsPort": 70000}},
    "port as a string": {"operator": {"healthPort": "8081"}},
    "root user": {"operator": {"runAsUser": 0}},
    "image tag latest": {"images": {"inference": {"tag": "latest"}}},
    "empty image tag": {"images": {"fill": {"tag": ""}}},
    "malformed digest": {"images": {"operator": {"digest": "sha256:xyz"}}},
    "bad pull policy": {"images": {"operator": {"pullPolicy": "Sometimes"}}},
    "fill may preempt": {"priorityClasses": {"fill": {"preemptionPolicy": "PreemptLowerPriority"}}},
    "priority above the user maximum": {"priorityClasses": {"inference": {"value": 2000000000}}},
    "priority as a float": {"priorityClasses": {"training": {"value": 1.5}}},
    "priority class names are fixed": {"priorityClasses": {"inference": {"name": "tts-high"}}},
    "bad preemption policy": {"priorityClasses": {"training": {"preemptionPolicy": "Always"}}},
    "scrape interval not a duration": {"metrics": {"serviceMonitor": {"interval": "30"}}},
    "prometheus url without scheme": {"operator": {"prometheusUrl": "prometheus:9090"}},
    "watch namespace not a DNS label": {"operator": {"watchNamespaces": ["Team_A"]}},
    "enabled as a string": {"dashboards": {"enabled": "yes"}},
    "label values must be strings": {"operator": {"podLabels": {"team": 3}}},
}

GOOD = {
    "digest pin": {"images": {"operator": {"digest": "sha256:" + "0" * 64}}},
    "negative fill priority": {"priorityClasses": {"fill": {"value": -2147483648}}},
    "paused operator": {"operator": {"replicas": 0}},
    "two replicas with leader election": {"operator": {"replicas": 2, "leaderElection": {"enabled": True}}},
    "namespaced operator": {"operator": {"watchNamespaces": ["tts"]}},
    "prefixed sidecar label": {"dashboards": {"label": "grafana.com/dashboard", "labelValue": ""}},
}


@pytest.mark.parametrize("values", BAD.values(), ids=BAD.keys())
def test_bad_values_are_rejected(render_raw, values):
    with pytest.raises(helm.HelmValuesError):
        render_raw(values)


@pytest.mark.parametrize("values", GOOD.values(), ids=GOOD.keys())
def test_good_edge_values_are_accepted(render_raw, values):
    assert render_raw(values)


def test_schema_is_strict_and_covers_every_default(lib):
    """values.yaml validates against the schema by itself (so no key lacks a schema entry) and
    every object level of the schema refuses unknown keys, except free-form Kubernetes maps."""
    schema = json.loads((lib.CHART_DIR / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    defaults = yaml.safe_load((lib.CHART_DIR / "values.yaml").read_text())
    jsonschema.Draft7Validator(schema).validate(defaults)

    open_objects = []

    def walk(node, path):
        if node.get("type") == "object" and "properties" in node:
            if node.get("additionalProperties", True) is not False:
                open_objects.append(path)
            for key, sub in node["properties"].items():
                walk(sub, f"{path}.{key}")

    walk(schema, "")
    assert open_objects == []

    def keys(d, path=""):
        for k, v in d.items():
            yield f"{path}.{k}"
            if isinstance(v, dict) and v and not k.endswith(("Labels", "labels", "Annotations",
                                                             "annotations", "nodeSelector",
                                                             "affinity", "matchLabels",
                                                             "requests", "limits")):
                yield from keys(v, f"{path}.{k}")

    def has(path):
        node = schema
        for part in path.strip(".").split("."):
            node = node.get("properties", {}).get(part)
            if node is None:
                return False
        return True

    missing = [k for k in keys(defaults) if not has(k)]
    assert missing == []
