"""``TTSFLEET_CUBLAS_SCALES=direct``: the fused RMSNorm writes its FP8 codes' scales in the order cuBLAS's
block-scaled GEMM reads them, so the GEMM needs no copy of them; ``copy`` (the default) keeps them
row-major. Why a test: a scale tensor read with the wrong strides gives wrong logits at full speed and
no error (:mod:`ttsfleet.kernels.layout`), so the layout must change only where cuBLAS reads it and the
values must not change at all."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from ttsfleet.catalog import GpuCatalog  # noqa: E402


@pytest.fixture
def direct():  # noqa: ANN201
    from ttsfleet.kernels import decode

    decode.set_cublas_scales("direct")
    yield
    decode.CUBLAS_SCALES_SWITCH.reset()


def test_scales_go_outer_major_only_where_cublas_reads_them_and_only_when_asked(direct):
    from ttsfleet.kernels import decode, dispatch

    h200 = dispatch.plan_for_capability((9, 0), GpuCatalog.default())
    rtx = dispatch.plan_for_capability((12, 0), GpuCatalog.default())
    outer = [decode.scales_outer_major(h200, m) for m in (1, 64, 65, 96, 2048)]
    assert outer == [False, False, True, True, True]
    assert not decode.scales_outer_major(rtx, 96), "sm_120 has no cuBLAS block-scaled path in the catalog"
    decode.set_cublas_scales("copy")
    assert not decode.scales_outer_major(h200, 96)
    assert decode.CUBLAS_SCALES_SWITCH.default == "copy", "unmeasured: not the default until timed"


@pytest.mark.parametrize("m", [5, 68])
def test_rmsnorm_writes_the_same_codes_and_scales_in_cublas_order_which_cublas_reads_uncopied(
        kernels_on, gen, m):
    from ttsfleet.kernels import cublas_fp8, triton_decode

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(m, 256, generator=gen).to(dev, torch.bfloat16)
    res = torch.randn(m, 256, generator=gen).to(dev, torch.bfloat16)
    w = (1 + 0.1 * torch.randn(256, generator=gen)).to(dev, torch.bfloat16)
    (q_row, s_row), h_row = triton_decode.rmsnorm(x, w, 1e-6, res, 128, outer_scales=False)
    (q_out, s_out), h_out = triton_decode.rmsnorm(x, w, 1e-6, res, 128, outer_scales=True)
    assert s_row.stride() == (2, 1) and s_out.stride() == (1, m)
    assert torch.equal(q_row.view(torch.uint8), q_out.view(torch.uint8)) and torch.equal(h_row, h_out)
    assert torch.equal(s_row, s_out)
    assert cublas_fp8._outer_major(s_out) is s_out, "cuBLAS's order: read as it is, no copy"
    copied = cublas_fp8._outer_major(s_row)
    assert copied.data_ptr() != s_row.data_ptr() and copied.stride() == (1, m) and torch.equal(copied, s_row)


def test_the_lever_variant_switches_the_scales_and_the_default_switches_them_back():
    from ttsfleet.kernels import decode, dispatch

    from tests.scripts import load_script

    levers = load_script("benchmarks/inference_h200/decode_levers.py")
    try:
        levers._variant("scalesdirect")
        assert decode.cublas_scales() == "direct"
        levers._variant("default")
        assert decode.cublas_scales() == "copy"
    finally:
        dispatch.use_catalog(None)
        decode.CUBLAS_SCALES_SWITCH.reset()


@pytest.mark.parametrize("splits", [1, 3])
def test_attention_writes_the_o_gemms_codes_and_scales_in_cublas_order_where_cublas_reads_them(
        kernels_on, monkeypatch, gen, splits):
    """Decode attention's FP8 output (the o GEMM's input), one pass and split: the same codes and
    scales either way; the order follows :func:`decode.scales_outer_major` (forced here: on the CPU no
    plan sends a GEMM to cuBLAS)."""
    from ttsfleet.kernels import cublas_fp8, triton_attention
    from ttsfleet.kernels.triton_attention_split import decode_attention_split

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    rows, kv, g, d = 6, 2, 4, 128
    kc = torch.randn(rows, 40, kv, d, generator=gen).to(dev, dtype)
    vc = torch.randn(rows, 40, kv, d, generator=gen).to(dev, dtype)
    q = torch.randn(rows, kv * g, d, generator=gen).to(dev, dtype)
    slots, lengths = torch.arange(rows, device=dev), torch.tensor([1, 5, 17, 33, 40, 9], device=dev)

    def attend():  # noqa: ANN202
        if splits == 1:
            return triton_attention.decode_attention_triton(q, kc, vc, slots, lengths, 128)
        return decode_attention_split(q, kc, vc, slots, lengths, splits, 128)

    (c_row, s_row) = attend()
    monkeypatch.setattr(cublas_fp8, "scales_outer_major", lambda plan, m: True)
    (c_out, s_out) = attend()
    assert s_row.stride() == (kv * g, 1) and s_out.stride() == (1, rows)
    assert torch.equal(c_row.view(torch.uint8), c_out.view(torch.uint8)) and torch.equal(s_row, s_out)
    assert cublas_fp8._outer_major(s_out) is s_out
