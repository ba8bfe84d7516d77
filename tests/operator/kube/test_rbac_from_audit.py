"""Least privilege checked against the calls the operator really makes, in both modes.

The API server's audit log records every request of the operator's ServiceAccounts during the
e2e tests of this session (cluster-wide: test_e2e_*; namespaced: test_namespaced). Each release's
RBAC, read back from the server as Helm installed it, must allow every call (no 403) and grant
nothing that was not used, except the finalizers rule that only admission checks. Runs after the
e2e modules (file order); skips its "unused" half when they did not run in this session.
"""

from __future__ import annotations

from typing import Any

import pytest
from ttsfleet.devtools.localkube import LocalKube

from . import audit
from .conftest import RELEASES, Api

#: Checked by OwnerReferencesPermissionEnforcement when a child sets blockOwnerDeletion; never a
#: request of its own (defect 2 of issue 17: without it every child create is forbidden).
ADMISSION_ONLY = {("ttsfleet.io", "ttsdeployments/finalizers", "update"),
                  ("ttsfleet.io", "filljobs/finalizers", "update")}
#: Calls only the full scenario makes: without them in the log the e2e modules did not run.
SCENARIO = {"ttsfleet": {("", "pods", "create"), ("apps", "deployments", "create"), ("", "pods", "patch"),
                         ("coordination.k8s.io", "leases", "create")},  # test_peering
            "tts-ns": {("", "pods", "create"), ("apps", "deployments", "create")}}
SA = {"ttsfleet": ("ttsfleet", "ttsfleet"), "tts-ns": ("tts-ops", "tts-ns-ttsfleet")}


def triples(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule.get("apiGroups", []) for r in rule.get("resources", [])
            for v in rule.get("verbs", [])}


async def granted(api: Api, release: str) -> set[tuple[str, str, str]]:
    """What the release's ClusterRole and Roles grant, read back from the API server."""
    name = "ttsfleet-operator" if release == "ttsfleet" else f"{release}-ttsfleet-operator"
    role = await api.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}")
    assert role is not None, name
    have = triples(role["rules"])
    for ns in RELEASES[release]["values"]["operator"].get("watchNamespaces", []):
        r = await api.get(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles/{name}")
        assert r is not None, f"{ns}/{name}"
        have |= triples(r["rules"])
    if RELEASES[release]["values"]["operator"].get("leaderElection", {}).get("enabled"):
        ns = RELEASES[release]["namespace"]
        r = await api.get(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles/{name}-leader")
        assert r is not None, f"{ns}/{name}-leader"
        have |= triples(r["rules"])
    return have


def used_by(kube: LocalKube, release: str) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) of the release's resource requests (discovery left out)."""
    calls = audit.requests(kube, audit.sa_user(*SA[release]))
    return {audit.call(e)[:3] for e in calls if e.get("objectRef")}


@pytest.mark.parametrize("release", sorted(SA))
async def test_every_call_is_granted(releases: Any, api: Api, kube: LocalKube, release: str) -> None:
    calls = audit.requests(kube, audit.sa_user(*SA[release]))
    if not calls:
        pytest.skip(f"no e2e test ran the {release} operator in this session")
    assert audit.forbidden(calls) == []
    assert used_by(kube, release) - await granted(api, release) == set(), "calls the chart does not grant"


async def test_every_grant_is_used(releases: Any, api: Api, kube: LocalKube) -> None:
    """Both modes render the same namespaced rules (a Role per namespace, or the ClusterRole), so
    a rule is needed when the code makes that call in either mode."""
    used = {r: used_by(kube, r) for r in SA}
    if not all(SCENARIO[r] <= used[r] for r in SA):
        pytest.skip("the e2e scenarios of both modes did not run in full in this session")
    union = set().union(*used.values())
    for release in SA:
        unused = await granted(api, release) - union - ADMISSION_ONLY
        assert unused == set(), f"{release}: grants no call of the operator used"
