"""Shared test data and small waiting helpers for the operator tests."""

from __future__ import annotations

import copy
import functools
from typing import Any

import kmock
from ttsfleet.devtools.wait import NOT_YET, wait_for_async

TTSD = "ttsfleet.io/v1alpha1/ttsdeployments"
FILLJOB = "ttsfleet.io/v1alpha1/filljobs"
DEPLOY = "apps/v1/deployments"
SVC = "v1/services"
PDB = "policy/v1/poddisruptionbudgets"
PODS = "v1/pods"
NODES = "v1/nodes"
EVENTS = "v1/events"

TTSD_SPEC: dict[str, Any] = {
    "model": {"checkpoint": "pvc://models/narrator/v3", "family": "ttsfleet-ar"},
    "image": "ghcr.io/ttsfleet/inference:test",
    "pools": [
        {"gpuClass": "h200", "minReplicas": 1, "maxReplicas": 6, "weight": 3},
        {"gpuClass": "rtx5090", "minReplicas": 0, "maxReplicas": 4, "weight": 1},
    ],
    "autoscale": {"targetInFlightPerReplica": 10, "stableWindowS": 20, "panicWindowS": 10,
                  "scaleDownStabilizationS": 30},
}

FILL_SPEC: dict[str, Any] = {
    "image": "ghcr.io/ttsfleet/fill:test",
    "manifest": "/data/manifest.jsonl",
    "output": "/data/out",
    "checkpointVolume": {"claimName": "ckpt", "mountPath": "/checkpoints"},
    "shards": 6,
    "gpuClasses": ["h200"],
    "maxParallelism": 10,
    "policy": {"gracePeriodS": 30, "checkpointIntervalS": 60, "evictionDeadlineS": 60},
}


def ttsd(name: str = "voice", ns: str = "ns1", **spec_overrides: Any) -> dict[str, Any]:
    spec = copy.deepcopy(TTSD_SPEC)
    spec.update(spec_overrides)
    return {"apiVersion": "ttsfleet.io/v1alpha1", "kind": "TTSDeployment",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


def filljob(name: str = "clean", ns: str = "ns1", **spec_overrides: Any) -> dict[str, Any]:
    spec = copy.deepcopy(FILL_SPEC)
    spec.update(spec_overrides)
    return {"apiVersion": "ttsfleet.io/v1alpha1", "kind": "FillJob",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


def node(name: str, gpu_class: str, gpus: int = 8) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"ttsfleet.io/gpu-class": gpu_class}},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


#: Poll on the event loop's (looptime-compressed) clock; a lookup into an object that is not
#: there yet (KeyError, IndexError, ...) means "not yet".
wait_for = functools.partial(wait_for_async, step=0.5, ignore=NOT_YET)


def _same(res: Any, resource: str) -> bool:
    want = kmock.resource(resource)
    return (res.group, res.version, res.plural) == (want.group, want.version, want.plural)


def objects(cluster: Any, resource: str, ns: str | None = "ns1") -> dict[str, dict[str, Any]]:
    """Live (not deleted) objects of one resource in one namespace, by name."""
    return {name: obj.raw for (res, rns, name), obj in list(cluster.objects.items())
            if _same(res, resource) and rns == ns and not obj.deleted}


def live(cluster: Any, resource: str, ns: str | None, name: str) -> dict[str, Any] | None:
    return objects(cluster, resource, ns).get(name)


def names(cluster: Any, resource: str, ns: str | None = "ns1") -> list[str]:
    return sorted(objects(cluster, resource, ns))
