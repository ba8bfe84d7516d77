"""Triton Snake (see :mod:`.snake`): one program per (row of ``B x C``, block of time steps) for
channels-first tensors; per (batch row, block of ``T x C`` elements) for channels-last ones.

Why two kernels: channels-first rows are contiguous in time, channels-last rows are contiguous in
channels (``[B, C, T]`` with strides ``(*, 1, C)``): walking time there would read every C-th
element. The channels-last kernel reads each batch row's ``T x C`` block in memory order and finds
the channel of an element as ``offset % C``; batch strides of ``x`` and ``y`` may differ, so ``y``
can be a slice of a causal conv's ``[history | new]`` buffer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def snake_kernel(x_ptr, a_ptr, b_ptr, y_ptr, C, T, s_xb, s_xc, s_xt, s_yb, s_yc, HAS_BIAS: tl.constexpr,
                 BLOCK: tl.constexpr):
    row = tl.program_id(0)
    b = row // C
    c = row % C
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < T
    x = tl.load(x_ptr + b * s_xb + c * s_xc + offs * s_xt, mask=ok, other=0.0).to(tl.float32)
    if HAS_BIAS:  # the producing conv's bias, added here instead of in a pass of its own
        x += tl.load(b_ptr + c).to(tl.float32)
    a = tl.load(a_ptr + c).to(tl.float32)
    s = tl.sin(a * x)
    y = x + s * s / (a + 1e-9)
    tl.store(y_ptr + b * s_yb + c * s_yc + offs, y.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def snake_cl_kernel(x_ptr, a_ptr, b_ptr, y_ptr, C, N, s_xb, s_yb, HAS_BIAS: tl.constexpr,
                    BLOCK: tl.constexpr):
    b = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    x = tl.load(x_ptr + b * s_xb + offs, mask=ok, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x += tl.load(b_ptr + offs % C, mask=ok, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + offs % C, mask=ok, other=1.0).to(tl.float32)
    s = tl.sin(a * x)
    y = x + s * s / (a + 1e-9)
    tl.store(y_ptr + b * s_yb + offs, y.to(y_ptr.dtype.element_ty), mask=ok)


def _rows_channels_last(t: torch.Tensor) -> bool:
    """Each batch row of ``t [B, C, T]`` is one dense ``T x C`` block, channels fastest."""
    _, c, n = t.shape
    return t.stride(1) == 1 and (t.stride(2) == c or n == 1)


def snake_triton(x: torch.Tensor, alpha: torch.Tensor, out: torch.Tensor | None = None,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """Snake of ``x + bias`` (``bias``: ``C`` values, or None for none) per channel."""
    b, c, t = x.shape
    has_bias = bias is not None
    bias_arg = bias if has_bias else alpha  # any pointer: never read without HAS_BIAS
    if _rows_channels_last(x) and (out is None or _rows_channels_last(out)):
        y = out if out is not None else torch.empty_like(x, memory_format=torch.preserve_format)
        if not _rows_channels_last(y):  # empty_like keeps only dense strides; x's rows may have gaps
            y = torch.empty((b, t, c), device=x.device, dtype=x.dtype).transpose(1, 2)
        n = c * t
        block = min(2048, triton.next_power_of_2(max(n, 16)))
        snake_cl_kernel[(b, triton.cdiv(n, block))](x, alpha, bias_arg, y, c, n, x.stride(0), y.stride(0),
                                                    HAS_BIAS=has_bias, BLOCK=block,
                                                    num_warps=4 if block >= 512 else 1)
        return y
    # channels-first: ``y`` rows contiguous in time (``out`` itself when its rows are, e.g. the tail
    # of a [history | new] buffer), read ``x`` through its strides
    y = out if out is not None and (out.stride(2) == 1 or t == 1) else torch.empty(
        (b, c, t), device=x.device, dtype=x.dtype)
    block = min(1024, triton.next_power_of_2(max(t, 16)))
    snake_kernel[(b * c, triton.cdiv(t, block))](x, alpha, bias_arg, y, c, t, x.stride(0), x.stride(1),
                                                 x.stride(2), y.stride(0), y.stride(1), HAS_BIAS=has_bias,
                                                 BLOCK=block, num_warps=4 if block >= 512 else 1)
    if out is not None and y is not out:
        out.copy_(y)
    return out if out is not None else y
