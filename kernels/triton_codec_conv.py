"""Triton convolutions for the codec's residual units, with their elementwise work in the epilogue.

Why (issue #25): a residual unit of the S2 codec decoder is Snake -> dilated causal conv (k=7) ->
Snake -> 1x1 conv -> residual add. Run as cuDNN convs between elementwise passes it reads and writes
its ``T x C`` tensor about eleven times; on the H200 the FLOP-free passes took ~9 of a 64 x 4 push's
14.7 ms (benchmarks/inference_h200/README.md, 2026-12-05). Here a conv is an implicit GEMM over
channels-last rows (time rows, channels contiguous), and what follows it is done on the
accumulator before the one store:

* :func:`conv_rows` — ``y[b, t, :] = epilogue(sum_k x[b, t + k*dil, :] @ W[k] + bias)``, the input
  being a causal conv's ``[history | new]`` buffer (so output row ``t`` reads rows ``t .. t+pad``);
  epilogue: Snake (the next Snake of the unit) or the residual add (``+ r[b, t, :]``), or neither.

The accumulator is float32 (bf16 / fp16 operands on tensor cores; float32 ones in IEEE float32, not
TF32, so a float32 codec keeps its numerics; Triton's interpreter gets bf16 dots wrong, 3.7.1, so it
takes them in float32 too); Snake and the residual are applied to it in float32 and the result is
rounded once (the unfused path rounds the conv's output to the activation dtype first).

Layout: every tensor is addressed as ``[B, T, C]`` rows through a batch and a time stride with
channels contiguous (stride 1) — the memory of the codec's channels-last ``[B, C, 1, T]`` tensors
(:mod:`ttsfleet.inference.codec_layers`) and of slices of its conv buffers. Weights are
``[K, Cin, Cout]`` contiguous (:func:`ttsfleet.kernels.codec_conv.weight_rows`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .codec_conv_tiles import ConvTile, tile_for
from .triton_gemm import INTERPRETING


@triton.jit
def conv_rows_kernel(x_ptr, w_ptr, b_ptr, a_ptr, r_ptr, y_ptr, T, CI, CO, DIL,
                     s_xb, s_xt, s_rb, s_rt, s_yb, s_yt,
                     KSIZE: tl.constexpr, SNAKE: tl.constexpr, RESIDUAL: tl.constexpr, F32_DOT: tl.constexpr,
                     BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_t = tl.program_id(0)
    pid_n = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    rt = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    t_ok = rt < T
    n_ok = rn < CO
    x_base = x_ptr + b * s_xb  # 64-bit base per stream, 32-bit offsets within it (registers)
    n_cblocks = tl.cdiv(CI, BLOCK_K)
    acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    # one flat loop over (tap, channel block), so Triton software-pipelines every step of the K sum;
    # tap k reads the input rows k * DIL later than the output row
    for i in range(0, KSIZE * n_cblocks):
        tap = i // n_cblocks
        ci = (i - tap * n_cblocks) * BLOCK_K + rk
        c_ok = ci < CI
        a = tl.load(x_base + (rt[:, None] + tap * DIL) * s_xt + ci[None, :],
                    mask=t_ok[:, None] & c_ok[None, :], other=0.0)
        w = tl.load(w_ptr + (tap * CI + ci[:, None]) * CO + rn[None, :], mask=c_ok[:, None] & n_ok[None, :],
                    other=0.0)
        if F32_DOT:  # float32 operands (IEEE, not TF32), and how the interpreter gets bf16 right
            acc = tl.dot(a.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, w, acc)
    acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if SNAKE:  # x + sin(alpha x)^2 / alpha, the unit's second Snake, on the float32 accumulator
        alpha = tl.load(a_ptr + rn, mask=n_ok, other=1.0).to(tl.float32)[None, :]
        s = tl.sin(alpha * acc)
        acc = acc + s * s / (alpha + 1e-9)
    tile_ok = t_ok[:, None] & n_ok[None, :]
    if RESIDUAL:  # the unit's input, added to its last conv's output
        r = tl.load(r_ptr + b * s_rb + rt[:, None] * s_rt + rn[None, :], mask=tile_ok, other=0.0)
        acc += r.to(tl.float32)
    y = y_ptr + b * s_yb + rt[:, None] * s_yt + rn[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=tile_ok)


def conv_rows_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, out: torch.Tensor,
                     dilation: int = 1, alpha: torch.Tensor | None = None,
                     residual: torch.Tensor | None = None, tile: ConvTile | None = None) -> torch.Tensor:
    """The launch behind :func:`ttsfleet.kernels.codec_conv.conv_rows` (arguments checked there):
    ``x [B, T + (K-1)*dilation, Ci]``, ``weight [K, Ci, Co]``, ``out`` / ``residual [B, T, Co]``,
    all with channel stride 1; ``tile`` None: :func:`~ttsfleet.kernels.codec_conv_tiles.tile_for`."""
    n_b, t, c_out = out.shape
    k_size, c_in, _ = weight.shape
    tile = tile or tile_for(t, k_size, c_in, c_out)
    res = residual if residual is not None else out  # any pointer: never read without RESIDUAL
    grid = (triton.cdiv(t, tile.block_t), triton.cdiv(c_out, tile.block_n), n_b)
    conv_rows_kernel[grid](x, weight, bias, alpha if alpha is not None else bias, res, out, t, c_in, c_out,
                           dilation, x.stride(0), x.stride(1), res.stride(0), res.stride(1), out.stride(0),
                           out.stride(1), KSIZE=k_size, SNAKE=alpha is not None,
                           RESIDUAL=residual is not None, F32_DOT=INTERPRETING or x.dtype == torch.float32,
                           BLOCK_T=tile.block_t, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k,
                           num_warps=tile.num_warps, num_stages=tile.num_stages)
    return out
