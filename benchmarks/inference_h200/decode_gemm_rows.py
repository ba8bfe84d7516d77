"""What the decode-GEMM side-by-side benchmarks share (``w8a16_gemm.py``, ``deepgemm_gemm.py``): the S2 Pro
decode shapes, weight copies that L2 cannot serve, graph timing under a deadline, and the loop over shape x
M that writes the JSON after every row.

Why one place: each benchmark compares one candidate kernel with ours on the same inputs; the way a row is
timed and recorded must be the same for all of them, or their tables do not compare.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from ttsfleet.kernels.reference import quantize_weight_ref

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
#: One layer pass's four GEMMs (gate_up as one linear): (N, K).
S2PRO_SHAPES = {"qkv": (6144, 2560), "o": (2560, 4096), "gate_up": (19456, 2560), "down": (2560, 9728)}
ROTATE_BYTES = 200 * 2**20
GRAPH_CALLS = 20


def start_report() -> tuple[dict[str, Any], float | None]:
    """The report's head (date, device, torch, the copy bandwidth measured now) and that bandwidth in
    bytes/s (None on CPU): each row's % of it is the issue's measure."""
    bw = None
    if CUDA:
        from ttsfleet.kernels.bench import copy_bandwidth

        bw = copy_bandwidth()
    report: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": torch.cuda.get_device_name() if CUDA else "cpu (interpreter, tiny shapes: a harness check)",
        "torch": torch.__version__, "copy_bw_TBps": round(bw / 1e12, 3) if bw else None, "rows": []}
    return report, bw


def weights(n: int, k: int, gen: torch.Generator) -> tuple[list[torch.Tensor], list[Any]]:
    """bf16 weights and their block-scaled FP8 forms, enough copies (>= 200 MB on a GPU) that a graph
    cycling through them never has its weights served from L2."""
    copies = max(2, math.ceil(ROTATE_BYTES / (n * k))) if CUDA else 1
    ws = [(torch.randn(n, k, device=DEV, generator=gen) / k**0.5).to(torch.bfloat16) for _ in range(copies)]
    return ws, [quantize_weight_ref(w, "bsgemm_fp8") for w in ws]


def rotated(fn: Callable[[Any], Any], copies: list[Any]) -> list[Callable[[], Any]]:
    """GRAPH_CALLS calls of ``fn``, each on the next weight copy."""
    return [lambda c=copies[i % len(copies)]: fn(c) for i in range(GRAPH_CALLS)]


def time_us(fns: list[Callable[[], Any]], started: float, deadline_s: float) -> float | None:
    """µs per call from a CUDA graph of ``fns`` (``kernels.bench.safe_us``); None on CPU, past the
    deadline, or where a launch failed (safe_us prints why)."""
    if not CUDA or time.time() - started > deadline_s:
        return None
    from ttsfleet.kernels.bench import safe_us

    us = safe_us(fns)
    return None if math.isnan(us) else us


def run_rows(report: dict[str, Any], shapes: dict[str, tuple[int, int]], ms: tuple[int, ...],
             measure: Callable[..., dict[str, Any]], show: Callable[[dict[str, Any]], None], out_json: Path,
             started: float, deadline_s: float, gen: torch.Generator) -> None:
    """``measure(name, n, k, m, ws, qws, gen)`` for every shape x M into ``report["rows"]``, each row shown
    and the JSON rewritten as it lands; past the deadline a row is recorded as skipped, never dropped."""
    for name, (n, k) in shapes.items():
        ws, qws = weights(n, k, gen)
        for m in ms:
            if time.time() - started > deadline_s:
                report["rows"].append({"op": name, "M": m, "skipped": "deadline"})
                continue
            row = measure(name, n, k, m, ws, qws, gen)
            report["rows"].append(row)
            show(row)
            report["elapsed_s"] = round(time.time() - started, 1)
            out_json.write_text(json.dumps(report, indent=1))
        del ws, qws


#: Layer passes a decode step runs: 36 slow layers + 4 fast layers x 10 codebook positions.
LAYER_PASSES = 76


def step_estimate(rows: list[dict[str, Any]], n_shapes: int) -> dict[str, dict[str, float]]:
    """Per M with all ``n_shapes`` shapes timed: ms a step spends in the four GEMMs (qkv, o, gate_up,
    down) by each method timed at every one, LAYER_PASSES times one row each. An estimate of what wiring
    a kernel in would move (gate_up runs as the fused SwiGLU kernel in the step: the same weight bytes),
    not a step measurement; ``best_fp8``: each shape on its fastest FP8 method (bf16 is another
    contract, twice the weight bytes)."""
    out: dict[str, dict[str, float]] = {}
    for m in sorted({r["M"] for r in rows if "us" in r}):
        at_m = [r for r in rows if r.get("M") == m and "us" in r]
        if len(at_m) != n_shapes:
            continue
        methods = set.intersection(*({k for k, v in r["us"].items() if v} for r in at_m))
        est = {k: round(LAYER_PASSES * sum(r["us"][k] for r in at_m) / 1e3, 3) for k in sorted(methods)}
        fp8 = [k for k in methods if k != "bf16"]
        if len(fp8) > 1:  # each shape on its fastest FP8 kernel: what a per-shape dispatch would give
            est["best_fp8"] = round(LAYER_PASSES * sum(min(r["us"][k] for k in fp8) for r in at_m) / 1e3, 3)
        out[str(m)] = est
    return out


def finish_report(report: dict[str, Any], out_json: Path, n_shapes: int) -> None:
    """The step estimate added, printed and written with the rest."""
    report["step_estimate"] = step_estimate(report["rows"], n_shapes)
    for m, est in report["step_estimate"].items():
        if not est:  # nothing timed at this M (the CPU harness)
            continue
        print(f"M={m}: the step's {LAYER_PASSES} layer passes of these four GEMMs: "
              + ", ".join(f"{k} {v:.2f} ms" for k, v in est.items()), flush=True)
    out_json.write_text(json.dumps(report, indent=1))
