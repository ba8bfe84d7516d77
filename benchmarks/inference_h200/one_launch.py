"""The two one-launch kernels against the launches they replace, side by side on one GPU (issue #26).

Why: both were built without a GPU (2026-12-05). The MLP's target is <= 24 us at M=1 (two launches:
33.6 us against a 17.6 us weight floor, 2026-12-01); the fast model's attention half (QKV GEMM, RoPE +
K/V store + attention over a 10-position frame cache, O GEMM: 26 MB of weights) is launches around
little data. Before timing, each M checks the one launch against the production launches (relative
error) and a second replay (bits), so a wrong kernel is never timed. Then, per M, CUDA-graph replays
(``kernels.bench``'s method: enough weight copies cycled that nothing is served from L2) of:

* MLP: ``two`` (the default launches, tuned configs), ``two+prefetch`` (``TTSFLEET_GEMM_PREFETCH=auto``),
  ``one`` (``TTSFLEET_MLP_LAUNCH=one``: down weights prefetched into L2 while gate_up runs),
  ``one@noprefetch``, ``one@gu2`` (gate_up in 2 K shares: 152 items instead of 76 at M=1), ``one@x2``
  (up to 2 programs per SM), ``one@gu3x2`` (gate_up in 3 K shares, 2 programs per SM: the two
  launches' gate_up grid);
* fast attention: ``separate`` (QKV GEMM, RoPE inside attention's launch, O GEMM), ``separate+prefetch``,
  ``one`` (``TTSFLEET_FAST_ATTN_LAUNCH=one``), ``one@noprefetch``, ``one@o128`` (O tiles of 128 columns:
  20 O items, all taken while QKV runs at M=1, instead of 40), ``one@x2`` (up to 2 programs per SM).

Rounds alternate the variants; the table gives medians (us), the spread ((max-min) / median) and the
weight floor at the measured copy bandwidth. JSON to ``$OUT/one_launch.json``.

    python3 -m benchmarks.inference_h200.one_launch     # on the device, from the repo root
    ONE_MS=1,8,64 ONE_EXTRA_MS=1 ONE_ROUNDS=5 ONE_PARTS=mlp,attention (defaults; the variants past
        the launches and the default one launch run at ONE_EXTRA_MS only; ONE_VARIANTS=a,b: only those)
    ONE_DRY=1 ONE_MS=1 python3 -P benchmarks/inference_h200/one_launch.py   # CPU: the checks only, at S2
        Pro size in Triton's interpreter (~1 min), so the script's own plumbing is tried before a device call
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

DRY = os.environ.get("ONE_DRY") == "1"  # CPU, Triton's interpreter, checks only (no timing)
if DRY:
    os.environ.setdefault("TRITON_INTERPRET", "1")
DEV = "cpu" if DRY else "cuda"
MS = [int(v) for v in os.environ.get("ONE_MS", "1,8,64").split(",")]
#: Where the variants beyond the launches and the default one launch (no prefetch, other plans) run:
#: each is a compile of its own (~10 s on the device), so only at these M.
EXTRA_MS = [int(v) for v in os.environ.get("ONE_EXTRA_MS", "1").split(",")]
BASIC = ("two", "one", "separate")
#: The extra variants to run (blank: all of them), e.g. ``ONE_VARIANTS=one@x2,one@gu3x2``.
ONLY = {v for v in os.environ.get("ONE_VARIANTS", "").split(",") if v}
ROUNDS = int(os.environ.get("ONE_ROUNDS", "5"))
PARTS = os.environ.get("ONE_PARTS", "mlp,attention").split(",")
HEADS, KV, HEAD_DIM, FRAME = 32, 8, 128, 10  # S2 Pro's fast model


def _mlp_variants(xq: torch.Tensor, xs: torch.Tensor, weights: list) -> dict[str, Callable[[], list]]:
    from ttsfleet.kernels import decode
    from ttsfleet.kernels import triton_mlp as tm
    from ttsfleet.kernels.ops import swiglu_mlp_fp8_codes

    def two(prefetch: str) -> list:
        decode.set_mlp_launch("two")  # whatever TTSFLEET_MLP_LAUNCH says: the launches it replaces
        decode.set_gemm_prefetch(prefetch)  # read at launch: the graph captures its launches
        return [partial(swiglu_mlp_fp8_codes, xq, xs, a, b, torch.bfloat16) for a, b in weights]

    def one(prefetch: int | None, gu_split: int = 1, per_sm: int = 1) -> list:
        from ttsfleet.kernels.decode import sm_count

        a, b = weights[0]
        plan = tm.one_launch_plan(xq.shape[0], a.shape[1], b.shape[1], 128, sm_count(xq.device), gu_split,
                                  per_sm)
        return [partial(tm.swiglu_mlp_one_launch, xq, xs, gu, dn, torch.bfloat16, plan=plan,
                        prefetch=prefetch) for gu, dn in weights]

    return {"two": lambda: two("off"), "two+prefetch": lambda: two("auto"), "one": lambda: one(None),
            "one@noprefetch": lambda: one(0), "one@gu2": lambda: one(None, 2),
            "one@x2": lambda: one(None, 1, 2), "one@gu3x2": lambda: one(None, 3, 2)}


def _frame(m: int) -> Any:
    """A frame cache of ``m`` rows at position 5 of 10, as the fast model's 6th codebook sees it."""
    from ttsfleet.inference.model_layers import rope_table
    from ttsfleet.kernels.triton_attention_block import FrameAttention

    cache = [torch.randn(m, FRAME, KV, HEAD_DIM, device=DEV, dtype=torch.bfloat16) for _ in range(2)]
    at = torch.tensor([5], device=DEV)
    rope = rope_table(FRAME + 1, HEAD_DIM, 1e6).to(DEV)
    return FrameAttention(HEADS, HEAD_DIM, rope, at, *cache, at + 1)


def _separate(xq: torch.Tensor, xs: torch.Tensor, wqkv: Any, wo: Any, fa: Any) -> torch.Tensor:
    """The production launches: QKV GEMM, RoPE + store inside attention (FP8 codes out), O GEMM."""
    from ttsfleet.kernels import decode
    from ttsfleet.kernels.ops import linear_fp8_codes

    qkv = linear_fp8_codes(xq, xs, wqkv, torch.bfloat16)
    codes, scales = decode.rope_attention(qkv, HEADS, HEAD_DIM, fa.rope, fa.pos, fa.k_cache, fa.v_cache, None,
                                          fa.lengths, quant_group=128)
    return linear_fp8_codes(codes, scales, wo, torch.bfloat16)


def _attention_variants(xq: torch.Tensor, xs: torch.Tensor, weights: list,
                        fa: Any) -> dict[str, Callable[[], list]]:
    from ttsfleet.kernels import decode
    from ttsfleet.kernels.bench import H
    from ttsfleet.kernels.triton_attention_block import O_BN, attention_block_one_launch

    decode.set_rope_attention("fused")

    def separate(prefetch: str) -> list:
        decode.set_gemm_prefetch(prefetch)
        return [partial(_separate, xq, xs, a, b, fa) for a, b in weights]

    def one(prefetch: int | None, o_bn: int = O_BN, per_sm: int = 1) -> list:
        from ttsfleet.kernels.decode import sm_count
        from ttsfleet.kernels.triton_attention_block import block_plan

        a, b = weights[0]
        plan = block_plan(xq.shape[0], H, a.shape[0], b.shape[1], KV, 128, sm_count(xq.device), o_bn=o_bn,
                          per_sm=per_sm)
        return [partial(attention_block_one_launch, xq, xs, qkv_w, o_w, fa, torch.bfloat16, plan=plan,
                        prefetch=prefetch) for qkv_w, o_w in weights]

    return {"separate": lambda: separate("off"), "separate+prefetch": lambda: separate("auto"),
            "one": lambda: one(None), "one@noprefetch": lambda: one(0), "one@o128": lambda: one(None, 128),
            "one@x2": lambda: one(None, O_BN, 2)}


def _check(one: Callable[[], torch.Tensor], base: Callable[[], torch.Tensor]) -> dict[str, Any]:
    from ttsfleet.kernels.testing import rel_err

    got, again = one(), one()
    return {"replay_equal": bool(torch.equal(got, again)), "rel_err_vs_launches": rel_err(got, base())}


def _time(variants: dict[str, Callable[[], list]], m: int) -> dict[str, Any]:
    from ttsfleet.kernels import decode
    from ttsfleet.kernels.bench import graph_us

    if m not in EXTRA_MS:
        variants = {name: calls for name, calls in variants.items() if name in BASIC}
    elif ONLY:
        variants = {name: calls for name, calls in variants.items() if name in BASIC or name in ONLY}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(ROUNDS):
        for name, calls in variants.items():
            times[name].append(graph_us(calls()))
    decode.GEMM_PREFETCH_SWITCH.reset()
    meds = {n: statistics.median(ts) for n, ts in times.items()}
    return {n: {"median": meds[n], "spread": (max(ts) - min(ts)) / meds[n], "all": ts}
            for n, ts in times.items()}


def _print(part: str, m: int, us: dict[str, Any], base: str, check: dict[str, Any]) -> None:
    cells = "  ".join(f"{n} {v['median']:6.2f} ({100 * v['spread']:.0f}%)" for n, v in us.items())
    print(f"{part:9s} M={m:3d}  {cells}  | one/{base} {us['one']['median'] / us[base]['median']:.3f}  "
          f"check {check}", flush=True)


def _mlp_row(m: int, xq: torch.Tensor, xs: torch.Tensor, weights: list) -> dict[str, Any]:
    from ttsfleet.kernels.triton_mlp import swiglu_mlp_one_launch

    a, b = weights[0]
    check = _check(lambda: swiglu_mlp_one_launch(xq, xs, a, b, torch.bfloat16),
                   lambda: _mlp_variants(xq, xs, [(a, b)])["two"]()[0]())
    if DRY:
        print(f"mlp       M={m:3d}  check {check}", flush=True)
        return {"part": "mlp", "M": m, "check": check}
    us = _time(_mlp_variants(xq, xs, weights), m)
    _print("mlp", m, us, "two", check)
    return {"part": "mlp", "M": m, "check": check, "us": us}


def _attention_row(m: int, xq: torch.Tensor, xs: torch.Tensor, weights: list) -> dict[str, Any]:
    from ttsfleet.kernels.triton_attention_block import attention_block_one_launch

    fa, (a, b) = _frame(m), weights[0]
    check = _check(lambda: attention_block_one_launch(xq, xs, a, b, fa, torch.bfloat16),
                   lambda: _separate(xq, xs, a, b, fa))
    if DRY:
        print(f"attention M={m:3d}  check {check}", flush=True)
        return {"part": "attention", "M": m, "check": check}
    us = _time(_attention_variants(xq, xs, weights, fa), m)
    _print("attention", m, us, "separate", check)
    return {"part": "attention", "M": m, "check": check, "us": us}


def _weights(n: int, k: int, copies: int) -> list:
    from ttsfleet.kernels.ops import quantize_weight

    return [quantize_weight(torch.randn(n, k, device=DEV) / k**0.5, "bsgemm_fp8") for _ in range(copies)]


def main() -> None:
    from ttsfleet.kernels import dispatch
    from ttsfleet.kernels.bench import INTER, H, copy_bandwidth, n_copies
    from ttsfleet.kernels.ops import quantize_activation

    if DRY:
        dispatch.configure("interpret")
    bw = float("nan") if DRY else copy_bandwidth()
    n_qkv, hd = (HEADS + 2 * KV) * HEAD_DIM, HEADS * HEAD_DIM
    copies = (1, 1) if DRY else (n_copies(3 * H * INTER), n_copies(n_qkv * H + H * hd))
    mlp_w = list(zip(_weights(2 * INTER, H, copies[0]), _weights(H, INTER, copies[0]), strict=True))
    att_w = list(zip(_weights(n_qkv, H, copies[1]), _weights(H, hd, copies[1]), strict=True))
    floors = {"mlp": 3 * H * INTER / bw * 1e6, "attention": (n_qkv * H + H * hd) / bw * 1e6}
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S"),
                              "gpu": "interpreter (dry run)" if DRY else torch.cuda.get_device_name(),
                              "copy_bw_gbs": bw / 1e9, "floor_us": floors, "rows": []}
    print(f"{result['gpu']}  copy {bw / 1e9:.0f} GB/s  weight floors (us): "
          + "  ".join(f"{k} {v:.1f}" for k, v in floors.items()), flush=True)
    for m in MS:
        xq, xs = quantize_activation(torch.randn(m, H, device=DEV, dtype=torch.bfloat16))
        if "mlp" in PARTS:
            result["rows"].append(_mlp_row(m, xq, xs, mlp_w))
        if "attention" in PARTS:
            result["rows"].append(_attention_row(m, xq, xs, att_w))
    with open(os.path.join(os.environ.get("OUT", "."), "one_launch.json"), "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
