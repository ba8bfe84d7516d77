"""The DeepGEMM side-by-side benchmark's harness on CPU (Triton's interpreter, tiny shapes, no timing):
our kernel's output is checked against the contract's reference per row, and a missing DeepGEMM is
reported in the JSON, not a crash. Why: the script's first run is on the lent GPU, after a build there;
a harness bug found then costs device time."""

from __future__ import annotations

import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from tests.scripts import load_script  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run is the benchmark itself")
def test_harness_checks_ours_and_reports_deepgemm_missing(tmp_path, monkeypatch, kernels_on):
    bench = load_script("benchmarks/inference_h200/deepgemm_gemm.py")
    monkeypatch.setattr(bench, "MS", (1, 16))
    assert bench.main([str(tmp_path)]) == 0
    report = json.loads((tmp_path / "deepgemm_gemm.json").read_text())
    assert report["deepgemm"] is None and report["deepgemm_unavailable"] == "no CUDA"
    rows = report["rows"]
    assert [(r["op"], r["M"]) for r in rows] == [("tiny", 1), ("tiny", 16)]
    for row in rows:
        assert row["check"]["ours_rel_err_ref"] < 1e-2
        assert "deepgemm_rel_err_ref" not in row["check"]
        assert all(v is None for v in row["us"].values())  # no timing without a GPU
