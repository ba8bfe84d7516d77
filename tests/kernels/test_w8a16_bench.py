"""The W8A16 benchmark's harness on CPU (Triton's interpreter, tiny shapes, no timing): its checks are
computed per row, agree with the prototype's own reference, and the JSON it writes says so.
Why: the script's first run is on the lent GPU; a harness bug found there costs device time."""

from __future__ import annotations

import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from tests.scripts import load_script  # noqa: E402

SCRIPT = "benchmarks/inference_h200/w8a16_gemm.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run is the benchmark itself")
def test_harness_rows_and_checks(tmp_path, monkeypatch, kernels_on):
    bench = load_script(SCRIPT)
    monkeypatch.setattr(bench, "SHAPES", {"tiny": (128, 256)})
    monkeypatch.setattr(bench, "MS", (1, 16))
    assert bench.main([str(tmp_path)]) == 0
    report = json.loads((tmp_path / "w8a16_gemm.json").read_text())
    rows = report["rows"]
    assert [(r["op"], r["M"]) for r in rows] == [("tiny", 1), ("tiny", 16)]
    for row in rows:
        refs = [v for k, v in row["check"].items() if k.endswith("rel_err_ref")]
        assert refs and max(refs) < 1e-2
        assert row["check"]["a16_rel_err_exact"] < row["check"]["fp8_rel_err_exact"]
        assert all(v is None for v in row["us"].values())  # no timing without a GPU
