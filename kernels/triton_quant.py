"""Triton activation quantizer (sm_90): bf16/fp32 -> FP8 codes + group scales in one launch.

Same arithmetic as :func:`ttsfleet.kernels.reference.quantize_activation_ref` (x * (1/s) with one
IEEE division per group, round-to-nearest-even, saturation at +-448, UE8M0 from the float32 bits),
so the two agree bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .layout import MX_BLOCK, cdiv
from .triton_gemm import (
    INTERPRETING,
    PDL,
    launch_opts,
    pdl_entry,
    quantize_group_rows,
)


@triton.jit
def act_quant_kernel(x_ptr, q_ptr, s_ptr, K, s_xm, s_qm, s_sm,
                     GROUP: tl.constexpr, G_PER_PROG: tl.constexpr, MX: tl.constexpr,
                     EXACT_CVT: tl.constexpr, USE_PDL: tl.constexpr):
    """One program: one row, G_PER_PROG consecutive groups of GROUP elements."""
    pdl_entry(USE_PDL)
    row = tl.program_id(0)
    g0 = tl.program_id(1) * G_PER_PROG
    offs_g = g0 + tl.arange(0, G_PER_PROG)
    offs_k = offs_g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    k_ok = offs_k < K
    x = tl.load(x_ptr + row * s_xm + offs_k, mask=k_ok, other=0.0).to(tl.float32)
    q, sc = quantize_group_rows(x, MX, EXACT_CVT)
    tl.store(q_ptr + row * s_qm + offs_k, q, mask=k_ok)
    g_ok = offs_g * GROUP < K
    tl.store(s_ptr + row * s_sm + offs_g, sc, mask=g_ok)


def quantize_activation_triton(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    kb = cdiv(k, block)
    q = torch.empty(m, k, device=x.device, dtype=torch.float8_e4m3fn)
    mx = block == MX_BLOCK
    s = torch.empty(m, kb, device=x.device, dtype=torch.uint8 if mx else torch.float32)
    gpp = min(triton.next_power_of_2(kb), max(1, 1024 // block))
    if m:
        act_quant_kernel[(m, triton.cdiv(kb, gpp))](x2, q, s, k, x2.stride(0), q.stride(0), s.stride(0),
                                                    GROUP=block, G_PER_PROG=gpp, MX=mx,
                                                    EXACT_CVT=INTERPRETING, USE_PDL=PDL, num_warps=4,
                                                    **launch_opts())
    return q.view(*lead, k), s.view(*lead, kb)
