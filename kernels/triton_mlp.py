"""Fused FP8 SwiGLU MLP on sm_90: two launches, or one, no bf16 intermediate.

Two launches (the default): launch 1 is the gate_up GEMM whose epilogue computes ``silu(g) * u`` and
quantizes it to FP8 codes + group scales (the down projection's activation format, 1x128 / 1x32 as
for any activation) in registers; launch 2 the down GEMM reading those codes. The activation of
launch 1 is quantized in its prologue, by a separate launch (``prequant``), or arrives quantized (a
fused norm's output). The intermediate is M x F FP8 bytes plus scales; the weights dominate the
traffic at decode M.

One launch (:func:`swiglu_mlp_one_launch`, ``TTSFLEET_MLP_LAUNCH=one``, decode M <= 64): the same
two GEMMs' tiles as work items of one persistent kernel, one program per SM. Why: at M=1 on an H200
the two launches take 33.6 us against a 17.6 us weight floor (issue #26); the down GEMM cannot start
until the gate_up kernel has drained, and then starts its weight stream cold. Here programs take
items from a global ticket in order — every gate_up tile (and split-K share) first, then the down
tiles — so the programs that take down items while gate_up still runs ask L2 for their down weights
(``cp.async.bulk.prefetch.L2``: nothing writes weights) and then wait on a counter of finished
h tiles. No deadlock whatever the residency: an item waits only for items of smaller tickets, and a
ticket is only ever held by a running program that does not wait while it holds a gate_up item.
Each item runs the GEMM kernel's own tile code (:func:`.triton_gemm.gemm_tile`,
:func:`.triton_gemm.finish_tile`), so its values equal two launches with the same tiles and splits bit
for bit (Triton's interpreter; on a GPU the same tile code). The counters return to zero at the end
(the last program out resets them), so the launch is CUDA-graph replayable like the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .decode import sm_count
from .layout import QuantizedWeight, cdiv
from .triton_gemm import (
    INTERPRETING,
    PDL,
    _prefetch_blocks,
    _scheme_params,
    _weight_desc,
    act_group,
    get_config,
    launch_gemm,
    launch_opts,
    pdl_entry,
    row_tile,
    tma_ok,
)
from .work_queue import MAX_ROWS, count_done, gemm_item, leave, most_shares, take_ticket, waiting_gemm_item
from .workspaces import workspace


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


# ----------------------------------------------------------------------------------------------
# one launch

#: Largest M the one-launch MLP takes (one row tile holds the batch); above it, two launches.
ONE_LAUNCH_MAX_M = MAX_ROWS
#: h columns per gate_up item (whole activation groups of either scheme, as the SwiGLU epilogue needs).
GATE_UP_BN = 128


@dataclass(frozen=True)
class OneLaunchPlan:
    """How the one-launch MLP splits its work: ``bm`` rows (one tile), gate_up tiles of
    :data:`GATE_UP_BN` h columns in ``gu_split`` K shares, down tiles of ``dn_bn`` output columns in
    ``dn_split`` K shares, ``programs`` persistent programs."""

    bm: int
    gu_tiles: int
    gu_split: int
    dn_bn: int
    dn_tiles: int
    dn_split: int
    programs: int
    num_warps: int

    @property
    def gu_items(self) -> int:
        return self.gu_tiles * self.gu_split

    @property
    def items(self) -> int:
        return self.gu_items + self.dn_tiles * self.dn_split


def one_launch_plan(m: int, d: int, f: int, group: int, sms: int, gu_split: int = 1,
                    per_sm: int = 1) -> OneLaunchPlan | None:
    """The split for ``M = m`` rows, model dim ``d``, hidden ``f`` (activation ``group`` 128 / 32) on
    ``sms`` SMs with up to ``per_sm`` programs each; None where one launch does not apply (M above
    :data:`ONE_LAUNCH_MAX_M`). ``per_sm`` 2 puts two programs' loads in flight per SM, as the two
    launches' grids (gate_up at M=1: 76 tiles x 3 K shares) do; the default 1 was timed on 2026-12-05
    (1.46x the two launches at M=1: gate_up streamed by 76 one-tile programs), 2 not yet.

    Down shares: the most (of :data:`~.triton_gemm.SPLIT_CHOICES`, each at least 2 K blocks) whose
    items still fit the programs gate_up leaves idle, so every down item is taken, and its weights
    prefetched, while gate_up runs (S2 Pro at M=1: 76 gate_up items + 20 tiles x 2 shares on 132 SMs).
    """
    if m < 1 or m > ONE_LAUNCH_MAX_M:
        return None
    bm = row_tile(m)
    gu_tiles = cdiv(f, GATE_UP_BN)
    dn_bn = 128 if d >= 128 * 8 else 64
    dn_tiles = cdiv(d, dn_bn)
    slots = sms * per_sm
    dn_split = most_shares(dn_tiles, cdiv(f, group), slots - gu_tiles * gu_split)
    items = gu_tiles * gu_split + dn_tiles * dn_split
    return OneLaunchPlan(bm=bm, gu_tiles=gu_tiles, gu_split=gu_split, dn_bn=dn_bn, dn_tiles=dn_tiles,
                         dn_split=dn_split, programs=max(1, min(slots, items)),
                         num_warps=8 if bm >= 32 else 4)


@triton.jit
def swiglu_mlp_one_launch_kernel(
    a_ptr, as_ptr, gu_ptr, gu_desc, gus_ptr, dn_ptr, dn_desc, dns_ptr, h_ptr, hs_ptr, out_ptr,
    gu_part, dn_part, gu_tickets, dn_tickets, counters,
    M, D, F,
    s_am, s_ak, s_asm, s_ask, s_gun, s_guk, s_gusn, s_gusk, s_dnn, s_dnk, s_dnsn, s_dnsk,
    s_hm, s_hk, s_hsm, s_hsk, s_om, s_on,
    BM: tl.constexpr, GU_BN: tl.constexpr, GU_TILES: tl.constexpr, GU_SPLIT: tl.constexpr,
    GU_PER: tl.constexpr, DN_BN: tl.constexpr, DN_TILES: tl.constexpr, DN_SPLIT: tl.constexpr,
    DN_PER: tl.constexpr, BK: tl.constexpr, A_GROUP: tl.constexpr, W_ROW_GROUP: tl.constexpr,
    W_K_GROUP: tl.constexpr, MX: tl.constexpr, SWAP: tl.constexpr, W_TMA: tl.constexpr,
    EXACT_CVT: tl.constexpr, USE_PDL: tl.constexpr, PREFETCH: tl.constexpr,
):
    """``out = down(silu(x gate) * (x up))`` on FP8 codes ``a``; see the module docstring.
    ``counters``: int32 [3] (next ticket, finished h tiles, programs done), zero between launches."""
    pdl_entry(USE_PDL)  # the counters and workspaces are touched only after the predecessor is done
    GU_ITEMS: tl.constexpr = GU_TILES * GU_SPLIT
    ITEMS: tl.constexpr = GU_ITEMS + DN_TILES * DN_SPLIT
    item = take_ticket(counters)
    while item < ITEMS:
        if item < GU_ITEMS:  # an h tile's share; the share that completes the tile counts it
            if gemm_item(item, a_ptr, as_ptr, gu_ptr, gu_desc, gus_ptr, h_ptr, hs_ptr, gu_part, gu_tickets,
                         M, 2 * F, D, F, s_am, s_ak, s_asm, s_ask, s_gun, s_guk, s_gusn, s_gusk, s_hm, s_hk,
                         s_hsm, s_hsk, BM, GU_BN, BK, GU_SPLIT, GU_PER, A_GROUP, W_ROW_GROUP, W_K_GROUP, MX,
                         True, 1, A_GROUP, SWAP, W_TMA, EXACT_CVT, False):
                count_done(counters + 1)
        else:  # a down share: once every h tile is counted
            waiting_gemm_item(item - GU_ITEMS, h_ptr, hs_ptr, dn_ptr, dn_desc, dns_ptr, out_ptr, dn_part,
                              dn_tickets, counters + 1, GU_TILES, M, D, F, s_hm, s_hk, s_hsm, s_hsk, s_dnn,
                              s_dnk, s_dnsn, s_dnsk, s_om, s_on, BM, DN_BN, BK, DN_SPLIT, DN_PER, A_GROUP,
                              W_ROW_GROUP, W_K_GROUP, MX, True, SWAP, W_TMA, EXACT_CVT, PREFETCH)
        item = take_ticket(counters)
    leave(counters, 3)


def swiglu_mlp_one_launch(xq: torch.Tensor, xs: torch.Tensor, gate_up: QuantizedWeight, down: QuantizedWeight,
                          out_dtype: torch.dtype, plan: OneLaunchPlan | None = None,
                          tma: bool = True, prefetch: int | None = None) -> torch.Tensor:
    """The SwiGLU MLP on FP8 codes ``xq [M, D]`` + scales ``xs`` in one launch (M <= 64); ``plan``
    defaults to :func:`one_launch_plan` for the device's SMs, ``prefetch`` (down weight blocks per
    item asked of L2 while it waits) to what fits half of L2 (the benchmark times 0 beside it)."""
    m, d = xq.shape
    f = gate_up.shape[0] // 2
    mx, grp, w_row_group, w_k_group = _scheme_params(gate_up)
    bk = min(grp, w_k_group)
    plan = plan or one_launch_plan(m, d, f, grp, sm_count(xq.device))
    if plan is None:
        raise ValueError(f"the one-launch MLP takes M <= {ONE_LAUNCH_MAX_M} rows, got {m}")
    hq = torch.empty(m, f, device=xq.device, dtype=torch.float8_e4m3fn)
    hs = torch.empty(m, cdiv(f, grp), device=xq.device, dtype=torch.uint8 if mx else torch.float32)
    out = torch.empty(m, d, device=xq.device, dtype=out_dtype)
    gu_part_n = plan.gu_items * 2 * plan.bm * GATE_UP_BN if plan.gu_split > 1 else 0
    dn_part_n = plan.dn_tiles * plan.dn_split * plan.bm * plan.dn_bn if plan.dn_split > 1 else 0
    part, tickets = workspace(xq.device, gu_part_n + dn_part_n + 1, plan.gu_tiles + plan.dn_tiles + 3)
    use_tma = tma and tma_ok(gate_up) and tma_ok(down)
    gu_per, dn_per = cdiv(cdiv(d, bk), plan.gu_split), cdiv(cdiv(f, bk), plan.dn_split)
    if prefetch is None:  # the down items' weights, asked of L2 while gate_up runs
        prefetch = _prefetch_blocks(xq.device, down, dn_per, plan.dn_tiles * plan.dn_split, plan.dn_bn * bk,
                                    "auto")
    swiglu_mlp_one_launch_kernel[(plan.programs,)](
        xq, xs, gate_up.qweight, _weight_desc(gate_up, GATE_UP_BN, bk) if use_tma else None, gate_up.scale,
        down.qweight, _weight_desc(down, plan.dn_bn, bk) if use_tma else None, down.scale, hq, hs, out,
        part, part[gu_part_n:], tickets, tickets[plan.gu_tiles:], tickets[plan.gu_tiles + plan.dn_tiles:],
        m, d, f,
        xq.stride(0), xq.stride(1), xs.stride(0), xs.stride(1),
        *gate_up.qweight.stride(), *gate_up.scale.stride(), *down.qweight.stride(), *down.scale.stride(),
        hq.stride(0), hq.stride(1), hs.stride(0), hs.stride(1), out.stride(0), out.stride(1),
        BM=plan.bm, GU_BN=GATE_UP_BN, GU_TILES=plan.gu_tiles, GU_SPLIT=plan.gu_split, GU_PER=gu_per,
        DN_BN=plan.dn_bn, DN_TILES=plan.dn_tiles, DN_SPLIT=plan.dn_split, DN_PER=dn_per, BK=bk, A_GROUP=grp,
        W_ROW_GROUP=w_row_group, W_K_GROUP=w_k_group, MX=mx, SWAP=True, W_TMA=use_tma, EXACT_CVT=INTERPRETING,
        USE_PDL=PDL, PREFETCH=prefetch,
        num_warps=plan.num_warps, num_stages=3, **launch_opts(),
    )
    return out
