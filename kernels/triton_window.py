"""Triton kernel for the DualAR token-window shift (one program per batch row, no allocation).

Why a kernel: inside a captured decode graph a torch ``copy_`` of overlapping memory needs a
temporary; this does the shift in registers. Within each chunk every element is loaded before any
is stored (barrier), and chunks advance toward higher addresses, so no element is overwritten
before it is read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def window_shift_kernel(prev_ptr, next_ptr, W, CW, s_pb, s_nb, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    base = prev_ptr + b * s_pb
    total = (W - 1) * CW
    for start in range(0, total, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < total
        v = tl.load(base + offs + CW, mask=ok)
        tl.debug_barrier()
        tl.store(base + offs, v, mask=ok)
        tl.debug_barrier()
    for start in range(0, CW, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < CW
        tl.store(base + total + offs, tl.load(next_ptr + b * s_nb + offs, mask=ok), mask=ok)


def prev_tokens_shift_triton(prev: torch.Tensor, next_tokens: torch.Tensor) -> None:
    bs, w, cw = prev.shape
    block = min(1024, max(32, triton.next_power_of_2(w * cw)))
    window_shift_kernel[(bs,)](prev, next_tokens, w, cw, prev.stride(0), next_tokens.stride(0),
                               BLOCK=block, num_warps=4)
