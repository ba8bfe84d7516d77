"""``benchmarks/inference_h200/decode_gemm_rows.py``: the step estimate the decode-GEMM benchmarks print
(what wiring a kernel in would move) sums, per M, every shape's time over the step's layer passes, and
only for the methods and M that every shape has. Why: a partial M (a deadline cut it) or a method one
shape lacks would print an estimate too small to mean anything."""

from __future__ import annotations

from tests.scripts import load_script


def test_step_estimate_sums_the_shapes_of_one_m_over_the_layer_passes():
    rows_mod = load_script("benchmarks/inference_h200/decode_gemm_rows.py")
    rows = [{"M": 1, "us": {"a16": 2.0, "fp8_codes": 3.0, "bf16": None}},
            {"M": 1, "us": {"a16": 1.0, "fp8_codes": 1.0, "bf16": 5.0}},
            {"M": 16, "us": {"a16": 1.0}},  # one shape short at M=16: no estimate
            {"op": "a", "M": 64, "skipped": "deadline"}]
    est = rows_mod.step_estimate(rows, n_shapes=2)
    assert rows_mod.LAYER_PASSES == 76  # 36 slow layers + 4 fast layers x 10 codebook positions
    assert est == {"1": {"a16": round(76 * 3.0 / 1e3, 3), "fp8_codes": round(76 * 4.0 / 1e3, 3),
                         "best_fp8": round(76 * (2.0 + 1.0) / 1e3, 3)}}


def test_best_fp8_takes_each_shapes_fastest_fp8_method_never_bf16():
    rows_mod = load_script("benchmarks/inference_h200/decode_gemm_rows.py")
    rows = [{"M": 64, "us": {"ours": 10.0, "cublas": 8.0, "bf16": 1.0}},
            {"M": 64, "us": {"ours": 5.0, "cublas": 9.0, "bf16": 1.0}}]
    est = rows_mod.step_estimate(rows, n_shapes=2)["64"]
    assert est["best_fp8"] == round(76 * (8.0 + 5.0) / 1e3, 3)
    assert est["best_fp8"] < min(est["ours"], est["cublas"])
    only_one = rows_mod.step_estimate([{"M": 1, "us": {"ours": 1.0, "bf16": 2.0}}], n_shapes=1)["1"]
    assert "best_fp8" not in only_one, "one FP8 method: nothing to choose between"
