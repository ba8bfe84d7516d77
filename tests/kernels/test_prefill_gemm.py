"""Prefill-size GEMMs: the catalog's split between our kernels and cuBLAS, and the pieces of the
cuBLAS path that run without a GPU (the SwiGLU epilogue kernel, through Triton's interpreter).

On a GPU the same module checks the dispatched prefill GEMMs against float64 math on the same FP8
codes (skipped on CPU: cuBLAS's block-scaled GEMM exists only on CUDA)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from ttsfleet.kernels import dispatch  # noqa: E402
from ttsfleet.kernels.check import f64_same_codes  # noqa: E402
from ttsfleet.kernels.ops import linear_fp8, quantize_weight, swiglu_mlp_fp8  # noqa: E402
from ttsfleet.kernels.reference import dequantize_activation, quantize_activation_ref  # noqa: E402
from ttsfleet.kernels.testing import TOL_SAME_CODES_BF16, randn, rel_err  # noqa: E402

from ttsfleet.catalog import GpuCatalog  # noqa: E402

CUDA = torch.cuda.is_available()


def _split_catalog(tmp_path, extra: str = "") -> GpuCatalog:
    f = tmp_path / "site.yaml"
    f.write_text("classes:\n  h200:\n    prefill_gemm: cublas_blockwise\n" + extra)
    return GpuCatalog.from_file(f)


def test_built_in_h200_sends_prefill_rows_to_cublas_and_the_rtx_classes_do_not():
    """On since the H200 run of 2026-12-02 (benchmarks/inference_h200/2026-12-02-ab/), from 128 rows
    since 2026-12-03 (decode batches of 128 faster there, of 64 slower: 2026-12-03b/run3), from 65 since
    2026-12-07f (the step at batch 72-120 1.28-1.38x longer on ours: cublas-rows-h200); sm_120 has no
    cuBLAS block-scaled path in the catalog."""
    plan = dispatch.plan_for_capability((9, 0), GpuCatalog.default())
    assert plan.fused and plan.prefill_gemm == "cublas_blockwise" and plan.large_gemm(8192)
    assert plan.large_gemm(65) and plan.large_gemm(128) and not plan.large_gemm(64)
    assert dispatch.plan_for_capability((12, 0), GpuCatalog.default()).prefill_gemm == "triton"


def test_catalog_file_sends_prefill_rows_to_cublas_and_keeps_decode_rows(tmp_path):
    plan = dispatch.plan_for_capability((9, 0), _split_catalog(tmp_path))
    assert plan.fused and plan.prefill_gemm == "cublas_blockwise"
    assert not plan.large_gemm(plan.prefill_min_rows - 1) and plan.large_gemm(plan.prefill_min_rows)
    assert not plan.large_gemm(64), "decode batches up to 64 rows must stay on our kernels"
    ref = dispatch.plan_for_capability((9, 0), _split_catalog(tmp_path), kernel_mode="reference")
    assert not ref.large_gemm(4096), "the reference backend has no prefill split"
    plan = dispatch.plan_for_capability((9, 0), _split_catalog(tmp_path, "    prefill_gemm_min_rows: 1024\n"))
    assert not plan.large_gemm(1023) and plan.large_gemm(1024)


def test_classes_of_one_arch_must_agree_on_the_prefill_split(tmp_path):
    f = tmp_path / "site.yaml"
    f.write_text("classes:\n  h200:\n    prefill_gemm: cublas_blockwise\n"
                 "  h100:\n    display_name: H100\n    arch: sm_90a\n    memory_gb: 80\n"
                 "    quantization: bsgemm_fp8\n    kernel_backend: triton\n    model_load_s: 90\n"
                 "    relative_cost: 0.8\n"
                 "    capacity: {points: [{concurrency: 1, frames_per_s: 100, ttfa_s: 0.1}], source: test}\n")
    with pytest.raises(ValueError, match="prefill_gemm"):
        GpuCatalog.from_file(f)


def _interpreting() -> bool:
    from ttsfleet.kernels import triton_gemm

    return triton_gemm.INTERPRETING


@pytest.mark.skipif(CUDA, reason="the interpreter check is the CPU half")
@pytest.mark.parametrize(("m", "f"), [(3, 256), (5, 384)])
def test_silu_mul_quant_matches_the_reference_quantizer(gen, m, f):
    if not _interpreting():
        pytest.skip("triton was imported before TRITON_INTERPRET could be set")
    from ttsfleet.kernels.cublas_fp8 import silu_mul_quant

    gu = randn(gen, m, 2 * f, scale=2.0, dtype=torch.bfloat16)
    q, s = silu_mul_quant(gu)
    assert s.shape == (m, f // 128) and s.stride() == (1, m), "cuBLAS wants outer-dim-major scales"
    g, u = gu.float().chunk(2, dim=-1)
    rq, rs = quantize_activation_ref(torch.nn.functional.silu(g) * u, 128)
    torch.testing.assert_close(s, rs, rtol=1e-6, atol=0)
    assert rel_err(dequantize_activation(q, s.contiguous()), dequantize_activation(rq, rs)) < 1e-3
    assert (q.view(torch.uint8) != rq.view(torch.uint8)).float().mean() < 0.01


def _use_split(tmp_path) -> None:
    dispatch.use_catalog(_split_catalog(tmp_path))
    if not dispatch.large_gemm(torch.empty(1, device="cuda"), 512):
        pytest.skip("the catalog does not run the Triton kernels on this GPU")


@pytest.fixture(autouse=True)
def _restore_catalog():
    yield
    dispatch.use_catalog(None)


@pytest.mark.skipif(not CUDA, reason="cuBLAS's block-scaled FP8 GEMM needs CUDA")
@pytest.mark.parametrize(("n", "k", "m"), [(6144, 2560, 512), (2560, 4096, 350)])
def test_prefill_linear_through_cublas_matches_same_codes_math(gen, n, k, m, tmp_path):
    _use_split(tmp_path)
    qw = quantize_weight(randn(gen, n, k, scale=k ** -0.5, device="cuda"), "bsgemm_fp8")
    x = randn(gen, m, k, device="cuda", dtype=torch.bfloat16)  # 350: rows padded to cuBLAS's alignment
    out = linear_fp8(x, qw)
    assert rel_err(out, f64_same_codes(x, qw)) < TOL_SAME_CODES_BF16


@pytest.mark.skipif(not CUDA, reason="cuBLAS's block-scaled FP8 GEMM needs CUDA")
def test_prefill_mlp_through_cublas_matches_our_kernel(gen, tmp_path):
    _use_split(tmp_path)
    d, f = 2560, 9728
    gate_up = quantize_weight(randn(gen, 2 * f, d, scale=d ** -0.5, device="cuda"), "bsgemm_fp8")
    down = quantize_weight(randn(gen, d, f, scale=f ** -0.5, device="cuda"), "bsgemm_fp8")
    x = randn(gen, 512, d, device="cuda", dtype=torch.bfloat16)
    big = swiglu_mlp_fp8(x, gate_up, down)  # 512 rows: cuBLAS + the epilogue kernel
    small = torch.cat([swiglu_mlp_fp8(x[i:i + 128], gate_up, down) for i in range(0, 512, 128)])  # ours
    # gate_up leaves cuBLAS in bf16 (ours keeps it in float32): a few codes of h round differently
    assert rel_err(big, small) < 2e-2


def test_cublas_operands_are_padded_and_laid_out_as_cublas_reads_them(gen):
    from ttsfleet.kernels.cublas_fp8 import ALIGN, _outer_major, _pad_rows

    xq, xs = quantize_activation_ref(randn(gen, 5, 256), 128)
    pq, ps = _pad_rows(xq, xs)
    assert pq.shape == (8, 256) and ps.shape == (8, 2) and 8 % ALIGN == 0
    assert torch.equal(pq[:5].view(torch.uint8), xq.view(torch.uint8)) and not pq[5:].float().any()
    assert torch.equal(ps[:5], xs) and torch.equal(ps[5:], torch.ones(3, 2))
    om = _outer_major(ps)
    assert om.stride() == (1, 8) and torch.equal(om, ps)
    assert _pad_rows(pq, ps)[0] is pq, "aligned rows are not copied"


def test_cublas_path_takes_only_shapes_it_can_read(gen):
    from ttsfleet.kernels.cublas_fp8 import supports

    assert supports(quantize_weight(randn(gen, 256, 512), "bsgemm_fp8"))
    assert not supports(quantize_weight(randn(gen, 256, 384), "bsgemm_fp8")), "3 K-blocks: unaligned scales"
    assert not supports(quantize_weight(randn(gen, 200, 512), "bsgemm_fp8")), "partial N block"
    assert not supports(quantize_weight(randn(gen, 256, 512), "mxfp8"))


def test_with_class_turns_the_split_off_for_one_run_and_leaves_the_built_in_alone():
    """How the side-by-side runs and the GPU gate pick a side (``GpuCatalog.with_class``)."""
    off = GpuCatalog.default().with_class("h200", prefill_gemm="triton")
    assert dispatch.plan_for_capability((9, 0), off).prefill_gemm == "triton"
    assert dispatch.plan_for_capability((9, 0), GpuCatalog.default()).prefill_gemm == "cublas_blockwise"
    assert off.get("rtx5090") == GpuCatalog.default().get("rtx5090")
