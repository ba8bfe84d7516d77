"""Split-KV decode attention ("flash-decoding"): one slot's keys shared out among several programs.

Why: :mod:`.triton_attention` runs one program per (row, KV head), which walks the row's keys alone.
S2 Pro has 8 KV heads, so a decode step at batch 1 launches 8 programs on an H200's 132 SMs, each
walking the whole context in sequence: at 4,096 positions the batch-1 step took 6.85 ms against
~5.0 ms at 576 (2026-12-04, run9), while its K/V are 0.6 GB (0.13 ms at the HBM's bandwidth). Here
each (row, KV head) has ``SPLITS`` programs, each over one contiguous share of the keys, writing its
online-softmax state (running max, sum, unnormalised output, float32); a second kernel per (row,
KV head) merges the shares (each rescaled by ``exp(m_s - max)``) and writes the output as the
one-pass kernel does (bf16, or the FP8 codes + scales of the output projection's input).

Split count: fixed per call from shapes only (batch, KV heads, cache length), never from the
lengths, so a CUDA graph captures it; the lengths then decide each share at run time (a share past
a row's length is empty and costs one program that stores an empty state). Same numerics as the
one-pass kernel up to the order of the float32 sums.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from .decode import attention_block_n, attn_tile
from .triton_attention import (
    _TL,
    FusedRope,
    _attend_keys,
    _fused_q,
    _prefetch_kv,
    _row_keys,
    _store_heads,
    block_g,
    cache_scale_args,
    kv_prefetch_args,
    output_buffers,
    query_args,
)
from .triton_gemm import INTERPRETING, PDL, launch_opts, pdl_entry


@triton.jit
def _split_partial_kernel(q_ptr, k_ptr, v_ptr, m_ptr, l_ptr, acc_ptr, slots_ptr, len_ptr, ks_ptr, vs_ptr,
                          scale, sq_b, sq_h, sk_slot, sk_pos, sk_head, s_len, ss_slot, ss_pos, ss_head,
                          G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                          SPLITS: tl.constexpr, SLOT_IS_ROW: tl.constexpr, KEYS_BOUND: tl.constexpr,
                          KV_FP8: tl.constexpr, USE_PDL: tl.constexpr, n_slots=1, cache_len=1,
                          PREFETCH: tl.constexpr = 0, KEY_BYTES: tl.constexpr = 0, qn_ptr=None, kn_ptr=None,
                          rope_ptr=None, pos_ptr=None, pos_stride=0, eps=0.0,
                          ROPE_FUSED: tl.constexpr = False, N_KV: tl.constexpr = 1,
                          QK_NORM: tl.constexpr = False, EXACT_CVT: tl.constexpr = False):
    """Program (row, KV head, share): the online-softmax state of keys ``[share * per, ...)``.
    ROPE_FUSED (``q_ptr`` the QKV output, as in the one-pass kernel): every share rotates its query
    heads; the share whose keys hold the row's position (share 0 where no share does) stores the
    KV head there."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    if USE_PDL and PREFETCH > 0:
        _prefetch_kv(k_ptr, v_ptr, slots_ptr, len_ptr, b, kvh, sp, s_len, sk_slot, sk_pos, sk_head, n_slots,
                     cache_len, SPLITS, BLOCK_N, PREFETCH, KEY_BYTES, SLOT_IS_ROW)
    pdl_entry(USE_PDL)
    slot, n_keys = _row_keys(slots_ptr, len_ptr, b, s_len, SLOT_IS_ROW)
    per = tl.cdiv(tl.cdiv(n_keys, SPLITS), BLOCK_N) * BLOCK_N  # whole key blocks per share
    lo = sp * per
    hi = tl.minimum(lo + per, n_keys)
    gi = tl.arange(0, BLOCK_G)
    di = tl.arange(0, D)
    heads = kvh * G + gi
    if ROPE_FUSED:
        pos = tl.load(pos_ptr + b * pos_stride).to(tl.int32)
        owner = tl.minimum(tl.where(pos < n_keys, pos // tl.maximum(per, 1), 0), SPLITS - 1)
        q = _fused_q(q_ptr, qn_ptr, kn_ptr, rope_ptr, pos_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, b, kvh, slot,
                     pos_stride, eps, sq_b, sk_slot, sk_pos, sk_head, ss_slot, ss_pos, ss_head, sp == owner,
                     G, BLOCK_G, D, N_KV, QK_NORM, KV_FP8, EXACT_CVT, q_ptr.dtype.element_ty)
    else:
        q = tl.load(q_ptr + b * sq_b + heads[:, None] * sq_h + di[None, :], mask=(gi < G)[:, None], other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    m_i, l_i, acc = _attend_keys(q, k_ptr, v_ptr, ks_ptr, vs_ptr, slot * sk_slot + kvh * sk_head,
                                 slot * ss_slot + kvh * ss_head, sk_pos, ss_pos, di, lo, hi, scale,
                                 m_i, l_i, acc, BLOCK_N, KEYS_BOUND, KV_FP8)
    state = ((b * tl.num_programs(1) + kvh) * SPLITS + sp).to(tl.int64) * BLOCK_G
    tl.store(m_ptr + state + gi, m_i)
    tl.store(l_ptr + state + gi, l_i)
    tl.store(acc_ptr + (state + gi[:, None]) * D + di[None, :], acc)


@triton.jit
def _split_merge_kernel(m_ptr, l_ptr, acc_ptr, o_ptr, os_ptr, so_b, so_h, s_osb, s_osg,
                        G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr,
                        QUANT: tl.constexpr, GROUP: tl.constexpr, MX: tl.constexpr, OUT_DTYPE: tl.constexpr,
                        EXACT_CVT: tl.constexpr, USE_PDL: tl.constexpr):
    """Program (row, KV head): the shares' states merged into the head's G output rows."""
    pdl_entry(USE_PDL)
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    gi = tl.arange(0, BLOCK_G)
    di = tl.arange(0, D)
    first = ((b * tl.num_programs(1) + kvh) * SPLITS).to(tl.int64) * BLOCK_G
    m_max = tl.full([BLOCK_G], float("-inf"), tl.float32)
    for sp in tl.static_range(SPLITS):
        m_max = tl.maximum(m_max, tl.load(m_ptr + first + sp * BLOCK_G + gi))
    total = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    for sp in tl.static_range(SPLITS):  # an empty share (max -inf, sum 0) weighs exp(-inf) = 0
        row = first + sp * BLOCK_G
        w = tl.exp(tl.load(m_ptr + row + gi) - m_max)
        total += w * tl.load(l_ptr + row + gi)
        acc += w[:, None] * tl.load(acc_ptr + (row + gi[:, None]) * D + di[None, :])
    out = (acc / total[:, None]).to(OUT_DTYPE)
    _store_heads(out, o_ptr, os_ptr, b, kvh, kvh * G + gi, gi < G, di, so_b, so_h, s_osb, s_osg, G, BLOCK_G,
                 D, QUANT, GROUP, MX, EXACT_CVT)


def decode_attention_split(q: Tensor | FusedRope, k_cache: Tensor, v_cache: Tensor, slots: Tensor | None,
                           lengths: Tensor, splits: int, quant_group: int = 0, k_scale: Tensor | None = None,
                           v_scale: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
    """:func:`~ttsfleet.kernels.triton_attention.decode_attention_triton`'s contract, the keys of every
    (row, KV head) shared out among ``splits`` programs (two launches)."""
    kv = k_cache.shape[2]
    q, q_ptr, sq_b, sq_h, fused = query_args(q, kv)
    bs, h, d = q.shape
    g = h // kv
    rows_g = block_g(g)
    out, osc = output_buffers(q, quant_group)
    m = torch.empty(bs, kv, splits, rows_g, device=q.device, dtype=torch.float32)
    total = torch.empty_like(m)
    acc = torch.empty(bs, kv, splits, rows_g, d, device=q.device, dtype=torch.float32)
    fp8 = k_scale is not None
    ks, vs, s_st = cache_scale_args(k_scale, v_scale, lengths)
    _split_partial_kernel[(bs, kv, splits)](
        q_ptr, k_cache, v_cache, m, total, acc, lengths if slots is None else slots, lengths, ks, vs,
        1.0 / math.sqrt(d), sq_b, sq_h, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        0 if lengths.numel() == 1 else lengths.stride(0), *s_st,
        G=g, BLOCK_G=rows_g, D=d, BLOCK_N=attention_block_n(k_cache.shape[1]), SPLITS=splits,
        SLOT_IS_ROW=slots is None, KEYS_BOUND=k_cache.shape[1] if INTERPRETING else 0, KV_FP8=fp8,
        USE_PDL=PDL, **kv_prefetch_args(k_cache, v_cache, bs * kv * splits, splits),
        **(dict(fused, EXACT_CVT=INTERPRETING) if fused else {}),
        num_warps=attn_tile()[0], **launch_opts(),
    )
    _split_merge_kernel[(bs, kv)](
        m, total, acc, out, osc, out.stride(0), out.stride(1), osc.stride(0), osc.stride(-1),
        G=g, BLOCK_G=rows_g, D=d, SPLITS=splits, QUANT=quant_group > 0, GROUP=max(quant_group, 1),
        MX=quant_group == 32, OUT_DTYPE=_TL[q.dtype], EXACT_CVT=INTERPRETING, USE_PDL=PDL, **launch_opts(),
    )
    return (out.view(bs, h * d), osc) if quant_group > 0 else out
