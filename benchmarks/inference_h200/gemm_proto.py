"""Issue #26 prototype check on one H200: the Gluon FP8 decode GEMM against the reference, today's
Triton kernel, cuBLAS block-scaled FP8 and torch bf16, at the S2 Pro decode shapes, in one short call.

Why one script: the Gluon kernel (``kernels/gluon_gemm.py``) was written and compiled for sm_90a
without a GPU; this is its first run. Per shape x M (qkv, o, gate_up, down x M = 1, 8, 16, 32, 64):

1. correctness: the Gluon kernel into a NaN-poisoned output vs the torch reference on the same FP8
   codes (float32 math, ``TOL_SAME_CODES_BF16`` as tests/kernels/test_gpu.py) and vs
   ``linear_fp8_codes_triton``; run twice (bitwise equal: the split-K fix-up sums in slot order) and
   replayed from a CUDA graph twice (equal again: the tickets reset themselves). A compile or launch
   error becomes a FAIL row, never the end of the run.
2. timing: each method replayed from a CUDA graph of 20 launches cycling through enough weight
   copies (>= 200 MB) that L2 does not serve the weights, median of 10 replays, µs per GEMM; weight
   bytes / time as GB/s and as % of the copy bandwidth measured in the same process (as
   ``step_bench.py``). Methods: ``gluon`` (the config table), ``triton`` (today's kernel, its tuned
   table), ``cublas_bw`` (``kernels/cublas_fp8.gemm_codes``: cuBLAS 1x128 / 128x128 block-scaled),
   ``bf16`` (torch bf16 matmul), and Gluon variants while time is left: ``g_nopdl`` (no
   programmatic dependent launch: no weight prefetch before the previous kernel ends), ``g_occ2``
   (two CTAs per SM, half the stages), ``g_bn64`` (64-row weight tiles, M >= 32).

Bounded to < 150 s: a deadline skips what is left (SKIP rows), compiles happen on the first call of
each config (~1-3 s each; 4 for the table, 4 per variant). JSON to ``$OUT/gemm_proto.json``.
Usage on the device, from the repo root: ``benchmarks/inference_h200/speed_run.sh gemmproto`` (its
wheels and ``ttsfleet/<component>`` links), or ``python3 -m benchmarks.inference_h200.gemm_proto``.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import triton
from ttsfleet.kernels import gluon_gemm as gg
from ttsfleet.kernels.bench import copy_bandwidth
from ttsfleet.kernels.reference import linear_fp8_codes_ref, quantize_activation_ref, quantize_weight_ref
from ttsfleet.kernels.testing import TOL_SAME_CODES_BF16, rel_err
from ttsfleet.kernels.workspaces import new_owner, workspace_scope

T0 = time.time()
DEADLINE_S = float(os.environ.get("GEMM_PROTO_DEADLINE_S", "140"))
GRAPH_CALLS = 20
REPLAYS = 10
ROTATE_BYTES = 200 * 2**20
MS = (1, 8, 16, 32, 64)
DEV = "cuda"  # a CPU dry run of the script's own logic (stand-in kernels) sets "cpu"




def left() -> float:
    return DEADLINE_S - (time.time() - T0)


def graph_us(calls: list[Callable[[], Any]]) -> float:
    """µs per call: ``calls`` captured into one CUDA graph, median of REPLAYS replays."""
    with workspace_scope(new_owner("gemm-proto")):  # the warm-up makes the workspaces the graph bakes
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm-up (compiles) outside the capture
            for c in calls:
                c()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        s.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for c in calls:
                c()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPLAYS):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    del g
    return statistics.median(times) * 1e3 / len(calls)


HANG_S = 20.0
_ON_HANG: list[Callable[[], None]] = []


def _wait_or_exit(what: str) -> None:
    """Wait for the GPU, at most HANG_S seconds: a kernel that never finishes (an mbarrier whose
    transaction bytes never arrive) cannot be killed from here, so say which launch hung, save the
    JSON and exit (code 3) instead of spending the call's whole time limit."""
    ev = torch.cuda.Event()
    ev.record()
    t0 = time.time()
    while not ev.query():
        if time.time() - t0 > HANG_S:
            print(f"HANG: {what} did not finish in {HANG_S:.0f} s; exiting", flush=True)
            for fn in _ON_HANG:
                fn()
            os._exit(3)
        time.sleep(0.0005)


def _err(exc: BaseException) -> str:
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {' | '.join(lines[:1] + lines[-2:])[:300]}"


def check_gluon(xq: torch.Tensor, xs: torch.Tensor, qw: Any, ref: torch.Tensor, tri: torch.Tensor | None,
                cfg: gg.GluonConfig | None, pdl: bool) -> dict[str, Any]:
    """Correctness of one Gluon config: vs reference and Triton, repeatable, graph-replayable (the
    graph is captured on a stream whose workspace exists before the capture, so no memset of the
    tickets is captured with it: a ticket the kernel failed to reset would show on replay)."""
    m, n = xq.shape[0], qw.shape[0]
    r: dict[str, Any] = {}
    out = torch.full((m, n), float("nan"), device=DEV, dtype=torch.bfloat16)
    t0 = time.time()
    gg.gluon_linear_fp8_codes(xq, xs, qw, torch.bfloat16, cfg=cfg, pdl=pdl, out=out)  # compiles if new
    r["first_call_s"] = round(time.time() - t0, 2)
    _wait_or_exit(f"Gluon {cfg or 'table config'} pdl={pdl} N={n} K={xq.shape[1]} M={m}")
    r["rel_err_ref"] = rel_err(out, ref)
    if tri is not None:
        r["rel_err_triton"] = rel_err(out, tri)
    again = gg.gluon_linear_fp8_codes(xq, xs, qw, torch.bfloat16, cfg=cfg, pdl=pdl)
    r["repeatable"] = bool(torch.equal(again, out))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gg.gluon_linear_fp8_codes(xq, xs, qw, torch.bfloat16, cfg=cfg, pdl=pdl)  # this stream's workspace
    s.synchronize()
    gout = torch.full((m, n), float("nan"), device=DEV, dtype=torch.bfloat16)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        gg.gluon_linear_fp8_codes(xq, xs, qw, torch.bfloat16, cfg=cfg, pdl=pdl, out=gout)
    ok = True
    for _ in range(3):
        gout.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ok = ok and bool(torch.equal(gout, out))
    r["graph_replay_equal"] = ok
    r["ok"] = (r["rel_err_ref"] < TOL_SAME_CODES_BF16 and r.get("rel_err_triton", 0.0) < TOL_SAME_CODES_BF16
               and r["repeatable"] and ok)
    return r


def _time(row: dict[str, Any], name: str, fn: Callable[[Any], Any], weights: list[Any]) -> None:
    if left() < 3:
        row["us"][name] = None
        return
    try:
        row["us"][name] = graph_us([partial(fn, weights[i % len(weights)]) for i in range(GRAPH_CALLS)])
    except Exception as exc:
        row["us"][name] = None
        row["check"].setdefault("timing_errors", {})[name] = _err(exc)


def _gluon_fn(xq: torch.Tensor, xs: torch.Tensor, cfg: gg.GluonConfig | None,
              pdl: bool) -> Callable[[Any], Any]:
    return lambda q: gg.gluon_linear_fp8_codes(xq, xs, q, torch.bfloat16, cfg=cfg, pdl=pdl)


def _triton_fn(xq: torch.Tensor, xs: torch.Tensor, q: Any) -> torch.Tensor:
    from ttsfleet.kernels.triton_gemm import linear_fp8_codes_triton

    return linear_fp8_codes_triton(xq, xs, q, torch.bfloat16)


def _cublas_fn(xq: torch.Tensor, xs: torch.Tensor, q: Any) -> torch.Tensor:
    from ttsfleet.kernels import cublas_fp8

    return cublas_fp8.gemm_codes(xq, xs, q, torch.bfloat16)


def _print_row(row: dict[str, Any], bw: float) -> None:
    g = row["check"].get("gluon", {})
    us = "  ".join(f"{k} {v:6.2f}" if v else f"{k}   -   " for k, v in row["us"].items())
    pct = {k: 100 * row["weight_bytes"] / (v * 1e-6) / bw for k, v in row["us"].items() if v and k != "bf16"}
    best = min((v, k) for k, v in row["us"].items() if v) if any(row["us"].values()) else (None, "-")
    print(f"{'ok  ' if g.get('ok') else 'FAIL'} {row['op']:7s} {row['N']:5d}x{row['K']:<5d} M={row['M']:<3d} "
          f"err ref {g.get('rel_err_ref', float('nan')):.2e} tri {g.get('rel_err_triton', float('nan')):.2e} "
          f"rep {g.get('repeatable')} graph {g.get('graph_replay_equal')} | us {us} | % copy bw "
          + " ".join(f"{k} {v:.0f}" for k, v in pct.items()) + f" | best {best[1]}"
          + (f" | {g['error']}" if "error" in g else ""), flush=True)


def main() -> int:
    out_dir = os.environ.get("OUT", "/tmp")
    os.makedirs(out_dir, exist_ok=True)
    ok, why = gg.available()
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    print(f"{dev}; torch {torch.__version__}; triton {triton.__version__}; gluon available: {ok} {why}",
          flush=True)
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    from ttsfleet.kernels.triton_gemm import linear_fp8_codes_triton

    report: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "device": dev,
        "torch": torch.__version__, "triton": triton.__version__, "copy_bw_TBps": round(bw / 1e12, 3),
        "gluon_available": ok, "gluon_why_not": why, "timing": (
            f"CUDA graph of {GRAPH_CALLS} launches cycling >= {ROTATE_BYTES >> 20} MB of weight copies, "
            f"median of {REPLAYS} replays, us per GEMM"),
        "configs": {f"{n}x{k}:M{b}": vars(c) for (n, k, b), c in gg.CONFIGS.items()},
        "rows": [],
    }

    def save() -> None:  # after every row: a run cut short keeps what it measured
        report["elapsed_s"] = round(time.time() - T0, 1)
        with open(os.path.join(out_dir, "gemm_proto.json"), "w") as fh:
            json.dump(report, fh, indent=1)

    _ON_HANG.append(save)
    for b in gg.M_BUCKETS:
        alts = [f"{k}={c or 'table'}" + ("" if p else " (no PDL)")
                for k, (c, p) in gg.variants(b).items() if k != "gluon"]
        print(f"config M<={b}: {gg.get_config(0, 0, b)}; variants " + ", ".join(alts), flush=True)
    gen = torch.Generator(device=DEV).manual_seed(26)
    weights: dict[str, tuple[list[torch.Tensor], list[Any]]] = {}
    for name, (n, k) in gg.S2_SHAPES.items():
        copies = max(2, math.ceil(ROTATE_BYTES / (n * k)))
        ws = [torch.randn(n, k, device=DEV, generator=gen, dtype=torch.bfloat16) / k**0.5
              for _ in range(copies)]
        weights[name] = (ws, [quantize_weight_ref(w, "bsgemm_fp8") for w in ws])
    cases = []
    # phase 1: every shape x M -- the table's Gluon config checked and timed beside the baselines
    for name, (n, k) in gg.S2_SHAPES.items():
        ws, qws = weights[name]
        for m in MS:
            row: dict[str, Any] = {"op": name, "N": n, "K": k, "M": m,
                                   "weight_bytes": n * k + qws[0].scale.numel() * 4,
                                   "config": vars(gg.get_config(n, k, m)), "check": {}, "us": {}}
            report["rows"].append(row)
            if left() < 5:
                print(f"SKIP {name} M={m}: deadline", flush=True)
                row["skipped"] = "deadline"
                continue
            x = torch.randn(m, k, device=DEV, generator=gen, dtype=torch.bfloat16)
            xq, xs = quantize_activation_ref(x)
            ref = linear_fp8_codes_ref(xq, xs, qws[0], torch.float32)
            try:
                tri = linear_fp8_codes_triton(xq, xs, qws[0], torch.bfloat16)
                row["check"]["triton_rel_err_ref"] = rel_err(tri, ref)
            except Exception as exc:
                tri = None
                row["check"]["triton_error"] = _err(exc)
            try:
                row["check"]["gluon"] = check_gluon(xq, xs, qws[0], ref, tri, None, True)
            except Exception as exc:
                row["check"]["gluon"] = {"ok": False, "error": _err(exc)}
                traceback.print_exc(limit=4)
            if row["check"]["gluon"].get("ok"):
                _time(row, "gluon", _gluon_fn(xq, xs, None, True), qws)
            _time(row, "triton", partial(_triton_fn, xq, xs), qws)
            _time(row, "cublas_bw", partial(_cublas_fn, xq, xs), qws)
            _time(row, "bf16", lambda w, x=x: torch.nn.functional.linear(x, w), ws)
            _print_row(row, bw)
            cases.append((row, xq, xs, ref, tri))
            save()
    # phase 2, while time is left: Gluon variants (each a compile per token tile), same checks
    print("variants: g_nopdl (no PDL), g_occ2 (2 CTAs/SM, half the stages), g_bn64 (64-row tiles)",
          flush=True)
    for vname in ("g_nopdl", "g_occ2", "g_bn64"):
        for row, xq, xs, ref, tri in cases:
            if left() < 15:
                break
            var = gg.variants(row["M"]).get(vname)
            if var is None:
                continue
            cfg, pdl = var
            try:
                row["check"][vname] = check_gluon(xq, xs, weights[row["op"]][1][0], ref, tri, cfg, pdl)
            except Exception as exc:
                row["check"][vname] = {"ok": False, "error": _err(exc)}
            if row["check"][vname].get("ok"):
                _time(row, vname, _gluon_fn(xq, xs, cfg, pdl), weights[row["op"]][1])
            else:
                print(f"FAIL variant {vname} {row['op']} M={row['M']}: {row['check'][vname]}", flush=True)
            save()
    print("\nsummary (us per GEMM; % of copy bandwidth in brackets):", flush=True)
    names = ["gluon", "g_nopdl", "g_occ2", "g_bn64", "triton", "cublas_bw", "bf16"]
    print(f"{'op':8s} {'M':>3s} " + " ".join(f"{k:>14s}" for k in names), flush=True)
    fails = 0
    for row in report["rows"]:
        row["GBps"] = {k: (row["weight_bytes"] / (v * 1e-6) / 1e9 if v else None)
                       for k, v in row["us"].items()}
        row["pct_copy_bw"] = {k: (100 * row["weight_bytes"] / (v * 1e-6) / bw if v else None)
                              for k, v in row["us"].items() if k != "bf16"}
        fails += not row["check"].get("gluon", {}).get("ok")
        cells = []
        for k in names:
            v = row["us"].get(k)
            p = row["pct_copy_bw"].get(k)
            cells.append(f"{v:7.2f} ({p:3.0f}%)" if v and p else (f"{v:7.2f}       " if v else f"{'-':>14s}"))
        print(f"{row['op']:8s} {row['M']:3d} " + " ".join(cells), flush=True)
    report["gluon_fail_rows"] = fails
    save()
    print(f"done in {report['elapsed_s']} s; gluon FAIL rows: {fails}; JSON: {out_dir}/gemm_proto.json",
          flush=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
