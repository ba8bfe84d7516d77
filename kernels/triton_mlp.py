"""Fused FP8 SwiGLU MLP on sm_90: two launches, no bf16 intermediate.

Launch 1: gate_up GEMM whose epilogue computes ``silu(g) * u`` and quantizes it to FP8 codes + group
scales (the down projection's activation format) in registers. Launch 2: the down GEMM reading those
codes. The activation of launch 1 is quantized in its prologue. The intermediate is M x F FP8 bytes
plus scales; the weights dominate the traffic at decode M.
"""

from __future__ import annotations

import torch

from .layout import BS_BLOCK, MX_BLOCK, QuantizedWeight, cdiv
from .triton_gemm import get_config, launch_gemm


def swiglu_mlp_fp8_triton(x: torch.Tensor, gate_up: QuantizedWeight, down: QuantizedWeight) -> torch.Tensor:
    d = x.shape[-1]
    x2 = x.reshape(-1, d)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    f = gate_up.shape[0] // 2
    cfg_gu = get_config("swiglu", m, gate_up.shape[0], d)
    mx = gate_up.scheme == "mxfp8"
    h_group = MX_BLOCK if mx else min(cfg_gu.bn, BS_BLOCK)
    hq = torch.empty(m, f, device=x.device, dtype=torch.float8_e4m3fn)
    hs = torch.empty(m, cdiv(f, h_group), device=x.device, dtype=torch.uint8 if mx else torch.float32)
    if cfg_gu.prequant:  # two launches before the down GEMM, but the GEMM streams A through smem
        from .triton_quant import quantize_activation_triton

        xq, xs = quantize_activation_triton(x2, MX_BLOCK if mx else BS_BLOCK)
        launch_gemm(xq, xs, gate_up, hq, None, cfg_gu, epi=1, h_scale=hs)
    else:
        launch_gemm(x2, None, gate_up, hq, None, cfg_gu, epi=1, h_scale=hs)
    out = torch.empty(m, d, device=x.device, dtype=x.dtype)
    cfg_d = get_config("down", m, d, f)
    launch_gemm(hq, hs, down, out, None, cfg_d, a_group=h_group)
    return out.view(x.shape)
