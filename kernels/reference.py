"""Torch reference implementations: the numerics every Triton kernel must reproduce.

Why they exist: CI has no GPU, the server must still run on CPU and on GPUs without a Triton path,
and the GPU kernels are tested against these. Quantization is defined *bit-exactly* here (IEEE
division, round-to-nearest-even, saturation at +-448) so a kernel can match it element for element:

* 1x128 / 128x128 (bsgemm): ``s = max(amax / 448, FLT_MIN)`` in float32; ``q = fp8(clamp(x * (1 / s)))``
  (one division per group, not per element: per-element IEEE division cost the GPU kernels 3x).
* 1x32 UE8M0 (mxfp8): ``e = ceil(log2(amax / 448))`` computed from the float32 bits (no log2
  rounding), clamped to the biased range [1, 254]; ``s = 2**e`` so ``|x / s| <= 448`` always.

For UE8M0 ``1 / s`` is an exact power of two, so ``x * (1 / s) == x / s``. Matmuls dequantize both
operands to float32 and accumulate in float32.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ttsfleet.quantization import FP8_SCHEMES

from .layout import BS_BLOCK, FP8_MAX, MX_BLOCK, QuantizedWeight, cdiv

FP8 = torch.float8_e4m3fn
FLT_MIN = 1.1754943508222875e-38


def _pad_to(t: Tensor, dim: int, mult: int) -> Tensor:
    extra = (-t.shape[dim]) % mult
    if not extra:
        return t
    pad = [0, 0] * (t.dim() - dim - 1) + [0, extra]
    return torch.nn.functional.pad(t, pad)


def _to_fp8(x: Tensor) -> Tensor:
    return x.clamp(-FP8_MAX, FP8_MAX).to(FP8)


def ue8m0_from_amax(amax: Tensor) -> Tensor:
    """Biased UE8M0 exponent (int32) of the smallest power of two >= amax/448, clamped to [1, 254]."""
    r = (amax.float() / FP8_MAX).contiguous()
    bits = r.view(torch.int32)
    exp = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    return (exp + (mant != 0).to(torch.int32)).clamp(1, 254)


def ue8m0_to_float(e: Tensor) -> Tensor:
    """2**(e - 127) as float32, exactly (e in [1, 254] is always a normal float32)."""
    return (e.to(torch.int32) << 23).view(torch.float32)


def quantize_activation_ref(x: Tensor, block: int = BS_BLOCK) -> tuple[Tensor, Tensor]:
    """``x [..., K]`` -> ``(fp8 [..., K], scales [..., ceil(K/block)])``; row-major contiguous scales.

    block 128: float32 scales (bsgemm). block 32: uint8 UE8M0 exponents (mxfp8).
    """
    if block not in (BS_BLOCK, MX_BLOCK):
        raise ValueError(f"activation block must be {BS_BLOCK} (bsgemm) or {MX_BLOCK} (mxfp8), got {block}")
    lead, k = x.shape[:-1], x.shape[-1]
    xf = _pad_to(x.reshape(-1, k).float(), 1, block)
    g = xf.view(xf.shape[0], -1, block)
    amax = g.abs().amax(dim=2)
    if block == BS_BLOCK:
        s = torch.clamp(amax / FP8_MAX, min=FLT_MIN)
        q = _to_fp8(g * (1.0 / s)[:, :, None])
        scales = s
    else:
        e = ue8m0_from_amax(amax)
        q = _to_fp8(g * (1.0 / ue8m0_to_float(e))[:, :, None])
        scales = e.to(torch.uint8)
    q = q.view(xf.shape[0], -1)[:, :k].contiguous()
    return q.view(*lead, k), scales.contiguous().view(*lead, cdiv(k, block))


def quantize_kv_ref(x: Tensor) -> tuple[Tensor, Tensor]:
    """K or V head vectors ``x [..., D]`` -> (e4m3 codes ``[..., D]``, uint8 UE8M0 exponents ``[...]``).

    The FP8 KV cache's format: one power-of-two scale per head vector (one per cache position, layer
    and KV head), by the mxfp8 rule over the whole head (the smallest ``2**(e-127) >= amax / 448``),
    so ``|x / s| <= 448`` always and dequantization ``code * 2**(e-127)`` is exact in bf16 and float32.
    """
    xf = x.float()
    e = ue8m0_from_amax(xf.abs().amax(dim=-1))
    q = _to_fp8(xf * (1.0 / ue8m0_to_float(e))[..., None])
    return q, e.to(torch.uint8)


def dequantize_kv(codes: Tensor, exps: Tensor, dtype: torch.dtype) -> Tensor:
    """The values an FP8 KV cache's ``codes [..., D]`` and exponents ``[...]`` stand for, in ``dtype``."""
    return (codes.float() * ue8m0_to_float(exps)[..., None]).to(dtype)


def quantize_weight_ref(w: Tensor, scheme: str) -> QuantizedWeight:
    """Offline quantizer: ``w [N, K]`` (any float dtype) -> :class:`QuantizedWeight`."""
    if w.dim() != 2:
        raise ValueError(f"weight must be 2-D [N, K], got shape {tuple(w.shape)}")
    if not w.is_floating_point():
        raise ValueError(f"weight must be floating point, got {w.dtype}")
    n, k = w.shape
    if scheme == "bsgemm_fp8":
        wf = _pad_to(_pad_to(w.float(), 0, BS_BLOCK), 1, BS_BLOCK)
        nb, kb = wf.shape[0] // BS_BLOCK, wf.shape[1] // BS_BLOCK
        blocks = wf.view(nb, BS_BLOCK, kb, BS_BLOCK)
        s = torch.clamp(blocks.abs().amax(dim=(1, 3)) / FP8_MAX, min=FLT_MIN)
        q = _to_fp8(blocks * (1.0 / s)[:, None, :, None]).view(nb * BS_BLOCK, kb * BS_BLOCK)[:n, :k]
        return QuantizedWeight(q.contiguous(), s.contiguous(), scheme, (n, k))
    if scheme == "mxfp8":
        q, e = quantize_activation_ref(w, MX_BLOCK)
        return QuantizedWeight(q, e, scheme, (n, k))
    raise ValueError(f"unknown quantization scheme {scheme!r}; expected one of {', '.join(FP8_SCHEMES)}")


def expand_scales(scale: Tensor, rows_block: int, k_block: int, rows: int, k: int) -> Tensor:
    """Per-element float32 multipliers ``[rows, k]`` from a logical ``[row_blocks, k_blocks]`` scale.

    Reads through the tensor's own strides (indexing), never its raw storage order.
    """
    s = ue8m0_to_float(scale) if scale.dtype == torch.uint8 else scale.float()
    return s.repeat_interleave(rows_block, 0)[:rows].repeat_interleave(k_block, 1)[:, :k]


def dequantize_weight(qw: QuantizedWeight) -> Tensor:
    """float32 ``[N, K]`` weight the FP8 codes and scales stand for."""
    n, k = qw.shape
    rb, kb = (BS_BLOCK, BS_BLOCK) if qw.scheme == "bsgemm_fp8" else (1, MX_BLOCK)
    return qw.qweight.float() * expand_scales(qw.scale, rb, kb, n, k)


def dequantize_activation(xq: Tensor, scales: Tensor) -> Tensor:
    """float32 ``[M, K]`` from ``quantize_activation`` output (block inferred from the scale dtype)."""
    m, k = xq.shape
    block = MX_BLOCK if scales.dtype == torch.uint8 else BS_BLOCK
    return xq.float() * expand_scales(scales, 1, block, m, k)


def act_block(scheme: str) -> int:
    return BS_BLOCK if scheme == "bsgemm_fp8" else MX_BLOCK


def linear_fp8_codes_ref(xq: Tensor, xs: Tensor, qw: QuantizedWeight, out_dtype: torch.dtype,
                         bias: Tensor | None = None) -> Tensor:
    """``xq [..., K]`` FP8 codes with their group scales: dequantize both, matmul in float32."""
    k = xq.shape[-1]
    out = dequantize_activation(xq.reshape(-1, k), xs.reshape(-1, xs.shape[-1])) @ dequantize_weight(qw).t()
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype).view(*xq.shape[:-1], qw.shape[0])


def linear_fp8_ref(x: Tensor, qw: QuantizedWeight, bias: Tensor | None = None,
                   out_dtype: torch.dtype | None = None) -> Tensor:
    """Quantize ``x`` per the scheme's activation format, dequantize both, matmul in float32."""
    xq, xs = quantize_activation_ref(x, act_block(qw.scheme))
    return linear_fp8_codes_ref(xq, xs, qw, out_dtype or x.dtype, bias)


def _w8a16_sums(x: Tensor, qw: QuantizedWeight) -> Tensor:
    """float32 ``[rows, N]`` sums of ``x`` as bf16 times each weight ``code * scale`` rounded once to
    bf16: what the W8A16 kernel's MMAs accumulate."""
    w = dequantize_weight(qw).to(torch.bfloat16).float()
    return x.reshape(-1, x.shape[-1]).to(torch.bfloat16).float() @ w.t()


def linear_w8a16_ref(x: Tensor, qw: QuantizedWeight, bias: Tensor | None = None) -> Tensor:
    """W8A16 (:func:`.triton_gemm.linear_w8a16_triton`): :func:`_w8a16_sums` (+ bias), bf16 out. No
    activation quantization: closer to a bf16 linear than the block-scaled FP8 product is."""
    out = _w8a16_sums(x, qw)
    if bias is not None:
        out = out + bias.float()
    return out.to(torch.bfloat16).view(*x.shape[:-1], qw.shape[0])


def swiglu_w8a16_ref(x: Tensor, gate_up: QuantizedWeight) -> Tensor:
    """The W8A16 MLP's first half (:func:`.triton_gemm.swiglu_w8a16_triton`): gate and up sums as
    :func:`linear_w8a16_ref` makes them (float32, not rounded), ``silu(g) * u`` in float32, bf16 out."""
    gate, up = _w8a16_sums(x, gate_up).chunk(2, dim=-1)
    h = torch.nn.functional.silu(gate) * up
    return h.to(torch.bfloat16).view(*x.shape[:-1], gate_up.shape[0] // 2)


def swiglu_mlp_fp8_codes_ref(xq: Tensor, xs: Tensor, gate_up: QuantizedWeight, down: QuantizedWeight,
                             out_dtype: torch.dtype) -> Tensor:
    """gate_up (fp32 result, never rounded) -> silu(g) * u in fp32 -> FP8 quantize -> down."""
    f = gate_up.shape[0] // 2
    gu = linear_fp8_codes_ref(xq, xs, gate_up, torch.float32)
    h = torch.nn.functional.silu(gu[..., :f]) * gu[..., f:]
    return linear_fp8_ref(h, down, out_dtype=out_dtype)


def swiglu_mlp_fp8_ref(x: Tensor, gate_up: QuantizedWeight, down: QuantizedWeight) -> Tensor:
    """:func:`swiglu_mlp_fp8_codes_ref` of ``x`` quantized per the scheme's activation format."""
    xq, xs = quantize_activation_ref(x, act_block(gate_up.scheme))
    return swiglu_mlp_fp8_codes_ref(xq, xs, gate_up, down, x.dtype)


def prev_tokens_shift_ref(prev: Tensor, next_tokens: Tensor) -> None:
    """Drop the oldest step of ``prev [bs, W, cw]`` and append ``next_tokens [bs, cw]``, in place."""
    if prev.shape[1] > 1:
        prev[:, :-1].copy_(prev[:, 1:].clone())
    prev[:, -1].copy_(next_tokens)
