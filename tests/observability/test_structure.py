"""Structural checks of the generated dashboard JSON and the build command."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ttsfleet.catalog import GpuCatalog
from ttsfleet.metrics import EXTERNAL_LIST, LATENCY_BUCKETS, PREFIX, all_exposed_names, external_names
from ttsfleet.observability import build, figures
from ttsfleet.observability.definitions import all_dashboards
from ttsfleet.observability.rules import rule_groups

CAT = GpuCatalog.default()

DASHBOARDS = sorted((build.REPO_ROOT / build.DASHBOARD_DIR).glob("*.json"))
DS = "${datasource}"
PROMQL_WORDS = {
    "sum", "avg", "min", "max", "count", "by", "without", "on", "ignoring", "group_left",
    "group_right", "and", "or", "unless", "rate", "increase", "histogram_quantile", "time",
    "vector", "label_replace", "scalar", "round", "offset", "bool", "e", "Inf", "NaN",
}


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _panels(d: dict) -> list[dict]:
    out = []
    for p in d["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (strings, matchers, label lists, ranges removed)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    words = set(re.findall(r"(?<![\w.])[A-Za-z_:][\w:]*", e))
    return words - PROMQL_WORDS


def test_chart_holds_one_file_per_dashboard() -> None:
    assert {p.stem for p in DASHBOARDS} == {d.uid for d in all_dashboards(CAT)}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_panel_ids_unique_and_grid_not_overlapping(path: Path) -> None:
    panels = _panels(_load(path))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_datasource_variable_used_everywhere(path: Path) -> None:
    d = _load(path)
    variables = d["templating"]["list"]
    assert [v for v in variables if v["type"] == "datasource" and v["name"] == "datasource"
            and v["query"] == "prometheus"]
    for v in variables:
        if v["type"] == "query":
            assert v["datasource"]["uid"] == DS, v["name"]
    for p in _panels(d):
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == DS, p["title"]
        assert p["targets"], f"{p['title']} has no query"
        for t in p["targets"]:
            assert t["datasource"]["uid"] == DS, p["title"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_variables_defined_and_used(path: Path) -> None:
    d = _load(path)
    defined = {v["name"] for v in d["templating"]["list"]}
    text = json.dumps([t["expr"] for p in _panels(d) for t in p.get("targets", [])]
                      + [v["query"]["query"] for v in d["templating"]["list"] if v["type"] == "query"])
    used = set(re.findall(r"\$([A-Za-z_]\w*)", text)) - {"__rate_interval", "__range"}  # not $1
    assert used <= defined, f"undefined variables: {used - defined}"
    assert defined - {"datasource"} <= used, f"variables no query uses: {defined - used - {'datasource'}}"


def _allowed_names() -> set[str]:
    recorded = {r["record"] for g in rule_groups(CAT)["groups"] for r in g["rules"] if "record" in r}
    return all_exposed_names() | external_names() | recorded


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_every_metric_in_the_contract(path: Path) -> None:
    allowed = _allowed_names()
    for p in _panels(_load(path)):
        for t in p.get("targets", []):
            for name in metric_names(t["expr"]):
                assert name in allowed, f"{p['title']}: {name!r} is not in the metric contract"


def test_rules_use_only_contract_metrics() -> None:
    allowed = _allowed_names()
    for g in rule_groups(CAT)["groups"]:
        for r in g["rules"]:
            assert metric_names(r["expr"]) <= allowed, r


def test_metric_name_extraction_sees_names() -> None:
    names = metric_names('sum by (le) (rate(ttsfleet_x_bucket{a="b"}[5m])) / on (gpu_class) foo:bar')
    assert names == {"ttsfleet_x_bucket", "foo:bar"}


def test_slo_is_a_bucket_boundary() -> None:
    assert figures.TTFA_SLO_S in LATENCY_BUCKETS


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ttsfleet.cli", "dashboards", *args],
                          capture_output=True, text=True, timeout=120, cwd=build.REPO_ROOT)


def test_build_check_passes_on_the_chart() -> None:
    proc = _cli("build", "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_build_check_fails_on_drift(tmp_path: Path) -> None:
    assert _cli("build", "--root", str(tmp_path)).returncode == 0
    assert _cli("build", "--check", "--root", str(tmp_path)).returncode == 0
    victim = tmp_path / build.DASHBOARD_DIR / "ttsfleet-fleet.json"
    victim.write_text(victim.read_text().replace("Allocated", "Allocatd"))
    (tmp_path / build.DASHBOARD_DIR / "old.json").write_text("{}")
    proc = _cli("build", "--check", "--root", str(tmp_path))
    assert proc.returncode == 1
    assert "ttsfleet-fleet.json" in proc.stderr and "old.json" in proc.stderr
    shutil.rmtree(tmp_path / "charts")


def test_build_takes_the_runs_catalog(tmp_path: Path) -> None:
    """A class added by a catalog file gets its capacity into the load rules (without it, the
    class's load-weighted utilization reads 0); the built-in files stay as they are."""
    from tests.catalogs import B200_YAML

    (tmp_path / "b200.yaml").write_text(B200_YAML)
    assert _cli("build", "--root", str(tmp_path), "--catalog", str(tmp_path / "b200.yaml")).returncode == 0
    rules = (tmp_path / build.RULES_PATH).read_text()
    shipped = (build.REPO_ROOT / build.RULES_PATH).read_text()
    assert '"gpu_class", "b200"' in rules and '"gpu_class", "b200"' not in shipped
    assert _cli("build", "--check", "--root", str(tmp_path)).returncode == 1  # built-in != b200 files
    bad = _cli("build", "--root", str(tmp_path), "--catalog", str(tmp_path / "missing.yaml"))
    assert bad.returncode == 2 and bad.stderr.startswith("error: catalog") and bad.stderr.count("\n") == 1


def test_external_names_are_apart_from_ttsfleets_own() -> None:
    """Other exporters' names never carry the ttsfleet prefix or shadow a contract name."""
    assert external_names().isdisjoint(all_exposed_names())
    for m in EXTERNAL_LIST:
        assert not m.name.startswith(PREFIX) and m.source and m.labels
    used = {n for d in DASHBOARDS for p in _panels(_load(d)) for t in p.get("targets", [])
            for n in metric_names(t["expr"])}
    assert external_names() <= used, "an external name no panel uses"
