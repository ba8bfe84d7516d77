"""Prefill through the catalog's GEMM split, side by side with our kernels alone (S2 Pro shape, FP8).

Why: the FP8 Triton GEMMs are tuned for decode rows; ``prefill_gemm: cublas_blockwise`` sends
GEMMs of at least ``prefill_gemm_min_rows`` rows to cuBLAS's block-scaled kernel (same numeric
contract). This times, in one process on one GPU: each GEMM shape and the MLP at rows 64 .. 4096
in both libraries (CUDA events, median of 20; weights rotated through > 200 MB so L2 does not serve
them), then ``model.prefill_batch`` of 1 / 4 / 16 prompts of 512 tokens with the split on and off,
and checks that both give the same greedy main token after each prompt.
Usage on the device: ``python3 -m benchmarks.inference_h200.prefill_dispatch OUT.json``.
"""

from __future__ import annotations

import json
import statistics
import sys

import torch
from ttsfleet.inference.loader import load_model
from ttsfleet.kernels import cublas_fp8, dispatch, triton_gemm, triton_mlp
from ttsfleet.kernels.ops import quantize_activation, quantize_weight

from benchmarks.inference_h200.prefill_graphs_bench import random_pieces
from ttsfleet.catalog import GpuCatalog

SHAPES = {"qkv": (6144, 2560), "o": (2560, 4096), "gate_up": (19456, 2560), "down": (2560, 9728)}
ROWS = (64, 128, 192, 256, 384, 512, 1024, 2048, 4096)


def timed(fn, reps: int = 20) -> float:  # noqa: ANN001
    for _ in range(3):
        fn(0)
    out = []
    for i in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(i)
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) * 1000)
    return statistics.median(out)


def _weight(g: torch.Generator, n: int, k: int):  # noqa: ANN202
    return quantize_weight((torch.randn(n, k, generator=g) / k ** 0.5).cuda(), "bsgemm_fp8")


def gemm_rows() -> list[dict]:
    g = torch.Generator().manual_seed(0)
    rows = []
    for name, (n, k) in SHAPES.items():
        copies = max(2, int(2e8 // (n * k)) + 1)
        ws = [_weight(g, n, k) for _ in range(copies)]
        for m in ROWS:
            xq, xs = quantize_activation(torch.randn(m, k, generator=g).cuda().bfloat16(), 128)
            ours = timed(lambda i, a=(xq, xs), w=ws: triton_gemm.linear_fp8_codes_triton(
                *a, w[i % len(w)], torch.bfloat16))
            cub = timed(lambda i, a=(xq, xs), w=ws: cublas_fp8.gemm_codes(*a, w[i % len(w)], torch.bfloat16))
            rows.append({"op": name, "m": m, "ours_us": round(ours, 2), "cublas_us": round(cub, 2)})
            print(f"{name:8} M={m:5}: ours {ours:8.1f} us  cuBLAS {cub:8.1f} us", flush=True)
    d, f = 2560, 9728
    gus = [_weight(g, 2 * f, d) for _ in range(3)]
    dns = [_weight(g, d, f) for _ in range(3)]
    for m in ROWS:
        xq, xs = quantize_activation(torch.randn(m, d, generator=g).cuda().bfloat16(), 128)
        ours = timed(lambda i, a=(xq, xs): triton_mlp.swiglu_mlp_fp8_triton(
            a[0], gus[i % 3], dns[i % 3], x_scale=a[1], out_dtype=torch.bfloat16))
        cub = timed(lambda i, a=(xq, xs): cublas_fp8.swiglu_mlp_codes(
            *a, gus[i % 3], dns[i % 3], torch.bfloat16))
        rows.append({"op": "mlp", "m": m, "ours_us": round(ours, 2), "cublas_us": round(cub, 2)})
        print(f"mlp      M={m:5}: ours {ours:8.1f} us  cuBLAS {cub:8.1f} us", flush=True)
    return rows


def prefill_rows() -> list[dict]:
    # explicit on both sides: taking the built-in catalog as one side compared Triton with Triton
    # while it had the split off (run1 of 2026-12-02)
    split, alone = (GpuCatalog.default().with_class("h200", prefill_gemm=gemm)
                    for gemm in ("cublas_blockwise", "triton"))
    # the gate preset: S2 Pro's layout with trained-model-like greedy margins, so "the greedy token
    # agrees" tests the numerics, not near-ties of random logits (run of 2026-12-02 on "s2-pro":
    # 1 of 3 agreed)
    model = load_model("s2-pro-gate", device="cuda", dtype=torch.bfloat16, quantize="bsgemm_fp8",
                       max_seq_len=1024)
    g = torch.Generator().manual_seed(1)
    cache = model.new_cache(16, 1024)
    rows = []
    for n in (1, 4, 16):
        pieces = random_pieces(model, n, g, lo=512, hi=513)
        res = {}
        for label, cat in (("ours", alone), ("split", split)):
            dispatch.use_catalog(cat)
            ms = timed(lambda i, p=pieces: model.prefill_batch(cache, p), reps=5) / 1000
            res[label] = (ms, cache.pending_logits[:n].argmax(-1).cpu())
        agree = bool(torch.equal(res["ours"][1], res["split"][1]))
        rows.append({"prompts": n, "tokens": 512 * n, "ours_ms": round(res["ours"][0], 2),
                     "split_ms": round(res["split"][0], 2),
                     "split_tokens_per_s": round(512 * n / res["split"][0] * 1000),
                     "greedy_main_token_agrees": agree})
        print(rows[-1], flush=True)
    dispatch.use_catalog(GpuCatalog.default())
    return rows


def main() -> None:
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "gemm": gemm_rows(),
              "prefill": prefill_rows()}
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
