"""Triton FP8 block-scaled GEMM for sm_90 (H100/H200), tuned for decode (M <= 128).

Why this shape of kernel: at decode M the GEMM is a weight stream (N*K FP8 bytes) and cuBLAS leaves
SMs idle because N/128 tiles do not fill 132 SMs. Here each program owns a BN x BM output tile and
a contiguous range of K (split-K); the last program to finish a tile (an atomic ticket per tile)
sums the other programs' float32 partials and runs the epilogue, so split-K costs no extra launch,
no memset, and the tickets return to zero, which keeps the kernel CUDA-graph replayable.

One kernel covers:
* bsgemm (1x128 activation, 128x128 weight scales, float32) and mxfp8 (1x32 UE8M0 both sides,
  emulated on sm_90 by scaling each 32-wide K chunk), with explicit scale strides;
* activations given as FP8 codes + scales, or as bf16/fp32 quantized in the prologue (bit-identical
  to the reference quantizer: x * (1/s) with one IEEE division per group, RNE, +-448);
* weight tiles read through TMA descriptors (``tma`` configs: bulk async copies, zero-filled at the
  edges, no address arithmetic in the loop) or plain masked loads (any alignment);
* epilogues: plain (+bias, cast to the output dtype), or SwiGLU (gate rows n and up rows F+n in one
  program; ``silu(g) * u`` is quantized to FP8 + scales for the down projection in registers). The
  SwiGLU output is always quantized in the scheme's own activation groups (1x128 / 1x32), so a tile
  must span whole groups: the result never depends on the launch config the tuner picked.

Every launch config the tuner may pick is in :func:`config_space`; :func:`check_config` rejects the
rest before launching, and the tests run the whole space (Triton's interpreter on CPU, the sweep on
the GPU checks each candidate before timing it; :mod:`.compile_check` compiles each for sm_90).
All decode kernels of the package launch with programmatic dependent launch (:data:`PDL`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from functools import cache
from typing import Any

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .decode import PDL_SWITCH
from .layout import BS_BLOCK, MX_BLOCK, QuantizedWeight, cdiv
from .workspaces import workspace

FLT_MIN = tl.constexpr(1.1754943508222875e-38)
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
#: Programmatic dependent launch (sm_90): every decode kernel may be launched while its predecessor
#: drains and waits (``griddepcontrol.wait``) before touching memory, so launch latency and set-up
#: overlap the previous kernel's tail. Not in the interpreter (no such instruction there), nor with
#: ``TTSFLEET_PDL=off`` (:data:`.decode.PDL_SWITCH`).
PDL = not INTERPRETING and PDL_SWITCH.get()


@triton.jit
def pdl_entry(ENABLED: tl.constexpr):
    """First statement of every decode kernel: wait for the previous kernel's memory, then let the
    next kernel launch. Safe without PDL (both instructions are then no-ops)."""
    if ENABLED:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def _ue8m0_to_f32(e):
    return (e.to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _ue8m0_from_amax(amax):
    r = tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))
    bits = r.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
    return tl.minimum(tl.maximum(e, 1), 254)


@triton.jit
def to_e4m3(x, EXACT: tl.constexpr):
    """Saturate to +-448 and round to float8 e4m3 (round to nearest even).

    EXACT rounds in float32 bit arithmetic first, so the final conversion is exact: Triton 3.6's
    interpreter converts float32 -> e4m3 without carrying into the exponent (124.3 -> 64). The GPU's
    conversion instruction is correct, so compiled kernels pass EXACT=False.
    """
    x = tl.minimum(tl.maximum(x, -448.0), 448.0)
    if EXACT:
        bits = x.to(tl.int32, bitcast=True)
        mag = bits & 0x7FFFFFFF
        normal = ((mag + 0x7FFFF + ((mag >> 20) & 1)) & -1048576).to(tl.float32, bitcast=True)
        ax = mag.to(tl.float32, bitcast=True)
        sub = (ax + 24576.0) - 24576.0  # multiples of 2**-9 (e4m3 subnormals), RNE by the fp32 add
        r = tl.where(ax >= 0.015625, normal, sub)
        x = tl.where(bits < 0, -r, r)
    return x.to(tl.float8e4nv)


@triton.jit
def quantize_group_rows(g, MX: tl.constexpr, EXACT_CVT: tl.constexpr):
    """``g [..., GROUP]`` float32 -> (FP8 codes like ``g``, the scale each group stores ``[...]``).

    The one copy of the quantizer's arithmetic inside Triton code (the activation quantizer, the
    decode kernels' fused norm and the SwiGLU epilogue below call it), groups along the last axis:
    UE8M0 exponent bytes when ``MX``, else float32 amax / 448 floored at FLT_MIN; codes are
    g * (1/s) with one IEEE division per group.
    """
    AX: tl.constexpr = len(g.shape) - 1
    amax = tl.max(tl.abs(g), axis=AX)
    if MX:
        e = _ue8m0_from_amax(amax)
        s = _ue8m0_to_f32(e)
    else:
        s = tl.maximum(tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32)), FLT_MIN)
    q = to_e4m3(g * tl.expand_dims(tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s), AX), EXACT_CVT)
    if MX:  # noqa: SIM108 - Triton code (one return: see below)
        sc = e.to(tl.uint8)
    else:
        sc = s
    return q, sc


# (helpers end in one ``return``: Triton compiles every ``return`` of a function, also one after a
# constexpr ``if`` that returned, so two differently shaped returns fail to compile)
@triton.jit
def _w_tile(w_ptr, w_desc, row0, kk, k0, row_lim, K, s_wn, s_wk, BN: tl.constexpr, W_TMA: tl.constexpr):
    """Rows ``row0 .. row0+BN`` x ``kk`` of the FP8 weight (TMA or masked pointer loads)."""
    if W_TMA:
        t = w_desc.load([row0, k0])
    else:
        rows = row0 + tl.arange(0, BN)
        mask = (rows < row_lim)[:, None] & (kk < K)[None, :]
        t = tl.load(w_ptr + rows[:, None] * s_wn + kk[None, :] * s_wk, mask=mask, other=0.0)
    return t


@triton.jit
def l2_prefetch(addr, nbytes, ok):
    """Ask L2 for ``nbytes`` at each address (int64, 16-byte aligned; sizes multiples of 16) where
    ``ok``: one ``cp.async.bulk.prefetch.L2`` per element (sm_90+). Fire and forget: no register, no
    shared memory, no wait, never a fault on a wrong guess (the callers clamp addresses in bounds)."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $3; mov.u32 $0, 0; }",
        "=r,l,r,r", [addr, ok.to(tl.int32), nbytes.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _l2_prefetch_rows(w_ptr, row0, k0, span, row_lim, K, s_wn, BN: tl.constexpr):
    """Ask L2 for ``span`` bytes of each weight row ``row0 .. row0+BN`` from column ``k0`` on: FP8 rows
    are K-contiguous, so a program's K range of a row is one run. A row past ``row_lim`` or an empty
    range issues nothing. Needs 16-byte aligned rows (``tma_ok``)."""
    rows = row0 + tl.arange(0, BN)
    nbytes = tl.minimum(K - k0, span)
    addr = (w_ptr + rows.to(tl.int64) * s_wn + k0).to(tl.int64, bitcast=True)
    l2_prefetch(addr, tl.zeros([BN], tl.int32) + nbytes, (rows < row_lim) & (nbytes > 0))


@triton.jit
def _w_scale(ws_ptr, rows, k0, ok, s_wsn, s_wsk, W_ROW_GROUP: tl.constexpr, W_K_GROUP: tl.constexpr,
             MX: tl.constexpr):
    ptrs = ws_ptr + (rows // W_ROW_GROUP) * s_wsn + (k0 // W_K_GROUP) * s_wsk
    if MX:  # noqa: SIM108 - Triton code
        s = _ue8m0_to_f32(tl.load(ptrs, mask=ok, other=127))
    else:
        s = tl.load(ptrs, mask=ok, other=1.0)
    return s


@triton.jit
def _scaled_dot(acc, a_q, w_t, sa, sw, SWAP: tl.constexpr):
    if SWAP:
        r = acc + tl.dot(w_t, tl.trans(a_q)) * (sw[:, None] * sa[None, :])
    else:
        r = acc + tl.dot(a_q, tl.trans(w_t)) * (sa[:, None] * sw[None, :])
    return r


@triton.jit
def _bf16_rne_in_f32(x):
    """``x`` rounded to bf16 (nearest even) by bit arithmetic, as float32: the interpreter's own
    conversion truncates."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _a16_dot(acc, a16, w_t, sw, SWAP: tl.constexpr, INTERP: tl.constexpr):
    """W8A16: the FP8 weight tile widened to bf16 with its row scales applied (``e4m3 * scale``
    rounded once to bf16), then one bf16 MMA that accumulates in place. Why: the block-scaled FP8
    product needs a float32 rescale of every 128-K block's MMA result before the next block adds to
    it, which keeps Triton's pipeliner from queueing the MMAs of a decode tile; here nothing sits
    between them. The weight bytes read are the same FP8 codes and scales."""
    w32 = w_t.to(tl.float32) * sw[:, None]
    if INTERP:  # Triton 3.6's interpreter multiplies bf16 operands' raw bits and truncates to bf16:
        w16 = _bf16_rne_in_f32(w32)  # the GPU's values (round to nearest even), held in float32
        a16 = a16.to(tl.float32)
    else:
        w16 = w32.to(tl.bfloat16)
    if SWAP:  # noqa: SIM108 - Triton code
        r = tl.dot(w16, tl.trans(a16), acc)
    else:
        r = tl.dot(a16, tl.trans(w16), acc)
    return r


@triton.jit
def fp8_gemm_kernel(
    a_ptr, as_ptr, w_ptr, w_desc, ws_ptr, out_ptr, bias_ptr, part_ptr, ticket_ptr, hs_ptr,
    M, N, K, F,
    s_am, s_ak, s_asm, s_ask, s_wn, s_wk, s_wsn, s_wsk, s_om, s_on, s_hsm, s_hsk,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr, PER: tl.constexpr,
    A_GROUP: tl.constexpr, W_ROW_GROUP: tl.constexpr, W_K_GROUP: tl.constexpr,
    MX: tl.constexpr, A_FP8: tl.constexpr, EPI: tl.constexpr, HAS_BIAS: tl.constexpr,
    SWAP: tl.constexpr, H_GROUP: tl.constexpr, W_TMA: tl.constexpr, EXACT_CVT: tl.constexpr,
    USE_PDL: tl.constexpr, PREFETCH: tl.constexpr = 0, A16: tl.constexpr = False,
):
    """out[m, n] = sum_k a[m, k] * w[n, k] with per-group scales; see the module docstring.

    EPI 0: plain -> out (dtype of out_ptr). EPI 1: SwiGLU over n < F using w rows n and F + n,
    writes FP8 codes to out_ptr [M, F] and group scales (H_GROUP wide) to hs_ptr.
    Program (pid_n, pid_m, pid_k) runs the PER K blocks ``pid_k * PER ..``; blocks past K are
    masked (pointer loads) or zero-filled (TMA) and contribute nothing.
    PREFETCH > 0 (with PDL only): before waiting for the previous kernel, ask L2 for the first
    PREFETCH of the program's K blocks of its weight rows (``decode.GEMM_PREFETCH_SWITCH``).
    A16: the activations stay bf16 and each weight tile is widened to bf16 with its block scale
    applied, so the MMAs accumulate in place (see :func:`_a16_dot`); with EPI 1 the SwiGLU output is
    then bf16 (out_ptr's dtype), not codes.
    """
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    if USE_PDL and PREFETCH > 0:  # weights are never written by a predecessor: safe before the wait
        k_first = pid_k * PER * BK
        span = tl.minimum(PER, PREFETCH) * BK
        _l2_prefetch_rows(w_ptr, pid_n * BN, k_first, span, F if EPI == 1 else N, K, s_wn, BN)
        if EPI == 1:
            _l2_prefetch_rows(w_ptr, F + pid_n * BN, k_first, span, 2 * F, K, s_wn, BN)
    pdl_entry(USE_PDL)
    res, res_u = gemm_tile(a_ptr, as_ptr, w_ptr, w_desc, ws_ptr, M, N, K, F, pid_n, pid_m, pid_k,
                           s_am, s_ak, s_asm, s_ask, s_wn, s_wk, s_wsn, s_wsk, BM, BN, BK, PER, A_GROUP,
                           W_ROW_GROUP, W_K_GROUP, MX, A_FP8, EPI, SWAP, W_TMA, EXACT_CVT, False, A16)
    finish_tile(res, res_u, pid_m * tl.num_programs(0) + pid_n, pid_n, pid_m, pid_k, part_ptr, ticket_ptr,
                out_ptr, bias_ptr, hs_ptr, M, N, F, s_om, s_on, s_hsm, s_hsk, BM, BN, SPLIT_K, EPI, HAS_BIAS,
                MX, H_GROUP, EXACT_CVT)


@triton.jit
def _load(ptrs, mask, other, CG: tl.constexpr):
    """``tl.load`` through L2 only when ``CG`` (data another program of this launch wrote: its L1
    lines could be stale), else as any load."""
    if CG:
        x = tl.load(ptrs, mask=mask, other=other, cache_modifier=".cg")
    else:
        x = tl.load(ptrs, mask=mask, other=other)
    return x


@triton.jit
def _a_tile(a_ptr, as_ptr, offs_m, kk, k0, m_ok, live, K, s_am, s_ak, s_asm, s_ask, A_GROUP: tl.constexpr,
            MX: tl.constexpr, A_FP8: tl.constexpr, EXACT_CVT: tl.constexpr, A_CG: tl.constexpr):
    """The activation tile ``[BM, BK]`` as FP8 codes and its row scales ``[BM]`` (codes as given, or
    bf16/fp32 quantized here: BK == A_GROUP, so each row of the tile is one scale group). ``A_CG``:
    read through L2 only (codes written by another program of the same launch)."""
    a_mask = m_ok[:, None] & (kk < K)[None, :]
    a_ptrs = a_ptr + offs_m[:, None] * s_am + kk[None, :] * s_ak
    s_ptrs = as_ptr + offs_m * s_asm + (k0 // A_GROUP) * s_ask
    a_raw = _load(a_ptrs, a_mask, 0.0, A_CG)
    if A_FP8:
        a_q = a_raw
        if MX:
            sa = _ue8m0_to_f32(_load(s_ptrs, m_ok & live, 127, A_CG))
        else:
            sa = _load(s_ptrs, m_ok & live, 1.0, A_CG)
    else:
        af = a_raw.to(tl.float32)
        amax = tl.max(tl.abs(af), axis=1)
        if MX:
            sa = _ue8m0_to_f32(_ue8m0_from_amax(amax))
        else:
            sa = tl.maximum(tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32)), FLT_MIN)
        inv = tl.math.div_rn(tl.full(sa.shape, 1.0, tl.float32), sa)  # one division per row
        a_q = to_e4m3(af * inv[:, None], EXACT_CVT)
    return a_q, sa


@triton.jit
def gemm_tile(a_ptr, as_ptr, w_ptr, w_desc, ws_ptr, M, N, K, F, pid_n, pid_m, pid_k,
              s_am, s_ak, s_asm, s_ask, s_wn, s_wk, s_wsn, s_wsk,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PER: tl.constexpr, A_GROUP: tl.constexpr,
              W_ROW_GROUP: tl.constexpr, W_K_GROUP: tl.constexpr, MX: tl.constexpr, A_FP8: tl.constexpr,
              EPI: tl.constexpr, SWAP: tl.constexpr, W_TMA: tl.constexpr, EXACT_CVT: tl.constexpr,
              A_CG: tl.constexpr, A16: tl.constexpr = False):
    """One program's share of a GEMM tile: the float32 sums ``[BM, BN]`` over its PER K blocks (and,
    for the SwiGLU epilogue, those of the up rows F + n). The one copy of the main loop: the GEMM
    kernel and the one-launch MLP (:mod:`.triton_mlp`) both run it."""
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    m_ok = offs_m < M
    n_lim = F if EPI == 1 else N
    n_ok = offs_n < n_lim
    offs_u = offs_n + F

    if SWAP:
        acc = tl.zeros((BN, BM), dtype=tl.float32)
        acc_u = tl.zeros((BN, BM), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        acc_u = tl.zeros((BM, BN), dtype=tl.float32)

    for i in range(PER):
        k0 = (pid_k * PER + i) * BK
        kk = k0 + offs_k
        live = k0 < K
        w_t = _w_tile(w_ptr, w_desc, pid_n * BN, kk, k0, n_lim, K, s_wn, s_wk, BN, W_TMA)
        sw = _w_scale(ws_ptr, offs_n, k0, n_ok & live, s_wsn, s_wsk, W_ROW_GROUP, W_K_GROUP, MX)
        if A16:
            a16 = tl.load(a_ptr + offs_m[:, None] * s_am + kk[None, :] * s_ak,
                          mask=m_ok[:, None] & (kk < K)[None, :], other=0.0).to(tl.bfloat16)
            acc = _a16_dot(acc, a16, w_t, sw, SWAP, EXACT_CVT)
        else:
            a_q, sa = _a_tile(a_ptr, as_ptr, offs_m, kk, k0, m_ok, live, K, s_am, s_ak, s_asm, s_ask, A_GROUP,
                              MX, A_FP8, EXACT_CVT, A_CG)
            acc = _scaled_dot(acc, a_q, w_t, sa, sw, SWAP)
        if EPI == 1:
            w_u = _w_tile(w_ptr, w_desc, F + pid_n * BN, kk, k0, F + n_lim, K, s_wn, s_wk, BN, W_TMA)
            su = _w_scale(ws_ptr, offs_u, k0, n_ok & live, s_wsn, s_wsk, W_ROW_GROUP, W_K_GROUP, MX)
            if A16:
                acc_u = _a16_dot(acc_u, a16, w_u, su, SWAP, EXACT_CVT)
            else:
                acc_u = _scaled_dot(acc_u, a_q, w_u, sa, su, SWAP)

    if SWAP:
        res = tl.trans(acc)
        res_u = tl.trans(acc_u)
    else:
        res = acc
        res_u = acc_u
    return res, res_u


@triton.jit
def finish_tile(res, res_u, tile, pid_n, pid_m, pid_k, part_ptr, ticket_ptr, out_ptr, bias_ptr, hs_ptr,
                M, N, F, s_om, s_on, s_hsm, s_hsk, BM: tl.constexpr, BN: tl.constexpr, SPLIT_K: tl.constexpr,
                EPI: tl.constexpr, HAS_BIAS: tl.constexpr, MX: tl.constexpr, H_GROUP: tl.constexpr,
                EXACT_CVT: tl.constexpr):
    """Hand one program's sums of output tile ``tile`` on: with split-K, store them as its partial and
    take the tile's ticket (the last of its SPLIT_K programs sums every partial in slot order and runs
    the epilogue); else run the epilogue. Returns 1 where this program wrote the tile's output, 0
    where another program of the tile will (the one-launch MLP counts finished tiles with it)."""
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    m_ok = offs_m < M
    n_ok = offs_n < (F if EPI == 1 else N)
    lm = tl.arange(0, BM)
    ln = tl.arange(0, BN)
    if SPLIT_K > 1:
        NSLOT: tl.constexpr = 2 if EPI == 1 else 1
        loc = lm[:, None] * BN + ln[None, :]
        slot = part_ptr + ((tile * SPLIT_K + pid_k) * NSLOT) * (BM * BN) + loc
        tl.store(slot, res)
        if EPI == 1:
            tl.store(slot + BM * BN, res_u)
        tl.debug_barrier()
        ticket = tl.atomic_add(ticket_ptr + tile, 1, sem="acq_rel", scope="gpu")
        wrote = (ticket == SPLIT_K - 1).to(tl.int32)
        if ticket == SPLIT_K - 1:
            # sum every slot (own included) in slot order: the result does not depend on which
            # program finished last, so split-K output is deterministic run to run
            res = tl.zeros((BM, BN), dtype=tl.float32)
            res_u = tl.zeros((BM, BN), dtype=tl.float32)
            for j in tl.static_range(SPLIT_K):  # unrolled: all partial loads in flight at once
                other = part_ptr + ((tile * SPLIT_K + j) * NSLOT) * (BM * BN) + loc
                res += tl.load(other, cache_modifier=".cg")
                if EPI == 1:
                    res_u += tl.load(other + BM * BN, cache_modifier=".cg")
            tl.store(ticket_ptr + tile, 0)
            _epilogue(res, res_u, offs_m, offs_n, m_ok, n_ok, out_ptr, bias_ptr, hs_ptr, s_om, s_on, s_hsm,
                      s_hsk, pid_n, F, EPI, HAS_BIAS, MX, BM, BN, H_GROUP, EXACT_CVT)
    else:
        wrote = 1
        _epilogue(res, res_u, offs_m, offs_n, m_ok, n_ok, out_ptr, bias_ptr, hs_ptr, s_om, s_on, s_hsm, s_hsk,
                  pid_n, F, EPI, HAS_BIAS, MX, BM, BN, H_GROUP, EXACT_CVT)
    return wrote


@triton.jit
def _epilogue(res, res_u, offs_m, offs_n, m_ok, n_ok, out_ptr, bias_ptr, hs_ptr, s_om, s_on, s_hsm, s_hsk,
              pid_n, F, EPI: tl.constexpr, HAS_BIAS: tl.constexpr, MX: tl.constexpr, BM: tl.constexpr,
              BN: tl.constexpr, H_GROUP: tl.constexpr, EXACT_CVT: tl.constexpr):
    """Plain: +bias, cast, store. SwiGLU: silu(g) * u, quantize per H_GROUP columns, store codes+scales;
    into a bf16 output (the W8A16 MLP's: its down GEMM reads bf16) cast and stored instead."""
    o_ptrs = out_ptr + offs_m[:, None] * s_om + offs_n[None, :] * s_on
    o_ok = m_ok[:, None] & n_ok[None, :]
    if EPI == 0:
        if HAS_BIAS:
            res += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(o_ptrs, res.to(out_ptr.dtype.element_ty), mask=o_ok)
    else:
        h = res / (1.0 + tl.exp(-res)) * res_u  # silu(g) * u in float32
        if out_ptr.dtype.element_ty == tl.bfloat16:  # the W8A16 MLP's output: its down GEMM reads bf16
            tl.store(o_ptrs, h.to(tl.bfloat16), mask=o_ok)
        else:
            NG: tl.constexpr = BN // H_GROUP
            q, sc = quantize_group_rows(tl.reshape(h, (BM, NG, H_GROUP)), MX, EXACT_CVT)
            tl.store(o_ptrs, tl.reshape(q, (BM, BN)), mask=o_ok)
            offs_g = pid_n * NG + tl.arange(0, NG)
            g_ok = offs_g * H_GROUP < F
            hs_ptrs = hs_ptr + offs_m[:, None] * s_hsm + offs_g[None, :] * s_hsk
            tl.store(hs_ptrs, sc, mask=m_ok[:, None] & g_ok[None, :])


# ----------------------------------------------------------------------------------------------
# configuration


@dataclass(frozen=True)
class GemmConfig:
    """Launch parameters; ``bm`` 0 means 'smallest power of two >= M, at least 16, at most 64'."""

    bn: int = 64
    split_k: int = 1
    swap: bool = True
    prequant: bool = False  # quantize activations in a separate launch instead of the prologue
    num_warps: int = 4
    num_stages: int = 4
    bm: int = 0
    tma: bool = False  # weight tiles through a TMA descriptor (needs K * 1 B 16-byte aligned)
    a16: bool = False  # W8A16: bf16 activations, FP8 weights widened in the tile, bf16 out

    def block_m(self, m: int) -> int:
        return self.bm or row_tile(m)


def row_tile(m: int) -> int:
    """Rows per tile for ``m`` rows: the smallest power of two >= M, at least 16 (``tl.dot``), at most 64."""
    return min(64, max(16, triton.next_power_of_2(m)))


KINDS = ("linear", "swiglu", "down")
# What the tuner may choose from; check_config admits exactly these values.
BN_CHOICES = (64, 128, 256)
SPLIT_CHOICES = (1, 2, 3, 4, 8)
BM_CHOICES = (0, 64, 128)
WARP_CHOICES = (4, 8)
STAGE_CHOICES = (3, 4, 5, 6)


def act_group(scheme: str) -> int:
    """The activation scale group along K: 1x128 (bsgemm) or 1x32 (mxfp8)."""
    return MX_BLOCK if scheme == "mxfp8" else BS_BLOCK


def check_config(kind: str, cfg: GemmConfig, scheme: str) -> None:
    """Raise ValueError for a config this kernel cannot run correctly (before any launch)."""
    if kind not in KINDS:
        raise ValueError(f"unknown GEMM kind {kind!r}; expected one of {KINDS}")
    bad = []
    if cfg.bn not in BN_CHOICES:
        bad.append(f"bn {cfg.bn} not in {BN_CHOICES}")
    if cfg.split_k not in SPLIT_CHOICES:
        bad.append(f"split_k {cfg.split_k} not in {SPLIT_CHOICES}")
    if cfg.bm not in BM_CHOICES:
        bad.append(f"bm {cfg.bm} not in {BM_CHOICES}")
    if cfg.num_warps not in WARP_CHOICES or cfg.num_stages not in STAGE_CHOICES:
        bad.append(f"num_warps {cfg.num_warps} / num_stages {cfg.num_stages} not in {WARP_CHOICES} / "
                   f"{STAGE_CHOICES}")
    if kind == "swiglu" and cfg.bn % act_group(scheme):
        bad.append(f"the SwiGLU epilogue quantizes whole 1x{act_group(scheme)} groups: bn {cfg.bn} must be a "
                   "multiple")
    if cfg.bn * max(cfg.bm, 16) > 256 * 64 or (kind == "swiglu" and cfg.bn > 128):
        bad.append(f"tile bn {cfg.bn} x bm {cfg.bm} is too large for the register file")
    if cfg.a16 and cfg.prequant:
        bad.append("a16 (bf16 activations) has no quantize launch (prequant off)")
    if bad:
        raise ValueError(f"invalid {kind} GEMM config {cfg}: " + "; ".join(bad))


def _splits(tiles: int, k_iters: int) -> list[int]:
    """The two smallest split-K factors that put >= 132 programs (one H200 wave) in flight, each
    split keeping >= 2 K blocks; fewer when K is too short."""
    ok = [s for s in SPLIT_CHOICES if s == 1 or k_iters >= 2 * s]
    filling = [s for s in ok if tiles * s >= 132]
    return filling[:2] if filling else ok[-1:]


def config_space(kind: str, m: int, n: int, k: int, scheme: str = "bsgemm_fp8") -> list[GemmConfig]:
    """Every config the tuner may pick for this shape: the sweep times exactly these, the tests run
    each of them, and :func:`check_config` admits each.

    Kept small on purpose (compile time on the lent GPU is the sweep's budget): bn 64/128 (SwiGLU
    128: whole 1x128 groups), the two split-K factors that first fill the SMs, TMA or pointer weight
    loads, a pipeline depth per tile size, and for M >= 64 the unswapped 64-row tile. Activations
    arrive as FP8 codes (``prequant``: a fused norm or a separate quantizer); the prologue-quantizing
    variant stays valid (tested) but is not a tuning choice.

    For M >= 32 the swapped linear tiles also come with 8 warps (two warpgroups share the tile's
    rows): on the H200 every decode GEMM but gate_up ran at 19-33 % of the copy bandwidth at M = 64
    against 38-57 % at M = 1 (2026-12-03b, ``gemm_proto.txt``), the MMA work per weight byte 64x
    larger while the 4-warp tile was the only one timed there. The same stages and tiles, so the
    same shared memory (within sm_120's 99 KiB where the 4-warp config is) and the same numerics.
    """
    k_iters = cdiv(k, act_group(scheme))
    n_eff = n // 2 if kind == "swiglu" else n
    bns = (128,) if kind == "swiglu" else (64, 128)
    tmas = (False, True) if k % 16 == 0 else (False,)
    out: list[GemmConfig] = []
    for bn in bns:
        # pipeline depth: ~48 KB of weight tiles in flight per program; the SwiGLU tile reads two
        # 128x128 tiles a step, and 3 stages (96 KB) let two programs share an SM
        stages = 3 if kind == "swiglu" else (6 if bn == 64 else 4)
        shapes = [(True, 0, 4)]
        if m >= 32:  # SwiGLU: two 128 x 64 float32 accumulators, 8 warps hold them; linear: see above
            shapes.append((True, 0, 8))
        if m >= 64 and bn == 128:
            shapes.append((False, 64, 8))
        for swap, bm, warps in shapes:
            for split in _splits(cdiv(n_eff, bn) * cdiv(m, bm or 64), k_iters):
                for tma in tmas:
                    cfg = GemmConfig(bn=bn, split_k=split, swap=swap, prequant=True, num_warps=warps,
                                     num_stages=stages if swap else 3, bm=bm, tma=tma)
                    check_config(kind, cfg, scheme)
                    out.append(cfg)
    return out


_TUNED_FILE = os.path.join(os.path.dirname(__file__), "tuned_h200.json")


@cache
def _tuned() -> dict[str, dict[str, Any]]:
    """Best configs measured on the H200 by benchmarks/kernels (key 'kind:N:K:Mbucket')."""
    try:
        with open(_TUNED_FILE) as fh:
            raw = json.load(fh)
    except (OSError, ValueError):
        return {}
    return {key: _config_fields(cfg) for key, cfg in raw.items()}


def _config_fields(entry: dict[str, Any]) -> dict[str, Any]:
    """A tuned table entry's :class:`GemmConfig` fields (the sweep also records its time, ``us``)."""
    names = {f.name for f in fields(GemmConfig)}
    return {k: v for k, v in entry.items() if k in names}


def m_bucket(m: int) -> int:
    for b in (1, 8, 16, 32, 64, 128):
        if m <= b:
            return b
    return 0  # large M: prefill


def config_key(kind: str, n: int, k: int, m: int) -> str:
    return f"{kind}:{n}:{k}:{m_bucket(m)}"


def heuristic_config(kind: str, m: int, n: int, k: int) -> GemmConfig:
    """Shapes the H200 sweep did not cover: fill the SMs with ~2 programs each (n-tiles x split-K).

    Prefill (M > 128) is not a tuned target: it uses the most tested config family (swapped
    operands, no split), which is correct at any M but not fast.
    """
    bn = 128 if kind == "swiglu" else 64
    if m > 128:
        return GemmConfig(bn=bn, split_k=1, swap=True, prequant=True)
    n_eff = n // 2 if kind == "swiglu" else n
    split = _splits(cdiv(n_eff, bn) * cdiv(m, 64), cdiv(k, BS_BLOCK))[0]
    # the sweep found a separate quantize launch faster than prologue quantization for most linears
    return GemmConfig(bn=bn, split_k=split, swap=True, prequant=True)


_OVERRIDE: dict[str, GemmConfig] = {}


def get_config(kind: str, m: int, n: int, k: int) -> GemmConfig:
    key = config_key(kind, n, k, m)
    if key in _OVERRIDE:
        return _OVERRIDE[key]
    t = _tuned().get(key)
    return GemmConfig(**t) if t else heuristic_config(kind, m, n, k)


def set_config(kind: str, m: int, n: int, k: int, cfg: GemmConfig | None) -> None:
    """Pin a config (the benchmark's sweep uses this); None removes the pin."""
    key = config_key(kind, n, k, m)
    if cfg is None:
        _OVERRIDE.pop(key, None)
    else:
        _OVERRIDE[key] = cfg


def pin_table(table: dict[str, dict[str, Any]] | None) -> None:
    """Pin every entry of a tuned table (``tuned_h200.json``'s format, e.g. a fresh sweep's) over the
    shipped one, after dropping every pin; None only drops them. Lets one process time the decode
    step on two tables side by side (``benchmarks/inference_h200/decode_levers.py``, ``table@FILE``)."""
    _OVERRIDE.clear()
    for key, raw in (table or {}).items():
        kind, n, k, mb = key.split(":")
        cfg = GemmConfig(**_config_fields(raw))
        check_config("swiglu" if kind == "swiglu" else "linear", cfg, "bsgemm_fp8")
        set_config(kind, int(mb), int(n), int(k), cfg)


def config_dict(cfg: GemmConfig) -> dict[str, Any]:
    return asdict(cfg)


# ----------------------------------------------------------------------------------------------
# workspaces and descriptors

_DESC: dict[tuple[int, int, int, int, int], Any] = {}


def tma_ok(qw: QuantizedWeight) -> bool:
    """TMA needs a 16-byte aligned base and row stride (FP8: K % 16 == 0)."""
    w = qw.qweight
    return w.data_ptr() % 16 == 0 and w.stride(0) % 16 == 0 and w.stride(1) == 1


def _weight_desc(qw: QuantizedWeight, bn: int, bk: int) -> Any:
    """Host-side TMA descriptor of ``qw.qweight`` with a [bn, bk] box, cached per weight and box."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    w = qw.qweight
    key = (w.data_ptr(), w.shape[0], w.shape[1], bn, bk)
    d = _DESC.get(key)
    if d is None:
        d = _DESC[key] = TensorDescriptor.from_tensor(w, [bn, bk])
    return d


def launch_opts() -> dict[str, Any]:
    """Extra launch keywords of every decode kernel (PDL on the GPU, nothing in the interpreter)."""
    return {"launch_pdl": True} if PDL else {}


def _prefetch_blocks(dev: torch.device, qw: QuantizedWeight, per: int, programs: int,
                     block_bytes: int, mode: str | int | None = None) -> int:
    """The launch's ``PREFETCH`` (K blocks per program asked of L2 before it waits): ``mode`` (default:
    the ``TTSFLEET_GEMM_PREFETCH`` switch; the one-launch kernels' waiting items pass ``auto``) through
    :func:`.decode.prefetch_blocks`, 0 without PDL (the interpreter) or where rows are not 16-byte
    aligned (the bulk prefetch needs it, as TMA does)."""
    from .decode import gemm_prefetch, l2_bytes, prefetch_blocks

    mode = gemm_prefetch() if mode is None else mode
    if mode == "off" or not PDL or dev.type != "cuda" or not tma_ok(qw) or qw.shape[1] % 16:
        return 0
    return prefetch_blocks(mode, per, programs, block_bytes, l2_bytes(dev.index or 0))


def _scheme_params(qw: QuantizedWeight) -> tuple[bool, int, int, int]:
    """(mx, act group, weight row group, weight k group)."""
    if qw.scheme == "mxfp8":
        return True, MX_BLOCK, 1, MX_BLOCK
    return False, BS_BLOCK, BS_BLOCK, BS_BLOCK


def launch_gemm(a: torch.Tensor, a_scale: torch.Tensor | None, qw: QuantizedWeight, out: torch.Tensor,
                bias: torch.Tensor | None, cfg: GemmConfig, epi: int = 0,
                h_scale: torch.Tensor | None = None) -> None:
    """Launch one GEMM. ``a`` is FP8 codes (with ``a_scale``) or a float tensor (prologue quant)."""
    m, k = a.shape
    n = qw.shape[0]
    mx, a_grp, w_row_group, w_k_group = _scheme_params(qw)
    check_config("swiglu" if epi == 1 else "linear", cfg, qw.scheme)
    a_fp8 = a.dtype == torch.float8_e4m3fn
    if cfg.a16 and (a_fp8 or out.dtype != torch.bfloat16):
        raise ValueError("an a16 GEMM takes float activations and writes bf16")
    bk = min(a_grp, w_k_group)
    f = n // 2 if epi == 1 else n
    bm = cfg.block_m(m)
    bn = cfg.bn
    grid = (triton.cdiv(f, bn), triton.cdiv(m, bm), cfg.split_k)
    nslot = 2 if epi == 1 else 1
    tiles = grid[0] * grid[1]
    if cfg.split_k > 1:
        part, tickets = workspace(a.device, tiles * cfg.split_k * nslot * bm * bn, tiles)
    else:
        part = tickets = out  # unused
    use_tma = cfg.tma and tma_ok(qw)
    per = cdiv(cdiv(k, bk), cfg.split_k)
    prefetch = _prefetch_blocks(a.device, qw, per, tiles * cfg.split_k, bn * bk * nslot)
    sc = a_scale if a_scale is not None else a
    hs = h_scale if h_scale is not None else out
    sc_st = (sc.stride(0), sc.stride(1)) if sc.dim() == 2 else (0, 0)
    hs_st = (hs.stride(0), hs.stride(1)) if hs.dim() == 2 else (0, 0)
    fp8_gemm_kernel[grid](
        a, sc, qw.qweight, _weight_desc(qw, bn, bk) if use_tma else None, qw.scale, out,
        bias if bias is not None else out, part, tickets, hs,
        m, n, k, f,
        a.stride(0), a.stride(1), *sc_st,
        qw.qweight.stride(0), qw.qweight.stride(1), qw.scale.stride(0), qw.scale.stride(1),
        out.stride(0), out.stride(1), *hs_st,
        BM=bm, BN=bn, BK=bk, SPLIT_K=cfg.split_k, PER=per, A_GROUP=a_grp,
        W_ROW_GROUP=w_row_group, W_K_GROUP=w_k_group, MX=mx, A_FP8=a_fp8, EPI=epi,
        HAS_BIAS=bias is not None, SWAP=cfg.swap, H_GROUP=a_grp if epi == 1 else 1, W_TMA=use_tma,
        EXACT_CVT=INTERPRETING, USE_PDL=PDL, PREFETCH=prefetch, A16=cfg.a16, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **launch_opts(),
    )


def rows_2d(x: torch.Tensor) -> torch.Tensor:
    """``x`` as ``[rows, K]`` with unit stride along K (what the kernels' pointer math assumes)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(1) == 1 else x2.contiguous()


def linear_fp8_triton(x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``linear_fp8`` on sm_90: one launch (prologue quantization) or two (``prequant`` configs)."""
    x2 = rows_2d(x)
    k = x2.shape[1]
    m, n = x2.shape[0], qw.shape[0]
    out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    cfg = get_config("linear", m, n, k)
    if cfg.prequant:
        from .triton_quant import quantize_activation_triton

        xq, xs = quantize_activation_triton(x2, act_group(qw.scheme))
        launch_gemm(xq, xs, qw, out, bias, cfg)
    else:
        launch_gemm(x2, None, qw, out, bias, cfg)
    return out.view(*x.shape[:-1], n)


def linear_fp8_codes_triton(xq: torch.Tensor, xs: torch.Tensor, qw: QuantizedWeight,
                            out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """GEMM on activations already quantized (by a fused norm or attention epilogue): one launch."""
    k = xq.shape[-1]
    xq2, xs2 = xq.reshape(-1, k), xs.reshape(-1, xs.shape[-1])
    m, n = xq2.shape[0], qw.shape[0]
    out = torch.empty(m, n, device=xq.device, dtype=out_dtype)
    launch_gemm(xq2, xs2, qw, out, bias, get_config("linear", m, n, k))
    return out.view(*xq.shape[:-1], n)


def a16_config_space(m: int, n: int, k: int, kind: str = "linear") -> list[GemmConfig]:
    """The W8A16 launch configs a benchmark times for one shape (a prototype's space, issue #26):
    64- or 128-row weight tiles (SwiGLU: 128, as the FP8 space), the first split-K factor that fills
    the SMs, 4 warps (and 8 for M >= 32, as the FP8 space), 4 stages (SwiGLU: 3, two weight tiles a
    step; a bf16 activation tile is twice an FP8 one). The first is the prototype's default."""
    out: list[GemmConfig] = []
    n_eff = n // 2 if kind == "swiglu" else n
    for bn in (128,) if kind == "swiglu" else (64, 128):
        split = _splits(cdiv(n_eff, bn) * cdiv(m, 64), cdiv(k, BS_BLOCK))[0]
        for warps in ((4, 8) if m >= 32 else (4,)):
            # TMA only where every weight box lies inside the tensor (S2 Pro's shapes): the FP8 path's
            # TMA configs never ran on a GPU at a tiny model's K = 64 either (its heuristic has none)
            tma = k % BS_BLOCK == 0 and n_eff % bn == 0
            cfg = GemmConfig(bn=bn, split_k=split, swap=True, prequant=False, num_warps=warps,
                             num_stages=3 if kind == "swiglu" else 4, tma=tma, a16=True)
            check_config(kind, cfg, "bsgemm_fp8")
            out.append(cfg)
    return out


@cache
def a16_default_config(m: int, n: int, k: int, kind: str = "linear") -> GemmConfig:
    """The prototype's launch config for one shape (the first of :func:`a16_config_space`), decided
    once per shape: the decode step calls it per linear."""
    return a16_config_space(m, n, k, kind)[0]


def linear_w8a16_triton(x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None = None,
                        cfg: GemmConfig | None = None) -> torch.Tensor:
    """``x @ dequant(qw).T`` with ``x`` kept in bf16 (no activation quantization): one launch. The
    prototype of issue #26's decode GEMM without the per-block rescale; its numerics are W8A16's
    (:func:`.reference.linear_w8a16_ref`), not the block-scaled FP8 contract's."""
    x2 = rows_2d(x)
    k = x2.shape[1]
    m, n = x2.shape[0], qw.shape[0]
    out = torch.empty(m, n, device=x.device, dtype=torch.bfloat16)
    launch_gemm(x2, None, qw, out, bias, cfg or a16_default_config(m, n, k))
    return out.view(*x.shape[:-1], n)


def swiglu_w8a16_triton(x: torch.Tensor, gate_up: QuantizedWeight,
                        cfg: GemmConfig | None = None) -> torch.Tensor:
    """``silu(x @ gate.T) * (x @ up.T)`` (``gate_up`` = gate rows then up rows) with ``x`` kept in bf16:
    one launch, bf16 ``[..., F]`` out for :func:`linear_w8a16_triton`'s down projection. The W8A16
    prototype's MLP half (:func:`.reference.swiglu_w8a16_ref`)."""
    x2 = rows_2d(x)
    k = x2.shape[1]
    m, f = x2.shape[0], gate_up.shape[0] // 2
    out = torch.empty(m, f, device=x.device, dtype=torch.bfloat16)
    launch_gemm(x2, None, gate_up, out, None, cfg or a16_default_config(m, 2 * f, k, "swiglu"), epi=1)
    return out.view(*x.shape[:-1], f)
