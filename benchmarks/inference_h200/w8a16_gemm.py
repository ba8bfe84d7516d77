"""Issue #26: the W8A16 decode GEMM prototype beside today's FP8 block-scaled kernel, per S2 Pro shape.

Why: at M = 64 today's block-scaled FP8 GEMMs stream their weights at 26-57 % of the copy bandwidth
(H100/H200 sweeps), against 54-77 % at M = 1, and they are 5.6 ms of a 9.1 ms step at batch 64. The
block-scaled product needs a float32 rescale of each 128-K block's MMA result before the next adds
to it, which keeps Triton's pipeliner from queueing a tile's MMAs. The prototype
(:func:`ttsfleet.kernels.triton_gemm.linear_w8a16_triton`) reads the same FP8 weight bytes, widens each
tile to bf16 with its scale applied, and keeps the activations in bf16, so the MMAs accumulate in
place. This measures whether that buys speed, and what it does to accuracy.

Per shape (qkv, o, gate_up as one linear, down) x M (1, 16, 64 by default):

* checks: the prototype against its own reference (``linear_w8a16_ref``: must agree to bf16 rounding),
  and both it and the FP8 path (``linear_fp8_ref`` math) against the exact bf16-operand linear;
* timing (CUDA only): µs per GEMM from a CUDA graph of 20 launches cycling weight copies of >= 200 MB
  (L2 does not serve them; ``kernels.bench.graph_us``): ``fp8_codes`` (today's decode path: codes from
  the fused norm, the tuned table's config), ``fp8_quant`` (bf16 in: the quantize launch + GEMM, the
  same input as the prototype's), each prototype config (``a16_config_space``) and the best of them,
  ``bf16`` (torch's linear on bf16 weights: twice the bytes).

A deadline (``W8A16_DEADLINE_S``, default 200 s) skips what is left, never the JSON. Without CUDA it
runs tiny shapes through Triton's interpreter with no timing: a check of the harness
(``tests/kernels/test_w8a16_bench.py``), not a measurement.

Usage (device, repo root): ``python3 -P benchmarks/inference_h200/w8a16_gemm.py`` (JSON + table to
``$OUT``, or the path given as the first argument).
"""

from __future__ import annotations

import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from ttsfleet.kernels import triton_gemm as tg  # noqa: E402
from ttsfleet.kernels.reference import linear_fp8_ref, linear_w8a16_ref  # noqa: E402
from ttsfleet.kernels.testing import rel_err  # noqa: E402

from benchmarks.inference_h200.decode_gemm_rows import (  # noqa: E402
    DEV,
    S2PRO_SHAPES,
    finish_report,
    rotated,
    run_rows,
    start_report,
    time_us,
)

SHAPES = S2PRO_SHAPES if CUDA else {"tiny_a": (192, 256), "tiny_b": (128, 384)}
MS = tuple(int(v) for v in os.environ.get("W8A16_MS", "1,16,64").split(","))
DEADLINE_S = float(os.environ.get("W8A16_DEADLINE_S", "200"))
T0 = time.time()


def _time_us(fn: Any, copies: list[Any]) -> float | None:
    """µs per call over rotated weight copies (``decode_gemm_rows.time_us``) under this run's deadline."""
    return time_us(rotated(fn, copies), T0, DEADLINE_S)


def _fp8_codes_fn(x: torch.Tensor) -> Any:
    from ttsfleet.kernels.triton_quant import quantize_activation_triton

    xq, xs = quantize_activation_triton(x, tg.act_group("bsgemm_fp8"))
    return lambda q: tg.linear_fp8_codes_triton(xq, xs, q, torch.bfloat16)


def measure_row(name: str, n: int, k: int, m: int, ws: list[torch.Tensor], qws: list[Any],
                gen: torch.Generator) -> dict[str, Any]:
    """One shape x M: the checks, then each method's time."""
    x = torch.randn(m, k, device=DEV, generator=gen).to(torch.bfloat16)
    exact = x.float() @ ws[0].float().t()
    own = linear_w8a16_ref(x, qws[0]).float()
    fp8_err = rel_err(linear_fp8_ref(x, qws[0]).float(), exact)
    weight_bytes = n * k + qws[0].scale.numel() * 4
    row: dict[str, Any] = {"op": name, "N": n, "K": k, "M": m, "weight_bytes": weight_bytes, "us": {},
                           "a16_configs": {}, "check": {"fp8_rel_err_exact": fp8_err}}
    for cfg in tg.a16_config_space(m, n, k):
        label = f"bn{cfg.bn}/split{cfg.split_k}/w{cfg.num_warps}"
        out = tg.linear_w8a16_triton(x, qws[0], cfg=cfg).float()
        row["check"][f"a16 {label} rel_err_ref"] = rel_err(out, own)
        row["check"].setdefault("a16_rel_err_exact", rel_err(out, exact))
        row["a16_configs"][label] = _time_us(lambda q, c=cfg: tg.linear_w8a16_triton(x, q, cfg=c), qws)
    timed = {k_: v for k_, v in row["a16_configs"].items() if v}
    if timed:
        best = min(timed, key=timed.get)
        row["us"]["a16"], row["a16_best"] = timed[best], best
    row["us"]["fp8_codes"] = _time_us(_fp8_codes_fn(x), qws)
    row["us"]["fp8_quant"] = _time_us(lambda q: tg.linear_fp8_triton(x, q), qws)
    row["us"]["bf16"] = _time_us(lambda w: torch.nn.functional.linear(x, w), ws)
    return row


def print_row(row: dict[str, Any], bw: float | None) -> None:
    us = row["us"]
    cells = "  ".join(f"{k} {v:6.2f}" if v else f"{k}    -  " for k, v in us.items())
    pct = "" if not bw else " | % copy bw " + " ".join(
        f"{k} {100 * row['weight_bytes'] / (v * 1e-6) / bw:.0f}" for k, v in us.items() if v and k != "bf16")
    chk = row["check"]
    errs = max(v for k, v in chk.items() if k.endswith("rel_err_ref"))
    print(f"{row['op']:8s} {row['N']:5d}x{row['K']:<5d} M={row['M']:<3d} err: a16 vs its ref {errs:.1e}, "
          f"vs exact a16 {chk['a16_rel_err_exact']:.2e} fp8 {chk['fp8_rel_err_exact']:.2e} | "
          f"us {cells}{pct} | best a16 {row.get('a16_best', '-')}", flush=True)


def main(argv: list[str]) -> int:
    out_dir = Path(argv[0] if argv else os.environ.get("OUT", "/tmp"))
    out_dir.mkdir(parents=True, exist_ok=True)
    report, bw = start_report()
    print(f"{report['device']}; torch {torch.__version__}; copy bandwidth {report['copy_bw_TBps']} TB/s",
          flush=True)
    gen = torch.Generator(device=DEV).manual_seed(26)
    run_rows(report, SHAPES, MS, measure_row, partial(print_row, bw=bw), out_dir / "w8a16_gemm.json",
             T0, DEADLINE_S, gen)
    finish_report(report, out_dir / "w8a16_gemm.json", len(SHAPES))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
