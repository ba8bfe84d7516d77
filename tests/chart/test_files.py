"""Dashboards (dashboards/*.json → ConfigMaps) and rules (rules/ttsfleet-rules.yaml →
PrometheusRule) render whether those folders are missing, empty or filled."""

from __future__ import annotations

import json
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

ON = {"prometheusRule": {"enabled": True}, "dashboards": {"enabled": True}}

RULES = {"groups": [
    {"name": "ttsfleet.recording", "interval": "30s", "rules": [
        {"record": "ttsfleet:in_flight:sum", "expr": "sum by (pool) (ttsfleet_in_flight_requests)"}]},
    {"name": "ttsfleet.alerts", "rules": [
        {"alert": "TTSFleetTTFAHigh", "expr": "histogram_quantile(0.99, sum by (le) "
                                              "(rate(ttsfleet_ttfa_seconds_bucket[5m]))) > 0.5",
         "for": "5m", "labels": {"severity": "warning"},
         "annotations": {"summary": "p99 time to first audio {{ $value }}s in {{ $labels.pool }}"}}]},
]}


def dashboard(title: str, uid: str) -> dict:
    return {"title": title, "uid": uid, "schemaVersion": 39,
            "panels": [{"id": 1, "type": "timeseries", "title": "in flight",
                        "targets": [{"expr": "sum(ttsfleet_in_flight_requests)"}]}]}


def configmaps(docs):
    return [d for d in docs if d["kind"] == "ConfigMap"]


def rules_of(docs):
    return [d for d in docs if d["kind"] == "PrometheusRule"]


@pytest.mark.parametrize("layout", ["missing", "empty"])
def test_missing_or_empty_folders_render_nothing_extra(chart_copy: Path, lib, layout):
    if layout == "empty":
        (chart_copy / "dashboards").mkdir()
        (chart_copy / "rules").mkdir()
        (chart_copy / "rules" / "ttsfleet-rules.yaml").write_text("# nothing yet\n")
    docs = lib.render_dir(chart_copy, ON)
    assert configmaps(docs) == [] and rules_of(docs) == []
    report = helm.lint(chart_copy, ON, strict=True, kube_version=lib.KUBE_VERSION + ".0")
    assert report["errors"] == [] and all(m["severity"] < 2 for m in report["messages"]), report


def test_filled_folders_become_configmaps_and_a_prometheusrule(chart_copy: Path, lib):
    (chart_copy / "dashboards").mkdir()
    boards = {"overview.json": dashboard("TTS overview", "tts-overview"),
              "Fill_Jobs.json": dashboard("Fill jobs", "tts-fill")}
    for name, body in boards.items():
        (chart_copy / "dashboards" / name).write_text(json.dumps(body, indent=2))
    (chart_copy / "dashboards" / "README.md").write_text("not a dashboard")
    (chart_copy / "rules").mkdir()
    (chart_copy / "rules" / "ttsfleet-rules.yaml").write_text(yaml.safe_dump(RULES, sort_keys=False))

    values = lib.deep_merge(ON, {"prometheusRule": {"labels": {"release": "kps"}},
                                 "dashboards": {"namespace": "monitoring", "folder": "TTS"}})
    docs = lib.render_dir(chart_copy, values)
    cms = {d["metadata"]["name"]: d for d in configmaps(docs)}
    assert set(cms) == {"ttsfleet-dashboard-overview", "ttsfleet-dashboard-fill-jobs"}
    for cm in cms.values():
        kubernetes_validate.validate(lib.strip(cm), lib.KUBE_VERSION, strict=True)
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"]["grafana_folder"] == "TTS"
        assert cm["metadata"]["namespace"] == "monitoring"
    (key, text), = cms["ttsfleet-dashboard-fill-jobs"]["data"].items()
    assert key == "fill-jobs.json"
    assert json.loads(text) == boards["Fill_Jobs.json"]  # byte-faithful JSON, not re-serialized

    (rule,) = rules_of(docs)
    lib.check_monitoring(lib.strip(rule))
    assert rule["spec"]["groups"] == RULES["groups"]  # {{ $labels }} templates pass through
    assert rule["metadata"]["labels"]["release"] == "kps"

    off = lib.render_dir(chart_copy, {"dashboards": {"enabled": False}})
    assert configmaps(off) == [] and rules_of(off) == []  # prometheusRule is off by default

    label = lib.render_dir(chart_copy, {"dashboards": {"label": "grafana.com/dashboard",
                                                       "labelValue": "ttsfleet"}})
    assert all(c["metadata"]["labels"]["grafana.com/dashboard"] == "ttsfleet" for c in configmaps(label))


@pytest.mark.parametrize("files, message", [
    ({"dashboards/broken.json": "{\"title\": "}, "not valid JSON"),
    ({"dashboards/a_b.json": "{}", "dashboards/a-b.json": "{}"}, "same ConfigMap name"),
    ({"rules/ttsfleet-rules.yaml": "groups: {name: x}\n"}, "must be a list"),
    ({"rules/ttsfleet-rules.yaml": "groups: [\n"}, "not valid YAML"),
])
def test_broken_files_fail_with_a_clear_message(chart_copy: Path, lib, files, message):
    for rel, text in files.items():
        (chart_copy / rel).parent.mkdir(exist_ok=True)
        (chart_copy / rel).write_text(text)
    with helm.Chart.load(chart_copy) as c, pytest.raises(helm.HelmRenderError, match=message):
        c.render(ON, name=lib.RELEASE, namespace=lib.NAMESPACE)


def test_the_shipped_dashboards_and_rules_render(render_docs, lib):
    """Whatever the observability engineer has put into the chart so far renders and validates."""
    shipped = sorted((lib.CHART_DIR / "dashboards").glob("*.json"))
    docs = render_docs(ON)
    cms = configmaps(docs)
    assert len(cms) == len(shipped)
    for cm in cms:
        kubernetes_validate.validate(lib.strip(cm), lib.KUBE_VERSION, strict=True)
        (text,) = cm["data"].values()
        assert isinstance(json.loads(text), dict)
        assert len(yaml.safe_dump(lib.strip(cm)).encode()) < 1_000_000  # ConfigMap size limit
    rules_file = lib.CHART_DIR / "rules" / "ttsfleet-rules.yaml"
    has_groups = rules_file.exists() and bool((yaml.safe_load(rules_file.read_text()) or {}).get("groups"))
    assert len(rules_of(docs)) == int(has_groups)
    for rule in rules_of(docs):
        lib.check_monitoring(lib.strip(rule))
