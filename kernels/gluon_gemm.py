"""Prototype (issue #26): the FP8 block-scaled decode GEMM in Triton's Gluon for sm_90a (H100/H200).

Status: **compiled for sm_90a without a GPU, never run on one**. Its first run is
``benchmarks/inference_h200/gemm_proto.py`` (correctness against the torch reference and against
:func:`.triton_gemm.linear_fp8_codes_triton`, then timing beside cuBLAS). ``bsgemm_fp8`` only, plain
linear epilogue only (no bias, no SwiGLU); :func:`gluon_linear_fp8_codes` has the contract of
``linear_fp8_codes_triton``.

Why Gluon: at decode M (1..64 tokens) the GEMM is a weight stream, and the per-128-K-block rescale
of the block-scaled contract (``acc += dot(w_blk, x_blk) * (sw * sx)``) forces Triton's ``tl``
pipeliner to wait for every block's tensor-core result before it issues the next one. Gluon exposes
the pieces (TMA, mbarriers, async ``wgmma``, ``wgmma.wait_group N``) so the kernel can keep both the
weight stream and the tensor cores busy while the CUDA cores rescale.

What the kernel does (``_bsgemm_kernel``)
------------------------------------------
* **Swap-AB**: the weight tile is wgmma's M side (``BN`` = 64 or 128 weight rows, K-major in shared
  memory, as FP8 wgmma requires), the tokens are its N side (``BM`` = 8..64, the activation tile
  K-major, read through a transposed shared-memory view). ``out[m, n] = sum_k x[m, k] * w[n, k]``
  is computed as ``acc[n, m]`` and stored transposed.
* **Work units and stream-K**: a unit is one 128-wide K block of one output tile (``BN x 128`` FP8
  weight bytes). The ``T * KB`` units (tile-major) are cut into ``P`` contiguous equal ranges, one
  per CTA (``P`` = the grid, a launch argument: one or two CTAs per SM). Every SM streams the same
  number of weight bytes (+-1 unit) whatever N is, so N = 2560 (20 tiles of 128 rows) fills 132 SMs
  as well as N = 19456 does; when ``T * KB`` is a multiple of ``P`` at tile boundaries this is
  exactly split-K. A CTA crosses tile boundaries inside its range without draining its pipeline.
* **Pipeline**: a ring of ``STAGES`` shared-memory buffers (weight + activation tile each) filled by
  TMA (``mbarrier.expect`` of the transaction bytes, one barrier per stage). Per unit ``i``: wait for
  its stage, issue ``wgmma`` into a *fresh* block accumulator (``use_acc=False``) asynchronously,
  ``wgmma_wait(1)`` retires unit ``i-1``'s MMA while unit ``i``'s runs, the freed stage is refilled
  with unit ``i-1+STAGES`` at once, then unit ``i-1``'s block result is scaled by
  ``w_scale[n_blk, k_blk] * x_scale[m, k_blk]`` and added into the float32 main accumulator (two
  accumulators: the block one on the tensor cores, the main one on the CUDA cores; FP8 wgmma
  accumulates in reduced precision, so promoting every 128-K block to float32 is also what keeps
  the numerics of the reference, as DeepGEMM does). The scales of unit ``i`` are loaded one unit
  ahead (plain loads; they are small and L2-resident). The loop is unrolled by two with two block
  accumulators alternating: with one loop-carried async accumulator the compiler copies it at the
  back-edge while its MMA is in flight and ptxas answers by serialising the wgmmas ("C7517
  warpgroup.wait is injected", seen on the first version); :func:`compile_config` fails on that
  diagnostic, so the overlap is checked, not assumed.
* **Fix-up without a second launch** (as :mod:`.triton_gemm`): a tile finished by one CTA is written
  directly; otherwise each contributing CTA stores its float32 partial into its own slot of a
  workspace, takes a ticket (``atomic_add``, acq_rel, gpu scope), and the last one sums the slots in
  slot order and writes the bf16 output and resets the ticket to 0 -- so the launch needs no memset
  and stays CUDA-graph replayable. Slots rather than float32 atomics into one buffer: the result is
  then bitwise the same run to run (the Triton kernel's property, which the device script checks),
  and nothing has to be zeroed. Which CTAs share a tile follows from the partition formula
  (``cta_of(u) = ((u + 1) * P - 1) // U``), so no counts are stored.
* **PDL** (programmatic dependent launch): the weight TMA loads of the first ``STAGES`` units are
  issued *before* ``griddepcontrol.wait`` (weights do not depend on the previous kernel -- a
  weight written by the kernel launched just before would be read stale), the activation loads,
  scale loads and workspace accesses after it; ``launch_dependents`` follows the wait, as in the
  Triton kernels.

Measured here (no GPU; ``python -m ttsfleet.kernels.gluon_gemm``): every config compiles for sm_90a
with triton 3.6.0 and 3.7.1, FP8 ``wgmma.mma_async ... e4m3.e4m3`` with ``wgmma.wait_group 1``,
TMA bulk copies, ``griddepcontrol.wait``, no spills, no ptxas wgmma serialisation; 76-239 registers
per thread (3.6.0) and 140-164 KB of shared memory per CTA (one CTA per SM) for the table's configs.

What is not done
----------------
* Warp specialisation (a 1-warp TMA producer partition, ``gl.warp_specialize``, with empty/ready
  barrier pairs): not built. What it would buy here is small: a stage is freed by the consumer's
  ``wgmma_wait`` in either design, so a producer warp could refill it no earlier; the single
  partition issues the refill right after that wait, and at decode M the CUDA-core work per unit
  (8-32 FMAs per thread) is far below the ~0.25-0.5 us one SM needs to stream a unit at its share
  of HBM bandwidth, so ``STAGES - 2`` to ``STAGES - 1`` units (~100 KB) stay in flight per SM. If
  the device run shows the stream stalling (well below the copy bandwidth at M = 1 on gate_up),
  that is the next step.
* Bias, the SwiGLU epilogue (gate and up rows in one tile, ``silu(g) * u`` quantized to 1x128 codes),
  mxfp8, prologue quantization of bf16 activations. M > 64 takes 64-token tiles (a second tile row
  of units; modelled by the tests, never run).
* Tuning: the config table (:data:`CONFIGS`) is a first guess from arithmetic (bytes in flight per
  SM, registers per thread), not a sweep; the device script times a few variants beside it.
* Not wired into ``ops`` / ``dispatch``: that waits for the device run's numbers.

The module imports where Gluon is missing (``available()`` says why); kernels are then undefined.
``python -m ttsfleet.kernels.gluon_gemm`` compiles every config of the table and of the device
script's variants for sm_90a without a GPU (in a process without ``TRITON_INTERPRET``; the tests
run it so).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from typing import Any

BK = 128  # the contract's K block: 128x128 weight scales, 1x128 activation groups
#: S2 Pro decode GEMMs (N, K): qkv (32 + 2 * 8 heads of 128), o (32 heads of 128 -> 2560),
#: gate_up (2 x 9728, one fused GEMM), down.
S2_SHAPES: dict[str, tuple[int, int]] = {
    "qkv": (6144, 2560),
    "o": (2560, 4096),
    "gate_up": (19456, 2560),
    "down": (2560, 9728),
}
M_BUCKETS = (1, 8, 16, 32, 64)
H200_SMS = 132
SMEM_LIMIT = 227 * 1024  # opt-in dynamic shared memory per block on sm_90

_IMPORT_ERROR: str | None = None
try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    # a CTA-wide barrier: ``thread_barrier`` in triton 3.6, ``barrier`` from 3.7 on
    _cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
except Exception as exc:  # no triton, or a triton without Gluon / its Hopper module
    _IMPORT_ERROR = f"{type(exc).__name__}: {exc}"


def available() -> tuple[bool, str]:
    """(usable, why not): Gluon importable and a CUDA device of compute capability 9.x present."""
    if _IMPORT_ERROR is not None:
        return False, f"triton.experimental.gluon (Hopper) does not import: {_IMPORT_ERROR}"
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    cc = torch.cuda.get_device_capability()
    if cc[0] != 9:
        return False, f"needs sm_90 (wgmma + TMA), this device is sm_{cc[0]}{cc[1]}"
    return True, ""


# ------------------------------------------------------------------------------------------------
# configuration


@dataclass(frozen=True)
class GluonConfig:
    """Compile-time tile shape and pipeline depth, and the launch's CTAs per SM.

    ``bn``: weight rows per tile (wgmma M: 64 or 128); ``bm``: token columns per tile (wgmma N:
    8..64, the padded M); ``stages``: TMA ring depth; ``warps``: 4 (one warpgroup) or 8 (two, each
    owning 64 weight rows: halves the accumulator registers per thread); ``ctas_per_sm``: the grid
    is ``ctas_per_sm * SMs`` CTAs (at most the number of units).
    """

    bn: int = 128
    bm: int = 8
    stages: int = 8
    warps: int = 4
    ctas_per_sm: int = 1

    def smem_bytes(self) -> int:
        """Pipeline ring + barriers + a float32 tile for the epilogue's layout conversion (bound)."""
        return self.stages * (self.bn + self.bm) * BK + self.stages * 8 + self.bn * self.bm * 4

    def regs_per_thread_acc(self) -> int:
        """float32 accumulator registers per thread: main + the block retiring + the block in flight."""
        return 3 * self.bn * self.bm // (self.warps * 32)


def check_config(cfg: GluonConfig) -> None:
    """ValueError for a config the kernel cannot run (wgmma / TMA / shared-memory limits)."""
    bad = []
    if cfg.bn not in (64, 128):
        bad.append(f"bn {cfg.bn} not in (64, 128)")
    if cfg.bm not in (8, 16, 32, 64):
        bad.append(f"bm {cfg.bm} not in (8, 16, 32, 64)")
    if cfg.warps not in (4, 8) or cfg.warps * 16 > cfg.bn:
        bad.append(f"warps {cfg.warps}: 4, or 8 with bn 128 (each warp owns 16 weight rows of wgmma's M)")
    if not 2 <= cfg.stages <= 12:
        bad.append(f"stages {cfg.stages} not in 2..12")
    if cfg.ctas_per_sm not in (1, 2):
        bad.append(f"ctas_per_sm {cfg.ctas_per_sm} not in (1, 2)")
    if cfg.smem_bytes() * cfg.ctas_per_sm > SMEM_LIMIT:
        bad.append(f"{cfg.ctas_per_sm} x {cfg.smem_bytes()} B shared memory > {SMEM_LIMIT} B per SM")
    if cfg.regs_per_thread_acc() > 160:
        bad.append(f"{cfg.regs_per_thread_acc()} accumulator registers per thread (> 160: spills)")
    if bad:
        raise ValueError(f"invalid Gluon GEMM config {cfg}: " + "; ".join(bad))


def m_bucket(m: int) -> int:
    """The decode M bucket of ``m`` (64 for anything larger: 64-token tiles)."""
    for b in M_BUCKETS:
        if m <= b:
            return b
    return 64


def _bm(bucket: int) -> int:
    return max(8, bucket)


def _default_config(bucket: int) -> GluonConfig:
    """96-128 KB of weight tiles in the ring per SM (one CTA each): at 4.3 TB/s / 132 SMs that is
    3-4 us of stream per SM, several times the loaded DRAM latency, within 227 KB of shared memory
    with the activation tiles. 8 warps at 64 tokens so the three 128 x 64 float32 accumulators
    take 32 registers each per thread instead of 64."""
    bm = _bm(bucket)
    stages = {8: 8, 16: 8, 32: 7, 64: 6}[bm]
    return GluonConfig(bn=128, bm=bm, stages=stages, warps=8 if bm == 64 else 4, ctas_per_sm=1)


#: The explicit table: (N, K, M bucket) -> config, every S2 Pro decode shape and bucket. All shapes
#: take the same per-bucket config for now (the stream-K partition already balances any N); the
#: device run's numbers are what would make entries differ.
CONFIGS: dict[tuple[int, int, int], GluonConfig] = {
    (n, k, b): _default_config(b) for (n, k) in S2_SHAPES.values() for b in M_BUCKETS
}
for _cfg in set(CONFIGS.values()):
    check_config(_cfg)


def variants(m: int) -> dict[str, tuple[GluonConfig | None, bool]]:
    """The device script's Gluon variants for M (name -> (config or None for the table's, PDL)), in
    the order it runs them: the table; no PDL (no weight prefetch before the previous kernel
    ends); two CTAs per SM with half the stages (M <= 32: at 64 tokens the 8-warp CTA's registers
    allow one per SM); 64-row weight tiles (M >= 32: half the fix-up partial per tile)."""
    base = _default_config(m_bucket(m))
    out: dict[str, tuple[GluonConfig | None, bool]] = {"gluon": (None, True), "g_nopdl": (None, False)}
    if base.bm <= 32:
        out["g_occ2"] = (GluonConfig(bn=base.bn, bm=base.bm, stages=base.stages // 2, warps=base.warps,
                                     ctas_per_sm=2), True)
    if base.bm >= 32:
        out["g_bn64"] = (GluonConfig(bn=64, bm=base.bm, stages=base.stages + 2, warps=4), True)
    for cfg, _ in out.values():
        if cfg is not None:
            check_config(cfg)
    return out


def get_config(n: int, k: int, m: int) -> GluonConfig:
    """The table's entry, or the bucket's default config for shapes outside the table."""
    b = m_bucket(m)
    return CONFIGS.get((n, k, b)) or _default_config(b)


def grid_size(cfg: GluonConfig, n: int, k: int, m: int, sms: int = H200_SMS) -> int:
    """CTAs launched: ``ctas_per_sm * sms``, at most one per work unit."""
    units = math.ceil(n / cfg.bn) * math.ceil(m / cfg.bm) * math.ceil(k / BK)
    return max(1, min(cfg.ctas_per_sm * sms, units))


@cache
def partition(cfg: GluonConfig, n: int, k: int, m: int, ctas: int) -> tuple[int, int, int]:
    """(tiles, units, max CTAs sharing one tile) of the stream-K split -- the kernel's own formulas,
    in Python, so the host sizes the workspace and the tests can check the arithmetic."""
    kb = math.ceil(k / BK)
    tiles = math.ceil(n / cfg.bn) * math.ceil(m / cfg.bm)
    units = tiles * kb
    if units * (ctas + 1) >= 2**31:
        raise ValueError(f"{units} units x {ctas} CTAs overflows the kernel's int32 partition arithmetic")

    def cta_of(u: int) -> int:
        return ((u + 1) * ctas - 1) // units

    most = max(cta_of(t * kb + kb - 1) - cta_of(t * kb) + 1 for t in range(tiles))
    return tiles, units, most


# ------------------------------------------------------------------------------------------------
# kernel

if _IMPORT_ERROR is None:
    # The state the helpers share travels in three tuples (Gluon functions are inlined):
    #   geo  = (M, N, KB, NT, U, P, pid, MAXC): sizes, the stream-K partition, this CTA, slots per tile
    #   ptrs = (ws_ptr, xs_ptr, out_ptr, part_ptr, ticket_ptr)
    #   st   = (s_wsn, s_wsk, s_xsm, s_xsk, s_om, s_on): element strides

    @gluon.jit
    def _gdc_wait():
        """``griddepcontrol.wait``: the previous kernel's memory is visible after it (a no-op
        without PDL). Inline asm: Gluon 3.6 has no builtin for it."""
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)

    @gluon.jit
    def _gdc_launch_dependents():
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)

    @gluon.jit
    def _unit_scale(u, geo, ptrs, st, BN: gl.constexpr, BM: gl.constexpr, layout: gl.constexpr):
        """``w_scale[n_blk, k_blk] * x_scale[tokens, k_blk]`` of unit ``u`` (tokens past M: 0)."""
        M = geo[0]
        KB = geo[2]
        NT = geo[3]
        t = u // KB
        kb = u - t * KB
        sw = gl.load(ptrs[0] + (((t % NT) * BN) // 128) * st[0] + kb * st[1])
        offs_m = (t // NT) * BM + gl.arange(0, BM, layout=layout)
        sx = gl.load(ptrs[1] + offs_m * st[2] + kb * st[3], mask=offs_m < M, other=0.0)
        return sx * sw

    @gluon.jit
    def _issue(w_desc, x_desc, u, geo, bar, w_buf, x_buf, pred, BN: gl.constexpr, BM: gl.constexpr):
        """TMA of unit ``u``'s weight tile [BN, BK] and activation tile [BM, BK] onto ``bar``."""
        BK_: gl.constexpr = w_desc.block_type.shape[1]
        KB = geo[2]
        NT = geo[3]
        t = u // KB
        k0 = (u - t * KB) * BK_
        tma.async_copy_global_to_shared(w_desc, [(t % NT) * BN, k0], bar, w_buf, pred)
        tma.async_copy_global_to_shared(x_desc, [(t // NT) * BM, k0], bar, x_buf, pred)

    @gluon.jit
    def _issue_w(w_desc, u, geo, bar, w_buf, pred, BN: gl.constexpr):
        BK_: gl.constexpr = w_desc.block_type.shape[1]
        t = u // geo[2]
        k0 = (u - t * geo[2]) * BK_
        tma.async_copy_global_to_shared(w_desc, [(t % geo[3]) * BN, k0], bar, w_buf, pred)

    @gluon.jit
    def _issue_x(x_desc, u, geo, bar, x_buf, pred, BM: gl.constexpr):
        BK_: gl.constexpr = x_desc.block_type.shape[1]
        t = u // geo[2]
        k0 = (u - t * geo[2]) * BK_
        tma.async_copy_global_to_shared(x_desc, [(t // geo[3]) * BM, k0], bar, x_buf, pred)

    @gluon.jit
    def _store_out(v, tn, tm, geo, ptrs, st, BN: gl.constexpr, BM: gl.constexpr, epi: gl.constexpr):
        """``out[m, n] = v[n, m]`` for the tile's rows and tokens inside [M, N], cast to out's dtype."""
        out_ptr = ptrs[2]
        offs_n = tn * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, epi))
        offs_m = tm * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, epi))
        o_ptrs = out_ptr + gl.expand_dims(offs_m, 0) * st[4] + gl.expand_dims(offs_n, 1) * st[5]
        mask = gl.expand_dims(offs_n < geo[1], 1) & gl.expand_dims(offs_m < geo[0], 0)
        gl.store(o_ptrs, v.to(out_ptr.dtype.element_ty), mask=mask)

    @gluon.jit
    def _flush(acc, t, geo, ptrs, st, BN: gl.constexpr, BM: gl.constexpr, epi: gl.constexpr):
        """Tile ``t``'s partial from this CTA: write it (sole contributor) or take part in the fix-up."""
        KB = geo[2]
        NT = geo[3]
        U = geo[4]
        P = geo[5]
        part_ptr = ptrs[3]
        ticket_ptr = ptrs[4]
        c_first = ((t * KB + 1) * P - 1) // U  # cta_of(first unit of t)
        c_last = ((t * KB + KB) * P - 1) // U  # cta_of(last unit of t)
        n_c = c_last - c_first + 1
        v = gl.convert_layout(acc, epi)
        if n_c == 1:
            _store_out(v, t % NT, t // NT, geo, ptrs, st, BN, BM, epi)
        else:
            ln = gl.arange(0, BN, layout=gl.SliceLayout(1, epi))
            lm = gl.arange(0, BM, layout=gl.SliceLayout(0, epi))
            loc = gl.expand_dims(ln, 1) + gl.expand_dims(lm, 0) * BN
            tile_base = part_ptr + (t * geo[7]) * (BN * BM)
            gl.store(tile_base + (geo[6] - c_first) * (BN * BM) + loc, v)
            _cta_barrier()  # every warp's partial is written before the ticket is taken
            ticket = gl.atomic_add(ticket_ptr + t, 1, sem="acq_rel", scope="gpu")
            if ticket == n_c - 1:
                # the last contributor: sum the slots in slot order (own included), so the
                # result does not depend on which CTA finished last
                tot = gl.zeros([BN, BM], gl.float32, epi)
                for j in range(n_c):
                    tot += gl.load(tile_base + j * (BN * BM) + loc, cache_modifier=".cg")
                gl.store(ticket_ptr + t, 0)
                _store_out(tot, t % NT, t // NT, geo, ptrs, st, BN, BM, epi)

    @gluon.jit
    def _retire(acc, res, f, done, u1, geo, ptrs, st, BN: gl.constexpr, BM: gl.constexpr,
                acc_l: gl.constexpr, epi: gl.constexpr):
        """Rescale unit ``done``'s block result into the main accumulator; flush it when the unit
        closes its tile or is this CTA's last."""
        acc = acc + res * gl.expand_dims(f, 0)
        if (done % geo[2] == geo[2] - 1) or (done == u1 - 1):
            _flush(acc, done // geo[2], geo, ptrs, st, BN, BM, epi)
            acc = gl.zeros([BN, BM], gl.float32, acc_l)
        return acc

    @gluon.jit
    def _step(u, u0, u1, pending, f_prev, acc, zero, ring, geo, ptrs, st, BN: gl.constexpr, BM: gl.constexpr,
              STAGES: gl.constexpr, acc_l: gl.constexpr, tok_l: gl.constexpr, epi: gl.constexpr):
        """Unit ``u`` (u > u0): issue its MMA into a fresh block accumulator, retire unit u-1's
        (``pending``) while it runs, refill u-1's stage with unit u-1+STAGES, rescale-add u-1.
        Returns (u's pending MMA, u's scales, the main accumulator)."""
        w_bufs, x_bufs, ready, w_desc, x_desc = ring
        TX_BYTES: gl.constexpr = (BN + BM) * w_desc.block_type.shape[1]  # FP8: one byte per element
        i = u - u0
        s = i % STAGES
        f_cur = _unit_scale(u, geo, ptrs, st, BN, BM, tok_l)
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        nxt = warpgroup_mma(w_bufs.index(s), x_bufs.index(s).permute((1, 0)), zero, use_acc=False,
                            is_async=True)
        res = warpgroup_mma_wait(1, deps=(pending,))
        ps = (i - 1) % STAGES
        ru = u - 1 + STAGES
        live = ru < u1
        mbarrier.expect(ready.index(ps), TX_BYTES, live)
        _issue(w_desc, x_desc, ru, geo, ready.index(ps), w_bufs.index(ps), x_bufs.index(ps), live, BN, BM)
        acc = _retire(acc, res, f_prev, u - 1, u1, geo, ptrs, st, BN, BM, acc_l, epi)
        return nxt, f_cur, acc

    @gluon.jit(do_not_specialize=["M", "MAXC"])  # one compile per config for every M of its bucket
    def _bsgemm_kernel(w_desc, x_desc, ws_ptr, xs_ptr, out_ptr, part_ptr, ticket_ptr,
                       M, N, K, MAXC, s_wsn, s_wsk, s_xsm, s_xsk, s_om, s_on,
                       BN: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr, USE_PDL: gl.constexpr):
        """``out[m, n] = sum_k (xq[m, k] * xs[m, k // 128]) * (wq[n, k] * ws[n // 128, k // 128])``;
        see the module docstring. The grid is 1-D: ``P`` CTAs share the ``U`` units evenly."""
        BK_: gl.constexpr = w_desc.block_type.shape[1]
        W: gl.constexpr = gl.num_warps()
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1],
                                                        instr_shape=[16, BM, 32])
        tok_l: gl.constexpr = gl.SliceLayout(0, acc_l)
        epi: gl.constexpr = gl.BlockedLayout([BN // 32, 1], [32, 1], [1, W], [0, 1])
        TX_BYTES: gl.constexpr = (BN + BM) * BK_

        pid = gl.program_id(0)
        P = gl.num_programs(0)
        KB = gl.cdiv(K, BK_)
        NT = gl.cdiv(N, BN)
        U = NT * gl.cdiv(M, BM) * KB
        u0 = pid * U // P
        u1 = (pid + 1) * U // P
        geo = (M, N, KB, NT, U, P, pid, MAXC)
        ptrs = (ws_ptr, xs_ptr, out_ptr, part_ptr, ticket_ptr)
        st = (s_wsn, s_wsk, s_xsm, s_xsk, s_om, s_on)

        w_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, BK_], w_desc.layout)
        x_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BM, BK_], x_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for b in gl.static_range(STAGES):
            mbarrier.init(ready.index(b), count=1)
        fence_async_shared()
        ring = (w_bufs, x_bufs, ready, w_desc, x_desc)

        # prologue: the weight tiles of the first STAGES units go out before the PDL wait (weights
        # do not depend on the previous kernel); activations after it
        for b in gl.static_range(STAGES):
            live = u0 + b < u1
            mbarrier.expect(ready.index(b), TX_BYTES, live)
            _issue_w(w_desc, u0 + b, geo, ready.index(b), w_bufs.index(b), live, BN)
        if USE_PDL:
            _gdc_wait()
            _gdc_launch_dependents()
        for b in gl.static_range(STAGES):
            _issue_x(x_desc, u0 + b, geo, ready.index(b), x_bufs.index(b), u0 + b < u1, BM)

        zero = gl.zeros([BN, BM], gl.float32, acc_l)
        acc = gl.zeros([BN, BM], gl.float32, acc_l)
        # Two block accumulators, unrolled by two (pa / pb): a single loop-carried async accumulator
        # is copied at the back-edge while its MMA is in flight, and ptxas then serialises the
        # wgmmas (C7517 "warpgroup.wait is injected"); alternating two keeps them in place.
        fa = _unit_scale(u0, geo, ptrs, st, BN, BM, tok_l)
        mbarrier.wait(ready.index(0), 0)
        pa = warpgroup_mma(w_bufs.index(0), x_bufs.index(0).permute((1, 0)), zero, use_acc=False,
                           is_async=True)
        rest = u1 - u0 - 1
        for j in range(rest // 2):
            u = u0 + 1 + 2 * j
            pb, fb, acc = _step(u, u0, u1, pa, fa, acc, zero, ring, geo, ptrs, st, BN, BM, STAGES, acc_l,
                                tok_l, epi)
            pa, fa, acc = _step(u + 1, u0, u1, pb, fb, acc, zero, ring, geo, ptrs, st, BN, BM, STAGES, acc_l,
                                tok_l, epi)
        if rest % 2 == 1:
            pb, fb, acc = _step(u1 - 1, u0, u1, pa, fa, acc, zero, ring, geo, ptrs, st, BN, BM, STAGES, acc_l,
                                tok_l, epi)
            rb = warpgroup_mma_wait(0, deps=(pb,))
            acc = _retire(acc, rb, fb, u1 - 1, u1, geo, ptrs, st, BN, BM, acc_l, epi)
        else:
            ra = warpgroup_mma_wait(0, deps=(pa,))
            acc = _retire(acc, ra, fa, u1 - 1, u1, geo, ptrs, st, BN, BM, acc_l, epi)
        for b in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(b))


# ------------------------------------------------------------------------------------------------
# host side


def _kernel_constexprs(cfg: GluonConfig, pdl: bool) -> dict[str, Any]:
    return {"BN": cfg.bn, "BM": cfg.bm, "STAGES": cfg.stages, "USE_PDL": pdl}


def _smem_layout(rows: int) -> Any:
    return gl.NVMMASharedLayout.get_default_for([rows, BK], gl.float8e4nv)


_WDESC: dict[tuple[int, int, int, int, int], Any] = {}


def _weight_desc(w: Any, bn: int) -> Any:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    key = (w.data_ptr(), w.shape[0], w.shape[1], w.stride(0), bn)
    d = _WDESC.get(key)
    if d is None:
        d = _WDESC[key] = TensorDescriptor(w, list(w.shape), list(w.stride()), [bn, BK], _smem_layout(bn))
    return d


@cache
def _sm_count(index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count


def gluon_linear_fp8_codes(xq: Any, xs: Any, qw: Any, out_dtype: Any = None, cfg: GluonConfig | None = None,
                           pdl: bool = True, out: Any = None) -> Any:
    """``linear_fp8_codes_triton``'s contract (no bias): ``xq [..., K]`` e4m3 codes with 1x128 float32
    scales ``xs [..., ceil(K/128)]`` times a ``bsgemm_fp8`` :class:`~.layout.QuantizedWeight` ->
    ``[..., N]`` in ``out_dtype`` (default bf16). ``cfg`` overrides the table (the device script's
    variants); ``pdl`` launches with programmatic dependent launch; ``out`` (``[M, N]``, any
    strides) receives the result (the device script poisons it to catch unwritten elements)."""
    import torch

    ok, why = available()
    if not ok:
        raise RuntimeError(f"the Gluon GEMM cannot run here: {why}")
    out_dtype = out_dtype or torch.bfloat16
    if qw.scheme != "bsgemm_fp8":
        raise ValueError(f"the Gluon GEMM implements bsgemm_fp8 only, got {qw.scheme!r} (the Triton kernel "
                         "covers the rest)")
    if xq.dtype != torch.float8_e4m3fn or xs.dtype != torch.float32:
        raise ValueError(f"activations must be float8_e4m3fn codes with float32 scales, got {xq.dtype} / "
                         f"{xs.dtype}")
    k = xq.shape[-1]
    n = qw.shape[0]
    if qw.shape[1] != k:
        raise ValueError(f"activation K {k} != weight K {qw.shape[1]}")
    if k % 16:
        raise ValueError(f"K={k}: TMA needs 16-byte aligned rows (K % 16 == 0)")
    xq2, xs2 = xq.reshape(-1, k), xs.reshape(-1, xs.shape[-1])
    if xq2.stride(1) != 1 or xq2.stride(0) % 16 or xq2.data_ptr() % 16:
        xq2 = xq2.contiguous()
    w = qw.qweight
    if w.data_ptr() % 16 or w.stride(0) % 16:
        raise ValueError("qweight must be 16-byte aligned with a 16-byte aligned row stride (TMA)")
    m = xq2.shape[0]
    given = out is not None
    if out is None:
        out = torch.empty(m, n, device=xq.device, dtype=out_dtype)
    elif tuple(out.shape) != (m, n):
        raise ValueError(f"out must be [{m}, {n}], got {list(out.shape)}")
    if m == 0:
        return out if given else out.view(*xq.shape[:-1], n)
    cfg = cfg or get_config(n, k, m)
    check_config(cfg)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    ctas = grid_size(cfg, n, k, m, _sm_count(xq.device.index or 0))
    tiles, _, most = partition(cfg, n, k, m, ctas)
    from .workspaces import workspace  # the Triton kernel's buffers: tickets are zero between launches

    part, tickets = workspace(xq.device, tiles * most * cfg.bn * cfg.bm, tiles)
    x_desc = TensorDescriptor(xq2, list(xq2.shape), list(xq2.stride()), [cfg.bm, BK], _smem_layout(cfg.bm))
    _bsgemm_kernel[(ctas,)](
        _weight_desc(w, cfg.bn), x_desc, qw.scale, xs2, out, part, tickets,
        m, n, k, most, qw.scale.stride(0), qw.scale.stride(1), xs2.stride(0), xs2.stride(1),
        out.stride(0), out.stride(1),
        **_kernel_constexprs(cfg, pdl), num_warps=cfg.warps, **({"launch_pdl": True} if pdl else {}),
    )
    return out if given else out.view(*xq.shape[:-1], n)


# ------------------------------------------------------------------------------------------------
# compile check (no GPU)

_PTR_TYPES = {"ws_ptr": "*fp32", "xs_ptr": "*fp32", "out_ptr": "*bf16", "part_ptr": "*fp32",
              "ticket_ptr": "*i32"}


def _desc_type(rows: int) -> str:
    """The JIT's signature string of a host TensorDescriptor of FP8 [rows, 128] boxes."""
    from triton.runtime.jit import mangle_type

    class _Fake:  # what the JIT reads off a torch tensor to type a descriptor's base
        dtype = "float8_e4m3fn"

        def data_ptr(self) -> int:
            return 1024

    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return mangle_type(TensorDescriptor(_Fake(), [4096, 4096], [4096, 1], [rows, BK], _smem_layout(rows)))


@dataclass
class CompileResult:
    cfg: GluonConfig
    ptx: str
    shared: int
    n_regs: int | None
    n_spills: int | None
    problems: list[str]


def compile_config(cfg: GluonConfig, pdl: bool = True, cc: int = 90) -> CompileResult:
    """Compile the kernel for ``cfg`` for sm_{cc}a with no GPU (``triton.compile`` on a Gluon AST
    source, PTX then cubin through the ptxas that ships with triton) and check the PTX: async
    ``wgmma`` on FP8 operands, TMA bulk copies, ``wgmma.wait_group 1`` (the overlap), PDL's
    ``griddepcontrol.wait``, shared memory within the sm_90 limit."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    if _IMPORT_ERROR is not None:
        raise RuntimeError(f"Gluon unavailable: {_IMPORT_ERROR}")
    fn = _bsgemm_kernel
    const = _kernel_constexprs(cfg, pdl)
    types = dict(_PTR_TYPES, w_desc=_desc_type(cfg.bn), x_desc=_desc_type(cfg.bm))
    sig = {a: "constexpr" if a in const else types.get(a, "i32") for a in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if sig[a].startswith("*")}
    src = GluonASTSource(fn, sig, const, attrs)
    opts: dict[str, Any] = {"num_warps": cfg.warps}
    if pdl:
        opts["launch_pdl"] = True
    k = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=opts)
    ptx = k.asm["ptx"]
    shared = int(k.metadata.shared)
    problems = []
    for needle, what in (("wgmma.mma_async", "no wgmma.mma_async"),
                         ("e4m3.e4m3", "the wgmma is not on FP8 e4m3 operands"),
                         ("cp.async.bulk.tensor", "no TMA copies"),
                         ("wgmma.wait_group.sync.aligned 1", "no wgmma.wait_group 1 (MMA/rescale overlap)")):
        if needle not in ptx:
            problems.append(what)
    if pdl and "griddepcontrol.wait" not in ptx:
        problems.append("no griddepcontrol.wait")
    if shared * cfg.ctas_per_sm > SMEM_LIMIT:
        problems.append(f"{cfg.ctas_per_sm} x {shared} B shared memory > {SMEM_LIMIT} B per SM")
    log = _ptxas_log(ptx, cc)
    n_regs = int(m.group(1)) if (m := re.search(r"Used (\d+) registers", log)) else None
    spills = [int(v) for v in re.findall(r"(\d+) bytes spill (?:stores|loads)", log)]
    n_spills = sum(spills) if spills else None
    # ptxas's wgmma diagnostics: a wait it injected (an accumulator touched while its MMA is in
    # flight) or serialised wgmmas both undo the overlap the kernel is for
    problems += [f"ptxas: {ln.strip()}" for ln in log.splitlines()
                 if re.search(r"C75\d\d|serialized|injected", ln)]
    if n_spills:
        problems.append(f"{n_spills} B register spills")
    return CompileResult(cfg, ptx, shared, n_regs, n_spills, problems)


def _ptxas_log(ptx: str, cc: int = 90) -> str:
    """``ptxas -v`` of the PTX for sm_{cc}a with the ptxas that ships with triton: registers, spills,
    and its wgmma pipeline diagnostics, which ``triton.compile`` does not surface."""
    from triton.backends.nvidia.compiler import get_ptxas

    try:
        ptxas = get_ptxas(cc).path
    except TypeError:  # a triton whose get_ptxas takes no arch
        ptxas = get_ptxas().path
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as fh:
            fh.write(ptx)
        proc = subprocess.run([ptxas, f"-arch=sm_{cc}a", "-v", src, "-o", os.path.join(tmp, "k.cubin")],
                              capture_output=True, text=True)
    return proc.stdout + proc.stderr


def table_configs(with_variants: bool = True) -> list[tuple[GluonConfig, bool]]:
    """Every distinct (config, PDL) the table launches, and with ``with_variants`` every one the
    device script's :func:`variants` launch (the table's configs without PDL among them), in a
    stable order."""
    cfgs = {(c, True) for c in CONFIGS.values()}
    if with_variants:
        cfgs |= {(c or _default_config(b), pdl) for b in M_BUCKETS for c, pdl in variants(b).values()}
    return sorted(cfgs, key=lambda c: (c[0].bm, c[0].bn, c[0].stages, c[0].warps, c[0].ctas_per_sm, not c[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ttsfleet.kernels.gluon_gemm",
                                 description="Compile the Gluon FP8 GEMM's configs for sm_90a without a GPU.")
    ap.add_argument("--compile", action="store_true",
                    help="compile every config of the table and the device script's variants (default)")
    ap.add_argument("--bm", type=int, action="append", help="only the configs of these token tiles")
    ap.add_argument("--table-only", action="store_true", help="not the device script's variants")
    ap.add_argument("--no-pdl", action="store_true", help="compile without programmatic dependent launch")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("gluon_gemm: unset TRITON_INTERPRET (the interpreter does not compile)", file=sys.stderr)
        return 2
    if _IMPORT_ERROR is not None:
        print(f"gluon_gemm: UNAVAILABLE {_IMPORT_ERROR}")
        return 3
    import triton

    failed = 0
    cfgs = list(dict.fromkeys((c, p and not args.no_pdl) for c, p in table_configs(not args.table_only)
                              if not args.bm or c.bm in args.bm))
    for cfg, pdl in cfgs:
        try:
            r = compile_config(cfg, pdl=pdl)
        except Exception as exc:  # a compile error is the finding
            lines = [ln for ln in str(exc).splitlines() if ln.strip()]
            msg = " | ".join(lines[:2] + lines[-2:])[:1500]
            print(f"FAIL {cfg} pdl={pdl}: {type(exc).__name__}: {msg}", flush=True)
            failed += 1
            continue
        status = "FAIL" if r.problems else "ok"
        failed += bool(r.problems)
        print(f"{status} {cfg} pdl={pdl}: {r.shared} B shared, regs {r.n_regs}, spills {r.n_spills}"
              + (f": {'; '.join(r.problems)}" if r.problems else ""), flush=True)
    print(f"gluon_gemm: {len(cfgs) - failed} of {len(cfgs)} configs compiled for sm_90a with triton "
          f"{triton.__version__}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
