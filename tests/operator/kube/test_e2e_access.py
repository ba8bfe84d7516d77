"""Who may call a pool, on a real control plane: ``spec.apiKeySecret`` and ``spec.networkPolicy``.

The API server accepts the NetworkPolicy the operator builds (its own validation, RBAC with the
chart's ServiceAccount), the policy is owned by the TTSDeployment (garbage-collected with it), a
change of peers is patched in, and switching the policy off deletes it. The pods get the key
from the Secret through ``secretKeyRef``; the test plays the kubelet's part (it resolves the
reference as a kubelet would) and starts the real server with that environment: the probes and
``/metrics`` answer without a key, synthesis only with one of the Secret's keys.

Enforcement is not tested here: the local plane has no network plugin (the fake kubelet gives
pods loopback IPs), so a NetworkPolicy is stored and never enforced, as on any cluster whose
plugin does not implement NetworkPolicy.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import httpx
import pytest
from ttsfleet.devtools.localkube import LocalKube

from . import audit
from .conftest import Api, gone, running_operator, wait_for

# A hang costs this test, not the run (see test_e2e_fill.py): ~5x its duration (15 s),
# at least 120 s (the session's first test also starts the control plane).
pytestmark = pytest.mark.timeout(120, method="signal")

NS = "tts-acc"
OPERATOR = audit.sa_user("ttsfleet", "ttsfleet")
TTSD = f"/apis/ttsfleet.io/v1alpha1/namespaces/{NS}/ttsdeployments"
POLICY = f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies/guarded-h200"
GATEWAY = {"namespaceSelector": {"kubernetes.io/metadata.name": "gateway"}}
MONITORING = {"namespaceSelector": {"kubernetes.io/metadata.name": "monitoring"},
              "podSelector": {"app.kubernetes.io/name": "prometheus"}}


def guarded(**spec: Any) -> dict[str, Any]:
    base = {"model": {"checkpoint": "s3://models/narrator/v3"}, "image": "ghcr.io/ttsfleet/inference:test",
            "pools": [{"gpuClass": "h200", "minReplicas": 1, "maxReplicas": 1}],
            "resources": {"cpu": "500m", "memory": "1Gi"},
            "apiKeySecret": {"name": "tts-keys", "key": "keys"},
            "networkPolicy": {"from": [GATEWAY, MONITORING]}}
    return {"apiVersion": "ttsfleet.io/v1alpha1", "kind": "TTSDeployment", "metadata": {"name": "guarded"},
            "spec": {**base, **spec}}


def peers(policy: dict[str, Any]) -> list[dict[str, Any]]:
    return policy["spec"]["ingress"][0]["from"]


async def resolved_env(api: Api, pod: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet makes it: secretKeyRef read from the Secret."""
    out = {}
    for e in pod["spec"]["containers"][0].get("env") or []:
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            secret = await api.get(f"/api/v1/namespaces/{NS}/secrets/{ref['name']}")
            out[e["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
        else:
            out[e["name"]] = e.get("value", "")
    return out


def serve_with_keys(tmp_path: Any, keys: str) -> Any:
    from tests.inference_server.conftest import start_server

    return start_server(tmp_path, env={"TTSFLEET_API_KEYS": keys})


async def test_api_key_from_the_secret_and_an_owned_network_policy(
        releases: Any, api: Api, kube: LocalKube, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    await api.namespace(NS)
    await api.create(f"/api/v1/namespaces/{NS}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tts-keys"},
        "stringData": {"keys": "key-one,key-two"}})
    async with running_operator(kube, "ttsfleet", tmp_path, monkeypatch) as rt:
        body = await api.create(TTSD, guarded())
        policy = await wait_for(lambda: api.get(POLICY), 60, "the pool's NetworkPolicy")
        owner = policy["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["uid"], owner.get("controller")) == ("TTSDeployment",
                                                                           body["metadata"]["uid"], True)
        assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/instance": "guarded",
                                                                "ttsfleet.io/pool": "h200"}
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        assert policy["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 8000}]
        assert peers(policy) == [{"namespaceSelector": {"matchLabels": GATEWAY["namespaceSelector"]}},
                                 {"namespaceSelector": {"matchLabels": MONITORING["namespaceSelector"]},
                                  "podSelector": {"matchLabels": MONITORING["podSelector"]}}]

        async def status_lists_it() -> bool:
            got = await api.get(f"{TTSD}/guarded") or {}
            return (got.get("status") or {}).get("networkPolicies") == ["guarded-h200"]
        await wait_for(status_lists_it, 60, "status.networkPolicies")

        # The pod carries the Secret's key as the server's API keys; the server then wants a key
        # for synthesis and none for probes and metrics.
        sel = "app.kubernetes.io/instance=guarded"
        pods = await wait_for(lambda: api.items(f"/api/v1/namespaces/{NS}/pods", labelSelector=sel), 60,
                              "the pool's pod")
        ref = next(e for e in pods[0]["spec"]["containers"][0]["env"] if e["name"] == "TTSFLEET_API_KEYS")
        assert ref["valueFrom"] == {"secretKeyRef": {"name": "tts-keys", "key": "keys"}}
        keys = (await resolved_env(api, pods[0]))["TTSFLEET_API_KEYS"]
        server = await asyncio.to_thread(serve_with_keys, tmp_path, keys)
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
                for open_path in ("/healthz", "/readyz", "/metrics"):
                    assert (await c.get(open_path)).status_code == 200, open_path
                body_ = {"text": "Only with a key.", "format": "pcm", "max_new_tokens": 4, "seed": 1}
                assert (await c.post("/v1/tts", json=body_)).status_code == 401
                ok = await c.post("/v1/tts", json=body_, headers={"Authorization": "Bearer key-two"})
                assert ok.status_code == 200 and ok.content
        finally:
            await asyncio.to_thread(server.stop)

        # Converged: passes of the reconcile loop leave the policy alone.
        since = audit.mark(kube)
        await asyncio.sleep(3 * rt.autoscale_interval_s + 1)
        sent = [w for w in audit.writes(audit.requests(kube, OPERATOR, since)) if "networkpolicies" in w]
        assert sent == [], sent

        # New peers are patched in; switching the policy off deletes it.
        await api.patch(f"{TTSD}/guarded", {"spec": {"networkPolicy": {"from": [GATEWAY]}}})

        async def one_peer() -> bool:
            got = await api.get(POLICY)
            return got is not None and len(peers(got)) == 1
        await wait_for(one_peer, 60, "the policy patched to one peer")
        await api.patch(f"{TTSD}/guarded", {"spec": {"networkPolicy": None}})
        await wait_for(lambda: gone(api, POLICY), 60, "the policy deleted once switched off")

        async def status_empty() -> bool:
            got = await api.get(f"{TTSD}/guarded") or {}
            return not (got.get("status") or {}).get("networkPolicies")
        await wait_for(status_empty, 60, "status.networkPolicies emptied")

        # Back on, then the TTSDeployment deleted: the garbage collector takes the policy with it.
        await api.patch(f"{TTSD}/guarded", {"spec": {"networkPolicy": {"from": [GATEWAY]}}})
        await wait_for(lambda: api.get(POLICY), 60, "the policy made again")
        assert await api.delete(f"{TTSD}/guarded") == 200
        await wait_for(lambda: gone(api, f"{TTSD}/guarded"), 60, "the TTSDeployment gone")
        await wait_for(lambda: gone(api, POLICY), 60, "the policy collected with its owner")
    assert audit.forbidden(audit.requests(kube, OPERATOR)) == []
