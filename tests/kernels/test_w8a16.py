"""The W8A16 decode GEMM prototype (issue #26): bf16 activations, FP8 block-scaled weights widened in
the tile, run through Triton's interpreter on CPU (the GPU runs the same tests at full speed).

Why these checks: the prototype changes what a decode GEMM computes (no activation quantization), so
it must equal its own reference (:func:`linear_w8a16_ref`) for every config its benchmark times, be
closer to the bf16 linear than the block-scaled FP8 product is (the reason it may replace it), and
refuse the configs it cannot run (a quantize launch, FP8 codes in or out). Its SwiGLU half (gate and up
tiles, ``silu(g) * u`` stored as bf16) likewise against its reference.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from ttsfleet.kernels.ops import quantize_weight  # noqa: E402
from ttsfleet.kernels.reference import linear_fp8_ref, linear_w8a16_ref  # noqa: E402
from ttsfleet.kernels.testing import randn, rel_err  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
#: bf16 output of float32 sums over the same bf16 operands: only the sums' order differs.
TOL_SAME_OPERANDS = 1e-2


@pytest.fixture(autouse=True)
def _interpreter_or_gpu(kernels_on) -> None:  # noqa: ANN001 - the conftest fixture
    return None


def _tg():  # noqa: ANN202
    from ttsfleet.kernels import triton_gemm

    return triton_gemm


def _case(gen: torch.Generator, m: int, n: int, k: int, scheme: str = "bsgemm_fp8"):  # noqa: ANN202
    w = randn(gen, n, k, scale=0.05, device=DEV)
    x = randn(gen, m, k, device=DEV).to(torch.bfloat16)
    return x, w, quantize_weight(w, scheme)


@pytest.mark.parametrize("m", [1, 5, 64])
def test_every_benchmarked_config_matches_its_reference(gen, m):
    tg = _tg()
    n, k = 192, 512
    x, _, qw = _case(gen, m, n, k)
    ref = linear_w8a16_ref(x, qw).float()
    for cfg in tg.a16_config_space(m, n, k):
        out = tg.linear_w8a16_triton(x, qw, cfg=cfg)
        assert out.dtype == torch.bfloat16 and out.shape == (m, n)
        assert rel_err(out.float(), ref) < TOL_SAME_OPERANDS, cfg


@pytest.mark.parametrize("swap", [True, False])
def test_both_operand_orders_split_k_and_bias(gen, swap):
    tg = _tg()
    m, n, k = 16, 128, 384
    x, _, qw = _case(gen, m, n, k)
    bias = randn(gen, n, device=DEV).to(torch.bfloat16)
    cfg = tg.GemmConfig(bn=64, split_k=3, swap=swap, prequant=False, num_stages=3, bm=0 if swap else 64,
                        num_warps=4, a16=True)
    out = tg.linear_w8a16_triton(x, qw, bias=bias, cfg=cfg)
    assert rel_err(out.float(), linear_w8a16_ref(x, qw, bias).float()) < TOL_SAME_OPERANDS


def test_mxfp8_weights_too(gen):
    tg = _tg()
    x, _, qw = _case(gen, 8, 128, 256, "mxfp8")
    cfg = tg.GemmConfig(bn=64, split_k=2, swap=True, prequant=False, num_stages=3, a16=True)
    out = tg.linear_w8a16_triton(x, qw, cfg=cfg)
    assert rel_err(out.float(), linear_w8a16_ref(x, qw).float()) < TOL_SAME_OPERANDS


def test_closer_to_bf16_than_the_block_scaled_product(gen):
    """Same FP8 weights both ways: the error left is the activation quantization's, which W8A16 has not."""
    m, n, k = 8, 128, 512
    x, w, qw = _case(gen, m, n, k)
    exact = x.float() @ w.float().t()
    a16 = rel_err(_tg().linear_w8a16_triton(x, qw).float(), exact)
    fp8 = rel_err(linear_fp8_ref(x, qw).float(), exact)
    assert a16 < fp8


@pytest.mark.parametrize("kind", ["linear", "swiglu"])
def test_a_quantize_launch_is_refused(kind):
    tg = _tg()
    with pytest.raises(ValueError, match="a16"):
        tg.check_config(kind, tg.GemmConfig(bn=128, a16=True, prequant=True), "bsgemm_fp8")


@pytest.mark.parametrize("what", ["fp8 codes in", "fp8 out"])
def test_fp8_codes_in_or_out_are_refused(gen, what):
    tg = _tg()
    x, _, qw = _case(gen, 4, 128, 256)
    codes = x.float().clamp(-448, 448).to(torch.float8_e4m3fn)
    a = codes if what == "fp8 codes in" else x
    out = torch.empty(4, 128, dtype=torch.float8_e4m3fn if what == "fp8 out" else torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match="a16 GEMM takes float activations and writes bf16"):
        tg.launch_gemm(a, None, qw, out, None, tg.a16_config_space(4, 128, 256)[0])


@pytest.mark.parametrize("m", [1, 5, 64])
def test_swiglu_half_matches_its_reference_for_every_benchmarked_config(gen, m):
    """The MLP's first half in one launch: gate and up tiles, ``silu(g) * u`` into bf16 (not codes)."""
    from ttsfleet.kernels.reference import swiglu_w8a16_ref

    tg = _tg()
    f, k = 128, 256
    x, _, gate_up = _case(gen, m, 2 * f, k)
    ref = swiglu_w8a16_ref(x, gate_up).float()
    for cfg in tg.a16_config_space(m, 2 * f, k, "swiglu"):
        out = tg.swiglu_w8a16_triton(x, gate_up, cfg=cfg)
        assert out.dtype == torch.bfloat16 and out.shape == (m, f)
        assert rel_err(out.float(), ref) < TOL_SAME_OPERANDS, cfg
