"""Who may call an inference pool: the API key the pods require and the NetworkPolicy around them.

Pure builders over ``spec.apiKeySecret`` and ``spec.networkPolicy`` (:mod:`ttsfleet.operator.models`),
no I/O; :mod:`ttsfleet.operator.desired` puts their output into each pool's objects.

- The key comes from a Secret through ``valueFrom.secretKeyRef``: the kubelet reads the Secret
  when it starts the container, so the operator needs no right on Secrets, and a missing Secret
  keeps the pod from starting instead of letting it serve without a key. The server leaves
  ``/healthz``, ``/readyz`` and ``/metrics`` open (the kubelet and Prometheus carry no key).
  Keys are read at start: after editing the Secret, restart the pools
  (``kubectl rollout restart deployment -l app.kubernetes.io/instance=NAME``).
- The NetworkPolicy admits the named peers on the serving port only. That port also serves
  ``/metrics``, so the peers must include Prometheus and, when the operator scrapes the pods
  itself (no ``TTSFLEET_PROMETHEUS_URL``), the operator's namespace. Kubelet probes come from the
  node and are allowed by the common network plugins. A NetworkPolicy is only enforced where the
  cluster's network plugin implements it (Calico, Cilium, ...); without one it is stored and
  ignored.
"""

from __future__ import annotations

from typing import Any

from ttsfleet.operator.models import ApiKeySecret, IngressPeer, IngressPolicy

from ttsfleet.contracts import serving as contract


def api_key_env(secret: ApiKeySecret | None) -> list[dict[str, Any]]:
    """``TTSFLEET_API_KEYS`` from the Secret's key, or nothing (the pods then accept any caller)."""
    if secret is None:
        return []
    return [{"name": contract.API_KEYS,
             "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}}}]


def _peer(peer: IngressPeer) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if peer.namespace_selector is not None:
        out["namespaceSelector"] = {"matchLabels": dict(peer.namespace_selector)}
    if peer.pod_selector is not None:
        out["podSelector"] = {"matchLabels": dict(peer.pod_selector)}
    return out


def network_policy(name: str, labels: dict[str, str], pod_selector: dict[str, str], port: int,
                   policy: IngressPolicy) -> dict[str, Any]:
    """The pool's NetworkPolicy ``name``: ingress to the pods ``pod_selector`` picks only from
    ``policy``'s peers, only on ``port``; egress is left alone."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "podSelector": {"matchLabels": dict(pod_selector)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [_peer(p) for p in policy.from_],
                         "ports": [{"protocol": "TCP", "port": port}]}],
        },
    }
