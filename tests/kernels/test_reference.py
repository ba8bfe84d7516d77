"""CPU tests of the public ops on the reference path: numerics against float64, and the layout
contract (scales read through their strides, never their storage order)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ttsfleet.kernels import QuantizedWeight, linear_fp8, quantize_weight, swiglu_mlp_fp8  # noqa: E402
from ttsfleet.kernels.reference import (  # noqa: E402
    act_block,
    dequantize_activation,
    dequantize_weight,
    quantize_activation_ref,
)
from ttsfleet.kernels.testing import (  # noqa: E402
    TOL_MLP_VS_UNQUANTIZED,
    TOL_SAME_CODES_BF16,
    TOL_SAME_CODES_F32,
    TOL_VS_UNQUANTIZED,
    randn,
    rel_err,
)

SCHEMES = ["bsgemm_fp8", "mxfp8"]


def _f64_same_codes(x, qw, bias=None):
    """float64 math on exactly the FP8 codes and scales the kernel sees."""
    xq, xs = quantize_activation_ref(x.reshape(-1, x.shape[-1]), act_block(qw.scheme))
    out = dequantize_activation(xq, xs).double() @ dequantize_weight(qw).double().t()
    return out if bias is None else out + bias.double()


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("m,n,k", [(1, 256, 256), (3, 200, 384), (17, 130, 160)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_linear_fp8_reference(gen, scheme, m, n, k, dtype):
    w = randn(gen, n, k, scale=k ** -0.5)
    x = randn(gen, m, k, dtype=dtype)
    bias = randn(gen, n, dtype=dtype)
    qw = quantize_weight(w, scheme)
    out = linear_fp8(x, qw, bias)
    assert out.dtype == dtype and tuple(out.shape) == (m, n)
    tol = TOL_SAME_CODES_BF16 if dtype == torch.bfloat16 else TOL_SAME_CODES_F32
    assert rel_err(out, _f64_same_codes(x, qw, bias)) < tol
    full = x.double() @ w.double().t() + bias.double()
    assert rel_err(out, full) < TOL_VS_UNQUANTIZED


def test_linear_fp8_keeps_leading_dims(gen):
    """Leading dims are a view of the rows: exactly the flattened call's output. A lone row is the
    same math, but the CPU GEMM may sum it in another order (a 1-row GEMV against a 6-row GEMM), so
    it is held to the same-codes tolerance, not bit equality (one bf16 ulp apart was seen in CI)."""
    qw = quantize_weight(randn(gen, 64, 128), "bsgemm_fp8")
    x = randn(gen, 2, 3, 128, dtype=torch.bfloat16)
    out = linear_fp8(x, qw)
    assert tuple(out.shape) == (2, 3, 64)
    assert torch.equal(out.reshape(6, 64), linear_fp8(x.reshape(6, 128), qw))
    assert rel_err(out[1, 2], linear_fp8(x[1, 2:3], qw)[0]) < TOL_SAME_CODES_BF16


@pytest.mark.parametrize("scheme", SCHEMES)
def test_scale_strides_are_honoured(gen, scheme):
    """Layout contract: the same logical scale stored K-major gives the same output; reading the
    K-major *storage* as if row-major (the source write-up's bug) gives a visibly wrong one."""
    w = randn(gen, 256, 512, scale=0.05) * torch.logspace(-2, 2, 512)  # scales must differ along K
    x = randn(gen, 4, 512, dtype=torch.bfloat16)
    qw = quantize_weight(w, scheme)
    kmajor = qw.scale.t().contiguous().t()  # same logical tensor, strides (1, rows)
    assert kmajor.stride() != qw.scale.stride()
    out_row = linear_fp8(x, qw)
    out_k = linear_fp8(x, QuantizedWeight(qw.qweight, kmajor, scheme, qw.shape))
    assert torch.equal(out_row, out_k)
    bug = kmajor.t().contiguous().view(-1).view(qw.scale.shape)  # storage read as row-major
    out_bug = linear_fp8(x, QuantizedWeight(qw.qweight, bug, scheme, qw.shape))
    assert rel_err(out_bug, out_row) > 0.5


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("m", [1, 5])
def test_swiglu_mlp_reference(gen, scheme, m):
    d, f = 256, 384
    w1, w3 = randn(gen, f, d, scale=d ** -0.5), randn(gen, f, d, scale=d ** -0.5)
    w2 = randn(gen, d, f, scale=f ** -0.5)
    gu, dn = quantize_weight(torch.cat([w1, w3]), scheme), quantize_weight(w2, scheme)
    x = randn(gen, m, d, dtype=torch.bfloat16)
    out = swiglu_mlp_fp8(x, gu, dn)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (m, d)
    xd = x.double()
    g, u = xd @ dequantize_weight(gu).double()[:f].t(), xd @ dequantize_weight(gu).double()[f:].t()
    ref = (torch.nn.functional.silu(g) * u) @ dequantize_weight(dn).double().t()
    assert rel_err(out, ref) < TOL_MLP_VS_UNQUANTIZED
    with pytest.raises(ValueError, match="not"):
        swiglu_mlp_fp8(x, gu, gu)


def test_linear_fp8_rejects_bad_input(gen):
    qw = quantize_weight(randn(gen, 64, 128), "bsgemm_fp8")
    with pytest.raises(ValueError, match="K=128"):
        linear_fp8(randn(gen, 2, 96), qw)
    with pytest.raises(ValueError, match="bias"):
        linear_fp8(randn(gen, 2, 128), qw, torch.ones(63))
    with pytest.raises(ValueError, match="bf16"):
        linear_fp8(torch.ones(2, 128, dtype=torch.int32), qw)
