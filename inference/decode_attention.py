"""Single-token decode attention that reads the slot KV cache in place, up to each slot's length.

Why not gather + SDPA: ``cache.k[layer][slots]`` copies ``[bs, max_seq_len, kv, d]`` per layer and
step, and SDPA then reads every masked position too; at bs 64 × 2048 positions on S2 Pro that is
~40 GB of traffic per frame, ten times the FP8 weights. The Triton kernel follows the slot index and
stops at the slot's length, so it reads only live keys. Static shapes, no host sync: capturable in
a CUDA graph. CPU (and any failure to import Triton) uses the torch reference below.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch import Tensor


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


_KERNEL = None


def _build_kernel():  # noqa: ANN202 - returns a triton.JITFunction
    import triton
    import triton.language as tl

    @triton.jit
    def _kernel(q_ptr, k_ptr, v_ptr, o_ptr, slots_ptr, len_ptr, scale,
                sq_b, sq_h, sk_slot, sk_pos, sk_head, so_b, so_h, s_len,
                G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                SLOT_IS_ROW: tl.constexpr, KEYS_BOUND: tl.constexpr):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        if SLOT_IS_ROW:  # noqa: SIM108 - Triton code
            slot = b.to(tl.int64)
        else:
            slot = tl.load(slots_ptr + b).to(tl.int64)
        n_keys = tl.load(len_ptr + b * s_len).to(tl.int32)
        gi = tl.arange(0, BLOCK_G)
        di = tl.arange(0, D)
        heads = kvh * G + gi
        gmask = gi < G
        q = tl.load(q_ptr + b * sq_b + heads[:, None] * sq_h + di[None, :], mask=gmask[:, None], other=0.0)
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, D], tl.float32)
        base = slot * sk_slot + kvh * sk_head
        # KEYS_BOUND > 0 (Triton's interpreter, which cannot loop to a loaded bound): walk the whole
        # cache length; the masks make the extra blocks no-ops.
        for start in range(0, KEYS_BOUND if KEYS_BOUND > 0 else n_keys, BLOCK_N):
            ni = start + tl.arange(0, BLOCK_N)
            nmask = ni < n_keys
            offs = base + ni[:, None].to(tl.int64) * sk_pos + di[None, :]
            k = tl.load(k_ptr + offs, mask=nmask[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
            s = tl.where(nmask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_ptr + offs, mask=nmask[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(o_ptr + b * so_b + heads[:, None] * so_h + di[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=gmask[:, None])

    return _kernel


def _triton_ok(q: Tensor) -> bool:
    from .fused import fused_enabled

    half = (torch.bfloat16, torch.float16)
    if not fused_enabled(q) or q.dtype not in (half if q.is_cuda else (*half, torch.float32)):
        return False  # (float32 on CUDA would run tf32 dots: not the reference's numerics)
    d = q.shape[-1]
    if d < 16 or d & (d - 1):
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor | None,
                     lengths: Tensor) -> Tensor:
    """Dispatch: Triton on CUDA (power-of-two head_dim), else :func:`decode_attention_ref`.

    ``slots`` None: row b reads cache slot b (the fast model's frame-local cache). ``lengths`` may hold
    one value for every row (shape ``[1]``).
    """
    global _KERNEL
    bs = q.shape[0]
    if not _triton_ok(q) or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        rows = torch.arange(bs, device=q.device) if slots is None else slots
        return decode_attention_ref(q, k_cache, v_cache, rows, lengths.expand(bs))
    if _KERNEL is None:
        _KERNEL = _build_kernel()
    h, d = q.shape[1:]
    kv = k_cache.shape[2]
    g = h // kv
    q = q.contiguous()
    out = torch.empty_like(q)
    _KERNEL[(bs, kv)](
        q, k_cache, v_cache, out, lengths if slots is None else slots, lengths, 1.0 / math.sqrt(d),
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), out.stride(1), 0 if lengths.numel() == 1 else lengths.stride(0),
        G=g, BLOCK_G=max(16, 1 << (g - 1).bit_length()), D=d, BLOCK_N=64 if k_cache.shape[1] > 16 else 16,
        SLOT_IS_ROW=slots is None,
        KEYS_BOUND=k_cache.shape[1] if os.environ.get("TRITON_INTERPRET") == "1" else 0,
    )
    return out
