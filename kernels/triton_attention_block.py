"""The fast model's attention half in one launch: QKV GEMM -> RoPE + KV store + attention -> O GEMM.

Why (issue #26): the fast transformer runs 4 layers x 10 positions per frame at M = batch rows, and
its attention half is launches around little data: at M = 1 the QKV GEMM (15.7 MB) took 7.8 us for
3.7 us of bytes, the O GEMM (10.5 MB) 6.5 us for 2.5, and the attention over a frame cache of at most
10 positions is a few KB — three to four launches per layer pass, 120-160 per frame, each waiting
for the one ahead to drain and then filling its pipeline. Here one persistent launch (one program
per SM, ``TTSFLEET_FAST_ATTN_LAUNCH=one``) runs them as work items taken from a global ticket in
order, as the one-launch MLP does (:mod:`.triton_mlp`): every QKV tile (and split-K share) first,
then one item per (row, KV head) that waits until all QKV tiles are counted, rotates its query heads,
stores its K/V head and attends (:func:`.triton_attention.attend_row_head`, the one-pass kernel's own
program body, RoPE fused), emitting the O GEMM's FP8 codes; then the O tiles, which ask L2 for their
weights and wait until every (row, KV head) item is counted. An item waits only for items of smaller
tickets, each held by a running program: no deadlock whatever the residency. The counters return to
zero at the end, so graphs replay it. The same tile code as the separate launches, so the same values
(bit for bit in Triton's interpreter against QKV GEMM + fused RoPE attention + O GEMM with the plan's
tiles: ``tests/kernels/test_attention_block.py``).

Scope: the frame-local cache (rows are slots, one shared position: the fast model), a dense cache,
FP8 weights without biases, at most :data:`MAX_ROWS` rows; the slow model keeps its launches (its
attention over long contexts wants the split-KV kernel's many programs per row).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .decode import attention_block_n, sm_count
from .layout import QuantizedWeight, cdiv
from .triton_attention import attend_row_head, block_g, output_buffers
from .triton_gemm import (
    INTERPRETING,
    PDL,
    _prefetch_blocks,
    _scheme_params,
    _weight_desc,
    launch_opts,
    pdl_entry,
    row_tile,
    tma_ok,
)
from .work_queue import (
    MAX_ROWS,
    count_done,
    gemm_item,
    leave,
    most_shares,
    take_ticket,
    wait_for,
    waiting_gemm_item,
)
from .workspaces import workspace

#: Default tile widths (output columns) of the QKV and O items: a first guess, not yet timed.
QKV_BN = 64
O_BN = 64


@dataclass(frozen=True)
class BlockPlan:
    """``bm`` rows; QKV tiles of ``qkv_bn`` columns in ``qkv_split`` K shares, ``m x kv`` attention
    items, O tiles of ``o_bn`` columns in ``o_split`` shares; ``programs`` persistent programs."""

    bm: int
    qkv_bn: int
    o_bn: int
    qkv_tiles: int
    qkv_split: int
    att_items: int
    o_tiles: int
    o_split: int
    programs: int
    num_warps: int

    @property
    def items(self) -> int:
        return self.qkv_tiles * self.qkv_split + self.att_items + self.o_tiles * self.o_split


def block_plan(m: int, d: int, n_qkv: int, hd: int, kv: int, group: int, sms: int, qkv_bn: int = QKV_BN,
               o_bn: int = O_BN, per_sm: int = 1) -> BlockPlan | None:
    """The split for ``m`` rows of model dim ``d``, QKV width ``n_qkv``, ``hd`` = heads x head dim, ``kv``
    KV heads, activation ``group``, on ``sms`` SMs; None above :data:`MAX_ROWS` rows. QKV takes up to
    half the SMs; the O shares fill what QKV and the attention items leave, so the O items are taken
    (and their weights prefetched) while QKV runs. S2 Pro's fast model at M = 1 on 132 SMs: 96 QKV
    tiles, 8 attention items, 40 O tiles. ``per_sm``: up to that many programs per SM (the plan
    counts ``sms x per_sm`` slots; 1, the default, timed on 2026-12-05, 2 not yet)."""
    if m < 1 or m > MAX_ROWS:
        return None
    bm = row_tile(m)
    qkv_tiles, o_tiles = cdiv(n_qkv, qkv_bn), cdiv(d, o_bn)
    slots = sms * per_sm
    qkv_split = most_shares(qkv_tiles, cdiv(d, group), slots // 2)
    o_split = most_shares(o_tiles, cdiv(hd, group), slots - qkv_tiles * qkv_split - m * kv)
    plan = BlockPlan(bm=bm, qkv_bn=qkv_bn, o_bn=o_bn, qkv_tiles=qkv_tiles, qkv_split=qkv_split,
                     att_items=m * kv, o_tiles=o_tiles, o_split=o_split, programs=1, num_warps=4)
    return BlockPlan(**{**plan.__dict__, "programs": max(1, min(slots, plan.items))})


@triton.jit
def attention_block_one_launch_kernel(
    a_ptr, as_ptr, wqkv_ptr, wqkv_desc, wqkvs_ptr, qkv_ptr, wo_ptr, wo_desc, wos_ptr, att_ptr, atts_ptr,
    out_ptr, k_ptr, v_ptr, len_ptr, qn_ptr, kn_ptr, rope_ptr, pos_ptr, qkv_part, o_part, qkv_tickets,
    o_tickets, counters,
    M, D, NQKV, HD, pos_stride, s_len, eps, scale,
    s_am, s_ak, s_asm, s_ask, s_qwn, s_qwk, s_qwsn, s_qwsk, s_own, s_owk, s_owsn, s_owsk,
    s_qkv, s_att, s_att_h, s_atts, s_om, s_on, sk_slot, sk_pos, sk_head,
    BM: tl.constexpr, QKV_BN: tl.constexpr, QKV_TILES: tl.constexpr, QKV_SPLIT: tl.constexpr,
    QKV_PER: tl.constexpr, O_BN: tl.constexpr, O_TILES: tl.constexpr, O_SPLIT: tl.constexpr,
    O_PER: tl.constexpr, BK: tl.constexpr, A_GROUP: tl.constexpr, W_ROW_GROUP: tl.constexpr,
    W_K_GROUP: tl.constexpr, MX: tl.constexpr, SWAP: tl.constexpr, W_TMA: tl.constexpr,
    G: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_D: tl.constexpr, BLOCK_N: tl.constexpr,
    KEYS_BOUND: tl.constexpr, N_KV: tl.constexpr, QK_NORM: tl.constexpr, OUT_DTYPE: tl.constexpr,
    EXACT_CVT: tl.constexpr, USE_PDL: tl.constexpr, PREFETCH: tl.constexpr, ATT_CODES: tl.constexpr,
):
    """``out = O(attention(RoPE(QKV(a))))`` for the rows of a frame cache; see the module docstring.
    ``counters``: int32 [4] (next ticket, QKV tiles done, attention items done, programs out)."""
    pdl_entry(USE_PDL)
    QKV_ITEMS: tl.constexpr = QKV_TILES * QKV_SPLIT
    att_items = M * N_KV
    first_o = QKV_ITEMS + att_items
    items = first_o + O_TILES * O_SPLIT
    item = take_ticket(counters)
    while item < items:
        if item < QKV_ITEMS:  # a QKV tile's share; the share that completes the tile counts it
            if gemm_item(item, a_ptr, as_ptr, wqkv_ptr, wqkv_desc, wqkvs_ptr, qkv_ptr, qkv_ptr, qkv_part,
                         qkv_tickets, M, NQKV, D, 0, s_am, s_ak, s_asm, s_ask, s_qwn, s_qwk, s_qwsn, s_qwsk,
                         s_qkv, 1, 0, 0, BM, QKV_BN, BK, QKV_SPLIT, QKV_PER, A_GROUP, W_ROW_GROUP, W_K_GROUP,
                         MX, True, 0, 1, SWAP, W_TMA, EXACT_CVT, False):
                count_done(counters + 1)
        elif item < first_o:  # a (row, KV head): once every QKV tile is counted
            wait_for(counters + 1, QKV_TILES)
            pair = item - QKV_ITEMS
            attend_row_head(qkv_ptr, k_ptr, v_ptr, att_ptr, atts_ptr, len_ptr, len_ptr, len_ptr, len_ptr,
                            scale, pair // N_KV, pair % N_KV, s_qkv, HEAD_D, sk_slot, sk_pos, sk_head, s_att,
                            s_att_h, s_atts, 1, s_len, 0, 0, 0, qn_ptr, kn_ptr, rope_ptr, pos_ptr, pos_stride,
                            eps, G, BLOCK_G, HEAD_D, BLOCK_N, True, KEYS_BOUND, ATT_CODES, A_GROUP, MX,
                            OUT_DTYPE, EXACT_CVT, False, True, N_KV, QK_NORM)
            count_done(counters + 2)
        else:  # an O share: once every attention item is counted
            waiting_gemm_item(item - first_o, att_ptr, atts_ptr, wo_ptr, wo_desc, wos_ptr, out_ptr, o_part,
                              o_tickets, counters + 2, att_items, M, D, HD, s_att, 1, s_atts, 1, s_own, s_owk,
                              s_owsn, s_owsk, s_om, s_on, BM, O_BN, BK, O_SPLIT, O_PER, A_GROUP, W_ROW_GROUP,
                              W_K_GROUP, MX, ATT_CODES, SWAP, W_TMA, EXACT_CVT, PREFETCH)
        item = take_ticket(counters)
    leave(counters, 4)


@dataclass(frozen=True)
class FrameAttention:
    """What the attention half reads besides its input and weights: the heads, the RoPE table and the
    shared position, the layer's frame cache ``[rows, S, KV, D]`` (dense; rows are slots) and how
    many keys each row attends (``lengths``, one shared value), the q/k norms (None: off)."""

    n_head: int
    head_dim: int
    rope: torch.Tensor
    pos: torch.Tensor  # int64 [1]
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    lengths: torch.Tensor  # [1]
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    eps: float = 1e-6


def attention_block_one_launch(aq: torch.Tensor, as_: torch.Tensor, wqkv: QuantizedWeight,
                               wo: QuantizedWeight, fa: FrameAttention, out_dtype: torch.dtype,
                               plan: BlockPlan | None = None, prefetch: int | None = None) -> torch.Tensor:
    """``[M, D]`` = the O projection of the frame-cache attention of ``aq`` (FP8 codes ``[M, D]`` +
    scales, a fused norm's output) in one launch; also stores each row's K/V head at ``fa.pos``."""
    m, d = aq.shape
    kv = fa.k_cache.shape[2]
    hd = fa.n_head * fa.head_dim
    mx, grp, w_row_group, w_k_group = _scheme_params(wqkv)
    bk = min(grp, w_k_group)
    plan = plan or block_plan(m, d, wqkv.shape[0], hd, kv, grp, sm_count(aq.device))
    if plan is None:
        raise ValueError(f"the one-launch attention block takes at most {MAX_ROWS} rows, got {m}")
    if fa.k_cache.shape[0] < m or fa.k_cache.dtype != out_dtype:
        raise ValueError("the one-launch attention block needs a dense frame cache of >= M rows, in the "
                         "output dtype")
    qkv = torch.empty(m, wqkv.shape[0], device=aq.device, dtype=out_dtype)
    codes = fa.head_dim % grp == 0  # else the attention writes q's dtype and the O GEMM quantizes it
    # row-major scales: this launch's own O tiles read them, not cuBLAS
    att, atts = output_buffers(qkv.new_empty(m, fa.n_head, fa.head_dim), grp if codes else 0,
                               outer_scales=False)
    out = torch.empty(m, wo.shape[0], device=aq.device, dtype=out_dtype)
    qkv_part_n = plan.qkv_tiles * plan.qkv_split * plan.bm * plan.qkv_bn if plan.qkv_split > 1 else 0
    o_part_n = plan.o_tiles * plan.o_split * plan.bm * plan.o_bn if plan.o_split > 1 else 0
    part, tickets = workspace(aq.device, qkv_part_n + o_part_n + 1, plan.qkv_tiles + plan.o_tiles + 4)
    use_tma = tma_ok(wqkv) and tma_ok(wo)
    qkv_per, o_per = cdiv(cdiv(d, bk), plan.qkv_split), cdiv(cdiv(hd, bk), plan.o_split)
    if prefetch is None:  # the O items' weights, asked of L2 while QKV and attention run
        prefetch = _prefetch_blocks(aq.device, wo, o_per, plan.o_tiles * plan.o_split, plan.o_bn * bk,
                                    "auto")
    norm = fa.q_norm is not None
    g = fa.n_head // kv
    kc = fa.k_cache
    attention_block_one_launch_kernel[(plan.programs,)](
        aq, as_, wqkv.qweight, _weight_desc(wqkv, plan.qkv_bn, bk) if use_tma else None, wqkv.scale, qkv,
        wo.qweight, _weight_desc(wo, plan.o_bn, bk) if use_tma else None, wo.scale, att, atts, out,
        kc, fa.v_cache, fa.lengths, fa.q_norm if norm else qkv, fa.k_norm if norm else qkv, fa.rope, fa.pos,
        part, part[qkv_part_n:], tickets, tickets[plan.qkv_tiles:], tickets[plan.qkv_tiles + plan.o_tiles:],
        m, d, wqkv.shape[0], hd, 0 if fa.pos.numel() == 1 else fa.pos.stride(0),
        0 if fa.lengths.numel() == 1 else fa.lengths.stride(0), fa.eps, 1.0 / math.sqrt(fa.head_dim),
        *aq.stride(), *as_.stride(), *wqkv.qweight.stride(), *wqkv.scale.stride(), *wo.qweight.stride(),
        *wo.scale.stride(), qkv.stride(0), att.stride(0), att.stride(1), atts.stride(0), *out.stride(),
        kc.stride(0), kc.stride(1), kc.stride(2),
        BM=plan.bm, QKV_BN=plan.qkv_bn, QKV_TILES=plan.qkv_tiles, QKV_SPLIT=plan.qkv_split, QKV_PER=qkv_per,
        O_BN=plan.o_bn, O_TILES=plan.o_tiles, O_SPLIT=plan.o_split, O_PER=o_per, BK=bk, A_GROUP=grp,
        W_ROW_GROUP=w_row_group, W_K_GROUP=w_k_group, MX=mx, SWAP=True, W_TMA=use_tma, G=g,
        BLOCK_G=block_g(g), HEAD_D=fa.head_dim, BLOCK_N=attention_block_n(kc.shape[1]),
        KEYS_BOUND=kc.shape[1] if INTERPRETING else 0, N_KV=kv, QK_NORM=norm, OUT_DTYPE=_tl_dtype(out_dtype),
        EXACT_CVT=INTERPRETING, USE_PDL=PDL, PREFETCH=prefetch, ATT_CODES=codes, num_warps=plan.num_warps,
        num_stages=3, **launch_opts(),
    )
    return out


def _tl_dtype(dtype: torch.dtype) -> tl.dtype:
    from .triton_attention import _TL

    return _TL[dtype]
