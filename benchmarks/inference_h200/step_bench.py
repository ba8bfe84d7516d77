"""The S2 Pro decode step on one GPU: time per batch size against its memory floor, and where it goes.

Why a script of its own (beside ``ttsfleet bench engine``): the step is what the kernels issue
targets, and its gap to the floor has to be split by measurement. Per batch size it replays the
whole step and its parts from CUDA graphs (``inference.bench_engine.step_breakdown``, the engine
bench's own method), then profiles one graph replay and sums the kernels' GPU time by family (FP8
GEMM, attention, norm, RoPE/KV store, sampler, heads, other) and counts the launches; step time minus
kernel time is the idle time between launches. The floor is every byte a frame must read once
(FP8 weights and scales of 36 slow + 4 fast layers x 10 positions, the float32 heads, the bf16 KV of
the contexts) over the measured copy bandwidth.

Usage on the GPU: ``python3 benchmarks/inference_h200/step_bench.py`` (JSON + markdown to $OUT).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import time
from collections import defaultdict
from typing import Any

import torch

BATCHES = [int(v) for v in os.environ.get("STEP_BATCHES", "1,8,32,64").split(",")]
PROFILE = [int(v) for v in os.environ.get("STEP_PROFILE", "1,64").split(",")]
CONTEXT = 576  # prompt 512 + half of 128 decoded frames, as the engine bench's breakdown
#: (family, kernel-name regex), first match wins: the one-launch kernels (GEMMs and attention in one
#: launch) before the families whose names they contain; cuBLAS's block-scaled FP8 GEMMs (``nvjet`` kernels
#: on FP8 operands, ``qq``: the catalog's prefill rows, decode batches from ``prefill_gemm_min_rows``)
#: before the heads' bf16 GEMMs (until 2026-12-07f they were counted as heads).
FAMILIES = [("one_launch", r"one_launch_kernel"), ("gemm_fp8", r"fp8_gemm_kernel"),
            ("gemm_cublas_fp8", r"nvjet_sm\d+_qq"), ("quantize", r"act_quant|silu_mul_quant"),
            ("attention", r"attention"), ("norm", r"rmsnorm"), ("rope_kv", r"qkv_rope"),
            ("sampler", r"penalty|finish|topk|sort|radix|_sample_kernel"),
            ("heads_f32", r"gemv|gemm|sgemm|cutlass|cublas|ampere|sm90"), ("other", r".")]


def copy_bandwidth() -> float:
    n = 1024**3
    a = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    del a, b
    return 2 * n * 2 / (statistics.median(times) * 1e-3)


def _bytes(t: Any) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _layer_bytes(blk: Any) -> int:
    total = 0
    for mod in blk.modules():
        for name in ("qweight", "gate_up_q", "down_q"):
            q = getattr(mod, name, None)
            if q is not None:
                total += _bytes(q.qweight) + _bytes(q.scale)
        w = getattr(mod, "weight", None)
        if isinstance(w, torch.Tensor):
            total += _bytes(w)
    return total


def floor_bytes(model: Any, bs: int, context: int) -> dict[str, int]:
    c = model.config
    kv = 2 * c.n_layer * context * c.n_local_heads * c.head_dim * model.embeddings.weight.element_size() * bs
    return {
        "slow_layers": sum(_layer_bytes(b) for b in model.layers),
        "fast_layers_x_positions": c.num_codebooks * sum(_layer_bytes(b) for b in model.fast_layers),
        "main_head": _bytes(model.main_head),
        "fast_head_x9": (c.num_codebooks - 1) * _bytes(model.fast_head),
        "kv_cache": kv,
    }


def _family(name: str) -> str:
    for fam, pat in FAMILIES:
        if re.search(pat, name, re.IGNORECASE):
            return fam
    return "other"


def profile_step(model: Any, cache: Any, bs: int, context: int) -> dict[str, Any]:
    """Kernel GPU time by family and launch count of one graph-replayed decode step."""
    from torch.profiler import ProfilerActivity, profile
    from ttsfleet.inference.bench_engine import capture_graph, decode_inputs, decode_step_fn

    graph = capture_graph(decode_step_fn(model, cache, context, decode_inputs(model, bs)))
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
    kernels = sorted((ev.time_range.start, ev.time_range.end, ev.name) for ev in prof.events()
                     if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time > 0)
    # With programmatic dependent launch a kernel starts while its predecessor drains and waits in
    # griddepcontrol.wait, so its duration overlaps; attribute each moment of busy GPU time to the
    # kernel that finishes it (end - max(start, previous end)) and count the rest as idle.
    fam_us: dict[str, float] = defaultdict(float)
    fam_n: dict[str, int] = defaultdict(int)
    names: dict[str, float] = defaultdict(float)
    last_end, busy = -1.0, 0.0
    for start, end, name in sorted(kernels, key=lambda e: e[1]):
        excl = max(0.0, end - max(start, last_end)) if last_end >= 0 else end - start
        busy += excl
        last_end = max(last_end, end)
        fam = _family(name)
        fam_us[fam] += excl / 3
        fam_n[fam] += 1
        names[name[:60]] += excl / 3
    top = sorted(names.items(), key=lambda kv: -kv[1])[:12]
    span = (max(e[1] for e in kernels) - min(e[0] for e in kernels)) / 3 if kernels else 0.0
    return {"kernel_us": {k: round(v, 1) for k, v in fam_us.items()},
            "launches": {k: v // 3 for k, v in fam_n.items()},
            "top_kernels_us": [[n, round(v, 1)] for n, v in top], "busy_us": round(busy / 3, 1),
            "span_us": round(span, 1)}


def main() -> None:
    from ttsfleet.inference.bench_engine import step_breakdown
    from ttsfleet.inference.loader import load_model
    from ttsfleet.kernels import dispatch

    t0 = time.time()
    bw = copy_bandwidth()
    model = load_model("s2-pro", device="cuda", dtype=torch.bfloat16, quantize="auto", max_seq_len=1024)
    plan = dispatch.plan("cuda")
    print(f"{torch.cuda.get_device_name(0)} copy {bw / 1e12:.2f} TB/s; kernels {plan.backend} "
          f"({plan.reason}); loaded in {time.time() - t0:.0f} s", flush=True)
    rows = step_breakdown(model, BATCHES, CONTEXT)
    cache = model.new_cache(max(PROFILE), CONTEXT + 4)
    for r in rows:
        fb = floor_bytes(model, r["batch"], CONTEXT)
        r["floor_bytes"] = fb
        r["floor_ms"] = round(sum(fb.values()) / bw * 1e3, 3)
        r["step_over_floor"] = round(r["step_ms"] / r["floor_ms"], 2)
        if r["batch"] in PROFILE:
            r["profile"] = profile_step(model, cache, r["batch"], CONTEXT)
            r["profile"]["idle_us"] = round(r["step_ms"] * 1e3 - r["profile"]["busy_us"], 1)
        print(json.dumps(r), flush=True)
    res = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "device": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "copy_bw_TBps": round(bw / 1e12, 3), "context": CONTEXT,
           "kernels": {"backend": plan.backend, "reason": plan.reason}, "rows": rows,
           "timing": "CUDA-graph replay of decode_step and of each part "
                     "(inference.bench_engine.step_breakdown), median of 20; kernel families from one "
                     "torch.profiler trace of 3 replays"}
    out = os.environ.get("OUT", "/tmp")
    with open(os.path.join(out, "step_bench.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"{'bs':>3} {'step':>7} {'slow':>6} {'fast':>6} {'floor':>6} {'x':>5}")
    for r in rows:
        print(f"{r['batch']:>3} {r['step_ms']:7.3f} {r['slow_ms']:6.3f} {r['fast_ms']:6.3f} "
              f"{r['floor_ms']:6.3f} {r['step_over_floor']:5.2f}")


if __name__ == "__main__":
    main()
