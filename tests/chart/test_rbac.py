"""The chart's RBAC is exactly operator/RBAC.md's tables: nothing missing, nothing more, and the
namespaced mode keeps its write rights inside its namespaces. (That the tables are the calls the
code makes is tested on a real API server: tests/operator/kube/test_rbac_from_audit.py.)"""

from __future__ import annotations

import re

import pytest

# RBAC.md rows that the chart deliberately does not grant, with the reason (none today).
NOT_GRANTED: set[tuple[str, str]] = set()
#: What the ClusterRole keeps in namespaced mode: cluster-wide reads, listed once then watched.
CLUSTER_WIDE = {("", r, v) for r in ("nodes", "pods") for v in ("list", "watch")}
#: RBAC.md's leader-election table: a Role in the release namespace, only with leaderElection on.
LEADER = {("coordination.k8s.io", "leases", v) for v in ("create", "get", "patch")}


def documented(lib) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) triples from the table in operator/RBAC.md."""
    path = lib.REPO / "operator" / "RBAC.md"
    if not path.exists():
        pytest.fail("operator/RBAC.md is missing: the chart's RBAC is built from it")
    triples = set()
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        group = re.findall(r"`([^`]*)`", cells[0])[0].strip('"')
        resources = re.findall(r"`([^`]+)`", cells[1])
        verbs = [v.strip() for v in cells[2].split(",") if v.strip()]
        assert resources and verbs, line
        triples |= {(group, r, v) for r in resources for v in verbs}
    assert len(triples) > 20, "RBAC.md table not recognised"
    return triples


def granted(rules) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


def test_cluster_wide_rbac_matches_the_operator_contract(render_docs, lib):
    docs = render_docs(None)
    (role,) = lib.by_kind(docs, "ClusterRole")
    have = granted(role["rules"])
    want = {t for t in documented(lib) if (t[0], t[1]) not in NOT_GRANTED} - LEADER
    assert want - have == set(), "permissions the operator needs but the chart does not grant"
    assert have - want == set(), "permissions the chart grants beyond operator/RBAC.md"
    assert not lib.by_kind(docs, "Role")


def test_no_wildcards_secrets_or_escalation(render_docs, lib):
    for values in ({}, lib.FULL_VALUES):
        for kind in ("ClusterRole", "Role"):
            for role in lib.by_kind(render_docs(values), kind):
                for g, r, v in granted(role["rules"]):
                    assert "*" not in (g, r, v)
                    assert r not in {"secrets", "clusterroles", "roles",
                                     "clusterrolebindings", "rolebindings", "serviceaccounts/token"}
                    assert v not in {"escalate", "bind", "impersonate", "deletecollection"}
                    # the catalog ConfigMaps are written by name: no reading every ConfigMap
                    assert r != "configmaps" or v in {"get", "create", "patch", "delete"}, (g, r, v)
                    # update only where admission checks it (blockOwnerDeletion), never on objects
                    assert v != "update" or r.endswith("/finalizers"), (g, r, v)


def test_namespaced_mode_confines_namespaced_rights(render_docs, lib):
    docs = render_docs({"operator": {"watchNamespaces": ["tts-a", "tts-b"]}})
    (cluster,) = lib.by_kind(docs, "ClusterRole")
    assert granted(cluster["rules"]) <= CLUSTER_WIDE
    assert ("", "pods", "list") in granted(cluster["rules"]), "the fill controller lists every pod"
    roles = lib.by_kind(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["tts-a", "tts-b"]
    cluster_wide = granted(lib.one(render_docs(None), "ClusterRole")["rules"])
    for role in roles:
        assert granted(role["rules"]) | granted(cluster["rules"]) == cluster_wide
    bindings = lib.by_kind(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["tts-a", "tts-b"]


def test_leader_election_is_opt_in_and_confined_to_its_lease(render_docs, lib):
    assert documented(lib) >= LEADER
    assert not lib.by_kind(render_docs(None), "Role")
    docs = render_docs({"operator": {"replicas": 2, "leaderElection": {"enabled": True}}})
    (role,) = lib.by_kind(docs, "Role")
    assert role["metadata"]["namespace"] == lib.NAMESPACE
    assert granted(role["rules"]) == LEADER
    for rule in role["rules"]:  # get/patch only the one Lease; create cannot name it
        names = None if rule["verbs"] == ["create"] else [f"{lib.RELEASE}-operator"]
        assert rule.get("resourceNames") == names, rule
    cluster = granted(lib.one(docs, "ClusterRole")["rules"])
    assert cluster == granted(lib.one(render_docs(None), "ClusterRole")["rules"])
    (binding,) = lib.by_kind(docs, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
