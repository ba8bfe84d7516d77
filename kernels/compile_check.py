"""Compile every Triton kernel the decode step can launch for sm_90 and sm_120, without a GPU.

Why: Triton's interpreter runs a kernel as Python, so CPU tests accept code the compiler rejects (a
helper with two differently shaped ``return`` statements passed on CPU and failed to compile on the
H200, costing a device call). ``triton.compile`` for a ``cuda:90`` / ``cuda:120`` target needs no
GPU: it runs Triton's passes, LLVM and ``ptxas`` for that arch. This compiles each FP8 GEMM config
the tuner may pick (:func:`triton_gemm.config_space` at the S2 Pro shapes, and the tuned table's
picks) and each decode kernel with its launch options (norms, RoPE + KV store and decode attention
with a dense and an FP8 cache, the activation quantizer, both samplers, the window shift), and
checks what the target is for:

* **sm_90a** (H200): ``wgmma`` tensor-core MMAs in the GEMMs;
* **sm_120a** (RTX 5090 / RTX PRO 6000): no ``wgmma`` (Hopper only: ptxas rejects it on sm_120) and
  no ``tcgen05`` (sm_100 only); the GEMMs must use the warp-level FP8 ``mma.sync ... e4m3.e4m3``;
* both: TMA bulk copies (``cp.async.bulk.tensor``) exactly in the ``tma`` configs (TMA exists from
  sm_90 on, sm_120 included), the programmatic-dependent-launch ``griddepcontrol.wait`` (PTX: sm_90
  and later) in every kernel launched with PDL, and the dynamic shared memory within the arch's
  opt-in limit per block (sm_90: 227 KiB; sm_120: 99 KiB, 100 KiB per SM less the 1 KiB the driver
  reserves; NVIDIA CCCL ``cuda/__device/arch_traits.h``). With ``-v`` each kernel's registers, spills
  (its stack frame: where ptxas puts Triton's spilled registers) and shared memory are reported
  (``cuobjdump --dump-resource-usage``); a spill is reported, not failed (a speed question).

Which GEMM schemes: sm_90 compiles bsgemm (what the catalog runs there); sm_120 compiles mxfp8 (its
catalog scheme) and bsgemm (selectable with ``--quantize bsgemm_fp8``). Must run in a process
without ``TRITON_INTERPRET=1``: ``python -m ttsfleet.kernels.compile_check [--arch 90|120] [-v]``
(exit 1 on any failure, 2 on bad usage; the tests run it so).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .codec_conv_tiles import S2_DECODER_UNIT_ROWS_PER_FRAME

S2_SHAPES = [("swiglu", 19456, 2560), ("down", 2560, 9728), ("linear", 6144, 2560), ("linear", 2560, 4096),
             ("linear", 4096, 2560)]
S2_VOCABS = (4097, 4096)  # the main-token head (semantic codes + end) and a codebook


@dataclass(frozen=True)
class Target:
    """What one arch must show in its compiled kernels."""

    cc: int
    gemm_mma: str  # PTX the FP8 GEMM's tensor-core MMA must contain
    forbidden: tuple[str, ...]  # PTX that must not appear (not this arch's)
    max_shared: int  # dynamic shared memory one block may opt into, bytes
    schemes: tuple[str, ...]  # GEMM schemes compiled for it

    @property
    def name(self) -> str:
        return f"sm_{self.cc}a"


TARGETS = {
    90: Target(90, "wgmma.mma_async", (), 227 * 1024, ("bsgemm_fp8",)),
    120: Target(120, "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", ("wgmma", "tcgen05"), 99 * 1024,
                ("mxfp8", "bsgemm_fp8")),
}


@dataclass
class Compiled:
    ptx: str
    shared: int
    cubin: bytes


Case = Callable[[Target], list[str]]


def _compile(fn: Any, types: dict[str, str], const: dict[str, Any], opts: dict[str, Any],
             target: Target, divisible: tuple[str, ...] = ()) -> Compiled:
    """``divisible``: integer arguments a launch passes as multiples of 16 (Triton specializes them
    so at run time, which decides vectorized loads and software pipelining)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    # a constexpr left out takes its default, as a launch does (typed as a runtime i32 it would
    # compile the branches it guards, e.g. a fused path with its pointers typed as integers)
    const = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}, **const}
    sig = {n: "constexpr" if n in const else types.get(n, "i32") for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n].startswith("*") or n in divisible}
    src = ASTSource(fn, sig, const, attrs)
    k = triton.compile(src, target=GPUTarget("cuda", target.cc, 32), options=opts)
    return Compiled(k.asm["ptx"], int(k.metadata.shared), k.asm["cubin"])


def _common(c: Compiled, target: Target, pdl: bool = True) -> list[str]:
    """The checks every kernel gets: arch-foreign instructions, PDL, shared memory."""
    bad = [f"has {op} (not on {target.name})" for op in target.forbidden if op in c.ptx]
    if pdl and "griddepcontrol.wait" not in c.ptx:
        bad.append("no griddepcontrol.wait")
    if c.shared > target.max_shared:
        bad.append(f"{c.shared} B shared memory > {target.max_shared} B per block on {target.name}")
    return bad


def resource_usage(cubin: bytes) -> dict[str, int]:
    """REG / STACK / SHARED / LOCAL of a cubin, from the cuobjdump that ships with Triton ({} if absent)."""
    from triton.backends.nvidia.compiler import get_ptxas

    tool = os.path.join(os.path.dirname(get_ptxas(90).path), "cuobjdump")
    if not os.path.exists(tool):
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as fh:
        fh.write(cubin)
    try:
        out = subprocess.run([tool, "--dump-resource-usage", fh.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(fh.name)
    return {k: int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", out)}


_REPORT: list[str] = []
_VERBOSE = False


def _note(name: str, c: Compiled) -> None:
    """With ``-v``: the kernel's registers / shared memory / spills (stack frame) into the report."""
    if not _VERBOSE:
        return
    use = resource_usage(c.cubin)
    if use:
        spill = use.get("STACK", 0) + use.get("LOCAL", 0)  # Triton's spills land in the stack frame
        _REPORT.append(f"{'SPILL ' if spill else ''}{name}: {use.get('REG', '?')} regs, {spill} B "
                       f"stack/local per thread, {c.shared} B dynamic shared")


def _gemm(kind: str, cfg: Any, m: int, k: int, scheme: str, prefetch: int = 0) -> Case:
    def run(target: Target) -> list[str]:
        from . import triton_gemm as tg

        epi = int(kind == "swiglu")
        mx = scheme == "mxfp8"
        grp = tg.act_group(scheme)
        scale = "*u8" if mx else "*fp32"
        ptrs = dict(a_ptr="*bf16" if cfg.a16 else "*fp8e4nv", as_ptr=scale, w_ptr="*fp8e4nv", ws_ptr=scale,
                    out_ptr="*fp8e4nv" if epi and not cfg.a16 else "*bf16", bias_ptr="*bf16",
                    part_ptr="*fp32", ticket_ptr="*i32", hs_ptr=scale)
        if cfg.tma:
            ptrs["w_desc"] = f"tensordesc<fp8e4nv[{cfg.bn}, {grp}]>"
        per = tg.cdiv(tg.cdiv(k, grp), cfg.split_k)  # K blocks per program, as launch_gemm passes it
        const = dict(BM=cfg.block_m(m), BN=cfg.bn, BK=grp, SPLIT_K=cfg.split_k, PER=per, A_GROUP=grp,
                     W_ROW_GROUP=1 if mx else 128, W_K_GROUP=grp, MX=mx, A_FP8=not cfg.a16, EPI=epi,
                     HAS_BIAS=False, SWAP=cfg.swap, H_GROUP=grp if epi else 1, W_TMA=cfg.tma, EXACT_CVT=False,
                     USE_PDL=True, PREFETCH=prefetch, A16=cfg.a16)
        if not cfg.tma:
            const["w_desc"] = None
        opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages, "launch_pdl": True}
        c = _compile(tg.fp8_gemm_kernel, ptrs, const, opts, target)
        _note(f"{target.name} {scheme} {kind} M={m} K={k} {cfg}", c)
        bad = [] if target.gemm_mma in c.ptx else [f"no {target.gemm_mma}"]
        if ("cp.async.bulk.tensor" in c.ptx) != cfg.tma:
            bad.append("TMA copies do not match the config")
        return bad + _prefetch_bad(c.ptx, prefetch, epi) + _common(c, target)

    return run


PREFETCH_OP = "cp.async.bulk.prefetch.L2.global"


def _prefetch_bad(ptx: str, prefetch: int, epi: int) -> list[str]:
    """With ``PREFETCH``: one L2 bulk prefetch per weight half (gate and up: two), all issued before
    the PDL wait (after it they would prefetch nothing the loop does not already wait for); without:
    none."""
    found = ptx.count(PREFETCH_OP)
    if not prefetch:
        return [f"{found} L2 prefetches with PREFETCH=0"] if found else []
    bad = [] if found == 1 + epi else [f"{found} L2 prefetches, expected {1 + epi}"]
    wait = ptx.find("griddepcontrol.wait")
    if found and not 0 <= ptx.rfind(PREFETCH_OP) < wait:
        bad.append("an L2 prefetch after griddepcontrol.wait")
    return bad


def _prefetch_cases(scheme: str) -> Iterator[tuple[str, Any, int, int]]:
    """The weight-prefetch variant (``TTSFLEET_GEMM_PREFETCH``) of each S2 Pro shape's M=1 pick, and
    one config without TMA (the prefetch takes plain pointers either way)."""
    from . import triton_gemm as tg

    for kind, n, k in S2_SHAPES:
        yield kind, tg.get_config(kind, 1, n, k), 1, k
    kind, n, k = S2_SHAPES[0]
    plain = [c for c in tg.config_space(kind, 64, n, k, scheme) if not c.tma and c.split_k > 1]
    if plain:
        yield kind, plain[0], 64, k


#: (M, TMA, PREFETCH) of the one-launch MLP compiled per scheme; the representative set keeps the first.
ONE_LAUNCH_CASES = ((1, True, 8), (1, False, 0), (64, True, 0))


def _mlp_one_launch(m: int, scheme: str, tma: bool, prefetch: int) -> Case:
    """The one-launch SwiGLU MLP (``TTSFLEET_MLP_LAUNCH=one``) at the S2 Pro shape, planned for 132
    SMs: both GEMMs' tensor-core MMAs, TMA exactly when asked, the work ticket's atomics, the L2
    prefetch of the down weights exactly when asked."""

    def run(target: Target) -> list[str]:
        from . import triton_gemm as tg
        from . import triton_mlp as tm

        (_, n, d), (_, _, f) = S2_SHAPES[0], S2_SHAPES[1]
        mx = scheme == "mxfp8"
        grp = tg.act_group(scheme)
        plan = tm.one_launch_plan(m, d, n // 2, grp, 132)
        scale = "*u8" if mx else "*fp32"
        ptrs = dict(a_ptr="*fp8e4nv", as_ptr=scale, gu_ptr="*fp8e4nv", gus_ptr=scale, dn_ptr="*fp8e4nv",
                    dns_ptr=scale, h_ptr="*fp8e4nv", hs_ptr=scale, out_ptr="*bf16", gu_part="*fp32",
                    dn_part="*fp32", gu_tickets="*i32", dn_tickets="*i32", counters="*i32")
        const: dict[str, Any] = dict(
            BM=plan.bm, GU_BN=tm.GATE_UP_BN, GU_TILES=plan.gu_tiles, GU_SPLIT=plan.gu_split,
            GU_PER=tg.cdiv(tg.cdiv(d, grp), plan.gu_split), DN_BN=plan.dn_bn, DN_TILES=plan.dn_tiles,
            DN_SPLIT=plan.dn_split, DN_PER=tg.cdiv(tg.cdiv(f, grp), plan.dn_split), BK=grp, A_GROUP=grp,
            W_ROW_GROUP=1 if mx else 128, W_K_GROUP=grp, MX=mx, SWAP=True, W_TMA=tma, EXACT_CVT=False,
            USE_PDL=True, PREFETCH=prefetch)
        if tma:
            ptrs["gu_desc"] = f"tensordesc<fp8e4nv[{tm.GATE_UP_BN}, {grp}]>"
            ptrs["dn_desc"] = f"tensordesc<fp8e4nv[{plan.dn_bn}, {grp}]>"
        else:
            const.update(gu_desc=None, dn_desc=None)
        opts = {"num_warps": plan.num_warps, "num_stages": 3, "launch_pdl": True}
        c = _compile(tm.swiglu_mlp_one_launch_kernel, ptrs, const, opts, target)
        _note(f"{target.name} {scheme} one-launch MLP M={m} tma={tma} PREFETCH={prefetch}", c)
        bad = [] if c.ptx.count(target.gemm_mma) >= 2 else [f"fewer than two {target.gemm_mma} sites"]
        if ("cp.async.bulk.tensor" in c.ptx) != tma:
            bad.append("TMA copies do not match the config")
        if "atom.global" not in c.ptx and "atom.acq_rel.gpu" not in c.ptx:
            bad.append("no global atomics (the work ticket)")
        if (PREFETCH_OP in c.ptx) != bool(prefetch):
            bad.append(f"L2 prefetch {'missing' if prefetch else 'present'} with PREFETCH={prefetch}")
        return bad + _common(c, target)

    return run


def _attention_block_one_launch(m: int, scheme: str) -> Case:
    """The fast model's attention half in one launch (``TTSFLEET_FAST_ATTN_LAUNCH=one``) at the S2 Pro
    fast shape (32 heads, 8 KV heads of 128, a 10-position frame cache), planned for 132 SMs: both
    GEMMs' tensor-core MMAs, TMA weight copies, the work ticket's atomics, the O weights' L2 prefetch."""

    def run(target: Target) -> list[str]:
        import triton.language as tl

        from . import triton_attention_block as tb
        from . import triton_gemm as tg
        from .decode import attention_block_n

        d, heads, kv, hd = 2560, 32, 8, 128
        mx = scheme == "mxfp8"
        grp = tg.act_group(scheme)
        plan = tb.block_plan(m, d, (heads + 2 * kv) * hd, heads * hd, kv, grp, 132)
        scale = "*u8" if mx else "*fp32"
        ptrs = dict(a_ptr="*fp8e4nv", as_ptr=scale, wqkv_ptr="*fp8e4nv", wqkvs_ptr=scale, qkv_ptr="*bf16",
                    wo_ptr="*fp8e4nv", wos_ptr=scale, att_ptr="*fp8e4nv", atts_ptr=scale, out_ptr="*bf16",
                    k_ptr="*bf16", v_ptr="*bf16", len_ptr="*i64", qn_ptr="*bf16", kn_ptr="*bf16",
                    rope_ptr="*fp32", pos_ptr="*i64", qkv_part="*fp32", o_part="*fp32", qkv_tickets="*i32",
                    o_tickets="*i32", counters="*i32", eps="fp32", scale="fp32",
                    wqkv_desc=f"tensordesc<fp8e4nv[{plan.qkv_bn}, {grp}]>",
                    wo_desc=f"tensordesc<fp8e4nv[{plan.o_bn}, {grp}]>")
        g = heads // kv
        const = dict(BM=plan.bm, QKV_BN=plan.qkv_bn, QKV_TILES=plan.qkv_tiles, QKV_SPLIT=plan.qkv_split,
                     QKV_PER=tg.cdiv(tg.cdiv(d, grp), plan.qkv_split), O_BN=plan.o_bn, O_TILES=plan.o_tiles,
                     O_SPLIT=plan.o_split, O_PER=tg.cdiv(tg.cdiv(heads * hd, grp), plan.o_split), BK=grp,
                     A_GROUP=grp, W_ROW_GROUP=1 if mx else 128, W_K_GROUP=grp, MX=mx, SWAP=True, W_TMA=True,
                     G=g, BLOCK_G=max(16, g), HEAD_D=hd, BLOCK_N=attention_block_n(10), KEYS_BOUND=0, N_KV=kv,
                     QK_NORM=False, OUT_DTYPE=tl.bfloat16, EXACT_CVT=False, USE_PDL=True, PREFETCH=4,
                     ATT_CODES=True)
        opts = {"num_warps": plan.num_warps, "num_stages": 3, "launch_pdl": True}
        c = _compile(tb.attention_block_one_launch_kernel, ptrs, const, opts, target)
        _note(f"{target.name} {scheme} one-launch attention block M={m}", c)
        bad = [] if c.ptx.count(target.gemm_mma) >= 2 else [f"fewer than two {target.gemm_mma} sites"]
        if "cp.async.bulk.tensor" not in c.ptx:
            bad.append("no TMA copies")
        if "atom.global" not in c.ptx and "atom.acq_rel.gpu" not in c.ptx:
            bad.append("no global atomics (the work ticket)")
        if PREFETCH_OP not in c.ptx:
            bad.append("no L2 prefetch of the O weights")
        return bad + _common(c, target)

    return run


def _decode_kernels(group: int) -> Case:
    """Norm, attention (dense / FP8 cache; bf16 or FP8-code output; one pass and split), RoPE + KV
    store, quantizer."""

    def run(target: Target) -> list[str]:
        import triton.language as tl

        from . import triton_attention as ta
        from . import triton_attention_split as tas
        from . import triton_decode as td
        from . import triton_quant as tq

        pdl = {"launch_pdl": True}
        bad: list[str] = []
        for quant in (False, True):
            out = "*fp8e4nv" if quant else "*bf16"
            common = dict(QUANT=quant, GROUP=group, MX=group == 32, OUT_DTYPE=tl.bfloat16, EXACT_CVT=False,
                          USE_PDL=True)
            norm = dict(x_ptr="*bf16", r_ptr="*bf16", w_ptr="*bf16", y_ptr=out, h_ptr="*bf16",
                        s_ptr="*u8" if group == 32 else "*fp32", eps="fp32")
            kernels = [("rmsnorm", td._rmsnorm_kernel, norm, dict(HAS_RES=True, BLOCK=4096, **common), 8)]
            for fp8 in (False, True):
                cache = "*fp8e4nv" if fp8 else "*bf16"
                attn = dict(q_ptr="*bf16", k_ptr=cache, v_ptr=cache, o_ptr=out,
                            os_ptr="*u8" if group == 32 else "*fp32", slots_ptr="*i64", len_ptr="*i64",
                            ks_ptr="*u8", vs_ptr="*u8", scale="fp32")
                key_bytes = 128 if fp8 else 256
                off = dict(PREFETCH=0, KEY_BYTES=0)
                kernels.append((f"attention kv_fp8={fp8}", ta._decode_attention_kernel, attn,
                                dict(G=4, BLOCK_G=16, D=128, BLOCK_N=64, SLOT_IS_ROW=False, KEYS_BOUND=0,
                                     KV_FP8=fp8, **off, **common), 4))
                kernels.append((f"attention kv_fp8={fp8} tile=8x32", ta._decode_attention_kernel, attn,
                                dict(G=4, BLOCK_G=16, D=128, BLOCK_N=32, SLOT_IS_ROW=False, KEYS_BOUND=0,
                                     KV_FP8=fp8, **off, **common), 8))
                kernels.append((f"attention kv_fp8={fp8} prefetch=2", ta._decode_attention_kernel, attn,
                                dict(G=4, BLOCK_G=16, D=128, BLOCK_N=64, SLOT_IS_ROW=False, KEYS_BOUND=0,
                                     KV_FP8=fp8, PREFETCH=2, KEY_BYTES=key_bytes, **common), 4))
                # RoPE + KV store inside attention (TTSFLEET_ROPE_ATTENTION=fused): q_ptr is the QKV output
                rope_types = dict(qn_ptr="*bf16", kn_ptr="*bf16", rope_ptr="*bf16", pos_ptr="*i64",
                                  eps="fp32")
                fused = dict(ROPE_FUSED=True, N_KV=8, QK_NORM=True)
                kernels.append((f"attention kv_fp8={fp8} rope fused", ta._decode_attention_kernel,
                                dict(attn, **rope_types),
                                dict(G=4, BLOCK_G=16, D=128, BLOCK_N=64, SLOT_IS_ROW=False, KEYS_BOUND=0,
                                     KV_FP8=fp8, **off, **fused, **common), 4))
                if not quant:  # the split's first pass writes float32 states, whatever the output
                    part = dict(attn, m_ptr="*fp32", l_ptr="*fp32", acc_ptr="*fp32")
                    split = dict(G=4, BLOCK_G=16, D=128, BLOCK_N=64, SPLITS=8, SLOT_IS_ROW=False,
                                 KEYS_BOUND=0, KV_FP8=fp8, USE_PDL=True)
                    kernels.append((f"attention split kv_fp8={fp8}", tas._split_partial_kernel, part,
                                    dict(split, **off), 4))
                    kernels.append((f"attention split kv_fp8={fp8} prefetch=1", tas._split_partial_kernel,
                                    part, dict(split, PREFETCH=1, KEY_BYTES=key_bytes), 4))
                    kernels.append((f"attention split kv_fp8={fp8} rope fused", tas._split_partial_kernel,
                                    dict(part, **rope_types),
                                    dict(split, **off, **fused, EXACT_CVT=False), 4))
                if not quant:
                    rope = dict(qkv_ptr="*bf16", qn_ptr="*bf16", kn_ptr="*bf16", rope_ptr="*bf16",
                                pos_ptr="*i64", slot_ptr="*i64", k_ptr=cache, v_ptr=cache, q_ptr="*bf16",
                                ks_ptr="*u8", vs_ptr="*u8", eps="fp32")
                    kernels.append((f"qkv_rope_store kv_fp8={fp8}", td._qkv_rope_store_kernel, rope,
                                    dict(H=32, KV=8, D=128, QK_NORM=True, SLOT_IS_ROW=False, KV_FP8=fp8,
                                         EXACT_CVT=False, USE_PDL=True), 1))
            merge = dict(m_ptr="*fp32", l_ptr="*fp32", acc_ptr="*fp32", o_ptr=out,
                         os_ptr="*u8" if group == 32 else "*fp32")
            kernels.append(("attention split merge", tas._split_merge_kernel, merge,
                            dict(G=4, BLOCK_G=16, D=128, SPLITS=8, **common), 4))
            for name, fn, types, const, warps in kernels:
                c = _compile(fn, types, const, {"num_warps": warps, **pdl}, target)
                _note(f"{target.name} {name} group={group} quant={quant}", c)
                # K and V: one L2 prefetch each where the launch asks for any (_prefetch_bad: 1 + 1)
                prefetch = _prefetch_bad(c.ptx, const.get("PREFETCH", 0), 1)
                bad += [f"{name} quant={quant}: {b}" for b in _common(c, target) + prefetch]
        qtypes = dict(x_ptr="*bf16", q_ptr="*fp8e4nv", s_ptr="*u8" if group == 32 else "*fp32")
        c = _compile(tq.act_quant_kernel, qtypes, dict(GROUP=group, G_PER_PROG=max(1, 1024 // group),
                                                        MX=group == 32, EXACT_CVT=False, USE_PDL=True),
                     {"num_warps": 4, **pdl}, target)
        return bad + [f"act_quant: {b}" for b in _common(c, target)]

    return run


def _samplers(vocab: int) -> Case:
    """Both fused samplers at an S2 Pro vocabulary, with a window and RAS, and the window shift."""

    def run(target: Target) -> list[str]:
        import triton

        from . import triton_decode as td
        from . import triton_window as tw
        from .decode import TOPK_CAP

        pdl = {"launch_pdl": True}
        block_v, k = triton.next_power_of_2(vocab), min(TOPK_CAP, vocab)
        warps = 4 if vocab <= 2048 else 8
        rows = dict(step_ptr="*i64", temp_ptr="*fp32", top_p_ptr="*fp32", top_k_ptr="*i64", seed_ptr="*i64",
                    ras_ptr="*i1", ras_win_ptr="*i64", ras_temp_ptr="*fp32", ras_top_p_ptr="*fp32")
        bad: list[str] = []
        pen = dict(l_ptr="*fp32", win_ptr="*i32", pen_ptr="*fp32", out_ptr="*fp32", greedy_ptr="*i64",
                   stat_ptr="*fp32")
        fin = dict(vals_ptr="*fp32", idx_ptr="*i64", stat_ptr="*fp32", greedy_ptr="*i64", out_ptr="*i64",
                   win_ptr="*i32", **rows)
        one = dict(l_ptr="*fp32", win_ptr="*i32", pen_ptr="*fp32", out_ptr="*i64", scratch_ptr="*i64", **rows)
        for name, fn, types, const, w in (
            ("sampler penalty (torch.topk path)", td._penalty_kernel, pen,
             dict(W=16, HAS_WIN=True, BLOCK_V=block_v, USE_PDL=True), warps),
            ("sampler finish (torch.topk path)", td._finish_kernel, fin,
             dict(K=k, BLOCK_K=triton.next_power_of_2(k), RAS=True, USE_PDL=True), 1),
            ("sampler, top-k in the kernel", td._sample_kernel, one,
             dict(W=16, HAS_WIN=True, BLOCK_V=block_v, K=k, BLOCK_K=triton.next_power_of_2(k), RAS=True,
                  USE_PDL=True), warps),
        ):
            c = _compile(fn, types, const, {"num_warps": w, **pdl}, target)
            _note(f"{target.name} {name} V={vocab}", c)
            bad += [f"{name}: {b}" for b in _common(c, target)]
        c = _compile(tw.window_shift_kernel, dict(prev_ptr="*i32", next_ptr="*i32"), dict(BLOCK=256),
                     {"num_warps": 4}, target)
        return bad + [f"window shift: {b}" for b in _common(c, target, pdl=False)]

    return run


#: The S2 codec decoder's residual-unit widths, each with a 4-frame push's time rows per stream.
CODEC_UNIT_WIDTHS = tuple((w, 4 * rows) for w, rows in S2_DECODER_UNIT_ROWS_PER_FRAME.items())


def _codec_convs(width: int, t: int) -> Case:
    """The codec's fused conv (:mod:`.triton_codec_conv`) at one decoder width, bf16: the 7-tap
    conv with Snake and the 1x1 conv with the residual add, each with its heuristic tile and, on
    sm_90a, the tile the shipped table gives it (:func:`~.codec_conv_tiles.tile_for`; the table is
    measured on an H200, so sm_120a, with 99 KiB of shared memory, keeps the heuristic's). Tensor-core
    MMAs required (``wgmma`` on sm_90a, ``mma.sync`` bf16 on sm_120a)."""

    def run(target: Target) -> list[str]:
        from . import codec_conv_tiles as ct
        from . import triton_codec_conv as tc

        types = dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", a_ptr="*bf16", r_ptr="*bf16", y_ptr="*bf16")
        mma = "wgmma.mma_async" if target.cc == 90 else "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
        bad: list[str] = []
        for name, ksize, const in (("7-tap + Snake", 7, dict(KSIZE=7, SNAKE=True, RESIDUAL=False)),
                                   ("1x1 + residual", 1, dict(KSIZE=1, SNAKE=False, RESIDUAL=True))):
            tiles = {ct.default_tile(t, width, width)}
            if target.cc == 90:
                tiles.add(ct.tile_for(t, ksize, width, width))
            bad += _codec_conv_tiles(tc.conv_rows_kernel, name, const, sorted(tiles, key=str), width, target,
                                     types, mma)
        return bad

    return run


def _codec_conv_tiles(kernel: Any, name: str, const: dict[str, Any], tiles: list[Any], width: int,
                      target: Target, types: dict[str, str], mma: str) -> list[str]:
    """One fused codec conv compiled at each of ``tiles``: what :func:`_common` finds, and a missing
    tensor-core MMA."""
    bad: list[str] = []
    for tile in tiles:
        consts = {**const, "F32_DOT": False, "BLOCK_T": tile.block_t, "BLOCK_N": tile.block_n,
                  "BLOCK_K": tile.block_k}
        c = _compile(kernel, types, consts,
                     {"num_warps": tile.num_warps, "num_stages": tile.num_stages}, target,
                     divisible=("CI", "CO", "s_xb", "s_xt", "s_rb", "s_rt", "s_yb", "s_yt"))
        _note(f"{target.name} codec conv {name} C={width} {tile}", c)
        bad += [f"{name} {tile.label}: {b}" for b in _common(c, target, pdl=False)]
        if mma not in c.ptx:
            bad.append(f"{name} {tile.label}: no {mma}")
    return bad


def _gemm_configs(scheme: str, representative: bool = False) -> Iterator[tuple[str, Any, int, int]]:
    """(kind, config, M, K) for every distinct config the tuner may pick, plus the tuned table's picks.

    ``representative``: the tuned picks, and of the rest one case per kernel structure (tile, warps,
    stages, TMA, split-K or not) -- what decides instructions, registers and shared memory -- so CI
    checks every structure in a quarter of the time; the full space stays the default.
    """
    from . import triton_gemm as tg

    seen, structures = set(), set()
    for kind, n, k in S2_SHAPES:
        for m in (1, 32, 64):
            tuned = tg.get_config(kind, m, n, k)
            for cfg in [*tg.config_space(kind, m, n, k, scheme), tuned]:
                key = (kind == "swiglu", cfg, cfg.block_m(m), k)
                structure = (kind == "swiglu", cfg.bn, cfg.swap, cfg.bm, cfg.num_warps, cfg.num_stages,
                             cfg.tma, cfg.split_k > 1)
                if key in seen or (representative and cfg != tuned and structure in structures):
                    continue
                seen.add(key)
                structures.add(structure)
                yield kind, cfg, m, k


def _a16_configs(representative: bool = False) -> Iterator[tuple[str, Any, int, int]]:
    """(kind, config, M, K) of the W8A16 prototype's benchmark space, linear and SwiGLU (sm_90 only: its
    MMA is bf16 ``wgmma``), one per distinct compile; ``representative``: one per tile structure."""
    from . import triton_gemm as tg

    seen, structures = set(), set()
    for kind, n, k in S2_SHAPES:
        fam = "swiglu" if kind == "swiglu" else "linear"
        for m in (1, 64):
            for cfg in tg.a16_config_space(m, n, k, fam):
                structure = (fam, cfg.bn, cfg.num_warps, cfg.block_m(m))
                if (fam, cfg, cfg.block_m(m), k) in seen or (representative and structure in structures):
                    continue
                seen.add((fam, cfg, cfg.block_m(m), k))
                structures.add(structure)
                yield fam, cfg, m, k


def cases(target: Target, representative: bool = False) -> Iterator[tuple[str, Case]]:
    """(name, compile-and-check) for every GEMM config of the target's schemes and the decode kernels."""
    for scheme in target.schemes:
        for kind, cfg, m, k in _gemm_configs(scheme, representative):
            yield f"{scheme} {kind} M={m} K={k} {cfg}", _gemm(kind, cfg, m, k, scheme)
        for kind, cfg, m, k in _prefetch_cases(scheme):
            yield f"{scheme} {kind} M={m} K={k} {cfg} PREFETCH=4", _gemm(kind, cfg, m, k, scheme, prefetch=4)
        for m, tma, prefetch in ONE_LAUNCH_CASES[:1] if representative else ONE_LAUNCH_CASES:
            yield (f"{scheme} one-launch MLP M={m} tma={tma} PREFETCH={prefetch}",
                   _mlp_one_launch(m, scheme, tma, prefetch))
        for m in (1,) if representative else (1, 64):
            yield f"{scheme} one-launch attention block M={m}", _attention_block_one_launch(m, scheme)
    if target.cc == 90:
        for kind, cfg, m, k in _a16_configs(representative):
            yield f"bsgemm_fp8 W8A16 {kind} M={m} K={k} {cfg}", _gemm(kind, cfg, m, k, "bsgemm_fp8")
    for group in sorted({32 if s == "mxfp8" else 128 for s in target.schemes}, reverse=True):
        yield f"decode kernels group={group}", _decode_kernels(group)
    for vocab in S2_VOCABS:
        yield f"samplers V={vocab}", _samplers(vocab)
    for width, t in CODEC_UNIT_WIDTHS[-1:] if representative else CODEC_UNIT_WIDTHS:
        yield f"codec unit convs C={width}", _codec_convs(width, t)


def check(target: Target, representative: bool = False) -> tuple[int, list[str]]:
    """Compile every case for ``target``; (cases, names of the failed ones), failures printed."""
    failed, n = [], 0
    for name, run in cases(target, representative):
        n += 1
        try:
            bad = run(target)
        except Exception as exc:  # a compile error is the finding
            lines = [ln for ln in str(exc).splitlines() if ln.strip()]  # Triton: "at L:C:", source, error
            bad = [f"{type(exc).__name__}: {' | '.join(lines[:1] + lines[-1:])[:400]}"]
        if bad:
            failed.append(name)
            print(f"FAIL {target.name} {name}: {'; '.join(bad)}", flush=True)
    return n, failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ttsfleet.kernels.compile_check",
                                 description="Compile the decode kernels for sm_90 / sm_120 without a GPU.")
    ap.add_argument("--arch", type=int, choices=sorted(TARGETS), action="append",
                    help="compute capability x 10 (repeatable; default: all)")
    ap.add_argument("--representative", action="store_true",
                    help="the tuned picks and one GEMM config per kernel structure (CI), not all")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="report registers / spills / shared memory per kernel (cuobjdump)")
    args = ap.parse_args(argv)
    global _VERBOSE
    _VERBOSE = args.verbose
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("compile_check: unset TRITON_INTERPRET (the interpreter does not compile)", file=sys.stderr)
        return 2
    status = 0
    for cc in args.arch or sorted(TARGETS):
        target = TARGETS[cc]
        _REPORT.clear()
        n, failed = check(target, args.representative)
        if args.verbose:
            print("\n".join(_REPORT))
        print(f"compile_check: {n - len(failed)} of {n} compiled for {target.name.removesuffix('a')} as "
              "configured", flush=True)
        status |= bool(failed)
    return status


if __name__ == "__main__":
    sys.exit(main())
