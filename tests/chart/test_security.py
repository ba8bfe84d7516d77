"""Every pod the chart runs: non-root, read-only root filesystem, no privilege escalation, all
capabilities dropped, seccomp RuntimeDefault; pinned images; nothing from the host."""

from __future__ import annotations

import re

POD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "Pod"}


def pod_specs(docs):
    for doc in docs:
        if doc["kind"] not in POD_KINDS:
            continue
        spec = doc["spec"]
        if doc["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        yield doc, (spec if doc["kind"] == "Pod" else spec["template"]["spec"])


def test_every_pod_is_locked_down(render_docs, value_set):
    _, values = value_set
    docs = render_docs(values)
    specs = list(pod_specs(docs))
    assert specs, "no pods rendered"
    for doc, pod in specs:
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        psc = pod["securityContext"]
        assert psc["runAsNonRoot"] is True, where
        assert psc["runAsUser"] > 0 and psc["runAsGroup"] > 0, where
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, where
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            assert not pod.get(key), where
        assert all("hostPath" not in v for v in pod.get("volumes", [])), where
        for c in pod["containers"] + pod.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc.get("privileged", False) is False, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert "memory" in c["resources"]["limits"], where
            assert c.get("livenessProbe"), where
            image = c["image"]
            assert re.search(r"(:[\w][\w.-]*|@sha256:[0-9a-f]{64})$", image), image
            assert not image.endswith(":latest"), image


def test_service_account_token_is_mounted_only_where_needed(render_docs, lib):
    docs = render_docs(None)
    assert lib.one(docs, "ServiceAccount")["automountServiceAccountToken"] is False
    (_, pod), = pod_specs(docs)
    assert pod["automountServiceAccountToken"] is True  # the operator talks to the API server
