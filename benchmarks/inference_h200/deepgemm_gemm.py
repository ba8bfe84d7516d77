"""Issue #26: DeepGEMM's block-scaled FP8 GEMM beside ours at the S2 Pro decode shapes, one process.

Why: the issue's anchors are published figures — DeepGEMM's 1 x 128 / 128 x 128 GEMMs (our numeric
contract) at 1.7-2.7 TB/s for M = 64 on an H800, and fish-scales-ops, the write-up's own kernel library,
which runs DeepGEMM's JIT on sm_90. Ours streams the weights at 26-67 % of the copy bandwidth at M = 64
(H100, 2026-12-07c). Measuring DeepGEMM on the same GPU, shapes and inputs says how much of that gap a
kernel of the same contract closes — whether to build a backend on it — instead of comparing with
numbers from other machines.

Per shape (qkv, o, gate_up as one linear, down) x M (1, 16, 64, 128 by default):

* checks: DeepGEMM's output and ours against the contract's reference (``linear_fp8_ref``, the same
  activation codes and scales): both must agree with it to float32 accumulation order;
* timing (CUDA only): µs per GEMM from a CUDA graph of 20 launches cycling weight copies of >= 200 MB
  (``kernels.bench.safe_us``): ``ours`` (codes in, today's decode config), ``deepgemm``
  (``deep_gemm.fp8_gemm_nt`` on the same codes and float32 scales, its layout transform of the
  activation scales included, as a decode step calling it would pay), ``cublas`` (cuBLAS's block-scaled
  FP8 GEMM of the same contract, the prefill path's: where it beats ours at a decode M, the catalog's
  ``prefill_gemm_min_rows`` could come down for that shape), ``bf16`` (cuBLAS, twice the bytes).

DeepGEMM is not a dependency: it is built on the device from ``.ext/deepgemm.tgz``
(``deepgemm_bundle.sh``, ``speed_run.sh deepgemm``). Where it does not import, each row says why and
ours is still checked and timed. Without CUDA: tiny shapes through Triton's interpreter, no timing — a
check of the harness (``tests/kernels/test_deepgemm_bench.py``).

Usage (device, repo root): ``python3 -m benchmarks.inference_h200.deepgemm_gemm [OUT_DIR]``.
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

from ttsfleet.kernels import cublas_fp8  # noqa: E402
from ttsfleet.kernels import triton_gemm as tg  # noqa: E402
from ttsfleet.kernels.reference import linear_fp8_ref  # noqa: E402
from ttsfleet.kernels.testing import rel_err  # noqa: E402
from ttsfleet.kernels.triton_quant import quantize_activation_triton  # noqa: E402

from benchmarks.inference_h200.decode_gemm_rows import (  # noqa: E402
    DEV,
    S2PRO_SHAPES,
    finish_report,
    rotated,
    run_rows,
    start_report,
    time_us,
)

SHAPES = S2PRO_SHAPES if CUDA else {"tiny": (128, 256)}
MS = tuple(int(v) for v in os.environ.get("DG_MS", "1,16,64,128").split(","))
DEADLINE_S = float(os.environ.get("DG_DEADLINE_S", "200"))
T0 = time.time()


def load_deepgemm() -> tuple[Any, str]:
    """The ``deep_gemm`` module, or None and why not (its import error, or no GPU)."""
    if not CUDA:
        return None, "no CUDA"
    try:
        import deep_gemm
    except Exception as exc:  # noqa: BLE001 - any import failure is the row's answer, not a crash
        return None, f"{type(exc).__name__}: {exc}"[:300]
    return deep_gemm, ""


def _time_us(fn: Any, copies: list[Any]) -> float | None:
    return time_us(rotated(fn, copies), T0, DEADLINE_S)


def measure_row(name: str, n: int, k: int, m: int, ws: list[torch.Tensor], qws: list[Any],
                gen: torch.Generator, dg: Any = None) -> dict[str, Any]:
    """One shape x M: each method's output checked against the contract's reference, then timed."""
    x = torch.randn(m, k, device=DEV, generator=gen).to(torch.bfloat16)
    xq, xs = quantize_activation_triton(x, tg.act_group("bsgemm_fp8"))
    ref = linear_fp8_ref(x, qws[0]).float()
    row: dict[str, Any] = {"op": name, "N": n, "K": k, "M": m, "us": {}, "check": {},
                           "weight_bytes": n * k + qws[0].scale.numel() * 4}

    def ours(q: Any) -> torch.Tensor:
        return tg.linear_fp8_codes_triton(xq, xs, q, torch.bfloat16)

    row["check"]["ours_rel_err_ref"] = rel_err(ours(qws[0]).float(), ref)
    row["us"]["ours"] = _time_us(ours, qws)
    if dg is not None:
        out = torch.empty(m, n, device=DEV, dtype=torch.bfloat16)

        def deepgemm(q: Any) -> torch.Tensor:
            dg.fp8_gemm_nt((xq, xs), (q.qweight, q.scale), out)
            return out

        try:
            row["check"]["deepgemm_rel_err_ref"] = rel_err(deepgemm(qws[0]).float(), ref)
            row["us"]["deepgemm"] = _time_us(deepgemm, qws)
        except Exception as exc:  # noqa: BLE001 - a shape it refuses is a result, the others still run
            row["deepgemm_error"] = f"{type(exc).__name__}: {exc}"[:300]
    if CUDA and cublas_fp8.supports(qws[0]):
        def cublas(q: Any) -> torch.Tensor:
            return cublas_fp8.gemm_codes(xq, xs, q, torch.bfloat16)

        row["check"]["cublas_rel_err_ref"] = rel_err(cublas(qws[0]).float(), ref)
        row["us"]["cublas"] = _time_us(cublas, qws)
    row["us"]["bf16"] = _time_us(partial(torch.nn.functional.linear, x), ws)
    return row


def print_row(row: dict[str, Any], bw: float | None) -> None:
    cells = "  ".join(f"{k} {v:6.2f}" if v else f"{k}    -  " for k, v in row["us"].items())
    fp8 = {k: v for k, v in row["us"].items() if v and k != "bf16"}
    pct = "" if not bw else " | % copy bw " + " ".join(
        f"{k} {100 * row['weight_bytes'] / (v * 1e-6) / bw:.0f}" for k, v in fp8.items())
    errs = " ".join(f"{k.split('_')[0]} {v:.1e}" for k, v in row["check"].items())
    note = f" | deepgemm: {row['deepgemm_error']}" if "deepgemm_error" in row else ""
    head = f"{row['op']:8s} {row['N']:5d}x{row['K']:<5d} M={row['M']:<3d}"
    print(f"{head} err vs ref: {errs} | us {cells}{pct}{note}", flush=True)


def main(argv: list[str]) -> int:
    out_dir = Path(argv[0] if argv else os.environ.get("OUT", "/tmp"))
    out_dir.mkdir(parents=True, exist_ok=True)
    dg, why = load_deepgemm()
    report, bw = start_report()
    report.update(deepgemm=getattr(dg, "__version__", "imported") if dg else None, deepgemm_unavailable=why)
    print(f"{report['device']}; torch {torch.__version__}; copy bandwidth {report['copy_bw_TBps']} TB/s; "
          f"deep_gemm {report['deepgemm'] or 'unavailable: ' + why}", flush=True)
    gen = torch.Generator(device=DEV).manual_seed(26)
    run_rows(report, SHAPES, MS, partial(measure_row, dg=dg), partial(print_row, bw=bw),
             out_dir / "deepgemm_gemm.json", T0, DEADLINE_S, gen)
    finish_report(report, out_dir / "deepgemm_gemm.json", len(SHAPES))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
