"""Decode-size FP8 GEMMs through DeepGEMM (``TTSFLEET_DECODE_GEMM=deepgemm``, opt-in; issue #26).

Why: DeepGEMM computes our numeric contract — 1x128 activation and 128x128 weight scales, float32 — with
warp-specialised TMA producers and the per-block rescale promoted on CUDA cores, the design the issue asks
of a decode GEMM; it is also what fish-scales-ops, the write-up's kernel library, runs on sm_90. Whether it
beats our Triton kernel at decode M is measured (``benchmarks/inference_h200/deepgemm_gemm.py``, lever
``deepgemm`` in ``decode_levers.py``), not assumed, so it stays off until it wins there.

It is not a dependency: where ``deep_gemm`` does not import (it is built from source on the GPU machine,
``speed_run.sh deepgemm``), choosing it fails at the first GEMM with one line saying why. Its operands are
ours as they are: FP8 codes from the fused norms with float32 scales ``[M, K/128]``, the weight's codes and
``[N/128, K/128]`` scales; DeepGEMM lays the activation scales out for its TMA itself (a small launch per
GEMM, counted in every timing). The SwiGLU MLP is gate_up (bf16 out), ``silu(g) * u`` quantized to codes
(the cuBLAS path's launch), then down: three launches where ours takes two.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch

from . import decode
from .layout import QuantizedWeight


@cache
def _module() -> tuple[Any, str]:
    """``deep_gemm`` and "" — or None and why it is not usable here (read once per process)."""
    try:
        import deep_gemm
    except Exception as exc:  # noqa: BLE001 - any import failure is the answer, given to the caller
        return None, f"{type(exc).__name__}: {exc}"[:300]
    if not hasattr(deep_gemm, "fp8_gemm_nt"):
        return None, "deep_gemm has no fp8_gemm_nt (a DeepGEMM older than 2.0)"
    return deep_gemm, ""


def unavailable() -> str:
    """Why DeepGEMM cannot run the decode GEMMs in this process ("" where it can)."""
    return _module()[1]


def supports(qw: QuantizedWeight) -> bool:
    """Block-scaled FP8 weights (128 x 128 float32 scales, the contract DeepGEMM computes) whose every
    block is whole: its TMA boxes and scale grid assume N and K multiples of 128 (S2 Pro's are)."""
    n, k = qw.shape
    return qw.scheme == "bsgemm_fp8" and n % 128 == 0 and k % 128 == 0


def hand_sms(dg: Any, device: torch.device) -> None:
    """Give DeepGEMM the SM count ``TTSFLEET_DEEPGEMM_SMS`` asks for (at most the device's; ``all``: the
    device's, DeepGEMM's own default, so with ``all`` alone nothing is ever set). Checked at every eager
    call, so a switch set between steps holds from the next capture on."""
    want, total = decode.deepgemm_sms(), decode.sm_count(device)
    sms = total if want == "all" else min(int(want), total)
    if dg.get_num_sms() != sms:
        dg.set_num_sms(sms)


def gemm_codes(xq: torch.Tensor, xs: torch.Tensor, qw: QuantizedWeight, out_dtype: torch.dtype,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """``xq [M, K]`` FP8 codes with 1x128 scales ``xs [M, K/128]`` times ``qw`` -> ``[M, N]``."""
    dg, why = _module()
    if dg is None:
        raise RuntimeError(f"TTSFLEET_DECODE_GEMM=deepgemm, but DeepGEMM cannot run here: {why}")
    hand_sms(dg, xq.device)
    out = torch.empty(xq.shape[0], qw.shape[0], device=xq.device, dtype=torch.bfloat16)
    dg.fp8_gemm_nt((xq, xs.float()), (qw.qweight, qw.scale), out)
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out if out_dtype == torch.bfloat16 else out.to(out_dtype)


def swiglu_mlp_codes(xq: torch.Tensor, xs: torch.Tensor, gate_up: QuantizedWeight, down: QuantizedWeight,
                     out_dtype: torch.dtype) -> torch.Tensor:
    """The SwiGLU MLP of :func:`ttsfleet.kernels.ops.swiglu_mlp_fp8_codes` through DeepGEMM: the cuBLAS
    path's three launches with DeepGEMM's GEMM in cuBLAS's place."""
    from . import cublas_fp8

    return cublas_fp8.swiglu_mlp_codes(xq, xs, gate_up, down, out_dtype, gemm=gemm_codes)
