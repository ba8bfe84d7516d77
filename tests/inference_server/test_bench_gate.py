"""The performance regression gate (``ttsfleet bench check``) and the in-process engine bench on CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ttsfleet.inference.bench_engine import regressions


def _report(points: dict[int, float]) -> dict:
    return {"points": [{"concurrency": c, "frames_per_s": f, "ttfa_s": 0.1} for c, f in points.items()]}


def test_a_drop_beyond_the_tolerance_is_a_regression() -> None:
    base = _report({1: 100.0, 64: 8000.0})
    assert regressions(base, _report({1: 96.0, 64: 7700.0})) == []
    found = regressions(base, _report({1: 100.0, 64: 7500.0}))
    assert len(found) == 1 and found[0].startswith("c=64") and "6.2%" in found[0]


def test_a_missing_concurrency_fails_the_gate() -> None:
    found = regressions(_report({1: 100.0, 64: 8000.0}), _report({1: 120.0}))
    assert found == ["c=64: not measured (baseline 8000.0 frames/s)"]


def test_bad_gate_inputs_are_rejected() -> None:
    with pytest.raises(ValueError, match="tolerance"):
        regressions(_report({1: 1.0}), _report({1: 1.0}), tolerance=1.5)
    with pytest.raises(ValueError, match="no points"):
        regressions({"points": []}, _report({1: 1.0}))


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ttsfleet.cli", "bench", *args], capture_output=True,
                          text=True, timeout=300)


def test_check_cli_exit_codes(tmp_path: Path) -> None:
    base, good, bad = tmp_path / "base.json", tmp_path / "good.json", tmp_path / "bad.json"
    base.write_text(json.dumps(_report({1: 100.0, 8: 700.0})))
    good.write_text(json.dumps(_report({1: 101.0, 8: 690.0})))
    bad.write_text(json.dumps(_report({1: 101.0, 8: 600.0})))
    assert _cli("check", str(base), str(good)).returncode == 0
    r = _cli("check", str(base), str(bad))
    assert r.returncode == 1 and "REGRESSION c=8" in r.stdout
    r = _cli("check", str(base), str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "Traceback" not in r.stderr and "cannot read bench report" in r.stderr


def test_engine_bench_on_cpu_reports_fixed_length_requests(tmp_path: Path) -> None:
    """The tiny model, codes-only: every request decodes exactly --frames frames (EOS ignored)."""
    r = _cli("engine", "--checkpoint", "tiny", "--codec", "none", "--device", "cpu", "--concurrency", "1,3",
             "--prompt-tokens", "12", "--frames", "6", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads((tmp_path / "bench.json").read_text())
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 3]
    for lv in report["levels"]:
        assert lv["errors"] == 0 and lv["requests"] == max(2 * lv["concurrency"], 4)
        # frames/s counts exactly requests x frames decoded over the wall time
        assert lv["frames_per_s"] * lv["wall_s"] == pytest.approx(lv["requests"] * 6, rel=1e-6)
    assert [p["concurrency"] for p in report["points"]] == [1, 3]
    assert (tmp_path / "bench.csv").read_text().splitlines()[0].startswith("concurrency,frames_per_s")
    assert (tmp_path / "bench.png").stat().st_size > 1000
