"""The hand-run Kubernetes example, ``fill_jobs/k8s-indexed-job.yaml``, rendered from the fill door.

Its argv, env names, metrics port, grace period and requeue code are
:mod:`ttsfleet.contracts.fill`'s (and :mod:`ttsfleet.contracts.exits`'), so the example cannot
drift from what the operator's fill pods run. ``ttsfleet fill render-example`` prints it;
``tests/fill_jobs/test_examples.py`` fails when the shipped file differs.
"""

from __future__ import annotations

from typing import Any

import yaml

from ttsfleet.contracts import fill as contract
from ttsfleet.contracts.exits import PREEMPTED_REQUEUE

HEADER = f"""\
# A fill job by hand on Kubernetes: one pod per shard (an Indexed Job), lowest priority.
# The operator's FillJob resource does the same with GPU-aware admission and eviction; use this
# when you want a one-off cleaning run without the operator:
#   kubectl apply -f k8s-indexed-job.yaml
#   kubectl logs -f job/ttsfleet-fill-example     # JSON lines, one event each
# Preemption: the kubelet sends SIGTERM, the job commits and exits {PREEMPTED_REQUEUE} within the
# grace period; the podFailurePolicy ignores exit {PREEMPTED_REQUEUE} (and evictions), so a replacement
# pod for that index resumes from the checkpoint on the PVC without using up backoffLimit. The
# shard is JOB_COMPLETION_INDEX of {contract.SHARDS_ENV} (= completions).
# Rendered by `ttsfleet fill render-example` from ttsfleet.contracts.fill: do not edit.
"""


def kubernetes_job(shards: int = 8) -> dict[str, Any]:
    """The Indexed Job: ``shards`` pods, each one shard, requeued on preemption."""
    labels = {"app.kubernetes.io/name": "ttsfleet-fill", "ttsfleet.io/workload": "fill"}
    args = contract.fill_argv(manifest="/data/manifest.jsonl", output="/data/clean",
                              checkpoint="/checkpoints/example")
    container = {
        "name": "fill",
        "image": "ghcr.io/ttsfleet/ttsfleet-fill:0.1.0",
        "command": ["ttsfleet", "fill", "run"],
        "args": args,
        "env": [{"name": contract.SHARDS_ENV, "value": str(shards)},
                {"name": contract.METRICS_PORT_ENV, "value": str(contract.METRICS_PORT)},
                {"name": contract.STATE_FILE_ENV, "value": contract.TERMINATION_LOG}],
        "ports": [{"name": "metrics", "containerPort": contract.METRICS_PORT}],
        "resources": {"requests": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"},
                      "limits": {"memory": "4Gi", "nvidia.com/gpu": "1"}},
        "volumeMounts": [{"name": "data", "mountPath": "/data"},
                         {"name": "checkpoints", "mountPath": "/checkpoints"}],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "ttsfleet-fill-example", "labels": dict(labels)},
        "spec": {
            "completionMode": "Indexed",
            "completions": shards,
            "parallelism": shards,
            "backoffLimit": 4,  # real failures (exit 1/2) only
            "podFailurePolicy": {"rules": [
                {"action": "Ignore", "onExitCodes": {"containerName": "fill", "operator": "In",
                                                     "values": [PREEMPTED_REQUEUE]}},
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            ]},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "restartPolicy": "Never",  # required by podFailurePolicy
                    "priorityClassName": "ttsfleet-fill",
                    "terminationGracePeriodSeconds": contract.GRACE_PERIOD_S,
                    "containers": [container],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "tts-data"}},
                                {"name": "checkpoints",
                                 "persistentVolumeClaim": {"claimName": "fill-checkpoints"}}],
                },
            },
        },
    }


def render_kubernetes_example(shards: int = 8) -> str:
    return HEADER + yaml.safe_dump(kubernetes_job(shards), sort_keys=False, width=100)
