"""Public FP8 ops: argument checks, then Triton or the torch reference, as :mod:`.dispatch` decides.

Why the checks live here and not in the kernels: a kernel given a wrong shape reads out of bounds
or garbage silently; one readable ``ValueError`` at the call is cheaper than a wrong waveform.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from . import dispatch
from .layout import BS_BLOCK, MX_BLOCK, QuantizedWeight
from .reference import (
    linear_fp8_codes_ref,
    linear_fp8_ref,
    quantize_activation_ref,
    quantize_weight_ref,
    swiglu_mlp_fp8_codes_ref,
    swiglu_mlp_fp8_ref,
)

_X_DTYPES = (torch.bfloat16, torch.float32, torch.float16)


def quantize_weight(w: Tensor, scheme: str) -> QuantizedWeight:
    """Offline / load-time quantizer (torch ops on ``w``'s device; not on the decode path)."""
    return quantize_weight_ref(w, scheme)


def quantize_activation(x: Tensor, block: int = BS_BLOCK) -> tuple[Tensor, Tensor]:
    """``x [..., K]`` -> ``(fp8 [..., K], scales [..., ceil(K/block)])``, one launch on sm_90.

    block 128: float32 scales (bsgemm); block 32: uint8 UE8M0 (mxfp8). Scales are row-major.
    """
    if block not in (BS_BLOCK, MX_BLOCK):
        raise ValueError(f"activation block must be {BS_BLOCK} or {MX_BLOCK}, got {block}")
    if x.dtype not in _X_DTYPES or x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must be a nonempty bf16/fp16/fp32 [..., K], got {x.dtype} {list(x.shape)}")
    if dispatch.use_triton(x):
        from .triton_quant import quantize_activation_triton

        return quantize_activation_triton(x, block)
    return quantize_activation_ref(x, block)


def _check_linear(x: Tensor, qw: QuantizedWeight, bias: Tensor | None) -> None:
    if not isinstance(qw, QuantizedWeight):
        raise ValueError(f"expected a QuantizedWeight, got {type(qw).__name__}")
    if x.dtype not in _X_DTYPES:
        raise ValueError(f"x must be bf16, fp16 or fp32, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] != qw.shape[1]:
        raise ValueError(f"x [..., {x.shape[-1] if x.dim() else '?'}] does not match weight K={qw.shape[1]}")
    if x.device != qw.qweight.device:
        raise ValueError(f"x on {x.device} but weight on {qw.qweight.device}")
    if bias is not None and (tuple(bias.shape) != (qw.shape[0],) or bias.device != x.device):
        raise ValueError(
            f"bias must be [{qw.shape[0]}] on {x.device}, got {tuple(bias.shape)} on {bias.device}")


def _rows(t: Tensor) -> int:
    return t.numel() // t.shape[-1]


def _large(t: Tensor, *weights: QuantizedWeight) -> bool:
    """A prefill-size GEMM that the catalog sends to cuBLAS's block-scaled kernel (see :mod:`.cublas_fp8`)."""
    if not dispatch.large_gemm(t, _rows(t)):
        return False
    from .cublas_fp8 import supports

    return all(supports(w) for w in weights)


def _deepgemm(t: Tensor, *weights: QuantizedWeight) -> bool:
    """A decode-size GEMM on codes that ``TTSFLEET_DECODE_GEMM=deepgemm`` sends to DeepGEMM
    (:mod:`.deepgemm_fp8`; rows within ``TTSFLEET_DEEPGEMM_ROWS``, at most
    ``decode.DECODE_GEMM_MAX_ROWS``; weight shapes within ``TTSFLEET_DEEPGEMM_SHAPES``; block-scaled
    weights)."""
    from . import decode

    if decode.decode_gemm() != "deepgemm":
        return False
    lo, hi = decode.deepgemm_rows()
    if not lo <= _rows(t) <= hi:
        return False
    shapes = decode.deepgemm_shapes()
    if shapes is not None and any(w.shape not in shapes for w in weights):
        return False
    from .deepgemm_fp8 import supports

    return all(supports(w) for w in weights)


def _codes_library(xq: Tensor, *weights: QuantizedWeight) -> Any:
    """The library module whose ``gemm_codes`` / ``swiglu_mlp_codes`` take these codes — DeepGEMM's
    at decode sizes where chosen, cuBLAS's at prefill sizes — or None: our Triton kernels."""
    if _deepgemm(xq, *weights):
        from . import deepgemm_fp8

        return deepgemm_fp8
    if _large(xq, *weights):
        from . import cublas_fp8

        return cublas_fp8
    return None


def linear_fp8(x: Tensor, qw: QuantizedWeight, bias: Tensor | None = None) -> Tensor:
    """``x [..., K] @ W.T (+ bias)`` -> ``[..., N]`` in ``x.dtype``; activations quantized on the fly."""
    _check_linear(x, qw, bias)
    if x.numel() == 0:
        return x.new_empty(*x.shape[:-1], qw.shape[0])
    if _large(x, qw):
        xq, xs = quantize_activation(x, BS_BLOCK)
        return linear_fp8_codes(xq, xs, qw, x.dtype, bias)
    if dispatch.use_triton(x):
        from .triton_gemm import linear_fp8_triton

        return linear_fp8_triton(x, qw, bias)
    return linear_fp8_ref(x, qw, bias)


def swiglu_mlp_fp8(x: Tensor, gate_up: QuantizedWeight, down: QuantizedWeight) -> Tensor:
    """``down(silu(x @ w1.T) * (x @ w3.T))``; gate_up rows: first F = w1 (gate), next F = w3 (up)."""
    if gate_up.scheme != down.scheme:
        raise ValueError(f"gate_up is {gate_up.scheme} but down is {down.scheme}")
    two_f, d = gate_up.shape
    if two_f % 2 or down.shape != (d, two_f // 2):
        raise ValueError(
            f"gate_up {list(gate_up.shape)} and down {list(down.shape)} are not [2F, D] and [D, F]")
    _check_linear(x, gate_up, None)
    if down.qweight.device != x.device:
        raise ValueError(f"down weight on {down.qweight.device} but x on {x.device}")
    if x.numel() == 0:
        return x.new_empty(x.shape)
    if _large(x, gate_up, down):
        xq, xs = quantize_activation(x, BS_BLOCK)
        return swiglu_mlp_fp8_codes(xq, xs, gate_up, down, x.dtype)
    if dispatch.use_triton(x):
        from .triton_mlp import swiglu_mlp_fp8_triton

        return swiglu_mlp_fp8_triton(x, gate_up, down)
    return swiglu_mlp_fp8_ref(x, gate_up, down)


def _check_codes(xq: Tensor, xs: Tensor, qw: QuantizedWeight) -> None:
    from .layout import cdiv
    from .reference import act_block

    if xq.dtype != torch.float8_e4m3fn or xq.dim() < 1 or xq.shape[-1] != qw.shape[1]:
        raise ValueError(f"codes must be float8_e4m3fn [..., {qw.shape[1]}], got {xq.dtype} {list(xq.shape)}")
    want = (*xq.shape[:-1], cdiv(qw.shape[1], act_block(qw.scheme)))
    if tuple(xs.shape) != want:
        raise ValueError(f"{qw.scheme} activation scales must be {list(want)}, got {list(xs.shape)}")
    if xq.device != qw.qweight.device or xs.device != xq.device:
        raise ValueError("codes, scales and weight must be on one device")


def linear_fp8_codes(xq: Tensor, xs: Tensor, qw: QuantizedWeight, out_dtype: torch.dtype,
                     bias: Tensor | None = None) -> Tensor:
    """``linear_fp8`` on activations already quantized (``quantize_activation``'s format), e.g. by a
    fused RMSNorm or attention epilogue: one launch, no quantizer."""
    _check_codes(xq, xs, qw)
    library = _codes_library(xq, qw)
    if library is not None:
        k = xq.shape[-1]
        out = library.gemm_codes(xq.reshape(-1, k), xs.reshape(-1, xs.shape[-1]), qw, out_dtype, bias)
        return out.view(*xq.shape[:-1], qw.shape[0])
    if dispatch.use_triton(xq):
        from .triton_gemm import linear_fp8_codes_triton

        return linear_fp8_codes_triton(xq, xs, qw, out_dtype, bias)
    return linear_fp8_codes_ref(xq, xs, qw, out_dtype, bias)


def linear_w8a16(x: Tensor, qw: QuantizedWeight, bias: Tensor | None = None) -> Tensor:
    """``x @ dequant(qw).T`` with ``x`` in bf16 and no activation quantization (W8A16, bf16 out): the
    Triton prototype where the dispatch runs the Triton kernels, its reference elsewhere."""
    if dispatch.use_triton(x):
        from .triton_gemm import linear_w8a16_triton

        return linear_w8a16_triton(x, qw, bias)
    from .reference import linear_w8a16_ref

    return linear_w8a16_ref(x, qw, bias)


def swiglu_w8a16(x: Tensor, gate_up: QuantizedWeight) -> Tensor:
    """``silu(gate) * up`` of ``x`` in bf16 over FP8 ``gate_up`` weights (W8A16, one launch where the
    Triton kernels run, bf16 out for :func:`linear_w8a16`'s down projection)."""
    if dispatch.use_triton(x):
        from .triton_gemm import swiglu_w8a16_triton

        return swiglu_w8a16_triton(x, gate_up)
    from .reference import swiglu_w8a16_ref

    return swiglu_w8a16_ref(x, gate_up)


def swiglu_mlp_fp8_codes(xq: Tensor, xs: Tensor, gate_up: QuantizedWeight, down: QuantizedWeight,
                         out_dtype: torch.dtype) -> Tensor:
    """:func:`swiglu_mlp_fp8` on activations already quantized: two launches, or one at decode M
    with ``TTSFLEET_MLP_LAUNCH=one`` (:func:`.decode.mlp_launch`)."""
    _check_codes(xq, xs, gate_up)
    library = _codes_library(xq, gate_up, down)
    if library is not None:
        d = xq.shape[-1]
        rows_q, rows_s = xq.reshape(-1, d), xs.reshape(-1, xs.shape[-1])
        out = library.swiglu_mlp_codes(rows_q, rows_s, gate_up, down, out_dtype)
        return out.view(*xq.shape[:-1], d)
    if dispatch.use_triton(xq):
        from . import decode
        from .triton_mlp import ONE_LAUNCH_MAX_M, swiglu_mlp_fp8_triton, swiglu_mlp_one_launch

        d = xq.shape[-1]
        rows = xq.numel() // max(d, 1)
        if decode.mlp_launch() == "one" and rows <= ONE_LAUNCH_MAX_M:
            out = swiglu_mlp_one_launch(xq.reshape(-1, d), xs.reshape(-1, xs.shape[-1]), gate_up, down,
                                        out_dtype)
            return out.view(*xq.shape[:-1], d)
        return swiglu_mlp_fp8_triton(xq, gate_up, down, x_scale=xs, out_dtype=out_dtype)
    return swiglu_mlp_fp8_codes_ref(xq, xs, gate_up, down, out_dtype)


__all__ = ["quantize_weight", "quantize_activation", "linear_fp8", "swiglu_mlp_fp8", "linear_fp8_codes",
           "linear_w8a16", "swiglu_w8a16", "swiglu_mlp_fp8_codes"]
