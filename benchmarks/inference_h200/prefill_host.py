"""What one ``model.prefill_batch`` call costs the host, per number of prompts (S2 Pro shape, FP8).

Why: py-spy of the served path at c=64 (2026-12-02, ``2026-12-02-ab/run2-gate-served-pyspy``) had
the engine thread inside ``prefill_batch`` in 82 % of its samples while NVML said the GPU was busy
39 % of the time: the prefill's host side, not its GPU work, sets the pace. This times, for 1, 2, 4
and 8 prompts of 300-400 tokens (a new length every call, as in the server), the host time until
the call returns and the time until its GPU work is done; then torch.profiler's CPU self time per
op for the 1-prompt call, so the next change aims at what is measured. Both prompt-attention GQA
modes (``TTSFLEET_PROMPT_GQA``: ``expand`` copies K/V heads, ``native`` uses SDPA's ``enable_gqa``)
are timed in one process, alternately per prompt count, with the same prompts.
Usage on the device: ``python3 -m benchmarks.inference_h200.prefill_host OUT.json [CATALOG.yaml]``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile
from ttsfleet.inference.loader import load_model
from ttsfleet.inference.model_layers import PROMPT_GQA_MODES, set_prompt_gqa
from ttsfleet.kernels import dispatch

from benchmarks.inference_h200.prefill_graphs_bench import random_pieces
from ttsfleet.catalog import GpuCatalog

PROMPTS = (1, 2, 4, 8)
CALLS = 12


def _timed_calls(model, cache, n: int, seed: int, mode: str) -> dict:  # noqa: ANN001
    set_prompt_gqa(mode)
    g = torch.Generator().manual_seed(seed)  # the same prompts for every mode
    host, total = [], []
    for _ in range(CALLS):
        pieces = random_pieces(model, n, g)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.prefill_batch(cache, pieces)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        host.append((t1 - t0) * 1e3)
        total.append((time.perf_counter() - t0) * 1e3)
    row = {"gqa": mode, "prompts": n, "host_ms_median": round(statistics.median(host), 2),
           "host_ms_min": round(min(host), 2), "host_ms_max": round(max(host), 2),
           "done_ms_median": round(statistics.median(total), 2)}
    print(row, flush=True)
    return row


def _profile_one_prompt(model, cache, g: torch.Generator, mode: str) -> list[dict]:  # noqa: ANN001
    set_prompt_gqa(mode)
    print(f"profile, GQA {mode}", flush=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(4):
            model.prefill_batch(cache, random_pieces(model, 1, g))
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
    print(table, flush=True)
    return [{"op": e.key, "calls": e.count, "self_cpu_us": round(e.self_cpu_time_total, 1)}
            for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:40]]


def main() -> None:
    if len(sys.argv) > 2:
        dispatch.use_catalog(GpuCatalog.load(sys.argv[2]))
    model = load_model("s2-pro", device="cuda", dtype=torch.bfloat16, quantize="bsgemm_fp8", max_seq_len=1024)
    cache = model.new_cache(16, 1024)
    g = torch.Generator().manual_seed(3)
    for mode in PROMPT_GQA_MODES:  # warm every path (Triton JIT, cuBLAS heuristics) before timing
        set_prompt_gqa(mode)
        for n in PROMPTS:
            model.prefill_batch(cache, random_pieces(model, n, g))
    torch.cuda.synchronize()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "catalog": sys.argv[2] if len(sys.argv) > 2 else "built-in",
              "calls": [_timed_calls(model, cache, n, 100 + n, mode)
                        for n in PROMPTS for mode in PROMPT_GQA_MODES],
              "profile_one_prompt_x4": {mode: _profile_one_prompt(model, cache, g, mode)
                                        for mode in PROMPT_GQA_MODES}}
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
