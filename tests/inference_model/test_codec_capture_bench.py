"""The codec start-up capture benchmark (``benchmarks/inference_h200/codec_capture.py``), smoke-run on
CPU with the tiny codec: every configuration runs in its own process and gives a row (capture time,
push times), a failing one gives an error row without losing the others, a bad configuration is one
line and exit 2, and the configuration grammar parses what the device calls pass."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ttsfleet.inference.codec_batch import CUDNN_CANDIDATES, use_conv_autotuner

from tests.scripts import load_script

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "inference_h200" / "codec_capture.py"


def _module():  # noqa: ANN202
    return load_script("benchmarks/inference_h200/codec_capture.py")


def test_configurations_parse_into_the_settings_the_child_applies() -> None:
    mod = _module()
    cfg = mod.parse_config("cl:limit=2+frames=4")
    assert (cfg["layout"], cfg["limit"], cfg["frames"], cfg["benchmark"]) == ("channels-last", 2, 4, True)
    assert mod.parse_config("ncl")["layout"] == "ncl"
    assert mod.parse_config("cl")["limit"] == CUDNN_CANDIDATES  # the server's setting unless named
    assert mod.parse_config("cl:benchmark=0")["benchmark"] is False
    for bad in ("nhwc:limit=2", "cl:limit=two", "cl:warps=4"):
        with pytest.raises(ValueError, match="config"):
            mod.parse_config(bad)


def test_cpu_smoke_run_gives_a_row_per_configuration(tmp_path: Path) -> None:
    out = tmp_path / "capture.json"
    done = subprocess.run([sys.executable, "-P", str(BENCH), str(out), "--device", "cpu", "--tiny",
                           "--configs", "cl:limit=10,ncl:benchmark=0+frames=2"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["name"] for r in rows] == ["cl:limit=10", "ncl:benchmark=0+frames=2"]
    for r in rows:
        assert "error" not in r, r
        assert r["capture_s"] >= 0 and r["push_ms"]["1x1"] > 0
    assert rows[0]["layout"] == "channels-last" and rows[1]["frames"] == 2
    assert "capture" in done.stdout and "push ms" in done.stdout


def test_a_spent_budget_and_a_bad_configuration_are_reported() -> None:
    mod = _module()
    rows = mod.run_all(["cl:limit=10"], "cpu", tiny=True, budget_s=-1)
    assert rows == [{"name": "cl:limit=10", "error": "not run: -1 s budget spent"}]
    bad = subprocess.run([sys.executable, "-P", str(BENCH), "--configs", "xl"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "layout must be cl or ncl" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_the_servers_conv_autotuner_times_a_few_candidates_not_one() -> None:
    """Three candidates per conv shape: half the start-up capture of PyTorch's 10 (H200 run13), while
    one candidate (or none) picked 20x slower kernels there."""
    before = torch.backends.cudnn.benchmark, torch.backends.cudnn.benchmark_limit
    try:
        use_conv_autotuner()
        assert torch.backends.cudnn.benchmark is True
        assert torch.backends.cudnn.benchmark_limit == CUDNN_CANDIDATES
        assert 1 < CUDNN_CANDIDATES < 10
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.benchmark_limit = before
