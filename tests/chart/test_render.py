"""The chart rendered and linted with the real Helm SDK; manifests strictly validated for 1.31."""

from __future__ import annotations

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest

MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def test_representative_values_render_and_validate_strictly(render_docs, lib, value_set):
    name, values = value_set
    docs = render_docs(values)
    assert docs, "nothing rendered"
    for doc in docs:
        if doc["kind"] in MONITORING_KINDS:
            continue  # not built-in: checked structurally in test_monitoring_*
        kubernetes_validate.validate(lib.strip(doc), lib.KUBE_VERSION, strict=True)
    kinds = sorted(d["kind"] for d in docs)
    if name == "minimal":
        assert kinds == ["Deployment"]
    else:
        for kind in ("Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service"):
            assert kind in kinds, f"{kind} missing from {name}"
        assert kinds.count("PriorityClass") == 3


def test_strict_validation_would_catch_an_unknown_field(render_docs, lib):
    """The validator the tests lean on really is strict (so a typo in a template fails)."""
    deployment = lib.strip(lib.one(render_docs(None), "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, lib.KUBE_VERSION, strict=True)


def test_helm_lint_strict_is_clean(lib, value_set):
    name, values = value_set
    report = helm.lint(lib.CHART_DIR, values, strict=True, kube_version=lib.KUBE_VERSION + ".0",
                       namespace=lib.NAMESPACE)
    assert report["errors"] == [], report
    serious = [m for m in report["messages"] if m["severity"] >= 2]
    assert serious == [], serious


def test_namespaced_objects_land_in_the_release_namespace(render_docs, lib, value_set):
    _, values = value_set
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "PriorityClass"}
    watched = set(values.get("operator", {}).get("watchNamespaces", []))
    dashboards_ns = values.get("dashboards", {}).get("namespace") or lib.NAMESPACE
    for doc in render_docs(values):
        ns = doc["metadata"].get("namespace")
        if doc["kind"] in cluster_scoped:
            assert ns is None, doc["metadata"]
        elif doc["kind"] in ("Role", "RoleBinding"):
            assert ns in watched
        elif doc["kind"] == "ConfigMap" and doc["metadata"]["name"].count("-dashboard-"):
            assert ns == dashboards_ns
        else:
            assert ns == lib.NAMESPACE, (doc["kind"], ns)


def test_selectors_services_and_bindings_fit_together(render_docs, lib):
    docs = render_docs(lib.FULL_VALUES)
    dep = lib.one(docs, "Deployment")
    pod = dep["spec"]["template"]
    selector = dep["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    svc = lib.one(docs, "Service")
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    port_names = {p["name"] for p in pod["spec"]["containers"][0]["ports"]}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= port_names
    sm = lib.one(docs, "ServiceMonitor")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert {e["port"] for e in sm["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}
    sa = lib.one(docs, "ServiceAccount")["metadata"]["name"]
    assert pod["spec"]["serviceAccountName"] == sa
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        for binding in lib.by_kind(docs, kind):
            assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa,
                                            "namespace": lib.NAMESPACE}]
            roles = lib.by_kind(docs, binding["roleRef"]["kind"])
            assert any(r["metadata"]["name"] == binding["roleRef"]["name"]
                       and r["metadata"].get("namespace") == binding["metadata"].get("namespace")
                       for r in roles)


def test_operator_container_follows_the_agreed_contract(render_docs):
    dep = next(d for d in render_docs(None) if d["kind"] == "Deployment")
    assert dep["spec"]["strategy"]["type"] == "Recreate"
    assert dep["spec"]["replicas"] == 1
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["command"] + c["args"] == ["ttsfleet", "operator", "run", "--metrics-port", "8080",
                                        "--health-port", "8081"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert "TTSFLEET_PROMETHEUS_URL" not in env  # optional: absent unless configured
    assert c["image"] == "ghcr.io/ttsfleet/ttsfleet-operator:0.1.0"


def test_operator_options_reach_the_container(render_docs, lib):
    dep = lib.one(render_docs(lib.FULL_VALUES), "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["args"][6:] == ["--namespace", "tts-prod", "--namespace", "tts-staging", "--verbose"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["TTSFLEET_PROMETHEUS_URL"] == "http://prometheus-operated.monitoring.svc:9090"
    assert env["TTSFLEET_LOG_FORMAT"] == "json"
    assert c["image"] == "registry.example.com/ttsfleet/operator@sha256:" + "a" * 64
    assert dep["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    custom = render_docs({"operator": {"metricsPort": 9100, "healthPort": 9101}})
    (c2,) = lib.one(custom, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert c2["args"][:6] == ["operator", "run", "--metrics-port", "9100", "--health-port", "9101"]
    assert ports != {p["name"]: p["containerPort"] for p in c2["ports"]}
    assert lib.one(custom, "Service")["spec"]["ports"][0]["port"] == 9100


def test_priority_classes_order_and_integer_values(render_docs, lib):
    for values in ({}, lib.FULL_VALUES):
        pcs = {d["metadata"]["labels"]["ttsfleet.io/priority-tier"]: d
               for d in lib.by_kind(render_docs(values), "PriorityClass")}
        assert set(pcs) == {"inference", "training", "fill"}
        for pc in pcs.values():
            assert type(pc["value"]) is int  # 1000000 must not come out as 1e+06
            assert pc["globalDefault"] is False
        assert pcs["inference"]["value"] > pcs["training"]["value"] > pcs["fill"]["value"]
        assert pcs["fill"]["preemptionPolicy"] == "Never"
        assert {p["metadata"]["name"] for p in pcs.values()} == {
            "ttsfleet-inference", "ttsfleet-training", "ttsfleet-fill"}
    big = lib.by_kind(render_docs(lib.FULL_VALUES), "PriorityClass")
    assert max(p["value"] for p in big) == 1000000000


@pytest.mark.parametrize("values, message", [
    ({"priorityClasses": {"inference": {"value": 100}, "training": {"value": 100}}},
     "inference.value"),
    ({"priorityClasses": {"training": {"value": -5000}}}, "training.value"),
    ({"operator": {"metricsPort": 8081}}, "metricsPort and healthPort"),
    ({"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}},
     "metrics.service.enabled"),
])
def test_inconsistent_values_fail_the_render(render_raw, values, message):
    with pytest.raises(helm.HelmRenderError, match=message):
        render_raw(values)


def test_notes_render_for_every_value_set(render_raw, value_set):
    _, values = value_set
    notes = next(v for k, v in render_raw(values).items() if k.endswith("NOTES.txt"))
    assert "ttsfleet.io/gpu-class=h200" in notes
    assert "rollout status deployment/" in notes


# --- monitoring kinds: not built into Kubernetes, checked structurally (conftest) ------------

def test_monitoring_is_off_by_default(render_docs):
    assert not [d for d in render_docs(None) if d["kind"] in MONITORING_KINDS]


def test_monitoring_resources_are_well_formed(render_docs, lib):
    docs = render_docs(lib.FULL_VALUES)
    sm, pm = lib.one(docs, "ServiceMonitor"), lib.one(docs, "PodMonitor")
    for doc in (sm, pm):
        lib.check_monitoring(lib.strip(doc))
        assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["tts-prod"]}
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "http"
    assert pm["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/managed-by": "ttsfleet-operator", "ttsfleet.io/workload": "inference"}
    any_ns = lib.one(render_docs({"metrics": {"podMonitor": {"enabled": True}}}), "PodMonitor")
    assert any_ns["spec"]["namespaceSelector"] == {"any": True}


def test_monitoring_schema_rejects_a_misspelt_field(render_docs, lib):
    sm = lib.strip(lib.one(render_docs(lib.FULL_VALUES), "ServiceMonitor"))
    sm["spec"]["endpoints"][0]["scrape_timeout"] = "10s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(sm, lib.MONITORING_SCHEMAS["ServiceMonitor"])


def test_packaged_chart_renders_the_same(lib, tmp_path, render_raw, chart):
    """`helm package` keeps everything the templates read (.helmignore drops nothing needed)."""
    archive = helm.package(lib.CHART_DIR, destination=tmp_path)
    values = {"prometheusRule": {"enabled": True}}
    with helm.Chart.load(archive) as packaged:
        assert packaged.render(values, name=lib.RELEASE, namespace=lib.NAMESPACE,
                               is_install=True) == render_raw(values)
        assert {c["name"] for c in packaged.crds} == {c["name"] for c in chart.crds}


def test_leader_election_reaches_the_container(render_docs, render_raw, lib):
    docs = render_docs({"operator": {"replicas": 2,
                                     "leaderElection": {"enabled": True, "leaseDurationSeconds": 20}}})
    dep = lib.one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"]["type"] == "RollingUpdate"  # only the Lease holder acts
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["args"][6:] == ["--leader-elect", "--lease-name", f"{lib.RELEASE}-operator",
                             "--lease-namespace", lib.NAMESPACE, "--lease-duration", "20",
                             "--renew-deadline", "10", "--retry-period", "2"]
    assert {"POD_NAME", "POD_NAMESPACE"} <= {e["name"] for e in c["env"]}  # identity, Lease namespace
    with pytest.raises(Exception, match="renewDeadlineSeconds < leaseDurationSeconds"):
        render_raw({"operator": {"leaderElection": {"enabled": True, "leaseDurationSeconds": 10}}})


def test_catalog_value_reaches_the_operator(render_docs, lib, tmp_path):
    """`catalog` (a catalog file's content) becomes a ConfigMap the operator reads as `--catalog`,
    at the path the serving door names; the file in it loads as the same catalog."""
    import yaml

    from tests.catalogs import B200_YAML
    from ttsfleet.catalog import GpuCatalog
    from ttsfleet.contracts.serving import CATALOG_DIR, CATALOG_KEY, CATALOG_PATH

    def catalog_maps(docs):
        return [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-catalog")]

    assert not catalog_maps(render_docs(None))  # the built-in catalog: nothing to hand over
    docs = render_docs({"catalog": yaml.safe_load(B200_YAML)})
    (cm,) = catalog_maps(docs)
    dep = lib.one(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["args"][c["args"].index("--catalog") + 1] == CATALOG_PATH
    mount = next(m for m in c["volumeMounts"] if m["name"] == "catalog")
    volume = next(v for v in pod["volumes"] if v["name"] == "catalog")
    assert (mount["mountPath"], volume["configMap"]["name"]) == (CATALOG_DIR, cm["metadata"]["name"])
    (tmp_path / CATALOG_KEY).write_text(cm["data"][CATALOG_KEY])
    (tmp_path / "b200.yaml").write_text(B200_YAML)
    assert GpuCatalog.load(tmp_path / CATALOG_KEY) == GpuCatalog.load(tmp_path / "b200.yaml")
    assert "ttsfleet.io/catalog-sha256" in dep["spec"]["template"]["metadata"]["annotations"]
