"""Triton single-token decode attention over a slot KV cache (the kernel behind
:func:`ttsfleet.kernels.decode.decode_attention`).

One program per (row, KV head): it follows the row's slot index, walks only the slot's first
``lengths[row]`` keys with an online softmax, and writes the G query heads it serves. Optionally
(``quant_group``) the epilogue writes the FP8 codes + 1xgroup scales of the bf16 output that the
output projection reads, instead of the bf16 output: a head of D >= group columns holds whole groups.

FP8 cache (``KV_FP8``): K/V are e4m3 codes with one UE8M0 exponent per (slot, position, KV head)
(:func:`ttsfleet.kernels.reference.quantize_kv_ref`). Codes convert exactly to q's dtype for the
dots; the power-of-two key scales multiply the scores and the value scales the probabilities (both
exact), so the kernel computes the reference's attention over the dequantized cache up to the
order of its float32 sums, while reading half the bytes of a bf16 cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from .cublas_fp8 import activation_scales
from .decode import attention_block_n, attn_tile
from .triton_decode import _rope_q_head, _rope_table, _store_kv_head, check_rope_inputs, quantize_groups
from .triton_gemm import INTERPRETING, PDL, _ue8m0_to_f32, l2_prefetch, launch_opts, pdl_entry


@triton.jit
def _attend_keys(q, k_ptr, v_ptr, ks_ptr, vs_ptr, base, sbase, sk_pos, ss_pos, di, lo, hi, scale,
                 m_i, l_i, acc, BLOCK_N: tl.constexpr, KEYS_BOUND: tl.constexpr, KV_FP8: tl.constexpr):
    """Online softmax of the G query rows ``q`` over keys ``[lo, hi)`` of one slot's KV head, carried
    in (``m_i``, ``l_i``, ``acc``: running max, sum and unnormalised output). KEYS_BOUND > 0 (Triton's
    interpreter, which cannot loop to a loaded bound): walk the whole cache length; the masks make the
    blocks outside ``[lo, hi)`` no-ops."""
    for start in range(0 if KEYS_BOUND > 0 else lo, KEYS_BOUND if KEYS_BOUND > 0 else hi, BLOCK_N):
        ni = start + tl.arange(0, BLOCK_N)
        nmask = (ni >= lo) & (ni < hi)
        offs = base + ni[:, None].to(tl.int64) * sk_pos + di[None, :]
        k = tl.load(k_ptr + offs, mask=nmask[:, None], other=0.0)
        if KV_FP8:  # exact e4m3 -> q dtype; the key's power-of-two scale multiplies its score
            k = k.to(q.dtype)
            ks = _ue8m0_to_f32(tl.load(ks_ptr + sbase + ni * ss_pos, mask=nmask, other=127))
            s = tl.dot(q, tl.trans(k)).to(tl.float32) * (ks[None, :] * scale)
        else:
            s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
        s = tl.where(nmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: exp(-inf - -inf) would be NaN
        alpha = tl.exp(m_i - m_ref)
        p = tl.exp(s - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + offs, mask=nmask[:, None], other=0.0)
        if KV_FP8:  # the value's scale rides on its probability (l_i keeps the unscaled sum)
            v = v.to(q.dtype)
            vs = _ue8m0_to_f32(tl.load(vs_ptr + sbase + ni * ss_pos, mask=nmask, other=127))
            acc = acc * alpha[:, None] + tl.dot((p * vs[None, :]).to(v.dtype), v).to(tl.float32)
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _row_keys(slots_ptr, len_ptr, b, s_len, SLOT_IS_ROW: tl.constexpr):
    """Row ``b``'s cache slot (itself where rows are slots) and how many of its keys it attends."""
    if SLOT_IS_ROW:  # noqa: SIM108 - Triton code
        slot = b.to(tl.int64)
    else:
        slot = tl.load(slots_ptr + b).to(tl.int64)
    return slot, tl.load(len_ptr + b * s_len).to(tl.int32)


@triton.jit
def _prefetch_kv(k_ptr, v_ptr, slots_ptr, len_ptr, b, kvh, sp, s_len, sk_slot, sk_pos, sk_head, n_slots,
                 cache_len, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr,
                 KEY_BYTES: tl.constexpr, SLOT_IS_ROW: tl.constexpr):
    """Before the PDL wait: ask L2 for the K and V rows of the first PREFETCH key blocks of share
    ``sp`` of row ``b``'s KV head ``kvh`` (one bulk prefetch per key and tensor). The slot and length
    are read before the predecessor is done, so they may be stale: a wrong guess costs bandwidth,
    never a result, and both are clamped so every address stays inside the cache."""
    slot, n_keys = _row_keys(slots_ptr, len_ptr, b, s_len, SLOT_IS_ROW)
    slot = tl.minimum(tl.maximum(slot, 0), n_slots - 1)
    n_keys = tl.minimum(tl.maximum(n_keys, 0), cache_len)
    per = tl.cdiv(tl.cdiv(n_keys, SPLITS), BLOCK_N) * BLOCK_N
    lo = sp * per
    keys = lo + tl.arange(0, PREFETCH * BLOCK_N)
    ok = keys < tl.minimum(lo + per, n_keys)
    offs = slot * sk_slot + kvh * sk_head + keys.to(tl.int64) * sk_pos
    nbytes = tl.full([PREFETCH * BLOCK_N], KEY_BYTES, tl.int32)
    l2_prefetch((k_ptr + offs).to(tl.int64, bitcast=True), nbytes, ok)
    l2_prefetch((v_ptr + offs).to(tl.int64, bitcast=True), nbytes, ok)


@triton.jit
def _fused_q(qkv_ptr, qn_ptr, kn_ptr, rope_ptr, pos_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, b, kvh, slot,
             pos_stride, eps, s_qkv, sk_slot, sk_pos, sk_head, ss_slot, ss_pos, ss_head, store,
             G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, N_KV: tl.constexpr,
             QK_NORM: tl.constexpr, KV_FP8: tl.constexpr, EXACT_CVT: tl.constexpr, Q_DTYPE: tl.constexpr):
    """The RoPE + KV-store kernel's work for one (row, KV head), inside attention (``ROPE_FUSED``): the
    G query heads normalised and rotated into registers ``[BLOCK_G, D]`` (rows past G zero, as the
    masked load leaves them), and, where ``store``, the KV head's k and v written into the cache at
    the row's position, then a barrier so the key loop's loads see them. The same helpers as
    ``triton_decode._qkv_rope_store_kernel``, so the same values."""
    row = b.to(tl.int64)
    half = tl.arange(0, D // 2)
    pos, cos, sin = _rope_table(rope_ptr, pos_ptr, row, pos_stride, half, D)
    gi = tl.arange(0, BLOCK_G)
    q = tl.zeros([BLOCK_G, D], Q_DTYPE)
    for g in tl.static_range(G):
        y0, y1 = _rope_q_head(qkv_ptr, qn_ptr, row, kvh * G + g, cos, sin, half, eps, s_qkv, D, QK_NORM,
                              Q_DTYPE)
        q = tl.where((gi == g)[:, None], tl.reshape(tl.join(y0, y1), (D,))[None, :], q)  # pairs interleaved
    if store:
        _store_kv_head(qkv_ptr, kn_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, row, kvh, slot, pos, cos, sin, half,
                       eps, s_qkv, sk_slot, sk_pos, sk_head, ss_slot, ss_pos, ss_head, G * N_KV, N_KV, D,
                       QK_NORM, KV_FP8, EXACT_CVT, Q_DTYPE)
    tl.debug_barrier()
    return q


@triton.jit
def _store_heads(out, o_ptr, os_ptr, b, kvh, heads, gmask, di, so_b, so_h, s_osb, s_osg,
                 G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, QUANT: tl.constexpr,
                 GROUP: tl.constexpr, MX: tl.constexpr, EXACT_CVT: tl.constexpr):
    """The KV head's G output rows: bf16, or (QUANT) the FP8 codes + scales the O GEMM reads."""
    o_ptrs = o_ptr + b * so_b + heads[:, None] * so_h + di[None, :]
    if QUANT:  # each head row is D / GROUP whole groups of the [H * D] output row
        NG: tl.constexpr = BLOCK_G * D // GROUP
        codes, sc = quantize_groups(tl.reshape(out.to(tl.float32), (BLOCK_G * D,)), BLOCK_G * D, GROUP, MX,
                                    EXACT_CVT)
        tl.store(o_ptrs, tl.reshape(codes, (BLOCK_G, D)), mask=gmask[:, None])
        gl = tl.arange(0, NG)
        tl.store(os_ptr + b * s_osb + (kvh * (G * D // GROUP) + gl) * s_osg, sc, mask=gl < G * D // GROUP)
    else:
        tl.store(o_ptrs, out, mask=gmask[:, None])


@triton.jit
def _decode_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, os_ptr, slots_ptr, len_ptr, ks_ptr, vs_ptr, scale,
                             sq_b, sq_h, sk_slot, sk_pos, sk_head, so_b, so_h, s_osb, s_osg, s_len,
                             ss_slot, ss_pos, ss_head,
                             G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                             SLOT_IS_ROW: tl.constexpr, KEYS_BOUND: tl.constexpr, QUANT: tl.constexpr,
                             GROUP: tl.constexpr, MX: tl.constexpr, OUT_DTYPE: tl.constexpr,
                             EXACT_CVT: tl.constexpr, KV_FP8: tl.constexpr, USE_PDL: tl.constexpr,
                             n_slots=1, cache_len=1, PREFETCH: tl.constexpr = 0, KEY_BYTES: tl.constexpr = 0,
                             qn_ptr=None, kn_ptr=None, rope_ptr=None, pos_ptr=None, pos_stride=0, eps=0.0,
                             ROPE_FUSED: tl.constexpr = False, N_KV: tl.constexpr = 1,
                             QK_NORM: tl.constexpr = False):
    """Program (row, KV head). ROPE_FUSED: ``q_ptr`` is the QKV GEMM's output ``[rows, (H + 2KV) D]``
    (row stride ``sq_b``) and the program first does the RoPE + KV-store kernel's work (:func:`_fused_q`)."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    if USE_PDL and PREFETCH > 0:
        _prefetch_kv(k_ptr, v_ptr, slots_ptr, len_ptr, b, kvh, 0, s_len, sk_slot, sk_pos, sk_head, n_slots,
                     cache_len, 1, BLOCK_N, PREFETCH, KEY_BYTES, SLOT_IS_ROW)
    pdl_entry(USE_PDL)
    attend_row_head(q_ptr, k_ptr, v_ptr, o_ptr, os_ptr, slots_ptr, len_ptr, ks_ptr, vs_ptr, scale, b, kvh,
                    sq_b, sq_h, sk_slot, sk_pos, sk_head, so_b, so_h, s_osb, s_osg, s_len, ss_slot, ss_pos,
                    ss_head,
                    qn_ptr, kn_ptr, rope_ptr, pos_ptr, pos_stride, eps, G, BLOCK_G, D, BLOCK_N, SLOT_IS_ROW,
                    KEYS_BOUND, QUANT, GROUP, MX, OUT_DTYPE, EXACT_CVT, KV_FP8, ROPE_FUSED, N_KV, QK_NORM)


@triton.jit
def attend_row_head(q_ptr, k_ptr, v_ptr, o_ptr, os_ptr, slots_ptr, len_ptr, ks_ptr, vs_ptr, scale, b, kvh,
                    sq_b, sq_h, sk_slot, sk_pos, sk_head, so_b, so_h, s_osb, s_osg, s_len, ss_slot, ss_pos,
                    ss_head,
                    qn_ptr, kn_ptr, rope_ptr, pos_ptr, pos_stride, eps, G: tl.constexpr,
                    BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, SLOT_IS_ROW: tl.constexpr,
                    KEYS_BOUND: tl.constexpr, QUANT: tl.constexpr, GROUP: tl.constexpr, MX: tl.constexpr,
                    OUT_DTYPE: tl.constexpr, EXACT_CVT: tl.constexpr, KV_FP8: tl.constexpr,
                    ROPE_FUSED: tl.constexpr, N_KV: tl.constexpr, QK_NORM: tl.constexpr):
    """Row ``b``'s attention for KV head ``kvh`` (its G query heads): the one-pass kernel's program,
    and a work item of the one-launch attention block (:mod:`.triton_attention_block`)."""
    slot, n_keys = _row_keys(slots_ptr, len_ptr, b, s_len, SLOT_IS_ROW)
    gi = tl.arange(0, BLOCK_G)
    di = tl.arange(0, D)
    heads = kvh * G + gi
    gmask = gi < G
    if ROPE_FUSED:
        q = _fused_q(q_ptr, qn_ptr, kn_ptr, rope_ptr, pos_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, b, kvh, slot,
                     pos_stride, eps, sq_b, sk_slot, sk_pos, sk_head, ss_slot, ss_pos, ss_head, True, G,
                     BLOCK_G, D, N_KV, QK_NORM, KV_FP8, EXACT_CVT, OUT_DTYPE)
    else:
        q = tl.load(q_ptr + b * sq_b + heads[:, None] * sq_h + di[None, :], mask=gmask[:, None], other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    m_i, l_i, acc = _attend_keys(q, k_ptr, v_ptr, ks_ptr, vs_ptr, slot * sk_slot + kvh * sk_head,
                                 slot * ss_slot + kvh * ss_head, sk_pos, ss_pos, di, 0, n_keys, scale,
                                 m_i, l_i, acc, BLOCK_N, KEYS_BOUND, KV_FP8)
    out = (acc / l_i[:, None]).to(OUT_DTYPE)
    _store_heads(out, o_ptr, os_ptr, b, kvh, heads, gmask, di, so_b, so_h, s_osb, s_osg, G, BLOCK_G, D, QUANT,
                 GROUP, MX, EXACT_CVT)


_TL = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def block_g(g: int) -> int:
    """Query rows per program: the KV head's G query heads, padded to a power of two >= 16 (tl.dot)."""
    return max(16, 1 << (g - 1).bit_length())


def output_buffers(q: Tensor, quant_group: int, outer_scales: bool | None = None) -> tuple[Tensor, Tensor]:
    """The kernel's output: bf16 like ``q`` (twice: no scales), or (``quant_group`` > 0) the FP8
    codes ``[bs, H, D]`` and their scales ``[bs, H * D / group]`` the output projection reads: row-major,
    or in cuBLAS's outer-dim-major order where ``outer_scales`` says so (None: where the output
    projection goes to cuBLAS and ``TTSFLEET_CUBLAS_SCALES=direct``,
    :func:`ttsfleet.kernels.decode.scales_outer_major`)."""
    if quant_group <= 0:
        out = torch.empty_like(q)
        return out, out
    bs, h, d = q.shape
    return (torch.empty(bs, h, d, device=q.device, dtype=torch.float8_e4m3fn),
            activation_scales(bs, h * d // quant_group, q.device,
                              torch.uint8 if quant_group == 32 else torch.float32, outer_major=outer_scales))


def cache_scale_args(k_scale: Tensor | None, v_scale: Tensor | None,
                     placeholder: Tensor) -> tuple[Tensor, Tensor, tuple[int, int, int]]:
    """The kernels' K / V exponent pointers and their strides: an FP8 cache's, or (a dense cache)
    ``placeholder`` twice with zero strides (the kernel never reads them then)."""
    if k_scale is None or v_scale is None:
        return placeholder, placeholder, (0, 0, 0)
    return k_scale, v_scale, (k_scale.stride(0), k_scale.stride(1), k_scale.stride(2))


def kv_prefetch_args(k_cache: Tensor, v_cache: Tensor, programs: int, splits: int) -> dict[str, int]:
    """The attention launch's prefetch arguments (``TTSFLEET_ATTN_PREFETCH``): key blocks per
    program (a power of two, from the cache's length, not the rows' lengths, so a CUDA graph keeps
    it), the bytes of one key row, the cache's slots and positions for the kernel's clamps. None
    without PDL (the interpreter), off the GPU, or where a key row is not 16-byte aligned."""
    from .decode import attn_prefetch, l2_bytes

    mode = attn_prefetch()
    key_bytes = k_cache.shape[-1] * k_cache.element_size()
    aligned = all(t.data_ptr() % 16 == 0 and all(st * t.element_size() % 16 == 0 for st in t.stride()[:3])
                  and t.stride(3) == 1 for t in (k_cache, v_cache)) and key_bytes % 16 == 0
    if mode == "off" or not PDL or not k_cache.is_cuda or not aligned or k_cache.stride() != v_cache.stride():
        return {}
    n = kv_prefetch_blocks(mode, k_cache.shape[1], splits, programs, key_bytes,
                           l2_bytes(k_cache.device.index or 0))
    if n <= 0:
        return {}
    return {"PREFETCH": n, "KEY_BYTES": key_bytes, "n_slots": k_cache.shape[0], "cache_len": k_cache.shape[1]}


def kv_prefetch_blocks(mode: str | int, cache_len: int, splits: int, programs: int, key_bytes: int,
                       l2: int) -> int:
    """Key blocks per program to prefetch: :func:`.decode.prefetch_blocks` over the share a program
    can have at most (the cache's length over ``splits``), K and V rows together, rounded down to a
    power of two (the kernel's key range is a ``tl.arange``)."""
    from .decode import prefetch_blocks

    block_n = attention_block_n(cache_len)
    share = -(-cache_len // splits)
    per = -(-share // block_n)
    n = prefetch_blocks(mode, per, programs, 2 * block_n * key_bytes, l2)
    return 1 << (n.bit_length() - 1) if n > 0 else 0


@dataclass(frozen=True)
class FusedRope:
    """The RoPE + KV-store kernel's inputs (``triton_decode.qkv_rope_store`` less the caches), given to
    decode attention in place of q: its programs then rotate their own query heads and store their
    own KV head (``_fused_q``), one launch instead of two."""

    qkv: Tensor  # [rows, (H + 2KV) D], row-contiguous
    n_head: int
    head_dim: int
    rope: Tensor  # the [P, D/2, 2] table
    pos: Tensor  # int64 [rows] or [1]
    q_norm: Tensor | None = None
    k_norm: Tensor | None = None
    eps: float = 1e-6

    def query(self, kv: int) -> tuple[Tensor, Tensor, int, int, dict]:
        """(a q-shaped ``[rows, H, D]`` tensor for the output buffers, the kernel's ``q_ptr``, its row
        and head strides, the kernel's fused arguments), as :func:`query_args` gives them."""
        check_rope_inputs(self.qkv, self.q_norm, self.k_norm)
        rows = self.qkv.shape[0]
        shaped = self.qkv.new_empty(rows, self.n_head, self.head_dim)
        norm = self.q_norm is not None
        extra = dict(qn_ptr=self.q_norm if norm else self.qkv, kn_ptr=self.k_norm if norm else self.qkv,
                     rope_ptr=self.rope, pos_ptr=self.pos, pos_stride=0 if self.pos.numel() == 1 else
                     self.pos.stride(0), eps=self.eps, ROPE_FUSED=True, N_KV=kv, QK_NORM=norm)
        return shaped, self.qkv, self.qkv.stride(0), self.head_dim, extra


def query_args(q: Tensor | FusedRope, kv: int) -> tuple[Tensor, Tensor, int, int, dict]:
    """The attention kernels' view of their query: q itself, or a :class:`FusedRope`'s."""
    if isinstance(q, FusedRope):
        return q.query(kv)
    q = q.contiguous()
    return q, q, q.stride(0), q.stride(1), {}


def decode_attention_triton(q: Tensor | FusedRope, k_cache: Tensor, v_cache: Tensor, slots: Tensor | None,
                            lengths: Tensor, quant_group: int = 0, k_scale: Tensor | None = None,
                            v_scale: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
    """See :func:`ttsfleet.kernels.decode.decode_attention`; ``quant_group`` > 0 needs D % group == 0;
    ``k_scale`` / ``v_scale`` (uint8 ``[slots, S, KV]``, equally strided): the FP8 cache's exponents.
    ``q`` a :class:`FusedRope`: the RoPE + KV store happen in this launch."""
    kv = k_cache.shape[2]
    q, q_ptr, sq_b, sq_h, fused = query_args(q, kv)
    bs, h, d = q.shape
    g = h // kv
    quant = quant_group > 0
    out, osc = output_buffers(q, quant_group)
    fp8 = k_scale is not None
    ks, vs, s_st = cache_scale_args(k_scale, v_scale, lengths)
    _decode_attention_kernel[(bs, kv)](
        q_ptr, k_cache, v_cache, out, osc, lengths if slots is None else slots, lengths, ks, vs,
        1.0 / math.sqrt(d),
        sq_b, sq_h, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        out.stride(0), out.stride(1), osc.stride(0), osc.stride(-1),
        0 if lengths.numel() == 1 else lengths.stride(0), *s_st,
        G=g, BLOCK_G=block_g(g), D=d, BLOCK_N=attention_block_n(k_cache.shape[1]),
        SLOT_IS_ROW=slots is None, KEYS_BOUND=k_cache.shape[1] if INTERPRETING else 0,
        QUANT=quant, GROUP=max(quant_group, 1), MX=quant_group == 32, OUT_DTYPE=_TL[q.dtype],
        EXACT_CVT=INTERPRETING, KV_FP8=fp8, USE_PDL=PDL, **kv_prefetch_args(k_cache, v_cache, bs * kv, 1),
        **fused, num_warps=attn_tile()[0], **launch_opts(),
    )
    return (out.view(bs, h * d), osc) if quant else out
