"""The generated rules file passes promtool, and promtool unit tests cover every rule."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ttsfleet.catalog import GpuCatalog
from ttsfleet.observability import build
from ttsfleet.observability.rules import render_yaml, rule_groups

CAT = GpuCatalog.default()

HERE = Path(__file__).parent
UNIT_TESTS = HERE / "promtool" / "ttsfleet-rules.test.yaml"
CHART_RULES = build.REPO_ROOT / build.RULES_PATH

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool")


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_chart_rules_file_is_the_generated_one() -> None:
    assert CHART_RULES.read_text() == render_yaml(CAT)


def test_promtool_check_rules() -> None:
    proc = _promtool("check", "rules", str(CHART_RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_promtool_unit_tests_pass() -> None:
    proc = _promtool("test", "rules", UNIT_TESTS.name, cwd=UNIT_TESTS.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_rule_has_a_unit_test() -> None:
    tests = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    exprs = " ".join(t["expr"] for g in tests for t in g.get("promql_expr_test", []))
    alerts = {t["alertname"] for g in tests for t in g.get("alert_rule_test", [])
              if t.get("exp_alerts")}  # a firing case, not only a silent one
    for group in rule_groups(CAT)["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                assert rule["record"] in exprs, f"recording rule {rule['record']} has no unit test"
            else:
                assert rule["alert"] in alerts, f"alert {rule['alert']} has no firing unit test"


def test_unit_tests_fail_on_a_broken_rule(tmp_path: Path) -> None:
    """Mutate one threshold in a copy of the rules: promtool's unit tests must notice."""
    rules = yaml.safe_load(render_yaml(CAT))
    for g in rules["groups"]:
        for r in g["rules"]:
            if r.get("alert") == "TTSFleetFillNotCheckpointing":
                r["expr"] = r["expr"].replace("> 300", "> 3000")
    target = tmp_path / "charts" / "ttsfleet" / "rules" / "ttsfleet-rules.yaml"
    target.parent.mkdir(parents=True)
    target.write_text(yaml.safe_dump(rules))
    dest = tmp_path / "tests" / "observability" / "promtool"
    dest.mkdir(parents=True)
    shutil.copy(UNIT_TESTS, dest)
    proc = _promtool("test", "rules", UNIT_TESTS.name, cwd=dest)
    assert proc.returncode != 0
    assert "TTSFleetFillNotCheckpointing" in proc.stdout + proc.stderr
