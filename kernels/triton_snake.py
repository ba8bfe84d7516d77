"""Triton Snake (see :mod:`.snake`): one program per (row of ``B x C``, block of time steps)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def snake_kernel(x_ptr, a_ptr, y_ptr, C, T, s_xb, s_xc, s_xt, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    b = row // C
    c = row % C
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < T
    x = tl.load(x_ptr + b * s_xb + c * s_xc + offs * s_xt, mask=ok, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + c).to(tl.float32)
    s = tl.sin(a * x)
    y = x + s * s / (a + 1e-9)
    tl.store(y_ptr + row * T + offs, y.to(y_ptr.dtype.element_ty), mask=ok)


def snake_triton(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    b, c, t = x.shape
    y = torch.empty((b, c, t), device=x.device, dtype=x.dtype)
    block = min(1024, triton.next_power_of_2(max(t, 16)))
    snake_kernel[(b * c, triton.cdiv(t, block))](x, alpha, y, c, t, x.stride(0), x.stride(1), x.stride(2),
                                                 BLOCK=block, num_warps=4 if block >= 512 else 1)
    return y
