"""CPU tests of the CLI wiring and the benchmark report writer (no GPU needed)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from ttsfleet.kernels.bench_report import markdown, write_reports  # noqa: E402
from ttsfleet.kernels.cli import app  # noqa: E402
from typer.testing import CliRunner  # noqa: E402


def _fake_results() -> dict:
    gemm = [{"op": "qkv", "M": m, "N": 6144, "K": 2560, "floor_us": 3.7, "ours_us": 3.7 * f, "bf16_us": 8.0,
             "fp8_tensor_us": 5.5, "fp8_rowwise_us": 11.0, "fp8_block_us": float("nan") if m == 1 else 10.0}
            for m, f in [(1, 1.2), (64, 1.5), (128, 3.0)]]
    mlp = [{"M": m, "floor_us": 17.5, "ours_us": us, "bf16_eager_us": 54.0, "bf16_compiled_us": 48.0,
            "fp8_block_eager_us": 80.0, "fp8_block_compiled_us": 47.0} for m, us in [(1, 22.0), (64, 30.0)]]
    return {"date": "2026-11-30T04:00:00Z", "device": "NVIDIA H200", "torch": "x", "triton": "y",
            "copy_bw_TBps": 4.27, "compile_mode": "default", "timing": "t", "gemm": gemm, "mlp": mlp}


def test_markdown_marks_targets_met_and_missed():
    md = markdown(_fake_results())
    lines = {ln.split("|")[1].strip() + ":" + ln.split("|")[2].strip(): ln for ln in md.splitlines()
             if ln.startswith("| qkv")}
    assert lines["qkv 6144×2560:1"].rstrip().endswith("met |")
    assert "**missed**" in lines["qkv 6144×2560:64"]  # 1.5x floor > 1.3x target
    assert lines["qkv 6144×2560:128"].rstrip().endswith("– |")  # no target above M=64
    mlp = [ln for ln in md.splitlines() if ln.startswith("| 1 |") or ln.startswith("| 64 |")]
    assert mlp[0].rstrip().endswith("met |") and "**missed**" in mlp[1]
    assert "faster" in md


def test_write_reports(tmp_path):
    pytest.importorskip("matplotlib")
    write_reports(_fake_results(), tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["bench_h200_2026-11-30.json", "bench_h200_2026-11-30.md", "bench_h200_2026-11-30.png"]
    assert json.loads((tmp_path / names[0]).read_text())["device"] == "NVIDIA H200"


def test_cli_check_on_cpu_and_bad_input():
    runner = CliRunner()
    res = runner.invoke(app, ["check", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    assert "PASS" in res.output and "FAIL" not in res.output
    from ttsfleet.errors import UserError

    res = runner.invoke(app, ["check", "--device", "tpu"])
    assert isinstance(res.exception, UserError)
    res = runner.invoke(app, ["bench", "--ms", "1,x"])
    assert isinstance(res.exception, UserError)
