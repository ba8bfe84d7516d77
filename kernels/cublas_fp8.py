"""Prefill-size FP8 GEMMs through cuBLAS's block-scaled path (``torch._scaled_mm``), same contract.

Why a second GEMM beside the Triton kernels: those are tuned for decode (M <= 128 rows), where they
beat cuBLAS; at prefill sizes they are 2.5-3.2x slower than cuBLAS's own 1x128-activation /
128x128-weight block-scaled FP8 GEMM, which computes the very numeric contract of ``bsgemm_fp8``
(benchmarks/kernels/README.md; /work/shared/baselines). Which rows go where is the GPU catalog's
decision (``prefill_gemm``, ``prefill_gemm_min_rows``), applied in :mod:`.ops`.

cuBLAS wants the scales in "outer-dim-major" order: the activation scale ``[M, K/128]`` with
strides ``(1, M)``, the weight scale as ``[K/128, N/128]`` with strides ``(1, K/128)`` (our
row-major ``[N/128, K/128]`` scale, transposed as a view). The SwiGLU MLP runs gate_up in cuBLAS
(bf16 out), then ``silu(g) * u`` quantized to 1x128 codes in one Triton launch that writes the
scales column-major for the down GEMM.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from . import dispatch
from .decode import scales_outer_major
from .layout import BS_BLOCK, QuantizedWeight, cdiv
from .triton_gemm import INTERPRETING, quantize_group_rows

#: cuBLAS reads each scale matrix with a leading dimension that must be 16-byte aligned: the
#: activation scales' is M (rows are padded up to a multiple of this), the weight scales' K/128.
ALIGN = 4


def supports(qw: QuantizedWeight) -> bool:
    """Whole 128-blocks and an aligned weight-scale leading dimension (the S2 / S1 shapes all are)."""
    n, k = qw.shape
    return (qw.scheme == "bsgemm_fp8" and n % BS_BLOCK == 0 and k % BS_BLOCK == 0
            and (k // BS_BLOCK) % ALIGN == 0 and qw.scale.stride(1) == 1)


def activation_scales(m: int, groups: int, device: torch.device, dtype: torch.dtype,
                      outer_major: bool | None = False) -> torch.Tensor:
    """An empty ``[m, groups]`` scale tensor for a producer of FP8 codes: row-major, or in cuBLAS's
    outer-dim-major order (strides ``(1, m)``), which :func:`gemm_codes` then reads without a copy.
    ``outer_major`` None: cuBLAS's order where the GEMM reading these ``m`` rows goes to cuBLAS and
    ``TTSFLEET_CUBLAS_SCALES=direct`` (:func:`~ttsfleet.kernels.decode.scales_outer_major`; float32
    scales only: mxfp8's uint8 exponents never go to cuBLAS)."""
    if outer_major is None:
        outer_major = dtype == torch.float32 and scales_outer_major(dispatch.plan(device), m)
    if outer_major:
        return torch.empty(groups, m, device=device, dtype=dtype).t()
    return torch.empty(m, groups, device=device, dtype=dtype)


def _outer_major(xs: torch.Tensor) -> torch.Tensor:
    """``[M, K/128]`` scales with strides ``(1, M)`` (a copy unless they already are)."""
    if xs.stride(0) == 1 and xs.shape[0] > 1 and xs.stride(1) == xs.shape[0]:
        return xs
    return xs.t().contiguous().t()


def _pad_rows(xq: torch.Tensor, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows up to a multiple of :data:`ALIGN`: zero codes (scale 1), sliced off the result."""
    extra = -xq.shape[0] % ALIGN
    if not extra:
        return xq, xs
    zq = torch.zeros(extra, xq.shape[1], device=xq.device, dtype=xq.dtype)
    return torch.cat([xq, zq]), torch.cat([xs.float(), xs.new_ones(extra, xs.shape[1], dtype=torch.float32)])


def gemm_codes(xq: torch.Tensor, xs: torch.Tensor, qw: QuantizedWeight, out_dtype: torch.dtype,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """``xq [M, K]`` FP8 codes with 1x128 scales ``xs [M, K/128]`` times ``qw`` -> ``[M, N]``."""
    m = xq.shape[0]
    aq, as_ = _pad_rows(xq, xs)
    out = torch._scaled_mm(aq, qw.qweight.t(), scale_a=_outer_major(as_.float()), scale_b=qw.scale.t(),
                           out_dtype=torch.bfloat16)[:m]
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out if out_dtype == torch.bfloat16 else out.to(out_dtype)


@triton.jit
def silu_mul_quant_kernel(gu_ptr, q_ptr, s_ptr, F, s_gm, s_qm, s_sm, s_sk,
                          GROUP: tl.constexpr, EXACT_CVT: tl.constexpr):
    """One program: one row's group ``pid(1)`` of ``h = silu(g) * u`` -> FP8 codes + its scale."""
    row = tl.program_id(0)
    grp = tl.program_id(1)
    offs = grp * GROUP + tl.arange(0, GROUP)
    ok = offs < F
    g = tl.load(gu_ptr + row * s_gm + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * s_gm + F + offs, mask=ok, other=0.0).to(tl.float32)
    h = g / (1.0 + tl.exp(-g)) * u
    q, sc = quantize_group_rows(h[None, :], False, EXACT_CVT)
    tl.store(q_ptr + row * s_qm + offs[None, :], q, mask=ok[None, :])
    tl.store(s_ptr + row * s_sm + grp * s_sk + tl.arange(0, 1), sc)


def silu_mul_quant(gu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``gu [M, 2F]`` (gate | up) -> FP8 codes of ``silu(g) * u`` ``[M, F]`` and their 1x128 scales
    ``[M, F/128]``, laid out with strides ``(1, M)`` as the next cuBLAS call wants them."""
    m, two_f = gu.shape
    f = two_f // 2
    q = torch.empty(m, f, device=gu.device, dtype=torch.float8_e4m3fn)
    s = activation_scales(m, cdiv(f, BS_BLOCK), gu.device, torch.float32, outer_major=True)
    if m:
        silu_mul_quant_kernel[(m, cdiv(f, BS_BLOCK))](gu, q, s, f, gu.stride(0), q.stride(0), s.stride(0),
                                                      s.stride(1), GROUP=BS_BLOCK, EXACT_CVT=INTERPRETING,
                                                      num_warps=1)
    return q, s


def swiglu_mlp_codes(xq: torch.Tensor, xs: torch.Tensor, gate_up: QuantizedWeight, down: QuantizedWeight,
                     out_dtype: torch.dtype, gemm: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
    """The SwiGLU MLP of :func:`ttsfleet.kernels.ops.swiglu_mlp_fp8_codes` at prefill sizes: 3 launches.
    ``gemm``: another library's ``gemm_codes`` in cuBLAS's place (DeepGEMM's, :mod:`.deepgemm_fp8`)."""
    gemm = gemm or gemm_codes
    hq, hs = silu_mul_quant(gemm(xq, xs, gate_up, torch.bfloat16))
    return gemm(hq, hs, down, out_dtype)
