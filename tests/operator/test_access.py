"""Who may call a pool (``spec.apiKeySecret``, ``spec.networkPolicy``), as pure functions: the env
from the Secret, the NetworkPolicy per pool, both strictly valid Kubernetes 1.31 objects. The real
control plane's side (accepted, owned, switched off) is tests/operator/kube/test_e2e_access.py."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from pydantic import ValidationError
from ttsfleet.operator.desired import desired_objects
from ttsfleet.operator.models import TTSDeploymentSpec

from tests.operator.helpers import ttsd
from ttsfleet.catalog import GpuCatalog

CAT = GpuCatalog.default()
PEERS = [{"namespaceSelector": {"kubernetes.io/metadata.name": "gateway"}},
         {"namespaceSelector": {"kubernetes.io/metadata.name": "monitoring"},
          "podSelector": {"app.kubernetes.io/name": "prometheus"}}]


def spec(**kw: Any) -> TTSDeploymentSpec:
    return TTSDeploymentSpec.model_validate(ttsd(**kw)["spec"], context={"catalog": CAT})


def kinds(s: TTSDeploymentSpec, kind: str) -> dict[str, dict[str, Any]]:
    out = {}
    for o in desired_objects("voice", s, CAT):
        o["metadata"]["namespace"] = "ns1"
        if o["kind"] == kind:
            out[o["metadata"]["name"]] = o
    return out


def test_the_api_key_comes_from_the_secret_and_wins_over_spec_env():
    s = spec(apiKeySecret={"name": "tts-keys"}, env=[{"name": "TTSFLEET_API_KEYS", "value": "leaked"}])
    for dep in kinds(s, "Deployment").values():
        kubernetes_validate.validate(dep, "1.31", strict=True)
        env = dep["spec"]["template"]["spec"]["containers"][0]["env"]
        keys = [e for e in env if e["name"] == "TTSFLEET_API_KEYS"]
        assert keys == [{"name": "TTSFLEET_API_KEYS",
                         "valueFrom": {"secretKeyRef": {"name": "tts-keys", "key": "api-keys"}}}]
    assert "leaked" not in str(kinds(s, "Deployment"))
    no_secret = kinds(spec(), "Deployment")["voice-h200"]["spec"]["template"]["spec"]["containers"][0]
    assert all(e["name"] != "TTSFLEET_API_KEYS" for e in no_secret["env"])


def test_a_network_policy_per_pool_admits_only_the_named_peers_on_the_serving_port():
    s = spec(networkPolicy={"from": PEERS})
    policies = kinds(s, "NetworkPolicy")
    assert sorted(policies) == ["voice-h200", "voice-rtx5090"]
    services = kinds(s, "Service")
    for name, pol in policies.items():
        kubernetes_validate.validate(pol, "1.31", strict=True)
        # the same pods as the pool's Service, and nothing else
        assert pol["spec"]["podSelector"]["matchLabels"] == services[name]["spec"]["selector"]
        assert pol["spec"]["policyTypes"] == ["Ingress"]
        (rule,) = pol["spec"]["ingress"]
        assert rule["ports"] == [{"protocol": "TCP", "port": 8000}]
        assert rule["from"] == [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}}},
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
             "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    assert kinds(spec(), "NetworkPolicy") == {}  # off unless asked for


@pytest.mark.parametrize("bad", [
    {"networkPolicy": {"from": []}},
    {"networkPolicy": {"from": [{}]}},
    {"networkPolicy": {"from": [{"podSelector": {"not a label": "x"}}]}},
    {"apiKeySecret": {"name": "Not_A_Name"}},
    {"apiKeySecret": {"name": "keys", "key": "a/b"}},
])
def test_bad_access_specs_are_refused(bad):
    with pytest.raises(ValidationError):
        spec(**bad)


def test_the_server_requires_the_keys_the_secret_holds():
    """What the kubelet does with the env (the Secret's value in TTSFLEET_API_KEYS) is what the
    server reads: those keys, nothing else."""
    from ttsfleet.inference.serve_config import ServeConfig

    env = kinds(spec(apiKeySecret={"name": "tts-keys", "key": "k"}), "Deployment")["voice-h200"]
    secret = {"tts-keys": {"k": "key-a, key-b"}}
    resolved = {}
    for e in env["spec"]["template"]["spec"]["containers"][0]["env"]:
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        resolved[e["name"]] = secret[ref["name"]][ref["key"]] if ref else e.get("value", "")
    resolved.pop("TTSFLEET_CATALOG")  # a file mounted in the pod: tests/doors/test_serving_door.py
    cfg = ServeConfig.from_env({**resolved, "TTSFLEET_CHECKPOINT": "tiny"})
    assert cfg.api_keys == ("key-a", "key-b")
