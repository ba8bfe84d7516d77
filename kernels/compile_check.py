"""Compile every Triton kernel the decode step can launch for sm_90, without a GPU.

Why: Triton's interpreter runs a kernel as Python, so CPU tests accept code the compiler rejects (a
helper with two differently shaped ``return`` statements passed on CPU and failed to compile on the
H200, costing a device call). ``triton.compile`` for a ``cuda:90`` target needs no GPU. This compiles
each FP8 GEMM config the tuner may pick (:func:`triton_gemm.config_space` at the S2 Pro shapes) and
each decode kernel with its launch options, and checks the PTX holds what the config is for:
``wgmma`` tensor-core MMAs, TMA bulk copies for ``tma`` configs, the programmatic-dependent-launch
``griddepcontrol`` instructions. Must run in a process without ``TRITON_INTERPRET=1``:
``python -m ttsfleet.kernels.compile_check`` (exit 1 on any failure; the tests run it so).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

S2_SHAPES = [("swiglu", 19456, 2560), ("down", 2560, 9728), ("linear", 6144, 2560), ("linear", 2560, 4096),
             ("linear", 4096, 2560)]


def _compile(fn: Any, types: dict[str, str], const: dict[str, Any], opts: dict[str, Any]) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {n: "constexpr" if n in const else types.get(n, "i32") for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if sig[n].startswith("*")}
    src = ASTSource(fn, sig, const, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]


def _gemm(kind: str, cfg: Any, m: int) -> Callable[[], list[str]]:
    def run() -> list[str]:
        from . import triton_gemm as tg

        epi = int(kind == "swiglu")
        ptrs = dict(a_ptr="*fp8e4nv", as_ptr="*fp32", w_ptr="*fp8e4nv", ws_ptr="*fp32",
                    out_ptr="*fp8e4nv" if epi else "*bf16", bias_ptr="*bf16", part_ptr="*fp32",
                    ticket_ptr="*i32", hs_ptr="*fp32")
        if cfg.tma:
            ptrs["w_desc"] = f"tensordesc<fp8e4nv[{cfg.bn}, 128]>"
        const = dict(BM=cfg.block_m(m), BN=cfg.bn, BK=128, SPLIT_K=cfg.split_k, PER=3, A_GROUP=128,
                     W_ROW_GROUP=128, W_K_GROUP=128, MX=False, A_FP8=True, EPI=epi, HAS_BIAS=False,
                     SWAP=cfg.swap, H_GROUP=128 if epi else 1, W_TMA=cfg.tma, EXACT_CVT=False, USE_PDL=True)
        if not cfg.tma:
            const["w_desc"] = None
        opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages, "launch_pdl": True}
        ptx = _compile(tg.fp8_gemm_kernel, ptrs, const, opts)
        bad = [] if "wgmma" in ptx else ["no wgmma"]
        if ("cp.async.bulk.tensor" in ptx) != cfg.tma:
            bad.append("TMA copies do not match the config")
        return bad + ([] if "griddepcontrol.wait" in ptx else ["no griddepcontrol.wait"])

    return run


def _decode(quant: bool) -> Callable[[], list[str]]:
    def run() -> list[str]:
        import triton.language as tl

        from . import triton_attention as ta
        from . import triton_decode as td

        pdl = {"launch_pdl": True}
        out = "*fp8e4nv" if quant else "*bf16"
        common = dict(QUANT=quant, GROUP=128, MX=False, OUT_DTYPE=tl.bfloat16, EXACT_CVT=False, USE_PDL=True)
        norm = dict(x_ptr="*bf16", r_ptr="*bf16", w_ptr="*bf16", y_ptr=out, h_ptr="*bf16", s_ptr="*fp32",
                    eps="fp32")
        attn = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", o_ptr=out, os_ptr="*fp32", slots_ptr="*i64",
                    len_ptr="*i64", scale="fp32")
        rope = dict(qkv_ptr="*bf16", qn_ptr="*bf16", kn_ptr="*bf16", rope_ptr="*bf16", pos_ptr="*i64",
                    slot_ptr="*i64", k_ptr="*bf16", v_ptr="*bf16", q_ptr="*bf16", eps="fp32")
        ptxs = [
            _compile(td._rmsnorm_kernel, norm, dict(HAS_RES=True, BLOCK=4096, **common),
                     {"num_warps": 8, **pdl}),
            _compile(ta._decode_attention_kernel, attn,
                     dict(G=4, BLOCK_G=16, D=128, BLOCK_N=64, SLOT_IS_ROW=False, KEYS_BOUND=0, **common),
                     {"num_warps": 4, **pdl}),
            _compile(td._qkv_rope_store_kernel, rope,
                     dict(H=32, KV=8, D=128, QK_NORM=True, SLOT_IS_ROW=False, USE_PDL=True),
                     {"num_warps": 1, **pdl}),
        ]
        return [f"kernel {i}: no griddepcontrol.wait" for i, p in enumerate(ptxs)
                if "griddepcontrol.wait" not in p]

    return run


def cases() -> Iterator[tuple[str, Callable[[], list[str]]]]:
    """(name, compile-and-check) for every distinct GEMM config of the tuner and the decode kernels."""
    from . import triton_gemm as tg

    seen = set()
    for kind, n, k in S2_SHAPES:
        for m in (1, 32, 64):
            for cfg in tg.config_space(kind, m, n, k):
                key = (kind == "swiglu", cfg, cfg.block_m(m))
                if key not in seen:
                    seen.add(key)
                    yield f"{kind} M={m} {cfg}", _gemm(kind, cfg, m)
    for quant in (False, True):
        yield f"decode kernels quant={quant}", _decode(quant)


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("compile_check: unset TRITON_INTERPRET (the interpreter does not compile)", file=sys.stderr)
        return 2
    failed, n = [], 0
    for name, run in cases():
        n += 1
        try:
            bad = run()
        except Exception as exc:  # a compile error is the finding
            bad = [f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"]
        if bad:
            failed.append(name)
            print(f"FAIL {name}: {'; '.join(bad)}", flush=True)
    print(f"compile_check: {n - len(failed)} of {n} compiled for sm_90 as configured")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
