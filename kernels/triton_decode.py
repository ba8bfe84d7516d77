"""Triton kernels that collapse the decode step's elementwise chains into single launches.

Why: one audio frame of S2 Pro runs 36 slow layers plus 4 fast layers at 10 positions, and the
reference path spends ~100 small torch ops per slow layer, ~80 per fast layer position and ~140 per
sampled token (measured with a dispatch counter): ~5,500 kernels per frame. Even replayed from a
CUDA graph each costs a few microseconds, which is what a 16 ms batch-1 step was made of. These
kernels do the same arithmetic in the reference's rounding order (float32 math, bf16 results where
the reference rounds to bf16), so tokens match the reference path except at float near-ties:

* :func:`rmsnorm` — optional residual add, then RMSNorm (1 launch instead of ~9), optionally
  emitting the FP8 codes + group scales the next GEMM reads instead of bf16 (the activation
  quantizer's launch folded in, bit-identical to quantizing the bf16 output);
* :func:`qkv_rope_store` — split the fused QKV output, per-head q/k RMSNorm, interleaved RoPE at
  each row's position, K/V written straight into the cache (1 launch instead of ~40);
* :func:`sample_topk` — repetition penalty, greedy argmax, top-p/top-k/temperature, the counter-based
  noise and the exponential race, plus S2's repetition-aware resampling for the main token
  (2 launches + one ``torch.topk`` instead of ~140 ops per token; or, ``select="kernel"``, one
  launch that also selects the row's best logits itself: :func:`_top_select`).

They run on CUDA, and on CPU tensors under ``TRITON_INTERPRET=1`` (how the tests check them without
a GPU). Callers reach them through :mod:`ttsfleet.kernels.decode`, which owns the dispatch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .cublas_fp8 import activation_scales
from .decode import TOPK_CAP, check_kv_cache
from .layout import cdiv
from .triton_gemm import (
    INTERPRETING,
    PDL,
    _ue8m0_from_amax,
    _ue8m0_to_f32,
    launch_opts,
    pdl_entry,
    quantize_group_rows,
    to_e4m3,
)


# ----------------------------------------------------------------------------- RMSNorm
@triton.jit
def quantize_groups(v, BLOCK: tl.constexpr, GROUP: tl.constexpr, MX: tl.constexpr, EXACT_CVT: tl.constexpr):
    """``v [BLOCK]`` float32 -> (FP8 codes [BLOCK], scales [BLOCK // GROUP]) as the activation quantizer."""
    q, sc = quantize_group_rows(tl.reshape(v, (BLOCK // GROUP, GROUP)), MX, EXACT_CVT)
    return tl.reshape(q, (BLOCK,)), sc


@triton.jit
def _rmsnorm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, s_ptr, D, eps, s_x, s_r, s_y, s_h, s_s, s_sg,
                    HAS_RES: tl.constexpr, BLOCK: tl.constexpr, QUANT: tl.constexpr, GROUP: tl.constexpr,
                    MX: tl.constexpr, OUT_DTYPE: tl.constexpr, EXACT_CVT: tl.constexpr,
                    USE_PDL: tl.constexpr):
    pdl_entry(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < D
    x = tl.load(x_ptr + row * s_x + offs, mask=m, other=0.0)
    if HAS_RES:  # h = x + r, rounded to the stream's dtype like a torch add
        r = tl.load(r_ptr + row * s_r + offs, mask=m, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + row * s_h + offs, x, mask=m)
    xf = x.to(tl.float32)
    inv = tl.math.rsqrt(tl.sum(xf * xf, axis=0) / D + eps)
    y = (xf * inv).to(x.dtype).to(tl.float32)  # reference: y.type_as(x) * weight
    w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    out = (y * w).to(OUT_DTYPE)
    if QUANT:  # the codes linear_fp8 would make of ``out``: quantize the rounded value
        q, sc = quantize_groups(out.to(tl.float32), BLOCK, GROUP, MX, EXACT_CVT)
        tl.store(y_ptr + row * s_y + offs, q, mask=m)
        gi = tl.arange(0, BLOCK // GROUP)
        tl.store(s_ptr + row * s_s + gi * s_sg, sc, mask=gi * GROUP < D)
    else:
        tl.store(y_ptr + row * s_y + offs, out, mask=m)


_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def rmsnorm(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None,
            quant_group: int = 0,
            outer_scales: bool | None = None) -> tuple[Tensor | tuple[Tensor, Tensor], Tensor]:
    """``x [M, D]`` (+ ``residual``) -> ``(rmsnorm(h) * weight, h)`` with ``h = x + residual`` (or ``x``).

    ``quant_group`` 128 (bsgemm) / 32 (mxfp8): the first result is ``(fp8 codes [M, D], scales
    [M, ceil(D / group)])`` of the normed row instead of the row itself; the scales row-major, or
    outer-dim-major (strides ``(1, M)``) where the GEMM reading them goes to cuBLAS and
    ``TTSFLEET_CUBLAS_SCALES=direct`` (:func:`ttsfleet.kernels.decode.scales_outer_major`;
    ``outer_scales`` True / False decides it instead).
    """
    m, d = x.shape
    if x.stride(1) != 1 or (residual is not None and residual.stride(1) != 1):
        raise ValueError("rmsnorm needs row-contiguous inputs")
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
    quant = quant_group > 0
    block = max(triton.next_power_of_2(d), quant_group)
    mx = quant_group == 32
    if quant:
        out = torch.empty(m, d, device=x.device, dtype=torch.float8_e4m3fn)
        scales = activation_scales(m, cdiv(d, quant_group), x.device, torch.uint8 if mx else torch.float32,
                                   outer_major=outer_scales)
    else:
        out = torch.empty(m, d, device=x.device, dtype=out_dtype)
        scales = out
    h = torch.empty_like(x) if residual is not None else x
    r = residual if residual is not None else x
    _rmsnorm_kernel[(m,)](x, r, weight, out, h, scales, d, eps, x.stride(0), r.stride(0), out.stride(0),
                          h.stride(0), scales.stride(0), scales.stride(-1), HAS_RES=residual is not None,
                          BLOCK=block, QUANT=quant, GROUP=max(quant_group, 1), MX=mx,
                          OUT_DTYPE=_TL_DTYPES[out_dtype], EXACT_CVT=INTERPRETING, USE_PDL=PDL,
                          num_warps=4 if d <= 1024 else 8,
                          **launch_opts())
    return ((out, scales) if quant else out), h


# ----------------------------------------------------------------------------- q/k norm + RoPE + KV store
@triton.jit
def _rope_pair(x0, x1, cos, sin, OUT_DTYPE: tl.constexpr):
    """Interleaved-pair rotation in float32 (the bf16 table promoted), rounded like ``type_as(x)``."""
    return (x0 * cos - x1 * sin).to(OUT_DTYPE), (x1 * cos + x0 * sin).to(OUT_DTYPE)


@triton.jit
def _head_norm(x0, x1, w_ptr, eps, half, D: tl.constexpr, X_DTYPE: tl.constexpr):
    """Per-head RMSNorm over the (even, odd) halves, rounded where the reference module rounds."""
    ss = tl.sum(x0 * x0, axis=0) + tl.sum(x1 * x1, axis=0)
    inv = tl.math.rsqrt(ss / D + eps)
    w0 = tl.load(w_ptr + 2 * half).to(tl.float32)
    w1 = tl.load(w_ptr + 2 * half + 1).to(tl.float32)
    y0 = (x0 * inv).to(X_DTYPE).to(tl.float32) * w0
    y1 = (x1 * inv).to(X_DTYPE).to(tl.float32) * w1
    return y0.to(X_DTYPE).to(tl.float32), y1.to(X_DTYPE).to(tl.float32)


@triton.jit
def _kv_exponent(amax):
    """UE8M0 exponent of a head vector's scale and ``1 / scale`` (exact: a power of two)."""
    e = _ue8m0_from_amax(amax)
    return e, tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), _ue8m0_to_f32(e))


@triton.jit
def _rope_q_head(qkv_ptr, qn_ptr, row, head, cos, sin, half, eps, s_qkv, D: tl.constexpr,
                 QK_NORM: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """Query head ``head`` of row ``row`` normalised and rotated: its (even, odd) halves in OUT_DTYPE."""
    base = qkv_ptr + row * s_qkv + head * D
    x0 = tl.load(base + 2 * half).to(tl.float32)
    x1 = tl.load(base + 2 * half + 1).to(tl.float32)
    if QK_NORM:
        x0, x1 = _head_norm(x0, x1, qn_ptr, eps, half, D, OUT_DTYPE)
    return _rope_pair(x0, x1, cos, sin, OUT_DTYPE)


@triton.jit
def _store_kv_head(qkv_ptr, kn_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, row, kvh, slot, pos, cos, sin, half,
                   eps, s_qkv, s_kslot, s_kpos, s_khead, s_sslot, s_spos, s_shead, H: tl.constexpr,
                   KV: tl.constexpr, D: tl.constexpr, QK_NORM: tl.constexpr, KV_FP8: tl.constexpr,
                   EXACT_CVT: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """KV head ``kvh`` of row ``row``: k normalised + rotated, v copied, both into the cache at
    (``slot``, ``pos``) (an FP8 cache: what a dense one would hold, then e4m3 codes + one exponent)."""
    dst = slot * s_kslot + pos * s_kpos + kvh * s_khead
    kbase = qkv_ptr + row * s_qkv + (H + kvh) * D
    x0 = tl.load(kbase + 2 * half).to(tl.float32)
    x1 = tl.load(kbase + 2 * half + 1).to(tl.float32)
    if QK_NORM:
        x0, x1 = _head_norm(x0, x1, kn_ptr, eps, half, D, OUT_DTYPE)
    vi = tl.arange(0, D)
    v = tl.load(qkv_ptr + row * s_qkv + (H + KV + kvh) * D + vi)
    if KV_FP8:  # what a dense cache would hold (q's dtype), then e4m3 codes + one exponent per head
        r0, r1 = _rope_pair(x0, x1, cos, sin, OUT_DTYPE)  # (names of their own: Triton types each
        k0, k1 = r0.to(tl.float32), r1.to(tl.float32)  # name once across the if/else branches)
        ek, inv_k = _kv_exponent(tl.maximum(tl.max(tl.abs(k0), axis=0), tl.max(tl.abs(k1), axis=0)))
        tl.store(k_ptr + dst + 2 * half, to_e4m3(k0 * inv_k, EXACT_CVT))
        tl.store(k_ptr + dst + 2 * half + 1, to_e4m3(k1 * inv_k, EXACT_CVT))
        vf = v.to(OUT_DTYPE).to(tl.float32)
        ev, inv_v = _kv_exponent(tl.max(tl.abs(vf), axis=0))
        tl.store(v_ptr + dst + vi, to_e4m3(vf * inv_v, EXACT_CVT))
        sdst = slot * s_sslot + pos * s_spos + kvh * s_shead
        tl.store(ks_ptr + sdst, ek.to(tl.uint8))
        tl.store(vs_ptr + sdst, ev.to(tl.uint8))
    else:
        y0, y1 = _rope_pair(x0, x1, cos, sin, k_ptr.dtype.element_ty)
        tl.store(k_ptr + dst + 2 * half, y0)
        tl.store(k_ptr + dst + 2 * half + 1, y1)
        tl.store(v_ptr + dst + vi, v.to(v_ptr.dtype.element_ty))


@triton.jit
def _rope_table(rope_ptr, pos_ptr, row, pos_stride, half, D: tl.constexpr):
    """Row ``row``'s position and its (cos, sin) halves from the bf16 table, in float32."""
    pos = tl.load(pos_ptr + row * pos_stride).to(tl.int64)
    cos = tl.load(rope_ptr + pos * D + 2 * half).to(tl.float32)
    sin = tl.load(rope_ptr + pos * D + 2 * half + 1).to(tl.float32)
    return pos, cos, sin


@triton.jit
def _qkv_rope_store_kernel(qkv_ptr, qn_ptr, kn_ptr, rope_ptr, pos_ptr, slot_ptr, k_ptr, v_ptr, q_ptr,
                           ks_ptr, vs_ptr, eps, s_qkv, pos_stride, s_kslot, s_kpos, s_khead, s_qm, s_qh,
                           s_sslot, s_spos, s_shead,
                           H: tl.constexpr, KV: tl.constexpr, D: tl.constexpr, QK_NORM: tl.constexpr,
                           SLOT_IS_ROW: tl.constexpr, KV_FP8: tl.constexpr, EXACT_CVT: tl.constexpr,
                           USE_PDL: tl.constexpr):
    pdl_entry(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    half = tl.arange(0, D // 2)
    pos, cos, sin = _rope_table(rope_ptr, pos_ptr, row, pos_stride, half, D)
    out_ty = q_ptr.dtype.element_ty
    if head < H:  # a query head: normalise, rotate, write q
        y0, y1 = _rope_q_head(qkv_ptr, qn_ptr, row, head, cos, sin, half, eps, s_qkv, D, QK_NORM, out_ty)
        tl.store(q_ptr + row * s_qm + head * s_qh + 2 * half, y0)
        tl.store(q_ptr + row * s_qm + head * s_qh + 2 * half + 1, y1)
    else:  # a KV head: normalise + rotate k, copy v, both into the cache at (slot, pos)
        if SLOT_IS_ROW:  # noqa: SIM108 - Triton code
            slot = row
        else:
            slot = tl.load(slot_ptr + row).to(tl.int64)
        _store_kv_head(qkv_ptr, kn_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, row, head - H, slot, pos, cos, sin,
                       half, eps, s_qkv, s_kslot, s_kpos, s_khead, s_sslot, s_spos, s_shead, H, KV, D,
                       QK_NORM, KV_FP8, EXACT_CVT, out_ty)


def check_rope_inputs(qkv: Tensor, q_norm: Tensor | None, k_norm: Tensor | None) -> None:
    """What the RoPE + KV-store work reads, separate kernel or fused into attention: row-contiguous
    qkv and q/k norm weights of its dtype (a ``ValueError`` naming which)."""
    for w in (q_norm, k_norm):
        if w is not None and w.dtype != qkv.dtype:
            raise ValueError(f"q/k norm weights are {w.dtype} but qkv is {qkv.dtype}")
    if qkv.stride(1) != 1:
        raise ValueError("the RoPE + KV store needs row-contiguous qkv")


def qkv_rope_store(qkv: Tensor, n_head: int, n_kv: int, head_dim: int, rope: Tensor, pos: Tensor,
                   k_cache: Tensor, v_cache: Tensor, slots: Tensor | None,
                   q_norm: Tensor | None = None, k_norm: Tensor | None = None, eps: float = 1e-6,
                   k_scale: Tensor | None = None, v_scale: Tensor | None = None) -> Tensor:
    """``qkv [M, (H + 2KV) D]`` -> q ``[M, H, D]``; k/v of row b go to ``cache[slots[b], pos[b]]``.

    ``rope``: the bf16 ``[P, D/2, 2]`` table; ``pos``: int64 ``[M]`` or ``[1]`` (same position for all
    rows); ``slots`` None means row b uses cache slot b. ``q_norm`` / ``k_norm``: per-head RMSNorm
    weights (slow model) or None (fast model). Caches: ``[slots, S, KV, D]`` with contiguous heads.
    FP8 caches (``float8_e4m3fn``) take ``k_scale`` / ``v_scale``, uint8 ``[slots, S, KV]``: each K/V
    head is rounded to q's dtype, then stored as :func:`~ttsfleet.kernels.reference.quantize_kv_ref`
    does (bit for bit).
    """
    m = qkv.shape[0]
    check_rope_inputs(qkv, q_norm, k_norm)
    if k_cache.stride(3) != 1 or k_cache.stride() != v_cache.stride():
        raise ValueError("qkv_rope_store needs equally strided, head-contiguous caches")
    fp8 = check_kv_cache(k_cache, v_cache, k_scale, v_scale)
    q = torch.empty(m, n_head, head_dim, device=qkv.device, dtype=qkv.dtype)
    norm = q_norm is not None
    ks, vs = (k_scale, v_scale) if fp8 else (pos, pos)
    s_st = (k_scale.stride(0), k_scale.stride(1), k_scale.stride(2)) if fp8 else (0, 0, 0)
    _qkv_rope_store_kernel[(m, n_head + n_kv)](
        qkv, q_norm if norm else qkv, k_norm if norm else qkv, rope, pos, slots if slots is not None else pos,
        k_cache, v_cache, q, ks, vs, eps, qkv.stride(0), 0 if pos.numel() == 1 else pos.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), q.stride(0), q.stride(1), *s_st,
        H=n_head, KV=n_kv, D=head_dim, QK_NORM=norm, SLOT_IS_ROW=slots is None, KV_FP8=fp8,
        EXACT_CVT=INTERPRETING, USE_PDL=PDL, num_warps=1, **launch_opts())
    return q


# ----------------------------------------------------------------------------- sampling
@triton.jit
def _mix32(x):
    """The sampler's 32-bit avalanche hash (uint32 wrap-around == the reference's ``& 0xFFFFFFFF``)."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x2C1B3C6D
    return x ^ (x >> 16)


@triton.jit
def _noise(seed, step, draw, cols):
    x = _mix32(seed.to(tl.uint32))
    x = _mix32(x ^ step.to(tl.uint32))
    x = _mix32(x ^ draw.to(tl.uint32))
    x = _mix32(_mix32(x ^ cols.to(tl.uint32)))
    return ((x >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)


@triton.jit
def _penalized_row(l_ptr, win_ptr, pen_ptr, row, offs, m, s_l, s_wb, s_ww, W: tl.constexpr,
                   HAS_WIN: tl.constexpr):
    """Row ``row``'s logits (float32, -inf past V) after the repetition penalty over its window."""
    x = tl.load(l_ptr + row * s_l + offs, mask=m, other=float("-inf")).to(tl.float32)
    if HAS_WIN:
        hit = offs < 0
        for w in range(W):
            hit = hit | (offs == tl.load(win_ptr + row * s_wb + w * s_ww))
        pen = tl.load(pen_ptr + row)
        x = tl.where(hit & m, tl.where(x > 0, x / pen, x * pen), x)
    return x


@triton.jit
def _penalty_kernel(l_ptr, win_ptr, pen_ptr, out_ptr, greedy_ptr, stat_ptr, V, s_l, s_wb, s_ww, s_o,
                    W: tl.constexpr, HAS_WIN: tl.constexpr, BLOCK_V: tl.constexpr, USE_PDL: tl.constexpr):
    """Repetition penalty over the window, then the row's argmax, max and softmax denominator."""
    pdl_entry(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_V)
    m = offs < V
    x = _penalized_row(l_ptr, win_ptr, pen_ptr, row, offs, m, s_l, s_wb, s_ww, W, HAS_WIN)
    tl.store(out_ptr + row * s_o + offs, x, mask=m)
    tl.store(greedy_ptr + row, tl.argmax(x, axis=0).to(tl.int64))
    mx = tl.max(x, axis=0)
    tl.store(stat_ptr + 2 * row, mx)
    tl.store(stat_ptr + 2 * row + 1, tl.sum(tl.exp(x - mx), axis=0))


@triton.jit
def _draw(vals, idx, r, kk, mx, z, temp, top_p, seed, step, draw):
    """Top-p (untempered) -> top-k -> temperature -> softmax -> exponential race, over the sorted best K."""
    cum = tl.cumsum(tl.exp(vals - mx) / z, axis=0)
    keep = ((r == 0) | (cum <= top_p)) & (r < kk)
    scaled = tl.where(keep, vals / tl.maximum(temp, 1e-5), float("-inf"))
    e = tl.exp(scaled - tl.max(scaled, axis=0))
    probs = e / tl.sum(e, axis=0)
    u = _noise(seed, step, draw, idx)
    score = tl.where(keep, probs / (-tl.log(u)), 0.0)
    best = tl.argmax(score, axis=0)
    return tl.sum(tl.where(r == best, idx, 0), axis=0)


@triton.jit
def _ordered_key(x):
    """float32 -> int32 with the same order (negative floats: magnitude bits flipped). Bijective, so
    :func:`_key_value` gives back the exact float."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def _key_value(key):
    bits = tl.where(key >= 0, key, key ^ 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _finish_row(vals, idx, r, mx, z, greedy_id, row, win_ptr, s_wb, s_ww, W, step_ptr, temp_ptr, top_p_ptr,
                top_k_ptr, seed_ptr, ras_ptr, ras_win_ptr, ras_temp_ptr, ras_top_p_ptr, draw, end_index,
                K: tl.constexpr, RAS: tl.constexpr):
    """The draw(s) of one row from its best K logits ``vals`` (descending) at vocab ``idx``."""
    seed = tl.load(seed_ptr + row)
    step = tl.load(step_ptr + row)
    top_k = tl.load(top_k_ptr + row)
    kk = tl.where(top_k > 0, top_k, K)
    temp = tl.load(temp_ptr + row)
    greedy = (temp <= 0) | (top_k == 1)
    normal = _draw(vals, idx, r, kk, mx, z, temp, tl.load(top_p_ptr + row), seed, step, draw)
    normal = tl.where(greedy, greedy_id, normal)
    if RAS:  # repetition-aware sampling: redraw hotter when the token repeats within the window
        ras_temp = tl.load(ras_temp_ptr + row)
        high = _draw(vals, idx, r, kk, mx, z, ras_temp, tl.load(ras_top_p_ptr + row), seed, step, draw + 1)
        high = tl.where((ras_temp <= 0) | (top_k == 1), greedy_id, high)
        wi = tl.arange(0, 64)
        wm = wi < W
        hist = tl.load(win_ptr + row * s_wb + wi * s_ww, mask=wm, other=-1).to(tl.int64)
        recent = wm & (wi >= W - tl.load(ras_win_ptr + row))
        in_window = tl.sum((recent & (hist == normal)).to(tl.int32), axis=0) > 0
        use_high = (tl.load(ras_ptr + row) != 0) & ~greedy & in_window & (normal != end_index)
        normal = tl.where(use_high, high, normal)
    return normal


@triton.jit(do_not_specialize=["draw", "end_index"])
def _finish_kernel(vals_ptr, idx_ptr, stat_ptr, greedy_ptr, out_ptr, step_ptr,
                   temp_ptr, top_p_ptr, top_k_ptr, seed_ptr,
                   ras_ptr, ras_win_ptr, ras_temp_ptr, ras_top_p_ptr, win_ptr,
                   s_v, W, s_wb, s_ww, draw, end_index,
                   K: tl.constexpr, BLOCK_K: tl.constexpr, RAS: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_entry(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, BLOCK_K)
    vals = tl.load(vals_ptr + row * s_v + r, mask=r < K, other=float("-inf")).to(tl.float32)
    idx = tl.load(idx_ptr + row * s_v + r, mask=r < K, other=0)
    normal = _finish_row(vals, idx, r, tl.load(stat_ptr + 2 * row), tl.load(stat_ptr + 2 * row + 1),
                         tl.load(greedy_ptr + row), row, win_ptr, s_wb, s_ww, W, step_ptr, temp_ptr,
                         top_p_ptr, top_k_ptr, seed_ptr, ras_ptr, ras_win_ptr, ras_temp_ptr, ras_top_p_ptr,
                         draw, end_index, K, RAS)
    tl.store(out_ptr + row, normal)


@triton.jit
def _top_select(x, m, offs, n_sel, scratch_ptr, row, BLOCK_K: tl.constexpr):
    """The row's best ``n_sel`` (<= BLOCK_K) logits of ``x`` in descending order (exactly tied
    values: lower vocab index first, as a stable sort) with their vocab indices.

    How, without a sort of the whole row: (1) bisect the order-preserving int32 key space for
    ``T``, the ``n_sel``-th largest key (32 counting passes: ``hi - lo`` starts below 2**32); (2) the
    selection is every key above ``T`` plus the first ties at ``T``; (3) compact it into the row's
    ``BLOCK_K`` scratch slots (a prefix sum gives each its slot; the CTA barrier makes the stores
    visible); (4) rank the <= BLOCK_K candidates against each other ([BLOCK_K, BLOCK_K] compares)
    and place each at its rank. Each value travels as one int64 (key high, ``2**31 - 1 - index``
    low), so value and index come back exactly and ties order by index."""
    key = tl.where(m, _ordered_key(x), -2147483648).to(tl.int64)  # padding below every logit
    lo = tl.min(key, axis=0)  # count(key >= lo) = BLOCK_V >= n_sel
    hi = tl.max(key, axis=0) + 1  # count(key >= hi) = 0 < n_sel
    for _ in range(32):
        mid = lo + (hi - lo) // 2
        take = tl.sum((key >= mid).to(tl.int32), axis=0) >= n_sel
        lo = tl.where(take, mid, lo)
        hi = tl.where(take, hi, mid)
    above = key > lo
    tie = m & (key == lo)
    room = n_sel - tl.sum(above.to(tl.int32), axis=0)
    sel = above | (tie & (tl.cumsum(tie.to(tl.int32), axis=0) <= room))
    slot = tl.cumsum(sel.to(tl.int32), axis=0) - 1
    tl.store(scratch_ptr + row * BLOCK_K + slot, (key << 32) + (2147483647 - offs), mask=sel)
    tl.debug_barrier()
    r = tl.arange(0, BLOCK_K)
    ok = r < n_sel
    cand = tl.load(scratch_ptr + row * BLOCK_K + r, mask=ok, other=0)
    rank = tl.sum((ok[None, :] & (cand[None, :] > cand[:, None])).to(tl.int32), axis=1)
    placed = tl.sum(tl.where(ok[None, :] & (rank[None, :] == r[:, None]), cand[None, :], 0), axis=1)
    vals = tl.where(ok, _key_value((placed >> 32).to(tl.int32)), float("-inf"))
    idx = tl.where(ok, 2147483647 - (placed & 2147483647), 0)
    return vals, idx


@triton.jit(do_not_specialize=["draw", "end_index"])
def _sample_kernel(l_ptr, win_ptr, pen_ptr, out_ptr, scratch_ptr, step_ptr, temp_ptr, top_p_ptr, top_k_ptr,
                   seed_ptr, ras_ptr, ras_win_ptr, ras_temp_ptr, ras_top_p_ptr, V, s_l, s_wb, s_ww, draw,
                   end_index, W: tl.constexpr, HAS_WIN: tl.constexpr, BLOCK_V: tl.constexpr, K: tl.constexpr,
                   BLOCK_K: tl.constexpr, RAS: tl.constexpr, USE_PDL: tl.constexpr):
    """The whole sampler of one row in one launch: penalty, statistics, the row's best ``top_k``
    logits selected in the kernel (:func:`_top_select`) instead of by ``torch.topk`` between two
    launches, then the draw(s) exactly as :func:`_finish_kernel` makes them."""
    pdl_entry(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_V)
    m = offs < V
    x = _penalized_row(l_ptr, win_ptr, pen_ptr, row, offs, m, s_l, s_wb, s_ww, W, HAS_WIN)
    greedy_id = tl.argmax(x, axis=0).to(tl.int64)
    mx = tl.max(x, axis=0)
    z = tl.sum(tl.exp(x - mx), axis=0)
    top_k = tl.load(top_k_ptr + row)
    n_sel = tl.minimum(tl.where(top_k > 0, top_k, K), K)  # ranks >= top_k are never kept
    vals, idx = _top_select(x, m, offs, n_sel, scratch_ptr, row, BLOCK_K)
    r = tl.arange(0, BLOCK_K)
    out = _finish_row(vals, idx, r, mx, z, greedy_id, row, win_ptr, s_wb, s_ww, W, step_ptr, temp_ptr,
                      top_p_ptr, top_k_ptr, seed_ptr, ras_ptr, ras_win_ptr, ras_temp_ptr, ras_top_p_ptr, draw,
                      end_index, K, RAS)
    tl.store(out_ptr + row, out)


def _window_args(window: Tensor | None, fallback: Tensor) -> tuple[bool, Tensor, int, int, int]:
    """(has window, tensor to pass, W, stride per row, stride per token)."""
    has_win = window is not None and window.shape[-1] > 0
    w_n = int(window.shape[-1]) if has_win else 0
    if w_n > 64:
        raise ValueError("the fused sampler handles windows of at most 64 tokens")
    s_wb, s_ww = (window.stride(0), window.stride(1)) if has_win else (0, 0)
    return has_win, (window if has_win else fallback), w_n, s_wb, s_ww


def sample_topk(logits: Tensor, batch, step: Tensor, draw: int, window: Tensor | None = None,  # noqa: ANN001
                ras_end_index: int | None = None, select: str = "torch") -> Tensor:
    """Fused :func:`ttsfleet.inference.sampling.sample` (``ras_end_index`` None) or ``sample_main``.

    Exact for rows whose ``top_k`` is in ``1..TOPK_CAP`` (or greedy): the kept set is a prefix of the
    row's best ``top_k`` logits, so only the best ``TOPK_CAP`` are sorted; the softmax denominator of
    top-p still runs over the whole row. ``window [bs, W]`` (any strides, W <= 64): previous tokens.
    ``select``: ``"torch"`` (two launches with ``torch.topk`` between them, measured on the H200) or
    ``"kernel"`` (one launch, the selection inside it; see :func:`_top_select`). Both give the same ids
    (tested); at exactly tied logits ``"kernel"`` keeps the lower vocab index first, as a stable sort.
    """
    if select == "kernel":
        return _sample_one_launch(logits, batch, step, draw, window, ras_end_index)
    if select != "torch":
        raise ValueError(f"top-k selection {select!r}: expected 'torch' or 'kernel'")
    bs, v = logits.shape
    dev = logits.device
    pen = torch.empty(bs, v, device=dev, dtype=torch.float32)
    greedy = torch.empty(bs, device=dev, dtype=torch.int64)
    stat = torch.empty(bs, 2, device=dev, dtype=torch.float32)
    has_win, w_t, w_n, s_wb, s_ww = _window_args(window, greedy)
    _penalty_kernel[(bs,)](logits, w_t, batch.repetition_penalty, pen, greedy, stat, v,
                           logits.stride(0), s_wb, s_ww, pen.stride(0), W=w_n, HAS_WIN=has_win,
                           BLOCK_V=triton.next_power_of_2(v), USE_PDL=PDL, num_warps=4 if v <= 2048 else 8,
                           **launch_opts())
    k = min(TOPK_CAP, v)
    vals, idx = torch.topk(pen, k, dim=-1)
    out = torch.empty(bs, device=dev, dtype=torch.int64)
    ras = ras_end_index is not None and has_win
    _finish_kernel[(bs,)](vals, idx, stat, greedy, out, step, batch.temperature, batch.top_p, batch.top_k,
                          batch.seed, batch.ras, batch.ras_window, batch.ras_temperature, batch.ras_top_p,
                          w_t, vals.stride(0), w_n, s_wb, s_ww, draw, ras_end_index if ras else -1,
                          K=k, BLOCK_K=triton.next_power_of_2(k), RAS=ras, USE_PDL=PDL, num_warps=1,
                          **launch_opts())
    return out


def _sample_one_launch(logits: Tensor, batch, step: Tensor, draw: int, window: Tensor | None,  # noqa: ANN001
                       ras_end_index: int | None) -> Tensor:
    """:func:`sample_topk` with ``select="kernel"``: :func:`_sample_kernel`, one program per row
    (``scratch``: the rows' candidate slots, written and read inside the launch)."""
    bs, v = logits.shape
    out = torch.empty(bs, device=logits.device, dtype=torch.int64)
    has_win, w_t, w_n, s_wb, s_ww = _window_args(window, out)
    k = min(TOPK_CAP, v)
    block_k = triton.next_power_of_2(k)
    scratch = torch.empty(bs, block_k, device=logits.device, dtype=torch.int64)
    ras = ras_end_index is not None and has_win
    _sample_kernel[(bs,)](logits, w_t, batch.repetition_penalty, out, scratch, step, batch.temperature,
                          batch.top_p, batch.top_k, batch.seed, batch.ras, batch.ras_window,
                          batch.ras_temperature, batch.ras_top_p, v, logits.stride(0), s_wb, s_ww, draw,
                          ras_end_index if ras else -1,
                          W=w_n, HAS_WIN=has_win, BLOCK_V=triton.next_power_of_2(v), K=k, BLOCK_K=block_k,
                          RAS=ras, USE_PDL=PDL, num_warps=4 if v <= 2048 else 8, **launch_opts())
    return out
