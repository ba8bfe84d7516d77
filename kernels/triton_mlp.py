"""Fused FP8 SwiGLU MLP on sm_90: two launches, no bf16 intermediate.

Launch 1: gate_up GEMM whose epilogue computes ``silu(g) * u`` and quantizes it to FP8 codes + group
scales (the down projection's activation format, 1x128 / 1x32 as for any activation) in registers.
Launch 2: the down GEMM reading those codes. The activation of launch 1 is quantized in its prologue,
by a separate launch (``prequant``), or arrives quantized (a fused norm's output). The intermediate
is M x F FP8 bytes plus scales; the weights dominate the traffic at decode M.
"""

from __future__ import annotations

import torch

from .layout import QuantizedWeight, cdiv
from .triton_gemm import act_group, get_config, launch_gemm


def swiglu_mlp_fp8_triton(x: torch.Tensor, gate_up: QuantizedWeight, down: QuantizedWeight,
                          x_scale: torch.Tensor | None = None,
                          out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x``: bf16/fp32 ``[..., D]``, or FP8 codes with ``x_scale`` (then ``out_dtype`` is required)."""
    d = x.shape[-1]
    x2 = x.reshape(-1, d)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    f = gate_up.shape[0] // 2
    cfg_gu = get_config("swiglu", m, gate_up.shape[0], d)
    grp = act_group(gate_up.scheme)
    mx = gate_up.scheme == "mxfp8"
    hq = torch.empty(m, f, device=x.device, dtype=torch.float8_e4m3fn)
    hs = torch.empty(m, cdiv(f, grp), device=x.device, dtype=torch.uint8 if mx else torch.float32)
    if x_scale is not None:
        launch_gemm(x2, x_scale.reshape(m, -1), gate_up, hq, None, cfg_gu, epi=1, h_scale=hs)
    elif cfg_gu.prequant:  # two launches before the down GEMM, but the GEMM streams A through smem
        from .triton_quant import quantize_activation_triton

        xq, xs = quantize_activation_triton(x2, grp)
        launch_gemm(xq, xs, gate_up, hq, None, cfg_gu, epi=1, h_scale=hs)
    else:
        launch_gemm(x2, None, gate_up, hq, None, cfg_gu, epi=1, h_scale=hs)
    out = torch.empty(m, d, device=x.device, dtype=out_dtype or x.dtype)
    launch_gemm(hq, hs, down, out, None, get_config("down", m, d, f))
    return out.view(*x.shape[:-1], d)
