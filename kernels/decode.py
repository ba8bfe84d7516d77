"""The decode step's non-GEMM kernels, one entry point each, dispatched by :mod:`.dispatch`.

What lives here: RMSNorm (+ residual, optionally emitting FP8 codes for the next GEMM), q/k norm +
RoPE + KV-cache store, single-token decode attention over a slot cache (optionally emitting FP8
codes for the output projection), the fused top-k sampler. The Triton kernels are in
``triton_decode`` / ``triton_attention`` (imported lazily: triton is optional); the torch reference
of decode attention is here because the reference decode path calls it on any device.

Why decode attention reads the cache in place: gathering ``cache.k[layer][slots]`` then SDPA copies
``[bs, max_seq_len, kv, d]`` per layer and step and reads every masked position too; at bs 64 x
2048 positions on S2 Pro that is ~40 GB of traffic per frame, ten times the FP8 weights. The kernel
follows the slot index and stops at each slot's length. Static shapes, no host sync: capturable in
a CUDA graph. May import torch, triton and the package's own modules only.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from . import dispatch

#: Largest ``top_k`` the fused sampler handles exactly: it filters only the row's best ``TOPK_CAP``
#: logits. Rows beyond it take the reference sampler.
TOPK_CAP = 64


def _triton_decode() -> Any:
    from . import triton_decode

    return triton_decode


def rmsnorm(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None,
            quant_group: int = 0) -> tuple[Any, Tensor]:
    """Fused residual add + RMSNorm (Triton); see :func:`ttsfleet.kernels.triton_decode.rmsnorm`."""
    return _triton_decode().rmsnorm(x, weight, eps, residual, quant_group)


def qkv_rope_store(*args: Any, **kwargs: Any) -> Tensor:
    """Split QKV, q/k RMSNorm, RoPE, K/V into the cache (Triton); see ``triton_decode.qkv_rope_store``."""
    return _triton_decode().qkv_rope_store(*args, **kwargs)


def sample_topk(*args: Any, **kwargs: Any) -> Tensor:
    """The fused top-k sampler (Triton); see ``triton_decode.sample_topk``."""
    return _triton_decode().sample_topk(*args, **kwargs)


def decode_attention_ref(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor,
                         lengths: Tensor) -> Tensor:
    """q ``[bs, H, D]``; caches ``[max_slots, S, KV, D]``; attend keys ``< lengths[b]`` of ``slots[b]``.

    Returns ``[bs, H, D]``. KV head j serves query heads ``j*g .. j*g+g-1``.
    """
    k = k_cache[slots].transpose(1, 2)  # [bs, KV, S, D]
    v = v_cache[slots].transpose(1, 2)
    g = q.shape[1] // k.shape[1]
    if g > 1:
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
    s = k.shape[2]
    mask = (torch.arange(s, device=q.device)[None, :] < lengths[:, None])[:, None, None, :]
    return F.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=mask)[:, :, 0]


def attention_kernel_fits(q: Tensor, k_cache: Tensor, v_cache: Tensor) -> bool:
    """Shapes and dtypes the Triton kernel computes with the reference's numerics."""
    half = (torch.bfloat16, torch.float16)
    if q.dtype not in (half if q.is_cuda else (*half, torch.float32)):
        return False  # (float32 on CUDA would run tf32 dots: not the reference's numerics)
    d = q.shape[-1]
    return d >= 16 and not d & (d - 1) and k_cache.is_contiguous() and v_cache.is_contiguous()


def decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor | None, lengths: Tensor,
                     quant_group: int = 0) -> Any:
    """Triton where the device's plan says so and the shape fits, else :func:`decode_attention_ref`.

    ``slots`` None: row b reads cache slot b (the fast model's frame-local cache). ``lengths`` may hold
    one value for every row (shape ``[1]``). ``quant_group`` > 0 (Triton only, ``D % group == 0``):
    returns ``(fp8 codes [bs, H * D], scales)`` of the output instead of the bf16 ``[bs, H, D]``.
    """
    if dispatch.use_triton(q) and attention_kernel_fits(q, k_cache, v_cache):
        from .triton_attention import decode_attention_triton

        return decode_attention_triton(q, k_cache, v_cache, slots, lengths, quant_group)
    if quant_group:
        raise ValueError("a quantized attention output needs the Triton kernel")
    bs = q.shape[0]
    rows = torch.arange(bs, device=q.device) if slots is None else slots
    return decode_attention_ref(q, k_cache, v_cache, rows, lengths.expand(bs))
